"""Every test (the research package's and the engine's) runs in its own folder, W&B off, no API key in sight."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.testing import INHERITED_ENV

sys.path.insert(0, str(Path(__file__).parent))  # tests/skips.py: the list of what skipped, at the end of a run
from skips import note_skip, pytest_sessionfinish, pytest_terminal_summary  # noqa: F401


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in ``tmp_path``; no W&B key, no inherited run folder or DDP port, W&B disabled unless a test says so;
    afterwards the environment as it was (what kiln sets for a command of its own, such as a sweep's W&B group,
    never reaches the next test)."""
    before = dict(os.environ)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["kiln"])  # the CLI gets its args from the test, not pytest's argv
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    for var in INHERITED_ENV:
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    os.environ.clear()
    os.environ.update(before)


def pytest_configure(config: pytest.Config) -> None:
    """The suite runs on the CPU, where its runs repeat bitwise, unless it is asked for the GPU tests (``-m gpu``,
    ``make test-gpu``): on a GPU machine ``make test`` passes as it does on CI (``accelerator: auto`` took the GPU,
    and tests comparing two runs bit for bit failed), and ``make test-gpu`` checks the GPU."""
    if not selects_gpu(config.option.markexpr):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # read when CUDA starts: this process's and every subprocess's


def selects_gpu(markexpr: str) -> bool:
    """Whether a ``-m`` expression asks for the GPU tests."""
    return "gpu" in markexpr.replace("not gpu", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if selects_gpu(config.option.markexpr):
        return
    kept_off = pytest.mark.skip(reason="a GPU test: `make test-gpu` runs it (`make test` keeps to the CPU)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(kept_off)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``KILN_FAILURES`` set (scripts/gpu_check.sh), each failure is appended to that file as it happens: a run
    cut short at a lent machine's time limit still says why each test failed (xdist prints them only at the end)."""
    note_skip(report)
    path = os.environ.get("KILN_FAILURES")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as out:
            out.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
