"""What ``kiln sweep`` and ``kiln multirun`` share: own options before ``--``; ``kiln fit`` here or as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kiln import console
from kiln.errors import Interrupted, KilnError, NeedsOwnProcess, Preempted, Stopped, first_line
from kiln.process import stop_signals
from kiln.runs import folders
from kiln.runs.record import RunRecord

STOPPED = (Stopped, Preempted, Interrupted)


def fit(args: list[str], inside: str, callbacks: Sequence[Any] = ()) -> Any:
    """``kiln fit <args>`` here (``build_cli``) for the command ``inside``, with that command's own ``sys.argv``
    hidden for the call; ``callbacks`` join the trainer's."""
    from kiln.cli import argv_hidden, build_cli

    record = RunRecord()
    try:
        with argv_hidden():
            cli = build_cli(["fit", *args], inside=inside, callbacks=callbacks, record=record)
        record.record("finished")
        return cli
    except Exception as err:  # a stop, a user error or a crash: the run's folder says which
        line = first_line(err)
        record.record("interrupted" if isinstance(err, STOPPED) else "failed", line)
        if not isinstance(err, STOPPED):  # the same command resumes a stopped run; a failed one saved nothing
            record.remove_if_unsaved()
        raise
    except BaseException as err:  # Ctrl-C, Lightning's SIGTERMException (a SystemExit)
        record.record("interrupted", type(err).__name__)
        raise


def failure_line(err: BaseException) -> str:
    """A failed run's reason in one line: kiln's own message, else the exception's type and first line."""
    line = str(err).splitlines()[0] if str(err) else ""
    return line if isinstance(err, KilnError) else f"{type(err).__name__}: {line}"


def under_policy(
    name: str, run: Callable[[], None], failed: Callable[[str], None], stopped: Callable[[], None] = lambda: None,
    fatal: tuple[type[Exception], ...] = (),
) -> None:  # fmt: skip
    """One run of a sweep or a multirun under the policy they share: a stop says so and goes up (the same command
    resumes the run); a failure (a user error, a crash) removes the folder the run made if it saved nothing, is
    told to ``failed`` in one line, and goes up only when every run would fail the same way (``fatal``)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    try:
        run()
    except (SIGTERMException, *STOPPED):
        print(f"{name}: interrupted; the same command resumes it from its last.ckpt", file=sys.stderr)
        stopped()
        raise
    except Exception as err:  # an in-process run's folder is gone if it saved nothing (``fit``)
        failed(failure_line(err))
        if isinstance(err, (NeedsOwnProcess, *fatal)):
            raise  # every run would fail the same way


def short_key(key: str) -> str:
    """A dotted CLI key by its last part (``…optimizer.init_args.lr`` -> ``lr``), for tables and names."""
    return key.rsplit(".", 1)[-1]


def describe(values: dict[str, Any]) -> str:
    """``lr=0.003, width=16``: a run's settings in one line."""
    return ", ".join(
        f"{short_key(k)}={v:.4g}" if isinstance(v, float) else f"{short_key(k)}={v}" for k, v in values.items()
    )


def fit_process(args: list[str], env: dict[str, str] | None = None, runs_under: Path | None = None) -> None:
    """``kiln fit <args>`` as its own process (DDP starts its ranks from that command line); its stderr
    passes through. A stop signal to this process is noted here and goes on to it, which saves and exits:
    a child stopped, or ending in any way after a stop came, is ``Interrupted`` (the rerun resumes it), and a
    child that finished returns, for the caller to stop at its next safe point. A failure is its error line.
    ``runs_under``: the folder of the child's run folders, where a child that a stop reached as it exited
    (after it recorded its run ``finished``) is seen to have finished."""
    stop_signals.stop_here("stopped before the next `kiln fit` began; the same command goes on from there")
    began = time.time()
    child = subprocess.Popen(
        [sys.executable, "-m", "kiln", *(["-v"] if console.verbose() else []), "fit", *args],
        env={**os.environ, **(env or {})}, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def forward(signum: int, frame: Any) -> None:
        stop_signals.note(signum)
        child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in stop_signals.STOP_SIGNALS}
    try:
        reason = _relay(child)
    finally:
        child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    code = child.returncode
    if code and stop_signals.received() and runs_under is not None and folders.finished_since(runs_under, began):
        return  # the stop came as it exited, its run recorded finished: the caller stops before the next
    if code in stop_signals.EXIT_CODES:  # stopped: saved and exited
        raise Interrupted(code)
    if -code in stop_signals.STOP_SIGNALS:  # killed by a stop signal before kiln's handler was installed
        raise Interrupted(stop_signals.exit_code(signal.Signals(-code).name))
    if code and stop_signals.received():  # whatever it ended with, a stop came: the rerun resumes it
        raise Interrupted(stop_signals.exit_code())
    if code:
        raise KilnError(reason or (f"`kiln fit` was killed by {signal.Signals(-code).name}" if code < 0 else
                                   f"`kiln fit` exited {code}; its output above says why"))  # fmt: skip


def _relay(child: subprocess.Popen) -> str:
    """Pass the child's stderr through; its reason to fail: its ``error:`` line, or a traceback's last line."""
    assert child.stderr is not None
    error = crash = ""
    in_traceback = False
    for line in child.stderr:
        sys.stderr.write(line.replace(stop_signals.RESUME_HINT, ""))  # the sweep or multirun says how it goes on
        if line.startswith("error: "):
            error = line.strip().removeprefix("error: ")
        in_traceback = in_traceback or line.startswith("Traceback (most recent call last)")
        if in_traceback and line.strip() and not line.startswith((" ", "Traceback")):
            crash, in_traceback = line.strip(), False  # the exception's own line ends the traceback
    return error or crash
