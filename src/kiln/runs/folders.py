"""One folder per run: ``<root>/<name>/<timestamp>`` holds config, checkpoints, logs and pictures."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from kiln.errors import UsageError

try:
    import fcntl
except ImportError:  # not on Windows: two commands on one run folder are not refused there
    fcntl = None  # type: ignore[assignment]

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


created: Path | None = None  # the run folder this process created (not resumed); removed if it fails unsaved
this_run: Path | None = None  # the run folder of this process's current command, created or resumed
created_top: Path | None = None  # the highest folder made for it (the experiment's, the root's): removed when empty


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


def new_command() -> None:
    """Forget the folder an earlier command in this process created (a notebook's): only this one's may go."""
    global created, created_top, this_run
    created = created_top = this_run = None
    release()


_held: IO[str] | None = None  # this command's hold on its run folder


def _launcher() -> bool:
    """Whether this process is global rank 0 of its launch (the one that holds the run folder and records its
    status): by torchrun's or SLURM's global rank, else by node and local rank (Lightning's own launch)."""
    for var in ("RANK", "SLURM_PROCID"):
        if rank := os.environ.get(var):
            return int(rank) == 0
    return all(int(os.environ.get(var) or 0) == 0 for var in ("NODE_RANK", "GROUP_RANK", "LOCAL_RANK"))


def hold(run_dir: Path) -> None:
    """Take the run folder for this command: an exclusive lock on ``<run>/.lock`` that the system drops when the
    process ends, however it ends. A second command on the same folder (two resumes of one run) stops in one
    line instead of training it a second time beside the first."""
    global _held
    if fcntl is None or not _launcher():
        return
    release()
    lock = (run_dir / ".lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise UsageError(
            f"{run_dir} is in use by another command (process {holder}): wait for it to end, or stop it first"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    _held = lock


def in_use(run_dir: Path) -> bool:
    """Whether a live process holds the run folder (``hold``); without a lock to ask, taken to be."""
    if fcntl is None or not (run_dir / ".lock").is_file():
        return True
    with (run_dir / ".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False  # the lock drops as the file closes


def release() -> None:
    global _held
    if _held is not None:
        _held.close()  # closing the file drops the lock
        _held = None


def resolve_run_dir(root: str | Path, name: str, resume: Path | None = None, prefix: str = "") -> Path:
    """Pick this run's folder, the same one in every process of a multi-process launch.

    A resumed run keeps the folder of its checkpoint. Otherwise the launching process picks a
    fresh timestamped folder (``prefix``: ``test-`` and so on for the evaluation commands, whose
    folders hold results, not training runs) and exports it; Lightning's DDP
    workers (``LOCAL_RANK`` > 0) inherit it. Cluster launches, whose processes start
    independently, use the job id instead, so a requeued SLURM job finds its old folder.
    """
    global created, created_top, this_run
    inherited = os.environ.get(RUN_DIR_ENV)
    if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
        return Path(inherited)
    if resume is not None:  # a resumed run goes on in its own folder
        hold(resume)
        os.environ[RUN_DIR_ENV] = str(resume)
        this_run = resume
        record_status("running")
        return resume
    job = job_id()
    if job is None and not _launcher():  # another node's first process: it cannot know rank 0's folder
        raise UsageError(
            "a multi-node launch without a job id: every node would pick a run folder of its own; give every "
            f"node the same {JOB_ID_ENV}=<new id> (the folder is job-<id>), or launch with scripts/torchrun.sh or SLURM"
        )
    base = Path(root).resolve() / name  # absolute: W&B's service process does not share our cwd
    created_top = first_missing(base)
    if job is not None:
        run_dir = base / job
        if not run_dir.is_dir():
            created = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)  # every process of the job, and its requeues, share it
    else:
        base.mkdir(parents=True, exist_ok=True)
        stamp = prefix + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        run_dir, n = base / stamp, 1
        while True:  # mkdir either creates the folder or fails: two runs never share one
            try:
                run_dir.mkdir()
                break
            except FileExistsError:  # another run started in the same second
                run_dir, n = base / f"{stamp}_{n}", n + 1
        created = run_dir
    hold(run_dir)
    os.environ[RUN_DIR_ENV] = str(run_dir)
    this_run = run_dir
    record_status("running")  # until the command says how it ended; a kill -9 leaves it so
    return run_dir


def current_run_dir() -> Path | None:
    """The run folder of the command in this process, if it got one."""
    exported = os.environ.get(RUN_DIR_ENV)
    return this_run or (Path(exported) if exported else None)


def record_status(state: str, detail: str = "", run_dir: str | Path | None = None) -> None:
    """``status.json`` in this command's run folder (global rank 0 only): ``running`` from its start, then how the
    command ended, ``finished``, ``failed`` or ``interrupted``, with its one line; what ``kiln.results`` lists.
    ``run_dir``: a run's own folder (``RunMetrics`` records a fit called from a notebook, outside a command)."""
    import json
    from datetime import datetime, timezone

    from kiln.files import written_whole

    folder = Path(run_dir) if run_dir is not None else this_run
    if folder is None or not folder.is_dir() or not _launcher():  # a second node's first process: not rank 0
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


def wandb_run_id(run_dir: Path) -> str | None:
    """The id of the W&B run logged in ``run_dir`` (its ``wandb/latest-run`` points at ``…-<id>``)."""
    latest = layout(run_dir).wandb / "latest-run"
    return latest.resolve().name.rsplit("-", 1)[-1] if latest.exists() else None
