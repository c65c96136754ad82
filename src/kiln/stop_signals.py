"""SIGTERM and SIGUSR1 in every subcommand: noted when they arrive, acted on at the next batch boundary."""

from __future__ import annotations

import signal
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: list[str] = []


def install() -> None:
    """Note the stop signals for the whole command, between Trainer stages too (the default handlers kill)."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:  # Lightning adds its SIGTERM handler to this one while a stage runs
            signal.signal(signum, _note)
    _received.clear()


def _note(signum: int, frame: Any) -> None:
    _received.append(signal.Signals(signum).name)


def received() -> str | None:
    """The last stop signal this process got, if any."""
    return _received[-1] if _received else None


def ignore_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a process-group SIGTERM (SLURM, systemd, ``kill -- -pgid``) leaves
    the workers to the main process, which saves at the step boundary and then shuts them down."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
