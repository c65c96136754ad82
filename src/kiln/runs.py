"""One folder per run: ``<root>/<name>/<timestamp>`` holds config, checkpoints, logs and pictures."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

RUN_DIR_ENV = "KILN_RUN_DIR"


def _job_id() -> str | None:
    """A cluster job id shared by all processes of one launch (SLURM, torchrun), if any."""
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var)
        if value and value != "none":
            return f"job-{value}"
    return None


def resolve_run_dir(root: str | Path, name: str, resume: Path | None = None) -> Path:
    """Pick this run's folder, the same one in every process of a multi-process launch.

    A resumed run keeps the folder of its checkpoint. Otherwise the launching process picks a
    fresh timestamped folder and exports it; Lightning's DDP
    workers (``LOCAL_RANK`` > 0) inherit it. Cluster launches, whose processes start
    independently, use the job id instead, so a requeued SLURM job finds its old folder.
    """
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return Path(inherited)
    if resume is not None:  # a resumed run goes on in its own folder
        os.environ[RUN_DIR_ENV] = str(resume)
        return resume
    base = Path(root).resolve() / name  # absolute: W&B's service process does not share our cwd
    job = _job_id()
    if job is not None:
        run_dir = base / job
    else:
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        run_dir, n = base / stamp, 1
        while run_dir.exists():  # two runs started in the same second
            run_dir, n = base / f"{stamp}_{n}", n + 1
    run_dir.mkdir(parents=True, exist_ok=True)
    os.environ[RUN_DIR_ENV] = str(run_dir)
    return run_dir


def remove_if_empty(run_dir: Path | None) -> None:
    """Drop a run folder that a failed start left with nothing in it."""
    if run_dir is not None and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()


def latest_checkpoint(root: str | Path, name: str) -> Path | None:
    """The newest ``last.ckpt`` (or SLURM ``hpc_ckpt_*.ckpt``) of any run of experiment ``name``."""
    runs = Path(root).resolve() / name
    found = [*runs.glob("*/checkpoints/last.ckpt"), *runs.glob("*/checkpoints/hpc_ckpt_*.ckpt")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run logged in ``run_dir`` (its ``wandb/latest-run`` points at ``…-<id>``)."""
    latest = run_dir / "wandb" / "latest-run"
    return latest.resolve().name.rsplit("-", 1)[-1] if latest.exists() else None
