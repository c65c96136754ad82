"""What ``kiln sweep`` and ``kiln multirun`` share: own options before ``--``; ``kiln fit`` here or as a process."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
from typing import Any

from kiln.errors import Interrupted, KilnError, Preempted, Stopped
from kiln.process import process_group
from kiln.runs import folders

STOPPED = (Stopped, Preempted, Interrupted)


def parse_command(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options, and the ``kiln fit`` arguments every run gets (what follows ``--``)."""
    fit_args = args[args.index("--") + 1 :] if "--" in args else []  # e.g. -- -c configs/trainer/gpu.yaml
    own = args[: args.index("--")] if "--" in args else args
    return parser.parse_args(own), fit_args  # a OneLineParser: a bad option raises UsageError


def fit(args: list[str]) -> Any:
    """``kiln fit <args>`` here (``build_cli``), with the command's own ``sys.argv`` hidden for the call."""
    from kiln.cli import argv_hidden, build_cli

    process_group.inside_command = True
    try:
        with argv_hidden():
            cli = build_cli(["fit", *args])
        folders.record_status("finished")
        return cli
    except Exception as err:  # a stop, a user error or a crash: the run's folder says which
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        folders.record_status("interrupted" if isinstance(err, STOPPED) else "failed", line)
        raise
    except BaseException as err:  # Ctrl-C, Lightning's SIGTERMException (a SystemExit)
        folders.record_status("interrupted", type(err).__name__)
        raise
    finally:
        process_group.inside_command = False


def resolved_config(fit_args: list[str]) -> str:
    """The config ``kiln fit <fit_args>`` resolves to (what ``--print_config`` prints), before anything runs:
    a rerun reuses a run only if this text is the same (the files behind ``-c`` may have changed)."""
    from kiln.cli import argv_hidden, build_cli

    printed = io.StringIO()
    with argv_hidden(), contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        build_cli(["fit", *fit_args, "--print_config"])
    return printed.getvalue()


def short_key(key: str) -> str:
    """A dotted CLI key by its last part (``…optimizer.init_args.lr`` -> ``lr``), for tables and names."""
    return key.rsplit(".", 1)[-1]


def describe(values: dict[str, Any]) -> str:
    """``lr=0.003, width=16``: a run's settings in one line."""
    return ", ".join(
        f"{short_key(k)}={v:.4g}" if isinstance(v, float) else f"{short_key(k)}={v}" for k, v in values.items()
    )


STOP = (signal.SIGTERM, signal.SIGUSR1)


def fit_process(args: list[str], env: dict[str, str] | None = None) -> None:
    """``kiln fit <args>`` as its own process (DDP starts its ranks from that command line); its stderr
    passes through. A stop signal to this process goes on to it, which saves and exits (``Interrupted``);
    its error line, or a crash's last line, becomes a ``KilnError``."""
    child = subprocess.Popen(
        [sys.executable, "-m", "kiln", "fit", *args], env={**os.environ, **(env or {})}, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    previous = {signum: signal.signal(signum, lambda signum, _: child.send_signal(signum)) for signum in STOP}
    last = error = ""
    try:
        assert child.stderr is not None
        for line in child.stderr:
            sys.stderr.write(line)
            last = line.strip() or last  # a crash's traceback ends on its one line
            error = line.strip().removeprefix("error: ") if line.startswith("error: ") else error
    finally:
        child.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if child.returncode in (128 + signal.SIGTERM, 128 + signal.SIGUSR1):
        raise Interrupted(child.returncode)
    if child.returncode:
        raise KilnError(error or last or f"`kiln fit` exited {child.returncode}")
