"""One folder per run: ``<root>/<name>/<timestamp>`` holds config, checkpoints, logs and pictures."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

RUN_DIR_ENV = "KILN_RUN_DIR"


@dataclass(frozen=True)
class RunLayout:
    """Where a run keeps what it writes: the one place that knows the folder's layout."""

    root: Path
    CHECKPOINTS = "checkpoints"
    LAST = "last.ckpt"

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def last(self) -> Path:
        """The newest training state (``LastCheckpoint``), what ``--ckpt_path last`` resumes."""
        return self.checkpoints / self.LAST

    @property
    def metrics(self) -> Path:
        """The test after fit's results; its presence marks a tested run."""
        return self.root / "metrics.json"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"


def layout(run_dir: str | Path) -> RunLayout:
    """The layout of the run folder ``run_dir`` (a Trainer's ``default_root_dir``)."""
    return RunLayout(Path(run_dir))


created: Path | None = None  # the run folder this process created (not resumed); removed if it fails unsaved
created_top: Path | None = None  # the highest folder made for it (the experiment's, the root's): removed when empty


def _first_missing(path: Path) -> Path | None:
    """The highest of ``path`` and its parents that does not exist yet (what ``mkdir(parents=True)`` creates)."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


def _job_id() -> str | None:
    """A cluster job id shared by all processes of one launch (SLURM, torchrun), if any."""
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var)
        if value and value != "none":
            return f"job-{value}"
    return None


def new_command() -> None:
    """Forget the folder an earlier command in this process created (a notebook's): only this one's may go."""
    global created
    created = None


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
    global created, created_top
    base = Path(root).resolve() / name  # absolute: W&B's service process does not share our cwd
    created_top = _first_missing(base)
    job = _job_id()
    if job is not None:
        run_dir = base / job
        if not run_dir.is_dir():
            created = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)  # every process of the job, and its requeues, share it
    else:
        base.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        run_dir, n = base / stamp, 1
        while True:  # mkdir either creates the folder or fails: two runs never share one
            try:
                run_dir.mkdir()
                break
            except FileExistsError:  # another run started in the same second
                run_dir, n = base / f"{stamp}_{n}", n + 1
        created = run_dir
    os.environ[RUN_DIR_ENV] = str(run_dir)
    return run_dir


def remove_failed_run() -> Path | None:
    """Remove the run folder this process created when the run failed before writing any checkpoint.

    It would hold only ``config.yaml`` and logger files of a run that trained nothing, which a
    later ``--ckpt_path last`` steps around without a word. Returns the folder removed.
    """
    if created is None or not created.is_dir() or any(layout(created).checkpoints.glob("*.ckpt")):
        return None
    shutil.rmtree(created, ignore_errors=True)
    folder = created.parent
    while created_top is not None and folder.is_relative_to(created_top):  # the folders made for it, if empty
        try:
            folder.rmdir()
        except OSError:
            break
        folder = folder.parent
    return created


def latest_checkpoint(root: str | Path, name: str) -> Path | None:
    """The newest ``last.ckpt`` (or SLURM ``hpc_ckpt_*.ckpt``) of experiment ``name``.

    Under a cluster job id only that job's own folder counts (a requeue keeps its id), so a second
    job with other settings never continues the first one's run.
    """
    runs = Path(root).resolve() / name
    job = _job_id()
    pattern = f"{job or '*'}/{RunLayout.CHECKPOINTS}"
    found = [*runs.glob(f"{pattern}/{RunLayout.LAST}"), *runs.glob(f"{pattern}/hpc_ckpt_*.ckpt")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def best_checkpoint(root: str | Path, name: str) -> Path | None:
    """The best checkpoint of experiment ``name``'s newest run, as its ``ModelCheckpoint`` recorded it."""
    from kiln.checkpointing import load_checkpoint_file

    last = latest_checkpoint(root, name)
    if last is None:
        return None
    states = load_checkpoint_file(last, mmap=True).get("callbacks", {})
    for key, state in states.items():
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") else None
        if best and Path(best).is_file():
            return Path(best)
    return None


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run logged in ``run_dir`` (its ``wandb/latest-run`` points at ``…-<id>``)."""
    latest = layout(run_dir).wandb / "latest-run"
    return latest.resolve().name.rsplit("-", 1)[-1] if latest.exists() else None
