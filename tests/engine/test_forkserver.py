"""The suite's forked `python -m kiln` (tests/engine/forkserver.py) answers as a real process does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest


@pytest.mark.slow  # real processes beside forked ones
def test_a_forked_kiln_command_prints_and_exits_as_a_real_process_and_an_import_time_variable_gets_a_real_one(
    tmp_path: Path,
) -> None:
    command = [sys.executable, "-m", "kiln", "fit", "--trainer.max_epochs", "2", "--nope", "1"]
    forked = forkserver.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    real = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.returncode == 2 and forked.stderr.startswith("error: --nope"), forked.stderr
    merged = forkserver.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    assert (merged.returncode, merged.stdout, merged.stderr) == (2, real.stdout + real.stderr, None)  # one stream
    assert forkserver.serves(dict(os.environ))  # it was forked
    assert not forkserver.serves({**os.environ, "TORCH_LOGS": "+dynamo"})  # read as torch imports: a real process
