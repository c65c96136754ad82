"""Every YAML in configs/ parses, and every preset that can run on this machine runs."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import forkserver
import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT, PROBES
from lightning.pytorch.callbacks import ModelSummary as Summary
from lightning.pytorch.callbacks import ProgressBar

from kiln.cli import build_cli
from kiln.commands.boundary import main

ALL_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "sweep")  # sweeps: test_sweep
NEEDS_GPU = {"trainer/gpu.yaml", "trainer/ddp.yaml", "trainer/fsdp.yaml"}
# relaunches the command line, or needs a cluster's environment: tested in test_ddp_cpu_preset_runs_two_processes
# and test_trainer_features.test_slurm_preset_takes_the_cluster_from_the_environment
# or reads the user's own files: tested in test_folder.test_the_folder_preset_runs and test_streaming
ELSEWHERE = {"trainer/ddp_cpu.yaml", "trainer/slurm.yaml", "data/folder.yaml", "data/streaming.yaml"}
FAST = ["-c", str(CONFIGS / "debug" / "fast_dev_run.yaml")]


def name(path: Path) -> str:
    return path.relative_to(CONFIGS).as_posix()


def readme_presets() -> set[str]:
    """The presets the README's table names, as ``folder/name.yaml``."""
    readme = (CONFIGS.parent / "README.md").read_text()
    table = readme[readme.index("### Presets in `configs/`") :].split("\n\n")[1]
    found = {"train.yaml"}
    for row in table.splitlines()[3:]:
        folder, presets = re.findall(r"\| `([^`]+)/` \| ([^|]+) \|", row)[0]
        found |= {f"{folder}/{preset}.yaml" for preset in re.findall(r"`([^`]+)`", presets)}
    return found


def test_the_readme_table_names_every_preset_and_nothing_else() -> None:
    """Every preset the table names exists, and it names every engine preset; experiment/ is the user's folder too
    (the README's own dataset example adds one there, which turned this test red in a clone)."""
    sweeps = {name(p) for p in (CONFIGS / "sweep").glob("*.yaml")}
    files, named = {name(p) for p in ALL_CONFIGS} | sweeps, readme_presets()
    assert named <= files
    assert {f for f in files if not f.startswith("experiment/")} == {
        n for n in named if not n.startswith("experiment/")
    }


def runnable(config: Path) -> bool:
    return name(config) not in ELSEWHERE and not name(config).startswith("experiment/")


def trained_in_test_fast(config: Path) -> bool:
    """A preset or experiment that a fast test trains for a step (so it parses, too)."""
    if name(config).startswith("experiment/"):
        return config.stem != "fashion_mnist"
    return runnable(config) and name(config) not in NEEDS_GPU and name(config) != "debug/profiler_pytorch.yaml"


@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=pytest.mark.slow) if trained_in_test_fast(c) else c for c in ALL_CONFIGS], ids=name
)  # test-fast parses here only the files it does not train
def test_every_config_is_accepted(config: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", str(config), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "model:" in printed and "trainer:" in printed


def trained_one_step(args: list[str]) -> None:
    """Run the command; it must finish having taken fast_dev_run's one optimizer step and tested."""
    cli = build_cli(args)
    assert cli.trainer.state.finished and cli.trainer.global_step == 1
    assert cli.test_metrics is None or "test/loss" in cli.test_metrics


# presets another fast test trains with: here in the full suite only, so test-fast trains each once
TRAINED_IN_OTHER_FAST_TESTS = {
    "train.yaml": "every test (the defaults)",
    "debug/limit.yaml": "helpers.LIMIT",
    "debug/fast_dev_run.yaml": "FAST, in this file",
    "debug/profiler.yaml": "test_profiler_preset_writes_its_report_into_the_run_folder",
    "callbacks/early_stopping.yaml": "test_early_stopping_preset_appends_and_stops",
    "callbacks/skip_nonfinite.yaml": "test_faults.py::test_a_skipped_step_leaves_batchnorm_statistics_as_before_it",
    "logger/csv.yaml": "test_pretrained.py::test_a_frozen_backbone_gets_no_gradient_until_its_epoch_then_trains_...",
    "data/on_device.yaml": "test_cli.py::test_predict_writes_probabilities_to_run_folder[on_device]",
}


def marked(config: Path) -> Any:
    """GPU presets need CUDA; the PyTorch profiler's trace takes seconds (the full suite runs it)."""
    if name(config) in NEEDS_GPU:
        return pytest.param(config, marks=pytest.mark.gpu)
    if name(config) == "debug/profiler_pytorch.yaml" or name(config) in TRAINED_IN_OTHER_FAST_TESTS:
        return pytest.param(config, marks=pytest.mark.slow)
    return config


@pytest.mark.parametrize("config", [marked(c) for c in ALL_CONFIGS if runnable(c)], ids=name)
def test_preset_runs_with_fast_dev_run(config: Path) -> None:  # GPU presets: also in `make test-gpu`
    if name(config) in NEEDS_GPU and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    trained_one_step(["fit", "-c", str(config), *FAST])


EXPERIMENTS = sorted((CONFIGS / "experiment").glob("*.yaml"))  # a new file is smoke-run without a test edit


@pytest.mark.parametrize(
    "on_device", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["loader", "on_device"]
)  # on the device: every experiment in the full suite; digits and signals in test-fast too
@pytest.mark.parametrize(
    "experiment",
    [pytest.param(e, marks=pytest.mark.slow) if e.stem == "fashion_mnist" else e for e in EXPERIMENTS],
    ids=lambda p: p.stem,
)  # FashionMNIST is MNIST's format and code: the full suite runs it
def test_experiment_runs_with_fast_dev_run(
    experiment: Path, on_device: bool, mnist_root: Path, cifar_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the project's folder, as `make train` runs it: a user's own experiment reads its data by a path relative
    to it (the README's `data/my_signals.pt`); its runs go to this test's folder."""
    assert mnist_root == cifar_root  # one data folder holds every dataset's files
    runs = Path.cwd() / "runs"
    monkeypatch.chdir(CONFIGS.parent)
    args = ["fit", "-c", str(experiment), *FAST, "--run.root", str(runs)]
    args += ["-c", str(CONFIGS / "data" / "on_device.yaml")] if on_device else []
    if "data_dir:" in experiment.read_text():  # a file-backed dataset: the small real-format files
        args += ["--data.init_args.data_dir", str(mnist_root), "--data.init_args.download", "false"]
    trained_one_step(args)


def test_profiler_preset_writes_its_report_into_the_run_folder() -> None:
    main(["fit", "-c", str(CONFIGS / "debug" / "profiler.yaml"), "--run.test_after_fit", "false"])
    (run_dir,) = Path("runs/digits").iterdir()
    report = run_dir / "fit-profile.txt"
    assert report.is_file() and "run_training_batch" in report.read_text()


def test_early_stopping_preset_appends_and_stops() -> None:
    args = ["fit", "-c", str(CONFIGS / "callbacks" / "early_stopping.yaml"), "--trainer.max_epochs", "50"]
    args += ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=train/loss",
             "--trainer.callbacks.patience=0", "--trainer.callbacks.stopping_threshold=100"]  # fmt: skip
    cli = build_cli([*args, "--run.test_after_fit", "false", "--trainer.limit_train_batches", "2"])
    kinds = [type(c).__name__ for c in cli.trainer.callbacks]  # type: ignore[attr-defined]
    assert "ModelCheckpoint" in kinds and kinds.count("EarlyStopping") == 2  # appended, defaults kept
    assert cli.trainer.current_epoch == 1  # the threshold stopper ends the run after its first check


@pytest.mark.slow
@pytest.mark.long
def test_ddp_cpu_preset_runs_two_processes_and_ddp_spawn_trains_and_records_the_same(tmp_path: Path) -> None:
    """ddp_spawn's test after fit (in processes of its own) logged at step 0: metrics.csv kept the test row alone
    and metrics.json said 0 epochs and 0 steps, for a run that trained as the ddp run did (tested: ddp_spawn only,
    a test spawns two more processes, ~10 CPU-s)."""
    validated, records = {}, {}
    for strategy in ("ddp", "ddp_spawn"):  # ddp_spawn pickles the CLI: a closure in it was an internal error
        cmd = [sys.executable, "-m", "kiln", "fit", "-c", str(CONFIGS / "trainer" / "ddp_cpu.yaml"), *LIMIT,
               "--trainer.strategy", strategy, "--run.root", str(tmp_path / strategy),
               "--trainer.callbacks+=probes.GroupAtExit", f"--trainer.callbacks.marker={tmp_path / strategy}-group",
               "-c", str(CONFIGS / "logger" / "csv.yaml"), "--trainer.max_epochs", "1",
               f"--run.test_after_fit={strategy == 'ddp_spawn'}"]  # fmt: skip
        env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": PROBES}
        done = forkserver.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        (run_dir,) = (tmp_path / strategy / "digits").iterdir()  # one run folder, not one per rank
        rank_1 = "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2"
        assert rank_1 in (run_dir / "console.log").read_text() and rank_1 not in done.stderr  # before: a spawned
        # rank's lines reached the console only
        metrics = json.loads((run_dir / "metrics.json").read_text())
        validated[strategy] = metrics["val"]["last"]
        with (run_dir / "metrics.csv").open() as f:
            rows = [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]
        records[strategy] = (metrics["epochs"], metrics["global_step"], rows)
        at_exit = {p.name: p.read_text() for p in tmp_path.glob(f"{strategy}-group.*")}  # one per rank process
        assert {name.split(".")[1] for name in at_exit} == {"0", "1"} and set(at_exit.values()) == {"False"}, at_exit
        # before, each rank's gloo group was left to the interpreter's exit, where it can abort the process
    assert validated["ddp_spawn"] == validated["ddp"] and "val/loss" in validated["ddp"]
    (epochs, steps, rows), (spawn_epochs, spawn_steps, spawn_rows) = records["ddp"], records["ddp_spawn"]
    assert (spawn_epochs, spawn_steps) == (epochs, steps) == (1, 5)
    assert spawn_rows[: len(rows)] == rows and len(rows) > 2  # every training and validation row, then the test's
    assert [row["step"] for row in spawn_rows[len(rows) :] if "test/acc" in row] == ["5"]


@pytest.mark.slow
def test_pytorch_profiler_preset_writes_a_trace_into_the_run_folder() -> None:
    main(["fit", "-c", str(CONFIGS / "debug" / "profiler_pytorch.yaml"), "--trainer.logger", "false"])
    (run_dir,) = Path("runs/digits").iterdir()
    traces = list(run_dir.glob("*.pt.trace.json"))
    assert traces and traces[0].stat().st_size > 1000


def test_a_switched_data_class_gets_its_own_defaults_not_the_old_classs(capsys: pytest.CaptureFixture) -> None:
    """The default data's test_fraction (0.2) is not the language model's data's (0.1): jsonargparse kept the old;
    ``--print_config`` (a multirun's "same config" too) says what the run uses."""
    switched = ["-c", str(CONFIGS / "experiment" / "sentences.yaml"), "--trainer.logger", "false"]
    data = build_cli(switched, run=False).datamodule
    assert data.fractions == (0.8, 0.1) and data.hparams["test_fraction"] == 0.1  # what checkpoints hold too
    written = build_cli([*switched, "--data.init_args.test_fraction", "0.3"], run=False).datamodule
    assert written.hparams["test_fraction"] == 0.3 and written.batch_size == 64  # written values stand
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *switched, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert exit_info.value.code in (0, None) and printed["data"]["init_args"]["test_fraction"] == 0.1  # before: 0.2


def test_a_run_of_switched_data_is_named_after_its_data_class_unless_run_name_is_written(
    capsys: pytest.CaptureFixture,
) -> None:
    """A user's data in a ``-c`` file without ``run.name`` filed its runs under ``runs/digits``, the default's name
    (and ``kiln.results`` listed them as that experiment)."""

    def run_name(*args: str) -> str:
        with pytest.raises(SystemExit):
            main(["fit", *args, "--print_config"])
        return str(yaml.safe_load(capsys.readouterr().out)["run"]["name"])

    assert run_name() == "digits"
    assert run_name("--data", "research.data.WaveformsDataModule") == "waveforms"  # before: digits
    assert run_name("--data", "research.data.WaveformsDataModule", "--run.name", "mine") == "mine"
    assert run_name("-c", str(CONFIGS / "data" / "streaming.yaml")) == "streamed"  # the preset's own name


def test_a_value_typed_numbers_number_is_written_as_the_number_and_read_back(capsys: pytest.CaptureFixture) -> None:
    """torchvision types ``RandomAffine``'s ``degrees`` as ``numbers.Number``: the run trained, but its config.yaml
    said ``degrees: Unable to serialize instance 10``, which ``-c`` and ``--ckpt_path`` refused to read back."""
    Path("affine.yaml").write_text(
        "data:\n  init_args:\n    train_transforms:\n      - class_path: torchvision.transforms.v2.RandomAffine\n"
        "        init_args: {degrees: 10}\n"
    )

    def degrees(*args: str) -> Any:
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", *args, "--print_config"])
        assert exit_info.value.code in (0, None)
        printed = capsys.readouterr().out
        Path("printed.yaml").write_text(printed)
        return yaml.safe_load(printed)["data"]["init_args"]["train_transforms"][0]["init_args"]["degrees"]

    assert degrees("-c", "affine.yaml") == 10
    assert degrees("-c", "printed.yaml") == 10  # the written config reads back
    assert degrees("-c", "affine.yaml", "--data.init_args.train_transforms.init_args.degrees", "7.5") == 7.5


@pytest.mark.parametrize("given", ["1", "1.0"])
def test_limit_train_batches_1_is_one_batch_whichever_order_typing_cached_the_union_in(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another import made ``Union[float, int]`` first (as on a GPU machine): ``1`` was read as ``1.0``, and Lightning
    reads an int as a number of batches, a float as a fraction of them (before: 40 steps trained for ``1``, not 2)."""
    import lightning

    monkeypatch.setitem(lightning.Trainer.__init__.__annotations__, "limit_train_batches", float | int | None)
    cli = build_cli(["--trainer.limit_train_batches", given, "--trainer.logger", "false"], run=False)
    assert repr(cli.config.trainer.limit_train_batches) == given
    assert repr(cli.trainer.limit_train_batches) == given  # what Lightning counts batches by


def test_a_command_reads_the_default_config_once_and_the_next_command_reads_it_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """jsonargparse asked the subcommand's parser for its defaults twice a command, each time reading train.yaml
    and building every class it names; kiln.cli.parser keeps them for the parse, and only for it."""
    import jsonargparse

    read: list[str] = []
    original = jsonargparse.ArgumentParser.get_defaults

    def counted(parser: Any, *args: Any, **kwargs: Any) -> Any:
        if parser.default_config_files:
            read.append(parser.default_config_files[0])
        return original(parser, *args, **kwargs)

    monkeypatch.setattr(jsonargparse.ArgumentParser, "get_defaults", counted)
    for epochs in (3, 4):  # the next command reads the file again: it may have changed in between
        with pytest.raises(SystemExit):
            main(["fit", "--trainer.max_epochs", str(epochs), "--print_config"])
        assert yaml.safe_load(capsys.readouterr().out)["trainer"]["max_epochs"] == epochs
    assert read == [str(CONFIGS / "train.yaml")] * 2  # before: four times


def test_a_progress_bar_model_summary_or_prediction_writer_added_replaces_the_default_one() -> None:
    """A run takes one of each: an added TQDMProgressBar was an internal error ("multiple progress bar
    callbacks"), an added RichModelSummary (for its max_depth) printed a second summary, and an added
    PredictionWriter (for its class maps) found predictions.csv taken (an internal error)."""
    from kiln.callbacks import PredictionWriter

    added = ["--trainer.callbacks+=TQDMProgressBar", "--trainer.callbacks+=RichModelSummary",
             "--trainer.callbacks.max_depth=2", "--trainer.callbacks+=kiln.callbacks.PredictionWriter",
             "--trainer.callbacks.class_maps=true", "--trainer.logger", "false"]  # fmt: skip
    callbacks = build_cli(added, run=False).trainer.callbacks  # type: ignore[attr-defined]
    bars, summaries = ([type(c).__name__ for c in callbacks if isinstance(c, base)] for base in (ProgressBar, Summary))
    assert bars == ["TQDMProgressBar"] and summaries == ["RichModelSummary"]
    (writer,) = [c for c in callbacks if isinstance(c, PredictionWriter)]
    assert writer.class_maps
