"""One command's run folder: made or resumed, held while the command runs, its end recorded, removed when it failed
before saving anything. The command's boundary makes the record and passes it on; no module keeps it."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import IO

from kiln.errors import UsageError
from kiln.runs.folders import JOB_ID_ENV, RUN_DIR_ENV, first_missing, job_id, launcher, layout, record_status

try:
    import fcntl
except ImportError:  # not on Windows: two commands on one run folder are not refused there
    fcntl = None  # type: ignore[assignment]


def hold(run_dir: Path) -> IO[str] | None:
    """An exclusive lock on ``<run>/.lock``, which the system drops when the process ends, however it ends (rank 0
    only): a second command on the same folder (two resumes of one run) stops in one line instead of training it a
    second time beside the first. The lock lasts while the returned file stays open."""
    if fcntl is None or not launcher():
        return None
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
    return lock


class RunRecord:
    """The run folder of one command, once it has one: ``folder``; ``created`` when this command made it (not a
    resume), and ``top``, the highest folder made for it (the experiment's, the root's), both removed if it fails
    unsaved."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.created: Path | None = None
        self.top: Path | None = None
        self._lock: IO[str] | None = None

    def __getstate__(self) -> dict[str, object]:
        """A copy without the hold (the process's own): Lightning's weight averaging deep-copies the module, which
        reaches the CLI, and ``ddp_spawn`` pickles it."""
        return {**vars(self), "_lock": None}

    def open(self, root: str | Path, name: str, resume: Path | None = None, prefix: str = "") -> Path:
        """Pick the run's folder, the same one in every process of a multi-process launch, hold it and record it
        ``running`` (until the command says how it ended; a kill -9 leaves it so).

        A resumed run keeps the folder of its checkpoint. Otherwise the launching process makes a fresh timestamped
        folder (``prefix``: ``test-`` and so on for the evaluation commands, whose folders hold results) and exports
        it to Lightning's DDP ranks (``LOCAL_RANK`` > 0), which inherit it. Cluster launches, whose processes start
        on their own, use the job id instead, so a requeued SLURM job finds its old folder."""
        inherited = os.environ.get(RUN_DIR_ENV)
        if inherited and int(os.environ.get("LOCAL_RANK", "0")) > 0:
            self.folder = Path(inherited)
            return self.folder
        run_dir = resume if resume is not None else self._made(Path(root).resolve() / name, prefix)
        self.close()
        self._lock = hold(run_dir)
        os.environ[RUN_DIR_ENV] = str(run_dir)  # for the ranks this process starts (kiln.process.process_group)
        self.folder = run_dir
        self.record("running")
        return run_dir

    def _made(self, base: Path, prefix: str) -> Path:
        """A new folder under ``base`` (absolute: W&B's service process does not share our cwd), or the job's."""
        job = job_id()
        if job is None and not launcher():  # another node's first process: it cannot know rank 0's folder
            raise UsageError(
                "a multi-node launch without a job id: every node would pick a run folder of its own; give every "
                f"node the same {JOB_ID_ENV}=<new id> (the folder is job-<id>), or launch with scripts/torchrun.sh or "
                "SLURM"
            )
        self.top = first_missing(base)
        if job is not None:
            run_dir = base / job
            if not run_dir.is_dir():
                self.created = run_dir
            run_dir.mkdir(parents=True, exist_ok=True)  # every process of the job, and its requeues, share it
            return run_dir
        base.mkdir(parents=True, exist_ok=True)
        stamp = prefix + datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        run_dir, n = base / stamp, 1
        while True:  # mkdir either creates the folder or fails: two runs never share one
            try:
                run_dir.mkdir()
                break
            except FileExistsError:  # another run started in the same second
                run_dir, n = base / f"{stamp}_{n}", n + 1
        self.created = run_dir
        return run_dir

    def record(self, state: str, detail: str = "") -> None:
        """How the command ended, in its folder's ``status.json`` (``kiln.runs.folders.record_status``)."""
        if self.folder is not None:
            record_status(state, detail, self.folder)

    def remove_if_unsaved(self) -> Path | None:
        """Remove the folder this command made when it failed before writing any checkpoint: it would hold only
        ``config.yaml`` and logger files of a run that trained nothing, which a later ``--ckpt_path last`` steps
        around without a word. Returns the folder removed."""
        made = self.created
        if made is None or not made.is_dir() or any(layout(made).checkpoints.glob("*.ckpt")):
            return None
        shutil.rmtree(made, ignore_errors=True)
        folder = made.parent
        while self.top is not None and folder.is_relative_to(self.top):  # the folders made for it, if empty
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent
        return made

    def close(self) -> None:
        """Let the folder go: another command may take it (the file's close drops the lock)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None
