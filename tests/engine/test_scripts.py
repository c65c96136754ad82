"""The launch scripts under scripts/ run as shipped: torchrun on two "nodes" of this machine, sbatch files parse."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import forkserver
import pytest
from helpers import PROBES

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
LIMIT = ["-c", str(SCRIPTS.parent / "configs" / "debug" / "limit.yaml"), "--trainer.logger", "false"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    "script",
    ["torchrun.sh", "slurm.sbatch", "sweep.sbatch", "multirun.sbatch", "engines/postgres.sh", "engines/slurm.sh"],
)
def test_each_launch_script_is_valid_bash(script: str) -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("script", ["torchrun.sh", "slurm.sbatch", "sweep.sbatch", "multirun.sbatch"])
def test_a_script_without_the_projects_environment_stops_in_one_line_before_anything_starts(
    script: str, tmp_path: Path
) -> None:
    """Without .venv (a GPU machine's own Python) torchrun.sh ended in `.venv/bin/python: No such file`, exit 127."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPTS / script, tmp_path / "scripts" / script)
    bare = {k: v for k, v in os.environ.items() if k != "VENV"}  # as a shell without one (gpu_check.sh sets it)
    done = subprocess.run(["bash", f"scripts/{script}"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=bare)  # fmt: skip
    torchrun = script == "torchrun.sh"  # finds the project from its own path; the sbatch scripts run in it
    wanted = f"{tmp_path}/.venv/bin/torchrun" if torchrun else ".venv/bin/kiln"
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"scripts/{script}: no {wanted}: run 'make install' in the project folder first, or set VENV to an "
        "environment with kiln"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scripts"]  # nothing made (no runs/, no study)
    other = subprocess.run(["bash", f"scripts/{script}"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                           env={**bare, "VENV": str(tmp_path / "mine")})  # fmt: skip
    assert f"no {tmp_path / 'mine'}/bin/{Path(wanted).name}:" in other.stderr


@pytest.mark.slow
def test_torchrun_script_trains_across_two_nodes_of_this_machine_into_one_run_folder(tmp_path: Path) -> None:
    """It called nvidia-smi (exit 127 without it) and forced the GPU preset (SyncBatchNorm: an internal error)."""
    for attempt in range(2):  # a port taken between free_port() and the store's bind (once in CI): a new one
        env = {**os.environ, "WANDB_MODE": "disabled", "NNODES": "2", "NPROC_PER_NODE": "1", "RDZV_ID": "two-nodes",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
        nodes = [subprocess.Popen([str(SCRIPTS / "torchrun.sh"), *LIMIT], cwd=tmp_path,
                                  env={**env, "NODE_RANK": str(rank)}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for rank in (0, 1)]  # fmt: skip
        errors = [node.communicate(timeout=300)[1] for node in nodes]
        if attempt or not any("RendezvousConnectionError" in error for error in errors):
            break
        shutil.rmtree(tmp_path / "runs", ignore_errors=True)
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
    record_status("finished", "", tmp_path)
    assert not layout(tmp_path).status.exists()
    for var in rank:
        monkeypatch.setenv(var, "0")
    record_status("finished", "", tmp_path)
    assert json.loads(layout(tmp_path).status.read_text())["status"] == "finished"


def finished_job(job: str, env: dict[str, str]) -> dict[str, str]:
    """Wait for a SLURM job to end; its ``scontrol show job`` fields. A requeued job waits (SLURM holds it back
    for a while before it may start again): it is told to start now."""
    for _ in range(300):
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
        fields = dict(item.split("=", 1) for item in shown.stdout.split() if "=" in item)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return fields
        if fields.get("JobState") == "PENDING" and fields.get("Restarts", "0") != "0":
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, capture_output=True)
        time.sleep(1)
    raise AssertionError(f"SLURM job {job} did not end in 300 s")


def srun_exit_codes(output: str) -> dict[int, int]:
    """Each task's exit code from srun's lines (``tasks 0-1: Exited with exit code 138``, or one line per task)."""
    codes = {}
    for tasks, code in re.findall(r"tasks? ([\d,-]+): Exited with exit code (\d+)", output):
        for span in tasks.split(","):
            first, _, last = span.partition("-")
            codes.update(dict.fromkeys(range(int(first), int(last or first) + 1), int(code)))
    return codes


def slurm_project(tmp_path: Path) -> Path:
    """A project folder for sbatch (the scripts run `.venv/bin/kiln` and read configs/ from where they start)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in (".venv", "configs", "scripts"):
        (project / name).symlink_to(SCRIPTS.parent / name)
    return project


def sbatch(project: Path, env: dict[str, str], *args: str) -> str:
    """Submit from ``project`` (output files in it); the job id."""
    done = subprocess.run(["sbatch", "--parsable", f"--chdir={project}", *args], cwd=project, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return done.stdout.strip().split(";")[0]


def array_of_two(project: Path, env: dict[str, str], script: str, *args: str) -> list[str]:
    """``script`` as an array of two tasks, both completed; their output files' texts."""
    array = sbatch(project, env, "--array=0-1", f"--output={project}/slurm-%A_%a.out", f"scripts/{script}", *args)
    for task in (0, 1):
        assert finished_job(f"{array}_{task}", env)["JobState"] == "COMPLETED"
    return [(project / f"slurm-{array}_{task}.out").read_text() for task in (0, 1)]


@pytest.mark.slow
def test_slurm_sbatch_saves_requeues_and_resumes_on_slurms_sigusr1_to_the_uninterrupted_runs_numbers(
    tmp_path: Path, slurm_conf: str
) -> None:
    """On a real one-node SLURM (scripts/engines/slurm.sh): scripts/slurm.sbatch as shipped, two DDP tasks under
    srun, SIGUSR1 from SLURM (``scancel --signal``, as ``--signal=SIGUSR1@90`` sends it) at step 4: kiln saves,
    requeues the job and both ranks exit with the preemption's code, 138; the requeued job resumes in its own
    folder to the end, with the uninterrupted job's metrics.csv, in one appended output file. (Under make test
    the cluster had been given OMP_NUM_THREADS cores, 1, and a two-task job waited for ever: PartitionConfig.)"""
    project = slurm_project(tmp_path)
    env = {**os.environ, "SLURM_CONF": slurm_conf, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    args = [*LIMIT[:2], "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "6", "--trainer.logger",
            "kiln.training.loggers.Csv", "--data.num_workers", "0"]  # fmt: skip
    probe = ["--trainer.callbacks+=probes.SlurmSignalAtStep", "--trainer.callbacks.step=4",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip

    def submit(*extra: str) -> str:
        two_tasks = ["--ntasks-per-node=2", f"--output={project}/slurm-%j.out"]
        return sbatch(project, env, *two_tasks, "scripts/slurm.sbatch", *args, *extra)

    whole, cut = submit(), submit(*probe)
    ended = {job: finished_job(job, env) for job in (whole, cut)}
    output = (project / f"slurm-{cut}.out").read_text()
    assert [ended[job]["JobState"] for job in (whole, cut)] == ["COMPLETED"] * 2, output[-3000:]
    assert ended[cut]["Restarts"] == "1" and ended[whole]["Restarts"] == "0"
    assert "SIGUSR1: stopped after step 4, saved" in output and f"requeued SLURM job {cut}" in output
    assert srun_exit_codes(output) == {0: 138, 1: 138}, output[-3000:]  # both ranks, the preemption's own code
    assert "internal error" not in output and "Traceback" not in output
    assert "run folder" in output.split(f"requeued SLURM job {cut}")[1]  # the requeue appended, then finished
    runs = project / "runs" / "digits"
    assert json.loads((runs / f"job-{cut}" / "status.json").read_text())["status"] == "finished"
    assert (runs / f"job-{cut}" / "metrics.csv").read_text() == (runs / f"job-{whole}" / "metrics.csv").read_text()


@pytest.mark.slow
def test_sweep_sbatch_array_tasks_share_one_study_on_a_real_slurm_and_run_each_trial_once(
    tmp_path: Path, slurm_conf: str
) -> None:
    """scripts/sweep.sbatch as shipped, an array of two tasks on one journal study: every trial had failed with
    ``KeyError: 'SLURM_NTASKS'`` (no --ntasks, and Lightning's SLURMEnvironment reads it)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    project = slurm_project(tmp_path)
    env = {**os.environ, "SLURM_CONF": slurm_conf, "WANDB_MODE": "disabled"}
    outputs = array_of_two(
        project, env, "sweep.sbatch", "--n_trials", "3", "--", *LIMIT[:2], "--trainer.logger", "false"
    )
    journal = project / "runs" / "sweeps" / "digits" / "study.journal"
    storage = JournalStorage(JournalFileBackend(str(journal)))
    trials = [t for t in optuna.load_study(study_name="digits", storage=storage).get_trials()
              if not t.user_attrs.get("surplus")]  # fmt: skip
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3, outputs[0][-1500:] + outputs[1][-1500:]
    ran = [
        line.split(":")[0] for out in outputs for line in out.splitlines() if re.match(r"trial-\d+: val/loss ", line)
    ]
    assert sorted(ran) == ["trial-0000", "trial-0001", "trial-0002"]  # each by one task


@pytest.mark.slow  # a SLURM cluster of its own
def test_slurm_tells_a_sweep_which_array_task_lives_and_stopping_the_engine_ends_its_jobs_alone(
    slurm_conf: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scancelled task's trial stayed "alive" for its heartbeat's 10 minutes: a resubmitted task had nothing to
    run, then started it over. SLURM knows at once: a running task lives whatever its heartbeat, a cancelled
    one is dead however fresh its heartbeat. Then `scripts/engines/slurm.sh stop`: it ended processes by
    ``pkill -f <folder>/`` (another user's ``tail`` of a log there) and left a cancelled job's orphans running."""
    from kiln.commands.sweep.study import alive

    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    array = subprocess.run(["sbatch", "--parsable", "--array=0-1", "--output=/dev/null", "--wrap", "sleep 300"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    for _ in range(60):  # both tasks running
        states = subprocess.run(["squeue", "-h", "-j", array, "-o", "%T"], capture_output=True, text=True).stdout
        if states.split() == ["RUNNING", "RUNNING"]:
            break
        time.sleep(0.5)
    assert alive(f"slurm:{array}_1", heartbeat=time.time() - 3600, stale_after=60)  # SLURM runs it
    subprocess.run(["scancel", f"{array}_1"], check=True)
    assert not alive(f"slurm:{array}_1", heartbeat=time.time(), stale_after=60)  # cancelled: dead at once
    assert alive(f"slurm:{array}_0", heartbeat=time.time() - 3600, stale_after=60)
    folder = str(Path(slurm_conf).parent)
    bystander = subprocess.Popen(["tail", "-f", f"{folder}/slurmd.log"], stdout=subprocess.DEVNULL,
                                 env={"PATH": os.environ["PATH"]})  # fmt: skip
    subprocess.run([str(SCRIPTS / "engines" / "slurm.sh"), "stop", folder], check=True, timeout=120)
    assert bystander.poll() is None  # not this cluster's: alive
    bystander.kill()
    bystander.wait()
    left = [p for p in Path("/proc").glob("[0-9]*") if f"SLURM_CONF={slurm_conf}".encode() in _environ(p)]
    assert left == [] and not Path(folder).exists()


def _environ(process: Path) -> bytes:
    try:
        return (process / "environ").read_bytes()
    except OSError:
        return b""


def test_a_second_node_without_a_job_id_stops_in_one_line_before_making_a_folder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Lightning's own multi-node launch (MASTER_ADDR and NODE_RANK on each node) left a stray run folder per
    node (``…_1`` beside rank 0's on a shared disk; on a disk of its own, one that said ``finished``)."""
    from kiln.commands.boundary import main

    monkeypatch.setenv("NODE_RANK", "1")
    with pytest.raises(SystemExit) as stop:
        main(["fit", *LIMIT, "--trainer.logger", "false"])
    assert stop.value.code == 2 and not Path("runs").exists()
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "a multi-node launch without a job id" in line and "KILN_JOB_ID=<new id>" in line


@pytest.mark.slow
def test_lightnings_own_two_node_launch_with_a_job_id_trains_into_one_run_folder(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "disabled", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "KILN_JOB_ID": "two"}  # fmt: skip
    command = ["kiln", "fit", "-c", str(SCRIPTS.parent / "configs" / "trainer" / "ddp_cpu.yaml"), "--trainer.devices",
               "1", "--trainer.num_nodes", "2", "--data.num_workers", "0", *LIMIT]  # fmt: skip

    def node(rank: int) -> subprocess.CompletedProcess[str]:  # forked from the tests' preloaded server
        return forkserver.run([sys.executable, "-m", *command], cwd=tmp_path, env={**env, "NODE_RANK": str(rank)},
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    with ThreadPoolExecutor(2) as pool:  # both nodes at once: each waits for the other to join
        nodes = list(pool.map(node, (0, 1)))
    errors = [done.stderr for done in nodes]
    assert [done.returncode for done in nodes] == [0, 0], errors[0][-2000:] + errors[1][-2000:]
    assert [p.name for p in (tmp_path / "runs" / "digits").iterdir()] == ["job-two"]  # no stray folder
    assert json.loads((tmp_path / "runs" / "digits" / "job-two" / "status.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_multirun_sbatch_array_tasks_train_each_run_once_and_each_aggregates_all(
    tmp_path: Path, slurm_conf: str
) -> None:
    """scripts/multirun.sbatch on the real one-node SLURM: a multirun spread over an array of two tasks."""
    project = slurm_project(tmp_path)
    env = {**os.environ, "SLURM_CONF": slurm_conf, "WANDB_MODE": "disabled"}
    outputs = array_of_two(project, env, "multirun.sbatch", "--seeds", "0-3", "--", *LIMIT[:2], "--trainer.logger",
                           "false")  # fmt: skip
    root = project / "runs" / "multirun" / "multirun"
    trained = {seed: [p for p in (root / "base" / f"seed{seed}").iterdir() if p.is_dir()] for seed in range(4)}
    assert all(len(runs) == 1 for runs in trained.values()), trained  # once each, by one task or the other
    assert all(out.count("runs/multirun/multirun: mean, std, 95% CI") == 1 for out in outputs)  # each sums all up
    with (root / "results.csv").open() as f:
        assert {int(r["n"]) for r in csv.DictReader(f)} == {4}, outputs[0][-1500:] + outputs[1][-1500:]
