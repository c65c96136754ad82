"""One folder per run: ``<root>/<name>/<timestamp>`` holds config, checkpoints, logs and pictures."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not on Windows: two commands on one run folder are not refused there
    fcntl = None  # type: ignore[assignment]

RUN_DIR_ENV = "KILN_RUN_DIR"
DEFAULT_ROOT = "runs"  # run.root when a command gives none (kiln.cli.run_options.RunOptions)


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
    def status(self) -> Path:
        """How the last command in this folder ended (``record_status``)."""
        return self.root / "status.json"

    @property
    def wandb(self) -> Path:
        return self.root / "wandb"

    @property
    def config(self) -> Path:
        """The config the run was resolved to (``kiln fit -c`` it to start another from it)."""
        return self.root / "config.yaml"

    @property
    def environment(self) -> Path:
        """``env.json``: the code, lock, versions, machine and data the run had (``kiln.runs.provenance``)."""
        return self.root / "env.json"


def layout(run_dir: str | Path) -> RunLayout:
    """The layout of the run folder ``run_dir`` (a Trainer's ``default_root_dir``)."""
    return RunLayout(Path(run_dir))


def run_of(checkpoint: str | Path) -> Path:
    """The run folder a checkpoint of it sits in (``<run>/checkpoints/<file>``)."""
    return Path(checkpoint).parent.parent


def read_metrics(run_dir: str | Path) -> dict[str, Any]:
    """A run's ``metrics.json`` (empty when it has none yet)."""
    import json

    path = layout(run_dir).metrics
    return json.loads(path.read_text()) if path.is_file() else {}


def first_missing(path: Path) -> Path | None:
    """The highest of ``path`` and its parents that does not exist yet (what ``mkdir(parents=True)`` creates)."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


JOB_ID_ENV = "KILN_JOB_ID"  # the same on every node of a launch that has no job id of its own (Lightning's own)


def job_id() -> str | None:
    """A cluster job id shared by all processes of one launch (SLURM, torchrun, else ``KILN_JOB_ID``), if any."""
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", JOB_ID_ENV):
        value = os.environ.get(var)
        if value and value != "none":
            return f"job-{value}"
    return None


def launcher() -> bool:
    """Whether this process is global rank 0 of its launch (the one that holds the run folder and records its
    status): by torchrun's or SLURM's global rank, else by node and local rank (Lightning's own launch)."""
    for var in ("RANK", "SLURM_PROCID"):
        if rank := os.environ.get(var):
            return int(rank) == 0
    return all(int(os.environ.get(var) or 0) == 0 for var in ("NODE_RANK", "GROUP_RANK", "LOCAL_RANK"))


def in_use(run_dir: Path) -> bool:
    """Whether a live process holds the run folder (``kiln.runs.record.hold``); without a lock to ask, taken to be."""
    if fcntl is None or not (run_dir / ".lock").is_file():
        return True
    with (run_dir / ".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False  # the lock drops as the file closes


def record_status(state: str, detail: str, run_dir: str | Path) -> None:
    """``status.json`` in the run folder ``run_dir`` (global rank 0 only): ``running`` from its command's start, then
    how the command ended, ``finished``, ``failed`` or ``interrupted``, with its one line; what ``kiln.results``
    lists."""
    import json
    from datetime import timezone

    from kiln.files import written_whole

    folder = Path(run_dir)
    if not folder.is_dir() or not launcher():  # a second node's first process: not rank 0
        return
    record = {"status": state, "detail": detail, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        with written_whole(layout(folder).status) as partial:
            partial.write_text(json.dumps(record, indent=2) + "\n")
    except OSError:  # a full disk: the run's other files say what they can
        pass


def finished_since(base: Path, since: float) -> bool:
    """Whether a run folder under ``base`` recorded ``finished`` at or after ``since`` (a ``time.time()``)."""
    import json

    for status in (layout(folder).status for folder in base.glob("*")):
        try:  # a second's slack: a file system may keep whole seconds
            if status.stat().st_mtime >= since - 1 and json.loads(status.read_text()).get("status") == "finished":
                return True
        except (OSError, ValueError):
            continue
    return False


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run logged in ``run_dir`` (its ``wandb/latest-run`` points at ``…-<id>``)."""
    latest = layout(run_dir).wandb / "latest-run"
    return latest.resolve().name.rsplit("-", 1)[-1] if latest.exists() else None
