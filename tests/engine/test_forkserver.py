"""The suite's forked `python -m kiln` (tests/engine/forkserver.py) answers as a real process does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
import torch
from helpers import LIMIT, PROBES


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


@pytest.mark.slow  # two real processes beside two forked ones, for each signal
@pytest.mark.parametrize(("name", "code"), [("SIGTERM", 143), ("SIGUSR1", 138)])
def test_a_stop_signal_and_its_resume_end_in_a_fork_as_in_a_real_process(tmp_path: Path, name: str, code: int) -> None:
    """The proof the signal, exit-code and resume tests lean on, run forked: a fork skips Python's own shutdown, and
    here it stops, says, exits, saves and resumes as a real process does (the same code, line, metrics.csv and
    weights)."""
    command = [sys.executable, "-m", "kiln", "fit", *LIMIT, "--trainer.logger", "kiln.training.loggers.Csv",
               "--run.test_after_fit", "false", "--trainer.log_every_n_steps", "1",
               "--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=7",
               f"--trainer.callbacks.name={name}", "--trainer.callbacks.marker=sent"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    ended = {}
    for kind, run in (("forked", forkserver.run), ("real", subprocess.run)):
        folder = tmp_path / kind
        folder.mkdir()
        cut = run(command, capture_output=True, text=True, cwd=folder, env=env, timeout=300)
        resumed = run([*command, "--ckpt_path", "last"], capture_output=True, text=True, cwd=folder, env=env,
                      timeout=300)  # fmt: skip
        (run_dir,) = (folder / "runs" / "digits").iterdir()
        said = [line.replace(str(run_dir), "<run>") for line in cut.stderr.splitlines() if line.startswith(name)]
        weights = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        ended[kind] = (cut.returncode, said, resumed.returncode, (run_dir / "metrics.csv").read_text(), weights)
    (cut_code, said, resumed_code, metrics, weights), real = ended["forked"], ended["real"]
    assert (cut_code, said, resumed_code, metrics) == real[:4] and cut_code == code and resumed_code == 0
    assert said and said[0].startswith(f"{name}: stopped after step 7")
    assert all(torch.equal(weights[k], v) for k, v in real[4].items())
