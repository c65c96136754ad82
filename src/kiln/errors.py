"""Errors a user can fix, and the ways a command stops: the boundary (kiln.commands) prints each as one line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KilnError(Exception):
    """A problem with the user's input (data, config, checkpoint) whose message says what to do."""

    exit_code = 1


class UsageError(KilnError):
    """Settings that do not parse (an unknown key, a wrong type, a missing class); exits 2, as argparse does."""

    exit_code = 2


class MissingDataError(KilnError, FileNotFoundError):
    """Dataset files are absent and could not be downloaded."""


class HealthCheckError(KilnError):
    """A batch or a training step failed a health check; the message names the batch, field and values."""


class DeviceMemoryError(KilnError):
    """A dataset asked to live on the device does not fit in its free memory."""


class ConfigError(KilnError, ValueError):
    """Settings that cannot work together; the message names them and the fix."""


class CallError(KilnError, ValueError):
    """A kiln function the user's code called with a value it cannot take; the line names the caller."""


class DataError(KilnError):
    """A dataset that cannot be trained or evaluated on as configured (an empty split, say)."""


class Stopped(Exception):
    """A stop signal (SIGTERM, SIGUSR1) ended the command at a safe point; it exits 128 + the signal."""

    def __init__(self, signal_name: str, what: str) -> None:
        super().__init__(f"{signal_name}: {what}")
        self.signal_name = signal_name


class Preempted(Exception):
    """A stage stopped on SIGUSR1 (after saving a resumable checkpoint in ``fit``, and requeueing under SLURM)."""


class Interrupted(Exception):
    """A ``kiln fit`` process stopped by a signal: the command stops too, and its rerun resumes the run."""

    def __init__(self, code: int) -> None:
        super().__init__(f"`kiln fit` exited {code}")
        self.code = code


class AlreadyFinished(Exception):
    """``fit --ckpt_path last`` on a run that trained and tested to its end: nothing to do."""


class NeedsOwnProcess(UsageError):
    """A run with several processes (DDP) started inside another command: it would relaunch that command."""


def first_line(err: BaseException) -> str:
    """An exception's first line of text, or its type's name where it says nothing: the cause in a one-line error."""
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def nearest(word: str, options: Iterable[str]) -> str:
    """``; did you mean X?`` for the closest option, or nothing: the end of a one-line error naming a wrong value."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
