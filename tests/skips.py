"""What skipped and why, at the end of every run; with CI=true a skip this machine could have run fails the run.

A skip names what it needs in its reason. Each group below says how to tell whether this machine has it: where
it does (root, SLURM's daemons, a PostgreSQL server, unshare), a skip of that group under CI=true means the
test did not run what it could have, and a green run would claim a proof it did not make."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable

import pytest


def _unshare() -> bool:
    found = shutil.which("unshare") is not None
    return found and subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode == 0


def _postgres() -> bool:
    return shutil.which("initdb") is not None or bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# group: (words of a skip's reason, whether this machine has what the group needs)
GROUPS: dict[str, tuple[tuple[str, ...], Callable[[], bool]]] = {
    "GPU tests (`make test-gpu` runs them)": (("make test-gpu",), lambda: False),
    "a CUDA GPU": (("CUDA GPU", "without bf16"), _gpu),
    "SLURM": (("slurm", "SLURM", "munge"), lambda: shutil.which("slurmctld") is not None),
    "PostgreSQL": (("PostgreSQL", "postgres", "initdb"), _postgres),
    "unshare": (("unshare",), _unshare),
    "root": (("needs root",), lambda: os.geteuid() == 0),
}
SKIPPED: dict[str, list[str]] = defaultdict(list)  # group -> "test: reason"


def _group(reason: str) -> str:
    return next((name for name, (words, _) in GROUPS.items() if any(w in reason for w in words)), "other")


def note_skip(report: pytest.TestReport) -> None:
    """Keep a skipped test's reason, under its group."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        SKIPPED[_group(reason)].append(f"{report.nodeid}: {reason}")


def _could_run() -> list[str]:
    """The groups that skipped here though this machine has what they need."""
    return [name for name in SKIPPED if name in GROUPS and GROUPS[name][1]()]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if os.environ.get("CI") == "true" and not hasattr(session.config, "workerinput") and _could_run():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)  # after pytest's own sections: the run's last lines
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    write = terminalreporter.write_line
    write("")
    write(f"skipped, by what they need: {sum(map(len, SKIPPED.values()))} tests" if SKIPPED else "skipped: none")
    for name, tests in sorted(SKIPPED.items()):
        write(f"  {name}: {len(tests)}")
        for test in tests:
            write(f"    {test}")
    if os.environ.get("CI") == "true" and (missed := _could_run()):
        write(f"CI=true: this machine has {', '.join(missed)}, yet tests that need it skipped: the run fails")
