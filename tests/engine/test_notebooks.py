"""``notebooks/results.ipynb`` runs from top to bottom on runs a test makes: fits with two loggers, a failed run,
a regression, a sweep and a multirun; what it shows names each of them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from helpers import CONFIGS, LIMIT
from test_health import nan_net_config

from kiln.commands.boundary import main

if TYPE_CHECKING:  # imported by the test that runs the notebook, not at collection (1.9 CPU-s of every worker)
    import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TINY = ["-c", str(CONFIGS / "debug" / "fast_dev_run.yaml")]


def shown(notebook: nbformat.NotebookNode) -> str:
    """Everything the executed notebook shows as text (prints, tables)."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


@pytest.mark.slow
def test_the_results_notebook_runs_on_fits_a_sweep_and_a_multirun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    main(["fit", *LIMIT, "-c", str(CONFIGS / "logger" / "csv.yaml")])
    regression = ["-c", str(CONFIGS / "experiment" / "friedman.yaml"), *LIMIT]  # no val/acc: curves of what it logs
    main(["fit", *regression, "-c", str(CONFIGS / "logger" / "csv.yaml")])
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *LIMIT, "--model.init_args.optimizer.init_args.lr", "0.01"])  # W&B's offline file
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(SystemExit):  # a NaN at step 7, after the checkpoints of step 6: a failed run that stays
        main(["fit", "-c", nan_net_config(tmp_path, [7]), "--trainer.logger", "false"])
    sweep = tmp_path / "tiny.yaml"
    space = {"model.init_args.optimizer.init_args.lr": {"low": 1e-3, "high": 1e-2}}
    args = [*LIMIT, "--trainer.logger=false"]
    sweep.write_text(yaml.safe_dump({"name": "tiny", "n_trials": 2, "pruner": "none", "args": args, "space": space}))
    main(["sweep", "-c", str(sweep)])
    main(["multirun", "--seeds", "0-1", "--name", "seeds", "--", *TINY])
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("KILN_RUNS", str(tmp_path / "runs"))
    notebook = nbformat.read(NOTEBOOKS / "results.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    text = shown(notebook)
    assert "runs under" in text and "finished" in text and "failed" in text  # 4 fits, the 2 trials (+2 multirun)
    assert "friedman" in text and "val/rmse @best" in text
    assert "model.init_args.optimizer.init_args.lr" in text  # a setting that differs between the runs
    assert "sweep tiny: 2 trials" in text and "multirun seeds" in text and "±" in text
    images = [o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # the curves, the run's two pictures, the sweep's history
