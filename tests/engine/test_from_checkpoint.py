"""A checkpoint is enough: validate, test and predict rebuild the model and the data it was trained with."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CONFIGS, LIMIT

from kiln.cli import build_cli
from kiln.cli.from_checkpoint import saved_config
from kiln.commands.boundary import main
from kiln.errors import UsageError

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
WIDTH = "--model.init_args.net.init_args.width"


def probabilities(path: Path) -> list[list[str]]:
    with path.open() as f:
        return [[v for k, v in row.items() if re.fullmatch(r"p\d+|p_.*", k)] for row in csv.DictReader(f)]


@pytest.mark.slow
def test_predict_with_only_the_checkpoint_gives_the_in_process_probabilities(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = ["--run.root", str(tmp_path)]
    fit = build_cli(["fit", *LIMIT, *QUIET, *root, f"{WIDTH}=16", "--run.name=narrow", "--run.test_after_fit=false"])
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    expected = torch.cat(fit.trainer.predict(fit.model, datamodule=fit.datamodule, ckpt_path=best))  # type: ignore[arg-type]
    predict = build_cli(["predict", "--ckpt_path", best, *LIMIT, *QUIET, *root])  # no -c, no width, no name
    assert predict.model.net.features[0].out_channels == 16
    (written,) = Path(predict.trainer.default_root_dir).glob("predictions.csv")
    assert written.parent.parent.name == "narrow"  # beside the run's own folder
    assert probabilities(written) == [[f"{p:.6f}" for p in row] for row in expected.tolist()]
    capsys.readouterr()
    build_cli(["validate", "--ckpt_path", "best", "--run.name=narrow", *LIMIT, *QUIET, *root])
    assert f"--ckpt_path best: {best}" in capsys.readouterr().err  # which file `best` chose


@pytest.mark.slow
def test_an_override_the_weights_cannot_take_stops_in_one_line_naming_both_values(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = ["--run.root", str(tmp_path)]
    fit = build_cli(["fit", *LIMIT, *QUIET, *root, f"{WIDTH}=16", "--run.test_after_fit=false"])
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["predict", "--ckpt_path", best, f"{WIDTH}=32", *QUIET, *root])
    assert stop.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "model.init_args.net.init_args.width" in line and "trained with 16, this command gives 32" in line
    for command, limit in (("validate", "val"), ("test", "test"), ("predict", "predict")):  # was: exit 0, no batch
        with pytest.raises(SystemExit) as stop:
            main([command, "--ckpt_path", best, f"--trainer.limit_{limit}_batches", "0", *QUIET, *root])
        assert stop.value.code == 2
        assert f"error: trainer.limit_{limit}_batches 0: kiln {command} would run no batch" in capsys.readouterr().err
    assert len(list((tmp_path / "digits").iterdir())) == 1  # the fit's run folder only: none left by the refusals


@pytest.mark.slow
def test_a_checkpoint_is_tested_on_its_own_data_never_the_default_of_the_same_shape(tmp_path: Path) -> None:
    synthetic = [
        "--data",
        "kiln.data.SyntheticDataModule",
        "--data.channels=1",
        "--data.size=8",
        "--data.num_samples=320",
    ]  # fmt: skip  (the shapes of the default digits: 1x8x8, 10 classes)
    root = ["--run.root", str(tmp_path)]
    fit = build_cli(["fit", *LIMIT, *QUIET, *root, *synthetic])
    after_fit = fit.test_metrics or {}
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    again = build_cli(["test", "--ckpt_path", best, *QUIET, *root])
    assert type(again.datamodule).__name__ == "SyntheticDataModule" and again.datamodule.num_samples == 320
    assert again.trainer.callback_metrics["test/acc"].item() == after_fit["test/acc"]  # what the run computed


def test_the_saved_config_holds_the_model_and_the_data_but_not_what_the_data_links() -> None:
    cli = build_cli(["--data", "kiln.data.SyntheticDataModule", "--data.size=8", f"{WIDTH}=16", *QUIET], run=False)
    checkpoint = {
        "hyper_parameters": dict(cli.model.hparams),
        "datamodule_hyper_parameters": dict(cli.datamodule.hparams),
    }
    saved = yaml.safe_load(saved_config(checkpoint, "nowhere/checkpoints/x.ckpt") or "")
    assert saved["data"]["class_path"] == "kiln.data.SyntheticDataModule" and saved["data"]["init_args"]["size"] == 8
    net = saved["model"]["init_args"]["net"]
    assert net["init_args"]["width"] == 16 and "num_classes" not in saved["model"]["init_args"]
    assert not {"num_classes", "in_channels"} & set(net["init_args"])  # set again from the data
    assert "run" not in saved  # no run folder config.yaml to take the experiment name from


@pytest.mark.slow
def test_init_from_starts_a_new_run_from_the_weights_with_a_new_head_for_other_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = ["--run.root", str(tmp_path)]
    fit = build_cli(["fit", *LIMIT, *QUIET, *root, "--run.test_after_fit=false"])
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    saved = torch.load(best, weights_only=True, map_location="cpu")["state_dict"]
    five = ["--data", "kiln.data.SyntheticDataModule", "--data.channels=1", "--data.size=8", "--data.num_classes=5",
            "--data.num_samples=320"]  # fmt: skip
    capsys.readouterr()
    tuned = build_cli([*LIMIT, *QUIET, *root, *five, "--init_from", best, "--run.name=five"], run=False)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--init_from")]
    assert "18 of 20 weights loaded; new, as their shape differs: net.head.1.weight, net.head.1.bias" in line
    weights = tuned.model.state_dict()
    assert all(torch.equal(weights[k], v) for k, v in saved.items() if not k.startswith("net.head"))  # step 0
    assert weights["net.head.1.weight"].shape == (5, 64)  # a new head for 5 classes
    assert tuned.trainer.current_epoch == 0 and tuned.run_dir is not None and tuned.run_dir.parent.name == "five"
    command = [
        "fit",
        *LIMIT,
        *QUIET,
        *root,
        *five,
        "--init_from",
        best,
        "--run.name=five",
        "--run.test_after_fit=false",
    ]
    first = build_cli(command)
    capsys.readouterr()
    resumed = build_cli([*command, "--ckpt_path", "last", "--trainer.max_epochs=3"])  # after a stop: go on
    assert "not applied, the run resumes its own checkpoint" in capsys.readouterr().err
    assert resumed.trainer.current_epoch == 3 and resumed.run_dir == first.run_dir  # in its own folder


def test_init_from_a_checkpoint_of_another_network_stops_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"encoder.weight": torch.zeros(3, 3)}}, other)
    with pytest.raises(UsageError, match=r"--init_from .*other.ckpt: none of its 1 weights fit this model"):
        build_cli([*QUIET, "--init_from", str(other)], run=False)


def test_init_from_another_network_class_is_refused_even_where_some_weights_match(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = ["--run.root", str(tmp_path)]
    digits = build_cli(["fit", *LIMIT, *QUIET, *root, "--run.test_after_fit=false"])  # SmallCNN
    best = digits.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    signals = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml"), *LIMIT, *QUIET, *root]  # SignalCNN
    with pytest.raises(UsageError) as refused:  # batch-norm tensors share names and sizes by chance
        build_cli([*signals, "--init_from", best], run=False)
    message = str(refused.value)
    assert "it holds a research.nets.SmallCNN, this run trains a research.nets.SignalCNN" in message
    assert "--init_partial true" in message and "fit only by chance (" in message
    capsys.readouterr()
    build_cli([*signals, "--init_from", best, "--init_partial", "true"], run=False)  # asked for: loaded
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("--init_from")]
    assert "weights loaded from a research.nets.SmallCNN (--init_partial)" in line


@pytest.mark.slow
def test_every_command_that_takes_a_checkpoint_finds_the_same_one_by_each_reference(tmp_path: Path) -> None:
    """One resolver (kiln.runs.reference) for best, last and a file, under a run.root of the user's: `kiln export`
    resolved on its own (`runs` hard-coded, best and last refused), beside the engine's three branches."""
    where = ["--run.root", str(tmp_path / "elsewhere"), "--run.name", "narrow"]
    fit = build_cli(["fit", *LIMIT, *QUIET, *where, f"{WIDTH}=16", "--run.test_after_fit=false"])
    run = Path(fit.trainer.default_root_dir)
    best = Path(fit.trainer.checkpoint_callback.best_model_path)  # type: ignore[union-attr]
    last = run / "checkpoints" / "last.ckpt"
    for given, expected in {"best": best, "last": last, str(best): best}.items():  # a file: its own
        validate = build_cli(["validate", "--ckpt_path", given, *LIMIT, *QUIET, *where])
        assert Path(validate.config.validate.ckpt_path).resolve() == expected.resolve(), given
        assert validate.model.net.features[0].out_channels == 16  # the run's own config, not the default's
    onnx = ["--format", "onnx", "--samples", "8", "--batch_sizes", "1"]
    main(["export", "--ckpt_path", "last", *LIMIT, *where, *onnx, "--output", str(tmp_path / "served")])
    assert Path(json.loads((tmp_path / "served" / "parity.json").read_text())["checkpoint"]) == last.resolve()
    main(["export", "--ckpt_path", "best", *LIMIT, *where, *onnx])  # beside the run, whatever its root
    assert Path(json.loads((run / "export" / "parity.json").read_text())["checkpoint"]) == best.resolve()


@pytest.mark.slow
def test_the_callbacks_a_run_left_out_its_checkpoints_evaluations_leave_out_too(tmp_path: Path) -> None:
    """validate, test and predict from a checkpoint ran the default callbacks the run had left out (`run.without`):
    a run that had to leave BatchSanityCheck out (dense labels) was refused again by `kiln validate` from it."""
    quiet = ["--trainer.logger", "false", "--run.root", str(tmp_path)]
    fit = build_cli(["fit", *LIMIT, *quiet, "--run.test_after_fit", "false", "--run.without", "[BatchSanityCheck]"])
    assert not [c for c in fit.trainer.callbacks if type(c).__name__ == "BatchSanityCheck"]  # type: ignore[attr-defined]
    last = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    (left_out,) = torch.load(last, weights_only=False)["config"]["left_out"]
    assert left_out.endswith(".BatchSanityCheck")
    for command in ("validate", "test", "predict"):
        evaluation = build_cli([command, *LIMIT, *quiet, "--ckpt_path", str(last)])
        names = [type(c).__name__ for c in evaluation.trainer.callbacks]  # type: ignore[attr-defined]
        assert "BatchSanityCheck" not in names and "ConfusionMatrixReport" in names, (command, names)
    other = build_cli(["fit", *LIMIT, *quiet, "--run.test_after_fit", "false", "--run.name", "whole"])
    best = other.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    evaluation = build_cli(["validate", *LIMIT, *quiet, "--ckpt_path", best])
    assert "BatchSanityCheck" in [type(c).__name__ for c in evaluation.trainer.callbacks]  # type: ignore[attr-defined]
