"""The quickstart notebook runs from top to bottom and shows every picture it draws: drawn on a figure without axes,
the batch grid, predictions and mistakes printed only `<Figure size … with 0 Axes>`, and nbmake passed."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.slow
def test_the_quickstart_runs_and_shows_each_figure_as_a_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("KILN_RUNS", str(tmp_path / "runs"))  # its runs here, not in the project's runs/
    notebook = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    outputs = [o for cell in notebook.cells for o in cell.get("outputs", []) if "data" in o]
    figures = [o for o in outputs if o["data"].get("text/plain", "").startswith("<Figure size")]
    assert len(figures) >= 5  # the batch, the curves, the confusion matrix, the predictions, the mistakes
    assert all("image/png" in o["data"] and " 0 Axes" not in o["data"]["text/plain"] for o in figures)
    assert list((tmp_path / "runs").iterdir()) == [tmp_path / "runs" / "notebook-digits"]
