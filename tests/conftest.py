"""Every test (the research package's and the engine's) runs in its own folder, W&B off, no API key in sight."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.process.process_group import DDP_ENV

# a run folder, a cluster job, and what Lightning's DDP set-up (and torchrun) exports: a test that inherited them
# would resume another's folder or start its DDP child processes on another's port
INHERITED = (*(v for v in DDP_ENV if v != "OMP_NUM_THREADS"), "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "GROUP_RANK",
             "RANK", "LOCAL_WORLD_SIZE")  # fmt: skip


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
    for var in INHERITED:
        monkeypatch.delenv(var, raising=False)
    yield tmp_path
    os.environ.clear()
    os.environ.update(before)
