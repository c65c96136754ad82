"""SIGTERM and SIGUSR1 in every subcommand: noted when they arrive, acted on at the next batch boundary."""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
RESUME_HINT = "; run the same command with `--ckpt_path last` to continue"  # a stopped run's line ends so
_received: list[str] = []


def install() -> None:
    """Note the stop signals for the whole command, between Trainer stages too (the default handlers kill)."""
    _received.clear()  # before the handlers: a signal that comes as they are set (or was pending) is kept
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:  # Lightning adds its SIGTERM handler to this one while a stage runs
            signal.signal(signum, note)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a launcher's blocked signals are inherited


def reclaim() -> None:
    """Point the stop signals at Python's handlers again, after the Trainer is built: a native library can take them
    over behind Python's back (OpenMPI, which mpi4py starts when Lightning looks for an MPI environment, swallows
    SIGUSR1), and a preemption warning then goes unheard."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if callable(handler := signal.getsignal(signum)):
                signal.signal(signum, handler)


def note(signum: int, frame: Any = None) -> None:
    """Remember a stop signal: the command acts on it at its next safe point."""
    _received.append(signal.Signals(signum).name)


def exit_code(name: str | None = None) -> int:
    """What a command stopped by ``name`` (default: the last stop signal) exits with: 128 + the signal, as the
    shell reports it."""
    return 128 + signal.Signals[name or _received[-1]].value


EXIT_CODES = tuple(exit_code(signum.name) for signum in STOP_SIGNALS)  # a command a stop signal ended


def received() -> str | None:
    """The last stop signal this process got, if any."""
    return _received[-1] if _received else None


def leaving() -> None:
    """A command a stop ended is exiting with the stop's code: later stop signals are ignored from here, as Python
    resets its handlers to the default (kill) while it finalizes, and SLURM ends a requeued job's tasks with a
    SIGTERM that would otherwise turn a rank's 138 into "Terminated"."""
    if threading.current_thread() is threading.main_thread():
        _ignore_stop_signals()  # kept to the end: Python leaves an ignored signal ignored


def worker_init_fn() -> Callable[[int], None]:
    """The DataLoader ``worker_init_fn`` (``ignore_in_worker``), with, once per process, the exit hook
    that ends such workers still alive at exit: they ignore the SIGTERM that multiprocessing's own exit
    sends its daemonic children, and it would then wait for them forever (a script or notebook that
    ends holding a loader's iterator)."""
    global _exit_hook
    if not _exit_hook:
        atexit.register(_end_workers)  # after multiprocessing's own exit function, so it runs first
        _exit_hook = True
    return ignore_in_worker


_exit_hook = False


def _end_workers() -> None:
    import multiprocessing

    children = [child for child in multiprocessing.active_children() if child.daemon]  # what it would end anyway
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would report each as "killed by signal"
    for child in children:
        child.kill()


def stop_here(what: str) -> None:
    """A safe point of a command outside Lightning's loops: stop if a stop signal came, saying ``what`` was done."""
    if (name := received()) is not None:
        from kiln.errors import Stopped

        raise Stopped(name, what)


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a process-group SIGTERM (SLURM, systemd, ``kill -- -pgid``) leaves
    the workers to the main process, which saves at the step boundary and then shuts them down."""
    _ignore_stop_signals()


def _ignore_stop_signals() -> None:
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
