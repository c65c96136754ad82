"""EMA weights (configs/callbacks/ema.yaml) against the template's guarantees: the closed form, one update per
optimizer step under accumulation, a skipped step leaves the average, checkpoints hold it, a resume is exact."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import CONFIGS, LIMIT, callback
from lightning.pytorch import Callback
from test_health import MODES, nan_net_config
from test_resume import assert_bitwise_equal, final_state, run_args

from kiln.callbacks import EMA
from kiln.cli import build_cli
from kiln.commands.boundary import main

EMA_PRESET = ["-c", str(CONFIGS / "callbacks" / "ema.yaml")]
CSV = ["-c", str(CONFIGS / "logger" / "csv.yaml")]


class Recorder(Callback):
    """After each optimizer step: the raw weights of one tensor and the average of it."""

    def __init__(self, name: str) -> None:
        self.name, self.step = name, 0
        self.raw: list[torch.Tensor] = []
        self.average: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            return  # an accumulation batch: no optimizer step
        self.step = trainer.global_step
        ema = next(c for c in trainer.callbacks if isinstance(c, EMA))
        assert ema._average_model is not None
        self.raw.append(dict(pl_module.named_parameters())[self.name].detach().clone())
        self.average.append(dict(ema._average_model.module.named_parameters())[self.name].detach().clone())


def fit_recorded(configs: list[str], flags: list[str], name: str = "net.head.1.bias") -> tuple[Any, Recorder]:
    cli = build_cli([*configs, *EMA_PRESET, *flags, "--trainer.logger", "false"], run=False)
    recorder = Recorder(name)
    cli.trainer.callbacks.append(recorder)  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, recorder


def test_the_average_is_the_closed_form_once_per_optimizer_step_under_accumulation() -> None:
    sgd = ["--model.init_args.optimizer", "torch.optim.SGD", "--model.init_args.optimizer.init_args.lr", "0.1",
           "--trainer.callbacks.decay", "0.8", "--trainer.accumulate_grad_batches", "4",
           "--trainer.limit_train_batches", "12"]  # fmt: skip
    cli, recorded = fit_recorded(LIMIT, sgd)
    ema = callback(cli, EMA)
    assert cli.trainer.global_step == 6 == int(ema._average_model.n_averaged) == len(recorded.raw)  # 2 epochs x 3
    expected = recorded.raw[0]  # the first update copies the weights
    for raw, average in zip(recorded.raw, recorded.average, strict=True):
        expected = expected if raw is recorded.raw[0] else 0.8 * expected + 0.2 * raw
        assert torch.allclose(average, expected, atol=1e-6)
    final = dict(cli.model.named_parameters())["net.head.1.bias"]
    assert torch.allclose(final, expected, atol=1e-6)  # after training the model holds the average
    last = torch.load(Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert torch.allclose(last["state_dict"]["net.head.1.bias"], expected, atol=1e-6)  # test, predict, export
    assert torch.equal(last["current_model_state"]["net.head.1.bias"], recorded.raw[-1])  # the raw weights, to resume


@pytest.mark.parametrize("mode", MODES)
def test_a_step_the_guard_skips_leaves_the_average_as_it_was(mode: str, tmp_path: Path) -> None:
    k = 4  # the step with a NaN loss
    skip = ["--non_finite.action", "skip", "--non_finite.mode", mode, "--trainer.max_epochs", "2",
            "--run.test_after_fit", "false"]  # fmt: skip
    cli, recorded = fit_recorded(["-c", nan_net_config(tmp_path, [k])], skip)
    assert len(recorded.average) == cli.trainer.global_step
    steps = range(len(recorded.average))
    moved = [i for i in steps[1:] if not torch.equal(recorded.average[i], recorded.average[i - 1])]
    assert moved == [i for i in steps[1:] if i != k]  # every step moved it but the skipped one (0-based: step k)


@pytest.mark.slow
def test_a_resume_with_ema_is_bitwise_the_uninterrupted_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    whole = build_cli([*run_args(0), *EMA_PRESET, "--run.root", str(tmp_path / "whole")])
    ckpt = Path(whole.trainer.default_root_dir) / "checkpoints" / "mid-step=8.ckpt"
    resumed = build_cli([*run_args(0), *EMA_PRESET, "--run.root", str(tmp_path / "resumed"), "--ckpt_path", str(ckpt)])
    a, b = final_state(resumed.trainer.default_root_dir), final_state(whole.trainer.default_root_dir)
    assert_bitwise_equal(a, b)  # the average (state_dict) and the optimizer
    for key, value in a["current_model_state"].items():
        assert torch.equal(value, b["current_model_state"][key]), key
    assert torch.equal(a["averaging_state"]["n_averaged"], b["averaging_state"]["n_averaged"])

    # the same resume without EMA would train on from the average (its state_dict), not the weights trained
    dropped = tmp_path / "dropped"
    with pytest.raises(SystemExit) as stop:
        main([*run_args(0), "--run.root", str(dropped), "--ckpt_path", str(ckpt)])
    assert stop.value.code == 1  # as a resume's other changed settings
    assert "was trained with weight averaging (kiln.callbacks.EMA), which this command leaves out" in (
        capsys.readouterr().err)  # fmt: skip
    assert not dropped.exists()


def fitted(name: str, flags: list[str]) -> tuple[dict[str, list[float]], dict[str, float], Path]:
    """A short fit's validation metrics by epoch (from metrics.csv), its test metrics and its best checkpoint."""
    main(["fit", *LIMIT, *CSV, "--run.name", name, *flags])
    (run_dir,) = Path("runs", name).iterdir()
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    by_epoch = {key: [float(r[key]) for r in rows if r.get(key)] for key in rows[0] if "val" in key}
    (tested,) = json.loads((run_dir / "metrics.json").read_text())["test"]
    return by_epoch, tested["metrics"], Path(tested["checkpoint"])


@pytest.mark.slow
def test_validation_and_test_are_on_the_average_and_the_raw_weights_metrics_are_logged_beside(
    capsys: pytest.CaptureFixture,
) -> None:
    plain_val, plain_test, _ = fitted("plain", [])  # EMA never changes what trains: its raw weights are these
    val, tested, best = fitted("ema", EMA_PRESET)
    assert val["val_raw/loss"] == pytest.approx(plain_val["val/loss"], abs=1e-6)
    assert val["val_raw/acc"] == pytest.approx(plain_val["val/acc"], abs=1e-6)
    assert val["val/loss"] != pytest.approx(plain_val["val/loss"], abs=1e-3)  # the average's own
    assert tested["test_raw/loss"] == pytest.approx(plain_test["test/loss"], abs=1e-6)
    main(["test", *LIMIT, *CSV, *EMA_PRESET, "--ckpt_path", str(best)])  # in a Trainer of its own: the average
    (alone,) = [d for d in Path("runs/ema").iterdir() if d.name.startswith("test-")]
    with (alone / "metrics.csv").open() as f:
        (again,) = list(csv.DictReader(f))
    assert tested["test/loss"] == pytest.approx(float(again["test/loss"]), abs=1e-6)  # was the raw weights'
    assert float(again["test_raw/loss"]) == pytest.approx(plain_test["test/loss"], abs=1e-6)

    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:  # without EMA: the average the checkpoint holds, said so
        warnings.simplefilter("always")
        main(["predict", *LIMIT, *CSV, "--ckpt_path", str(best)])
    assert f"weights: the EMA average {best} holds" in capsys.readouterr().err
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)]  # Lightning's
