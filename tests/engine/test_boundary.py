"""One boundary for every kiln command: a crash is one line naming where its traceback went."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import forkserver
import pytest
import torch
from helpers import LIMIT, PROBES

from kiln.commands.boundary import main

KILN = [sys.executable, "-m", "kiln"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    return forkserver.run([*KILN, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.slow
def test_a_crash_is_one_line_with_the_traceback_saved(tmp_path: Path) -> None:
    crash = ["--model.init_args.net", "faulty.CrashAtStep", "--model.init_args.net.init_args.step", "7"]
    done = run(["fit", *LIMIT, *crash, "--trainer.enable_progress_bar", "false"], tmp_path)
    assert done.returncode == 1
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: TypeError: unsupported operand type(s)") and "Traceback" not in done.stderr
    assert "(raised in your code: " in line and "faulty.py:" in line and "please report it" not in line  # not kiln's
    saved = Path(line.split("the traceback is in ")[1].split(";")[0])
    assert saved.parent.parent.name == "digits"  # in the run folder, which holds the checkpoints of epoch 0 ...
    assert "Traceback (most recent call last)" in saved.read_text() and "faulty.py" in saved.read_text()
    (tmp_path / "early").mkdir()
    early = run(["fit", *LIMIT, *crash[:2], "--model.init_args.net.init_args.step", "0"], tmp_path / "early")
    (line,) = [line for line in early.stderr.splitlines() if line.startswith("error:")]
    saved = Path(line.split("the traceback is in ")[1].split(";")[0])  # ... or, with no run folder left, a temp file
    assert saved.is_file() and not (tmp_path / "early" / "runs" / "digits").exists()


def test_an_error_raised_in_kilns_own_code_is_an_internal_error_to_report() -> None:
    """Called from the user's code (this test), through a library (yaml), raised where kiln called it: kiln's."""
    from kiln.commands.blame import internal_error
    from kiln.files import load_yaml

    with pytest.raises(Exception) as raised:
        load_yaml("key: [")
    line = internal_error(raised.value)
    assert line.startswith("internal error (") and line.endswith("; please report it") and "your code" not in line


class _Broken(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError(f"sample {index} is broken")


def test_an_error_raised_in_a_datasets_worker_process_names_the_users_line() -> None:
    """torch re-raises a worker's error from its own frames: the user's dataset bug read "internal error … please
    report it"."""
    from kiln.commands.blame import internal_error

    with pytest.raises(ValueError) as raised:
        next(iter(torch.utils.data.DataLoader(_Broken(), num_workers=1)))
    line = internal_error(raised.value)
    assert line.startswith("ValueError: sample 0 is broken (raised in your code: ") and "please report" not in line
    assert f"{__file__}:" in line and ", in __getitem__, in a DataLoader worker process); the traceback is in" in line


def _run_state() -> dict[tuple[str, str], tuple[int, str]]:
    """Every module-level value of the engine's modules (not its functions, classes or imported modules), with the
    environment: what one command could leave behind for the next in the same process."""
    state = {("os.environ", k): (0, v) for k, v in os.environ.items()}
    for name, module in list(sys.modules.items()):
        if name == "kiln" or name.startswith("kiln."):
            for key, value in vars(module).items():
                if not key.startswith("__") and not callable(value) and not isinstance(value, types.ModuleType):
                    state[(name, key)] = (id(value), repr(value)[:300])
    return state


def test_a_fit_and_a_failed_fit_in_one_python_session_leave_no_variable_global_or_run_folder_behind(
    tmp_path: Path,
) -> None:
    """A notebook's commands: each left PL_GLOBAL_SEED, PL_SEED_WORKERS and W&B's variables set, and module globals
    held the last one's run folder (a later failure's clean-up could remove the folder of an earlier run)."""
    (tmp_path / ".env").write_text("KILN_TEST_FROM_DOTENV=1\n")  # loaded for each command, not for the session
    before = dict(os.environ)
    quiet = [*LIMIT, "--trainer.logger", "false", "--run.test_after_fit", "false"]
    main(["fit", *quiet, "--run.root", str(tmp_path / "runs")])  # its modules imported: the state to keep
    (first,) = (tmp_path / "runs" / "digits").iterdir()
    assert dict(os.environ) == before
    kept = _run_state()
    with pytest.raises(SystemExit):
        main(["fit", *quiet, "--run.root", str(tmp_path / "runs"), "--model.init_args.num_classes", "3"])
    assert _run_state() == kept
    assert list((tmp_path / "runs" / "digits").iterdir()) == [first]  # the failed run's folder only is removed
    main(["fit", *quiet, "--run.root", str(tmp_path / "other")])
    assert _run_state() == kept and first.is_dir()
