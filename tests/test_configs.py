"""Every YAML in configs/ parses, and every preset that can run on this machine runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS

from kiln.cli import main

ALL_CONFIGS = sorted(CONFIGS.rglob("*.yaml"))
NEEDS_GPU = {"trainer/gpu.yaml", "trainer/ddp.yaml", "trainer/fsdp.yaml"}
# relaunches the command line, or needs a cluster's environment: tested in test_ddp_cpu_preset_runs_two_processes
# and test_trainer_features.test_slurm_preset_takes_the_cluster_from_the_environment
ELSEWHERE = {"trainer/ddp_cpu.yaml", "trainer/slurm.yaml"}
FAST = ["-c", str(CONFIGS / "debug" / "fast_dev_run.yaml")]


def name(path: Path) -> str:
    return path.relative_to(CONFIGS).as_posix()


def test_config_folder_has_the_documented_presets() -> None:
    names = {name(p) for p in ALL_CONFIGS}
    for preset in ["train.yaml", "trainer/cpu.yaml", "trainer/gpu.yaml", "trainer/ddp.yaml", "logger/wandb.yaml",
                   "logger/csv.yaml", "logger/tensorboard.yaml", "debug/fast_dev_run.yaml", "debug/overfit.yaml",
                   "debug/limit.yaml", "debug/profiler.yaml", "experiment/digits.yaml", "experiment/mnist.yaml",
                   "experiment/fashion_mnist.yaml", "experiment/cifar10.yaml", "callbacks/early_stopping.yaml",
                   "trainer/deterministic.yaml", "trainer/ddp_cpu.yaml", "trainer/fsdp.yaml", "trainer/slurm.yaml",
                   "debug/anomaly.yaml", "callbacks/skip_nonfinite.yaml", "data/on_device.yaml"]:  # fmt: skip
        assert preset in names


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=name)
def test_every_config_is_accepted(config: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "model:" in printed and "trainer:" in printed


def runnable(config: Path) -> bool:
    return name(config) not in ELSEWHERE and not name(config).startswith("experiment/")


@pytest.mark.parametrize(
    "config",
    [pytest.param(c, marks=pytest.mark.gpu) if name(c) in NEEDS_GPU else c for c in ALL_CONFIGS if runnable(c)],
    ids=name,
)
def test_preset_runs_with_fast_dev_run(config: Path) -> None:  # GPU presets: also in `make test-gpu`
    if name(config) in NEEDS_GPU and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    main(["fit", "-c", str(config), *FAST])


@pytest.mark.parametrize("on_device", [False, True], ids=["loader", "on_device"])
@pytest.mark.parametrize("experiment", ["digits", "mnist", "fashion_mnist", "cifar10"])
def test_experiment_runs_with_fast_dev_run(
    experiment: str, on_device: bool, mnist_root: Path, cifar_root: Path
) -> None:
    assert mnist_root == cifar_root  # one data folder holds every dataset's files
    args = ["fit", "-c", str(CONFIGS / "experiment" / f"{experiment}.yaml"), *FAST]
    args += ["-c", str(CONFIGS / "data" / "on_device.yaml")] if on_device else []
    if experiment != "digits":
        args += ["--data.init_args.data_dir", str(mnist_root), "--data.init_args.download", "false"]
    main(args)


def test_profiler_preset_writes_its_report_into_the_run_folder() -> None:
    main(["fit", "-c", str(CONFIGS / "debug" / "profiler.yaml"), "--run.test_after_fit", "false"])
    (run_dir,) = Path("runs/digits").iterdir()
    report = run_dir / "fit-profile.txt"
    assert report.is_file() and "run_training_batch" in report.read_text()


def test_early_stopping_preset_appends_and_stops() -> None:
    args = ["fit", "-c", str(CONFIGS / "callbacks" / "early_stopping.yaml"), "--trainer.max_epochs", "50"]
    args += ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=train/loss",
             "--trainer.callbacks.patience=0", "--trainer.callbacks.stopping_threshold=100"]  # fmt: skip
    from kiln.cli import build_cli

    cli = build_cli([*args, "--run.test_after_fit", "false", "--trainer.limit_train_batches", "2"])
    kinds = [type(c).__name__ for c in cli.trainer.callbacks]  # type: ignore[attr-defined]
    assert "ModelCheckpoint" in kinds and kinds.count("EarlyStopping") == 2  # appended, defaults kept
    assert cli.trainer.current_epoch == 1  # the threshold stopper ends the run after its first check


@pytest.mark.slow
def test_ddp_cpu_preset_runs_two_processes(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), *FAST,
           "--run.root", str(tmp_path / "runs")]  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in done.stderr + done.stdout


@pytest.mark.slow
def test_pytorch_profiler_preset_writes_a_trace_into_the_run_folder() -> None:
    main(["fit", "-c", str(CONFIGS / "debug" / "profiler_pytorch.yaml"), "--trainer.logger", "false"])
    (run_dir,) = Path("runs/digits").iterdir()
    traces = list(run_dir.glob("*.pt.trace.json"))
    assert traces and traces[0].stat().st_size > 1000
