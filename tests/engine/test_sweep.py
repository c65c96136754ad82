"""Sweeps: trials are real `kiln fit` runs in an Optuna study that survives failures and resumes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import forkserver
import optuna
import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT, PROBES

from kiln import results
from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.commands.sweep.command import sweep_command
from kiln.commands.sweep.space import read_sweep
from kiln.errors import ConfigError, UsageError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
LR = "model.init_args.optimizer.init_args.lr"
WIDTH = "model.init_args.net.init_args.width"


def sweep_file(tmp_path: Path, name: str = "tiny", **extra: object) -> Path:
    spec = {
        "name": name,
        "n_trials": 4,
        "pruner": "none",
        "args": [*LIMIT, *QUIET],
        "space": {
            LR: {"low": 1.0e-3, "high": 1.0e-2, "log": True},
            "model.init_args.net.init_args.width": {"choices": [8, 16]},
        },
        **extra,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def study(tmp_path: Path, name: str = "tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'runs' / 'sweeps' / name / 'study.db'}")


def states(s: optuna.Study) -> list[str]:
    return [t.state.name for t in s.get_trials()]


# README: `kiln fit -c best.yaml` reaches the best trial's value bitwise on a CPU, and on a GPU with the
# deterministic preset; on a GPU without it, to within its non-deterministic kernels (relative 1e-5 here)
EXACT_ON_GPU = pytest.param(["-c", str(CONFIGS / "trainer" / "deterministic.yaml")], marks=pytest.mark.gpu)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], EXACT_ON_GPU], ids=["auto", "deterministic_gpu"])
def test_a_sweep_completes_its_trials_and_best_yaml_reproduces_the_best(extra: list[str], tmp_path: Path) -> None:
    if extra and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the CPU case is bitwise without the preset)")
    spec = sweep_file(tmp_path)
    if extra:
        spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), "args": [*LIMIT, *QUIET, *extra]}))
    main(["sweep", "-c", str(spec), "--root", str(tmp_path / "runs" / "sweeps")])
    done = study(tmp_path)
    assert states(done) == ["COMPLETE"] * 4
    folder = tmp_path / "runs" / "sweeps" / "tiny"
    assert {p.name for p in folder.iterdir()} >= {"study.db", "best.yaml", "history.png", "importance.png"}
    assert sorted(p.name for p in folder.glob("trial-*")) == [f"trial-{n:04d}" for n in range(4)]
    rerun = build_cli(["fit", "-c", str(folder / "best.yaml")])  # its own run folder, not the trial's
    again = rerun.trainer.checkpoint_callback.best_model_score.item()  # type: ignore[union-attr]
    if torch.cuda.is_available() and not extra:
        assert again == pytest.approx(done.best_value, rel=1e-5)
    else:
        assert again == done.best_value
    assert "runs/tiny-best" in str(rerun.trainer.default_root_dir)
    assert rerun.test_metrics is not None  # best.yaml kept the trials' test_after_fit false: the rerun printed nothing
    (trial_file,) = (folder / "trial-0000").glob("*/config.yaml")
    trial_config = yaml.safe_load(trial_file.read_text())
    assert trial_config["run"]["summary"] is False  # the sweep prints a line per trial, told by argument ...
    assert rerun.config.fit.run.summary is True  # ... and the rerun of best.yaml ends on its own summary


@pytest.mark.slow
@pytest.mark.parametrize("logger", ["csv", "tensorboard"])
def test_best_yaml_reproduces_a_trial_that_logged_to_files(logger: str, tmp_path: Path) -> None:
    spec = yaml.safe_load(sweep_file(tmp_path, n_trials=1).read_text())
    spec["args"] = [*LIMIT, "-c", str(CONFIGS / "logger" / f"{logger}.yaml"), "--trainer.enable_progress_bar=false"]
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
    main(["sweep", "-c", str(tmp_path / "tiny.yaml"), "--root", str(tmp_path / "runs" / "sweeps")])
    best = tmp_path / "runs" / "sweeps" / "tiny" / "best.yaml"
    assert "save_dir" not in best.read_text()  # was `save_dir: null`, which the logger's type refused
    rerun = build_cli(["fit", "-c", str(best), "--run.test_after_fit=false"])
    assert rerun.trainer.checkpoint_callback.best_model_score.item() == study(tmp_path).best_value  # type: ignore[union-attr]
    assert Path(rerun.trainer.logger.save_dir) == rerun.run_dir  # type: ignore[union-attr, arg-type]  # its own folder


@pytest.mark.slow
def test_a_diverging_trial_fails_with_the_guards_line_and_a_bad_one_is_pruned(tmp_path: Path) -> None:
    planted = [{LR: 3e-3, "model.init_args.net.init_args.width": 16}] * 2 + [
        {LR: 1e6, "model.init_args.net.init_args.width": 16},  # diverges: the non-finite guard stops it
        {LR: 1e-7, "model.init_args.net.init_args.width": 16},  # learns nothing: worse than the median
    ]
    path = sweep_file(tmp_path, space={LR: {"low": 1.0e-7, "high": 1.0e6, "log": True},
                                       "model.init_args.net.init_args.width": {"choices": [16]}},
                      enqueue=planted, pruner="median", pruner_startup_trials=2, pruner_warmup_epochs=0,
                      n_trials=3)  # fmt: skip  # the failed trial does not count: 4 trials hold the 3
    main(["sweep", "-c", str(path), "--root", str(tmp_path / "runs" / "sweeps")])
    trials = study(tmp_path).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]
    assert trials[2].user_attrs["error"].startswith("non-finite training step")  # the guard's own line
    listed = results.runs(tmp_path / "runs" / "sweeps").set_index("experiment")  # the failed run saved nothing
    assert list(listed.index) == ["tiny/trial-0000", "tiny/trial-0001", "tiny/trial-0003"]
    assert list(listed.status) == ["finished"] * 3
    assert list(listed.detail[:2]) == ["", ""]
    assert listed.detail.iloc[2].startswith("the sweep pruned after epoch 0 (val/loss ")  # a cut run's numbers


@pytest.mark.slow
@pytest.mark.long
def test_subprocess_trials_train_on_two_ddp_ranks_report_from_rank_0_and_prune_on_both(tmp_path: Path) -> None:
    planted = [{LR: 3e-3}, {LR: 1e6}, {LR: 1e-7}]  # one good, one that diverges, one worse than the median
    path = sweep_file(tmp_path, space={LR: {"low": 1.0e-7, "high": 1.0e6, "log": True}}, enqueue=planted, n_trials=2,
                      pruner="median", pruner_startup_trials=1, pruner_warmup_epochs=0)  # fmt: skip
    spec = yaml.safe_load(path.read_text())
    spec["args"] += ["-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), "--trainer.max_epochs=2"]
    path.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(path), "--root", "runs/sweeps", "--subprocess"]
    done = forkserver.run(command, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"},
                          cwd=tmp_path, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "sweeps").rglob("console.log"))  # both ranks'
    assert logs.count("Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2") == 2  # on 2 ranks: each trial whose
    # folder stays (the diverged one failed before its first checkpoint: its folder, log and all, is removed)
    trials = study(tmp_path).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "PRUNED"]
    assert [len(t.intermediate_values) for t in trials] == [2, 0, 1]  # one report per epoch: rank 0 only
    assert trials[1].user_attrs["error"].startswith("non-finite training step")  # the child's own line
    assert "trial-0002: pruned after epoch 0" in done.stderr  # both ranks stopped (else DDP would hang)


@pytest.mark.slow
@pytest.mark.real_process  # a sweep driver's signals: no fork proof covers them
def test_sigterm_to_the_driver_alone_reaches_a_subprocess_trial_which_the_rerun_resumes(tmp_path: Path) -> None:
    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=3",
             "--trainer.callbacks.parent=true", f"--trainer.callbacks.marker={tmp_path / 'sent'}",
             "--trainer.callbacks.only_in=trial-0000"]  # fmt: skip
    path = sweep_file(tmp_path, n_trials=1)  # each trial is a process of its own: one is enough
    spec = yaml.safe_load(path.read_text())
    spec["args"] += probe
    path.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(path), "--root", "runs/sweeps", "--subprocess"]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    first = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 143, first.stderr[-2000:]  # the trial saved and exited 143, then the driver
    assert "trial-0000: interrupted; the same command resumes it" in first.stderr
    assert states(study(tmp_path)) == ["RUNNING"]
    second = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "trial-0000: resuming (its driver is gone)" in second.stderr and "resuming from" in second.stderr
    assert states(study(tmp_path)) == ["COMPLETE"]  # resumed, and no other trial begun
    assert len(list((tmp_path / "runs" / "sweeps" / "tiny" / "trial-0000").iterdir())) == 1  # resumed in place


def probed_sweep(tmp_path: Path, probe: list[str], n_trials: int) -> list[str]:
    """A sweep file whose trials carry ``probe`` (callbacks of tests/engine/probes.py), and its command."""
    path = sweep_file(tmp_path, n_trials=n_trials)
    spec = yaml.safe_load(path.read_text())
    spec["args"] += probe
    path.write_text(yaml.safe_dump(spec))
    return [sys.executable, "-m", "kiln", "sweep", "-c", str(path), "--root", "runs/sweeps", "--subprocess"]


@pytest.mark.slow
@pytest.mark.real_process  # a sweep driver's signals: no fork proof covers them
@pytest.mark.parametrize("probe", ["SignalAtFitEnd", "SignalAsItExits"], ids=["fit_end", "exiting"])
def test_a_stop_as_a_subprocess_trial_ends_keeps_its_result_and_stops_the_sweep_before_another(
    tmp_path: Path, probe: str
) -> None:
    """``exiting``: the forwarded SIGTERM killed the trial's process as it exited, after it recorded its run
    finished (seen once in CI): the trial was called interrupted, not COMPLETE, until the rerun."""
    probe_args = [f"--trainer.callbacks+=probes.{probe}", "--trainer.callbacks.only_in=trial-0000",
                  f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    command = probed_sweep(tmp_path, probe_args, n_trials=2)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    first = forkserver.run(  # its own process group: the one the probe signals, as SLURM's
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, start_new_session=True
    )
    assert first.returncode == 143, first.stderr[-2000:]  # was 0: the driver went on to trial 1
    assert "SIGTERM: kiln sweep stopped between trials" in first.stderr
    assert states(study(tmp_path)) == ["COMPLETE"]  # the trial that trained to its end counts, and is not failed
    if probe == "SignalAsItExits":
        return  # what the rerun shows after a stop between trials, fit_end shows (each trial: a fresh interpreter)
    second = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert states(study(tmp_path)) == ["COMPLETE"] * 2


@pytest.mark.slow
@pytest.mark.real_process  # a sweep driver's signals: no fork proof covers them
def test_a_subprocess_trial_killed_fails_with_the_signal_as_its_reason_not_its_last_output_line(
    tmp_path: Path,
) -> None:
    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=2",
             "--trainer.callbacks.name=SIGKILL", f"--trainer.callbacks.marker={tmp_path / 'm'}"]  # fmt: skip
    command = probed_sweep(tmp_path, probe, n_trials=1)
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    done = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]  # every trial failed
    trial = study(tmp_path).get_trials()[0]
    assert trial.state.name == "FAIL" and trial.user_attrs["error"] == "`kiln fit` was killed by SIGKILL"


@pytest.mark.slow  # its multirun twin, 0.5 s, is in test-fast
def test_in_process_trials_refuse_ddp_in_one_line_naming_subprocess(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, args=[*LIMIT, *QUIET, "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml")])
    with pytest.raises(UsageError, match=r"trains on 2 processes \(DDP\).* add --subprocess"):
        sweep_command(["-c", str(path), "--root", str(tmp_path / "runs" / "sweeps")])
    assert states(study(tmp_path)) == ["FAIL"]  # the sweep stops at once, not with every trial failing
    assert not list((tmp_path / "runs" / "sweeps" / "tiny").glob("trial-*"))  # no empty run folder


@pytest.mark.slow
@pytest.mark.real_process  # a sweep driver's signals: no fork proof covers them
def test_sigterm_in_trial_2_then_the_same_command_resumes_it_and_ends_with_4_trials(tmp_path: Path) -> None:
    probe = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=3",
             f"--trainer.callbacks.marker={tmp_path / 'sent'}", "--trainer.callbacks.only_in=trial-0002"]  # fmt: skip
    spec = yaml.safe_load(sweep_file(tmp_path).read_text())
    spec["args"] += probe
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(tmp_path / "tiny.yaml"), "--root", "runs/sweeps"]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
    first = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert first.returncode == 143, first.stderr[-2000:]
    assert "trial-0002: interrupted; the same command resumes it" in first.stderr
    assert states(study(tmp_path)) == ["COMPLETE", "COMPLETE", "RUNNING"]
    second = forkserver.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "trial-0002: resuming (its driver is gone)" in second.stderr and "resuming from" in second.stderr
    assert states(study(tmp_path)) == ["COMPLETE"] * 4  # not 5 or 6
    assert len(list((tmp_path / "runs" / "sweeps" / "tiny" / "trial-0002").iterdir())) == 1  # resumed in place


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["journal", "postgresql"])
def test_two_workers_on_one_study_share_the_trials_run_none_twice_and_take_over_a_killed_ones(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A journal file on a shared disk, or a real PostgreSQL server (scripts/engines/postgres.sh), the workers two
    SLURM array tasks (no controller answers: the heartbeat alone tells liveness). On the journal, the worker of
    trial 0 is killed with SIGKILL at step 7: the other finished its own trials, exited 0 and left that one RUNNING
    for a driver started 600 s later; it resumes it now from its last.ckpt, before it exits."""
    if engine == "journal":
        url = str(tmp_path / "tiny.journal")
        storage: Any = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    else:
        url = storage = request.getfixturevalue("postgres_url")
    path = sweep_file(tmp_path)
    spec = yaml.safe_load(path.read_text())
    spec["args"] += ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=7",
                     "--trainer.callbacks.name=SIGKILL", "--trainer.callbacks.only_in=trial-0000",
                     f"--trainer.callbacks.marker={tmp_path / 'sent'}"] if engine == "journal" else []  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(path), "--root", "runs/sweeps", "--storage", url,
               "--stale_after", "3"]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES, "SLURM_ARRAY_JOB_ID": "9"}

    def worker(task: int) -> subprocess.CompletedProcess[str]:
        return forkserver.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                              env={**env, "SLURM_ARRAY_TASK_ID": str(task)})  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        workers = list(pool.map(worker, (0, 1)))
    outputs = [w.stderr for w in workers]
    killed = engine == "journal"
    assert sorted(w.returncode for w in workers) == ([-9, 0] if killed else [0, 0]), (
        outputs[0][-1500:] + outputs[1][-1500:]
    )
    trials = [
        t for t in optuna.load_study(study_name="tiny", storage=storage).get_trials() if not t.user_attrs.get("surplus")
    ]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    ran = [
        line.split(":")[0]
        for out in outputs
        for line in out.splitlines()
        if line.startswith("trial-") and "val/loss" in line
    ]
    assert sorted(ran) == [f"trial-{n:04d}" for n in range(4)]  # each trial finished by exactly one worker
    if killed:
        (live,) = [w.stderr for w in workers if w.returncode == 0]
        assert "trial-0000: resuming (its driver is gone)" in live
        assert f"resuming from {tmp_path}/runs/sweeps/tiny/trial-0000/" in live
        assert len(list((tmp_path / "runs" / "sweeps" / "tiny" / "trial-0000").iterdir())) == 1  # in place
    else:
        assert all(out.count("val/loss") >= 1 for out in outputs)  # both workers took part


def test_sweep_file_mistakes_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nspace:\n  lr: {low: 1, high: 0}\n")
    with pytest.raises(UsageError, match=r"bad.yaml: space.lr: low 1 and high 0 must be numbers with low < high"):
        read_sweep(bad)
    bad.write_text("name: x\nspace:\n  lr: {low: 0.0, high: 1.0, log: true}\n")
    with pytest.raises(UsageError, match=r"a log scale needs low > 0"):
        read_sweep(bad)
    assert read_sweep(CONFIGS / "sweep" / "digits.yaml").n_trials == 20


def test_a_requeued_slurm_task_takes_back_its_own_trial_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.commands.sweep import study

    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setattr(study, "OWNER", study._owner())
    assert study.OWNER == "slurm:77_3"
    assert not study.alive("slurm:77_3")  # this task's run before the requeue: resume its trial
    assert study.alive("slurm:77_4")  # another task's, without a heartbeat (a driver before heartbeats)
    assert study.alive("elsewhere-host:1")  # another machine's, the same
    assert study.alive("elsewhere-host:1", time.time() - 60)  # its heartbeat is recent
    assert not study.alive("elsewhere-host:1", time.time() - study.STALE - 1)  # it stopped: the host died
    assert not study.alive("slurm:77_4", time.time() - study.STALE - 1)
    assert not study.alive(f"{study.socket.gethostname()}:999999999")  # no such process here


def test_the_argv_wandb_agent_builds_reaches_the_model_and_the_rendered_config_is_wandbs(tmp_path: Path) -> None:
    from wandb.sdk.launch.sweeps.utils import create_sweep_command, create_sweep_command_args

    from kiln.commands.sweep.space import wandb_config

    main(["sweep", "-c", str(CONFIGS / "sweep" / "digits.yaml"), "--root", str(tmp_path), "--wandb"])
    rendered = yaml.safe_load((tmp_path / "digits" / "wandb_sweep.yaml").read_text())
    assert rendered == wandb_config(read_sweep(CONFIGS / "sweep" / "digits.yaml"))
    assert rendered["parameters"][LR] == {"distribution": "log_uniform_values", "min": 1e-4, "max": 3e-2}
    assert rendered["command"][:3] == ["${env}", "kiln", "fit"] and rendered["command"][-1] == "${args}"
    assert rendered["early_terminate"] == {"type": "hyperband", "min_iter": 2}  # the median pruner's warm-up, +1
    values = {LR: 0.0123, WIDTH: 48, "data.init_args.batch_size": 32}
    argv = create_sweep_command_args({"args": {k: {"value": v} for k, v in values.items()}})["args"]  # wandb's own
    command = create_sweep_command(rendered["command"][1:])  # what the agent runs, less ${env}
    assert command[-1] == "${args}"
    cli = build_cli([*argv, "--trainer.logger", "false"], run=False)
    assert cli.config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.0123
    assert cli.model.net.features[0].out_channels == 48 and cli.datamodule.batch_size == 32


def test_under_a_wandb_agent_without_a_key_the_run_stops_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(
        ConfigError, match=r"W&B sweep agent \(WANDB_SWEEP_ID=abc123\): no API key .* nothing was trained"
    ):
        build_cli([*LIMIT], run=False)


@pytest.mark.slow
def test_with_wandb_on_the_pictures_and_the_table_go_to_a_run_in_the_sweeps_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    spec = yaml.safe_load(sweep_file(tmp_path, n_trials=2).read_text())
    spec["args"] = [a for a in spec["args"] if a != "--trainer.logger=false"]  # the default W&B logger
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
    main(["sweep", "-c", str(tmp_path / "tiny.yaml"), "--root", str(tmp_path / "runs" / "sweeps")])
    folder = tmp_path / "runs" / "sweeps" / "tiny"
    (report_run,) = folder.glob("wandb/offline-run-*")  # the sweep's own run, beside the trials' runs
    images = {p.name.split("_")[0] for p in (report_run / "files" / "media" / "images" / "sweep").glob("*.png")}
    assert images == {"history", "importance"}
    assert [p.name.split("_")[0] for p in (report_run / "files" / "media" / "table" / "sweep").iterdir()] == ["trials"]
    trial_runs = list(folder.glob("trial-*/*/wandb/offline-run-*"))
    assert len(trial_runs) == 2
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SILENT"}  # a fit in this process set it
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(tmp_path / "tiny.yaml"), "--root",
               str(tmp_path / "runs" / "sweeps"), "--report"]  # fmt: skip
    alone = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert len(list(folder.glob("wandb/offline-run-*"))) == 2  # the report's run again
    assert not [line for line in alone.stderr.splitlines() if line.startswith("wandb:")]  # were 7 banner lines


@pytest.mark.slow
def test_workers_and_reruns_never_draw_the_same_settings_and_one_driver_repeats_from_its_seed(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, space={LR: {"low": 1.0e-4, "high": 1.0e-1, "log": True}})
    first = ["sweep", "-c", str(path), "--root", str(tmp_path / "a")]
    main([*first, "--n_trials", "1"])  # one worker (or a driver killed after its first trial) ...
    main([*first, "--n_trials", "2"])  # ... and the next one on the same study
    shared = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'a' / 'tiny' / 'study.db'}")
    drawn = [t.params[LR] for t in shared.get_trials()]
    assert len(set(drawn)) == 2  # a sampler seeded with a constant drew trial 0's value again
    main(["sweep", "-c", str(path), "--root", str(tmp_path / "b"), "--n_trials", "2"])  # alone, from the same seed
    alone = optuna.load_study(study_name="tiny", storage=f"sqlite:///{tmp_path / 'b' / 'tiny' / 'study.db'}")
    assert [t.params[LR] for t in alone.get_trials()] == drawn


def test_a_misspelt_space_key_stops_before_any_trial(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = sweep_file(tmp_path, space={"model.init_args.optimizer.init_args.lrr": {"low": 1.0e-3, "high": 1.0e-2}})
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "-c", str(path), "--root", str(tmp_path / "runs" / "sweeps")])
    assert stop.value.code == 2
    error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))
    assert "sweep tiny:" in error and "lrr" in error
    assert study(tmp_path).get_trials() == []  # nothing used up: the fixed file runs all of n_trials


@pytest.mark.slow
def test_a_misspelt_metric_stops_at_the_first_check_and_the_fixed_file_runs_every_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = sweep_file(tmp_path, metric="val/accuracy", direction="maximize", n_trials=2)
    root = ["--root", str(tmp_path / "runs" / "sweeps")]
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "-c", str(path), *root])
    assert stop.value.code == 2
    error = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error:"))
    assert "'val/accuracy' is not logged in validation" in error and "did you mean val/acc?" in error
    (failed,) = study(tmp_path).get_trials()
    assert failed.state.name == "FAIL"
    assert not list((tmp_path / "runs" / "sweeps" / "tiny").glob("trial-0000/*/checkpoints/*.ckpt"))  # untrained
    path.write_text(path.read_text().replace("val/accuracy", "val/acc"))
    main(["sweep", "-c", str(path), *root])
    assert states(study(tmp_path)) == ["FAIL", "COMPLETE", "COMPLETE"]  # the failed one did not use a trial up


def test_an_empty_study_file_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    database = tmp_path / "runs" / "sweeps" / "tiny" / "study.db"
    database.parent.mkdir(parents=True)
    database.touch()  # 0 bytes: SQLite would start a new study beside the old trial folders
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "-c", str(sweep_file(tmp_path)), "--root", str(tmp_path / "runs" / "sweeps")])
    assert stop.value.code == 2 and f"{database} is empty (0 bytes)" in capsys.readouterr().err
    assert database.stat().st_size == 0


@pytest.mark.slow
def test_drivers_started_together_on_a_new_study_share_it(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, n_trials=3)  # a new SQLite study that three drivers create at the same moment
    command = [sys.executable, "-m", "kiln", "sweep", "-c", str(path), "--root", str(tmp_path / "runs" / "sweeps")]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    drivers = forkserver.run_together([command] * 3, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    errors = [driver.stderr for driver in drivers]
    assert [driver.returncode for driver in drivers] == [0, 0, 0], [e[-800:] for e in errors]  # was IntegrityError
    trials = [t for t in study(tmp_path).get_trials() if not t.user_attrs.get("surplus")]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3 and len({t.params[LR] for t in trials}) == 3


@pytest.mark.slow  # two sweeps and a refusal: 4.6 s
def test_a_changed_search_space_is_refused_in_one_line_and_leaves_no_trial_running(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A range turned to `log: true`: every rerun was an internal error (Optuna's 'Cannot set different log
    configuration') and left a trial RUNNING."""
    linear = {LR: {"low": 1.0e-3, "high": 1.0e-2}}
    path = sweep_file(tmp_path, space=linear, n_trials=1)
    command = ["sweep", "-c", str(path), "--root", str(tmp_path / "runs" / "sweeps"), "--n_trials", "2"]
    main(["sweep", "-c", str(path), "--root", str(tmp_path / "runs" / "sweeps")])
    path = sweep_file(tmp_path, space={LR: {"low": 1.0e-3, "high": 1.0e-2, "log": True}})
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(command)
    assert stop.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "the search space of study 'tiny' changed since its trials ran" in error and "log=True" in error
    assert error.endswith("restore the file, or give the sweep another name (a new study)")
    assert states(study(tmp_path)) == ["COMPLETE"]  # nothing drawn, nothing left RUNNING
    sweep_file(tmp_path, space=linear)
    main(command)  # restored: the study goes on
    assert states(study(tmp_path)) == ["COMPLETE", "COMPLETE"]


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("missing/study.journal", "the folder missing does not exist: create it (mkdir -p)"),
        ("sqlite:///missing/study.db", "the folder missing does not exist: create it (mkdir -p)"),
        (
            "postgresql+psycopg2://me:hunter2@127.0.0.1:1/db",  # psycopg (3) is in the dev group: the real-server tests
            "its database driver (psycopg2) is not installed: make add PKG='psycopg2-binary'",
        ),
        ("mysql://me:hunter2@127.0.0.1:1/db", "make add PKG='PyMySQL', and write the URL as mysql+pymysql://"),
    ],
    ids=["journal_in_a_missing_folder", "sqlite_in_a_missing_folder", "postgresql_without_driver", "mysql"],
)
def test_a_storage_that_cannot_work_is_one_line_naming_the_fix_and_never_the_password(
    storage: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Internal errors before (an ImportError 'please report it', a FileNotFoundError); a wrong diagnosis for SQLite
    ('not a readable study database … restore it'); the password was printed with the URL."""
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "-c", str(sweep_file(tmp_path)), "--storage", storage])
    assert stop.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert expected in line and "hunter2" not in line and "internal error" not in line


def test_a_postgresql_server_refusing_the_connection_is_one_line_naming_what_to_check(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A real server's refusal (wrong password, missing database) was 'not a readable study database … restore it,
    or move the sweep folder aside': advice for a broken file, not a connection."""
    for storage, why in [(postgres_url.replace("kiln:kiln@", "kiln:hunter2@"), "password authentication failed"),
                         (postgres_url.removesuffix("/kiln") + "/nodb", 'database "nodb" does not exist')]:  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            main(["sweep", "-c", str(sweep_file(tmp_path)), "--storage", storage])
        assert stop.value.code == 2
        (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert ": cannot connect (" in line and why in line and "check the URL's host, port, user, password" in line
        assert "hunter2" not in line and "restore" not in line


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a 64 KiB file system needs root")
def test_a_study_on_a_full_disk_says_the_disk_is_full(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It said 'not a readable study database … restore it' of a database that was fine, on a disk that was full."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this machine does not let even root mount a tmpfs (a container without CAP_SYS_ADMIN)")
    try:
        with pytest.raises(SystemExit) as stop:
            main(["sweep", "-c", str(sweep_file(tmp_path)), "--storage", f"sqlite:///{disk / 'study.db'}"])
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)  # the study may still hold its file open
    assert stop.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "no space left on its disk" in line and "restore" not in line


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_a_disk_that_fills_between_trials_stops_the_sweep_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Optuna's StorageInternalError (database or disk is full) was an internal error."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this machine does not let even root mount a tmpfs (a container without CAP_SYS_ADMIN)")
    spec = sweep_file(tmp_path, n_trials=1, args=["-c", str(CONFIGS / "debug" / "fast_dev_run.yaml"), *QUIET])
    command = ["sweep", "-c", str(spec), "--storage", f"sqlite:///{disk / 'study.db'}"]
    try:
        main(command)  # the study exists, with one trial
        with (disk / "filler").open("wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:  # then the disk fills up
                filler.write(b"\0" * 4096)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main([*command, "--n_trials", "3"])
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)  # the study may still hold its file open
    assert stop.value.code != 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "no space left" in line and "internal error" not in line


@pytest.mark.slow
def test_a_driver_with_nothing_to_start_waits_while_another_hosts_trial_beats_and_resumes_it_once_it_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A worker killed on another host left its trial RUNNING: the other drivers exited, and only one started
    more than 600 s later (a hard-coded limit) took it over."""
    import optuna

    spec = sweep_file(tmp_path, n_trials=1)
    command = ["sweep", "-c", str(spec), "--root", str(tmp_path / "runs" / "sweeps"), "--stale_after", "2"]
    main([*command, "--report"])  # creates the study, runs nothing
    trial = study(tmp_path).ask()  # a driver on another host drew it, beats for 2 s, then dies
    trial.set_user_attr("owner", "elsewhere-host:4242")
    trial.set_user_attr("stale_after", 2.0)
    owners: list[str] = []  # the trial's owner after each beat: never another while its driver beats

    def beat() -> None:
        for _ in range(6):
            with contextlib.suppress(Exception):  # SQLite busy: the next beat
                trial.set_user_attr("heartbeat", time.time())
                owners.append(study(tmp_path).trials[0].user_attrs["owner"])
            time.sleep(0.3)

    beating = threading.Thread(target=beat)
    beating.start()
    main(command)
    beating.join()
    err = capsys.readouterr().err
    assert "tiny: waiting for trial-0000, which other drivers run" in err and "trial-0000: resuming (its driver" in err
    (resumed,) = study(tmp_path).get_trials()
    assert resumed.state == optuna.trial.TrialState.COMPLETE and resumed.user_attrs["owner"] != "elsewhere-host:4242"
    assert len(list((tmp_path / "runs" / "sweeps" / "tiny" / "trial-0000").iterdir())) == 1  # in its own folder
    assert owners and set(owners) == {"elsewhere-host:4242"}  # not taken over while its driver beat


def test_a_sweep_of_fast_dev_run_trials_says_why_it_writes_no_best_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A fast_dev_run trial saves no config.yaml: the sweep wrote no best.yaml and said nothing."""
    spec = sweep_file(tmp_path, n_trials=1, args=["-c", str(CONFIGS / "debug" / "fast_dev_run.yaml"), *QUIET])
    main(["sweep", "-c", str(spec), "--root", str(tmp_path / "runs" / "sweeps")])
    err = capsys.readouterr().err
    assert "no best.yaml: the best trial, 0, left no config.yaml in a run folder (a fast_dev_run trial" in err
    assert not (tmp_path / "runs" / "sweeps" / "tiny" / "best.yaml").exists()
