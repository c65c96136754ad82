"""The Optuna study a sweep is: its storage, opened or created once, its trials' owners, a trial reopened."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kiln.commands.sweep.space import Sweep, read_sweep
from kiln.errors import UsageError
from kiln.process import running
from kiln.process.secrets import redact_url


def _owner() -> str:
    """Who runs a trial: a SLURM array task (the same after a requeue, on any node), else host and pid."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job:
        return f"slurm:{job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    return f"{socket.gethostname()}:{os.getpid()}"


OWNER = _owner()


def storage_for(sweep_dir: Path, given: str | None) -> Any:
    """SQLite in the sweep folder by default; any Optuna URL; a ``.log``/``.journal`` file as a journal."""
    import optuna

    if given is None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        database = (sweep_dir / "study.db").resolve()
        if database.is_file() and database.stat().st_size == 0:  # SQLite would take it for a new, empty study
            raise UsageError(
                f"{database} is empty (0 bytes): not the study its trial folders came from; restore it, or move "
                "the sweep folder aside to start the sweep anew"
            )
        return f"sqlite:///{database}"
    file = given.removeprefix("sqlite:///")
    if (given.startswith("sqlite:///") or given.endswith((".log", ".journal"))) and not Path(file).parent.is_dir():
        raise UsageError(
            f"--storage {given}: the folder {Path(file).parent} does not exist: create it (mkdir -p), or give a "
            "file in an existing folder"
        )
    if given.endswith((".log", ".journal")):  # a shared filesystem without a database server
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(given))
    return given


DRIVERS = {  # the module SQLAlchemy imports for a URL: how to add it (MySQLdb needs a compiler: PyMySQL instead)
    "psycopg2": "make add PKG='psycopg2-binary'", "psycopg": "make add PKG='psycopg[binary]'",
    "MySQLdb": "make add PKG='PyMySQL', and write the URL as mysql+pymysql://…", "pymysql": "make add PKG='PyMySQL'",
}  # fmt: skip


def shown(storage: Any) -> str:
    """A storage as a line may show it: a database URL without its password (``user:…@`` or ``?password=``)."""
    text = str(storage)
    return text.removeprefix("sqlite:///") if text.startswith("sqlite:///") else redact_url(text)


def _no_driver(storage: Any, err: ImportError) -> UsageError:
    module = getattr(err.__cause__, "name", None) or err.name or "?"  # Optuna wraps SQLAlchemy's import
    return UsageError(
        f"--storage {shown(storage)}: its database driver ({module}) is not installed: "
        f"{DRIVERS.get(module, f'make add PKG={module}')}"
    )


def _unopened(storage: Any, reason: str, err: Exception) -> UsageError:
    """Why a study could not be opened, in one line: no connection to a server, a full disk, an unreadable file."""
    from sqlalchemy.exc import OperationalError

    where = shown(storage)
    if isinstance(err, OperationalError) and not str(storage).startswith("sqlite"):
        return UsageError(
            f"{where}: cannot connect ({reason}): check the URL's host, port, user, password and database, and "
            "that its server runs"
        )
    if "disk is full" in reason:
        return UsageError(f"{where}: no space left on its disk ({reason}): free some, then rerun")
    return UsageError(
        f"{where}: not a readable study database ({reason}): restore it, or move the sweep folder aside to start "
        "the sweep anew"
    )


def open_study(sweep: Sweep, storage: Any) -> Any:
    import optuna

    from kiln.commands.sweep.sampling import TrialSeeded

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own one line per trial
    kind = optuna.samplers.TPESampler if sweep.sampler == "tpe" else optuna.samplers.RandomSampler
    sampler = TrialSeeded(lambda seed: kind(seed=seed), sweep.seed)
    pruner = (
        optuna.pruners.MedianPruner(
            n_startup_trials=sweep.pruner_startup_trials, n_warmup_steps=sweep.pruner_warmup_epochs
        )
        if sweep.pruner == "median"
        else optuna.pruners.NopPruner()
    )
    from sqlalchemy.exc import DatabaseError, IntegrityError

    for attempt in range(6):
        try:
            return optuna.create_study(
                study_name=sweep.name, storage=storage, direction=sweep.direction, sampler=sampler, pruner=pruner,
                load_if_exists=True,
            )  # fmt: skip
        except ImportError as err:
            raise _no_driver(storage, err) from None
        except (DatabaseError, optuna.exceptions.DuplicatedStudyError) as err:
            reason = str(getattr(err, "orig", None) or err).splitlines()[0]
            racing = isinstance(err, IntegrityError | optuna.exceptions.DuplicatedStudyError) or "exists" in reason
            if racing and attempt < 5:  # another driver created the same new study meanwhile: load it next
                time.sleep(0.2 * (attempt + 1))
                continue
            raise _unopened(storage, reason, err) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


HEARTBEAT = 60  # at most, seconds between a running trial's heartbeats (its driver writes them)
STALE = 600  # a trial of a driver from before `stale_after` was recorded: its heartbeat is this old, it is dead
LIVE_JOB = {
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}  # not COMPLETING: its processes are being ended


def slurm_job_alive(owner: str) -> bool | None:
    """Whether SLURM still runs (or will requeue) the array task ``slurm:<job>_<task>``; ``None`` where
    ``squeue`` cannot tell (none here, no controller): the heartbeat decides."""
    import subprocess

    job = owner.removeprefix("slurm:").rstrip("_")
    try:
        asked = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if asked.returncode != 0:  # a job SLURM has forgotten (ended minutes ago) is an invalid id
        return False if "invalid job id" in asked.stderr.lower() else None
    return bool(LIVE_JOB & set(asked.stdout.split()))


def alive(owner: str, heartbeat: float | None = None, stale_after: float = STALE) -> bool:
    """Whether a RUNNING trial's driver still runs: this host asks the process, SLURM its job; another host's
    trial is alive while its heartbeat is younger than ``stale_after`` (or when it has none: a driver from
    before heartbeats)."""
    if owner.startswith("slurm:"):
        if owner == OWNER:
            return False  # our own task's earlier run (requeued): gone
        if (job := slurm_job_alive(owner)) is not None:
            return job
    else:
        host, _, pid = owner.rpartition(":")
        if host == socket.gethostname():
            return not pid.isdigit() or running(int(pid))
    return heartbeat is None or time.time() - heartbeat < stale_after


@contextmanager
def beating(trial: Any, stale_after: float) -> Iterator[None]:
    """Write the trial's heartbeat (a user attribute, in every Optuna storage) five times in ``stale_after``
    while it runs, with ``stale_after`` itself: a driver elsewhere takes a trial whose heartbeat stopped that
    long ago for dead, and resumes it. Optuna's own heartbeat is for database storages only, and fails a stale
    trial (its retry starts over from scratch)."""
    stop = threading.Event()
    trial.set_user_attr("stale_after", stale_after)

    def beat() -> None:
        while True:
            with contextlib.suppress(Exception):  # a storage hiccup: the next beat tries again
                trial.set_user_attr("heartbeat", time.time())
            if stop.wait(min(HEARTBEAT, stale_after / 5)):
                return

    thread = threading.Thread(target=beat, name="kiln-sweep-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def claim(study: Any, trial: Any) -> bool:
    """Take over an orphan: write this driver as its owner, then read it back after a pause. Of drivers that took
    it at once, the last writer keeps it (no storage offers a compare-and-set on a trial)."""
    trial.set_user_attr("owner", OWNER)
    trial.set_user_attr("heartbeat", time.time())
    time.sleep(1.0)
    now = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
    return bool(now.user_attrs.get("owner") == OWNER)


def orphans(study: Any) -> list[Any]:
    """Trials left RUNNING by a driver that is gone (killed, preempted; on another host, its heartbeat stopped):
    to resume."""
    from optuna.trial import TrialState

    def dead(attrs: dict[str, Any]) -> bool:
        return not alive(attrs.get("owner", ""), attrs.get("heartbeat"), attrs.get("stale_after", STALE))

    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if dead(t.user_attrs)]


def others_running(study: Any) -> list[Any]:
    """The trials other drivers run now (or ran, until one here takes them for dead); a driver from before
    heartbeats is left out: nothing would ever tell its death."""
    from optuna.trial import TrialState

    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [t for t in running if t.user_attrs.get("owner") != OWNER and "heartbeat" in t.user_attrs]


def reopen_trial(spec: str) -> Any:
    """The trial a ``--subprocess`` trial's ``kiln fit`` belongs to, from what the driver put in its environment."""
    import optuna

    given = json.loads(spec)
    study = open_study(read_sweep(given["file"]), storage_for(Path(given["dir"]), given["storage"]))
    return optuna.trial.Trial(study, given["trial"])  # no public call reopens a trial by id (README)
