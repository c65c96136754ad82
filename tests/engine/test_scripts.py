"""The launch scripts under scripts/ run as shipped: torchrun on two "nodes" of this machine, sbatch files parse."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
LIMIT = ["-c", str(SCRIPTS.parent / "configs" / "debug" / "limit.yaml"), "--trainer.logger", "false"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("script", ["torchrun.sh", "slurm.sbatch", "sweep.sbatch", "engines/postgres.sh"])
def test_each_launch_script_is_valid_bash(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_torchrun_script_trains_across_two_nodes_of_this_machine_into_one_run_folder(tmp_path: Path) -> None:
    """It called nvidia-smi (exit 127 without it) and forced the GPU preset (SyncBatchNorm: an internal error)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "NNODES": "2", "NPROC_PER_NODE": "1", "RDZV_ID": "two-nodes",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    nodes = [subprocess.Popen([str(SCRIPTS / "torchrun.sh"), *LIMIT], cwd=tmp_path, env={**env, "NODE_RANK": str(rank)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]  # fmt: skip
    errors = [node.communicate(timeout=300)[1] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    (run_dir,) = (tmp_path / "runs" / "digits").iterdir()  # one folder for both nodes, named after the rendezvous
    assert run_dir.name == "job-two-nodes"
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in (run_dir / "console.log").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["test"]  # trained and tested to its end


@pytest.mark.parametrize(
    "rank",
    [{"RANK": "1"}, {"SLURM_PROCID": "2"}, {"NODE_RANK": "1"}, {"GROUP_RANK": "1"}, {"LOCAL_RANK": "1"}],
    ids=["torchrun", "slurm", "lightning", "elastic_group", "local"],
)
def test_only_global_rank_zero_records_how_the_run_ended(
    rank: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decided by LOCAL_RANK, the first process of a second node recorded its own status.json: on a disk of its
    own, a run folder saying ``finished`` beside no checkpoint (the checkpoints are global rank 0's)."""
    from kiln.runs.folders import layout, record_status

    for var, value in {"LOCAL_RANK": "0", **rank}.items():
        monkeypatch.setenv(var, value)
    record_status("finished", run_dir=tmp_path)
    assert not layout(tmp_path).status.exists()
    for var in rank:
        monkeypatch.setenv(var, "0")
    record_status("finished", run_dir=tmp_path)
    assert json.loads(layout(tmp_path).status.read_text())["status"] == "finished"
