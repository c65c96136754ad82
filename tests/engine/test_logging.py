"""What the template logs, and that it reads metrics no more often than someone can look at them."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import callback
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import RichProgressBar

from kiln.callbacks import ProgressBar
from kiln.cli import build_cli

SHORT = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "12", "--trainer.limit_val_batches", "2",
         "--trainer.log_every_n_steps", "5", "--run.test_after_fit", "false"]  # fmt: skip


class LossRecorder(Callback):
    """Every batch's loss (with accumulation: every micro-batch's, undivided), in order."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        self.losses.append(float(loss) * trainer.accumulate_grad_batches)


# accumulate -> {written step: micro-batches averaged}, and the batches behind the last (epoch-end) value;
# 12 batches per epoch, Lightning writes every 5th optimizer step (steps 4, 9, ...), kiln each epoch's last window
# at its last step too (11 and 23; with accumulation 5 and 11), which Lightning's epoch-end write left out
FIRST = {4: range(0, 5), 9: range(5, 10), 11: range(10, 12), 14: range(12, 15), 19: range(15, 20), 23: range(20, 24)}
WINDOWS = {
    1: (FIRST, range(20, 24)),
    2: ({4: range(0, 10), 5: range(10, 12), 9: range(12, 20), 11: range(20, 24)}, range(20, 24)),  # 6 steps an epoch
}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_train_loss_is_the_mean_since_the_last_log_on_written_steps_and_epoch_ends(
    tmp_path: Path, accumulate: int
) -> None:
    recorder = LossRecorder()
    cli = build_cli([*SHORT, "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                     "--trainer.logger.save_dir", str(tmp_path / "logs"),
                     "--trainer.accumulate_grad_batches", str(accumulate)], run=False)  # fmt: skip
    cli.trainer.callbacks.append(recorder)  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    log_dir = cli.trainer.logger.log_dir  # type: ignore[union-attr]
    assert log_dir is not None and len(recorder.losses) == 24
    with open(Path(log_dir) / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    written = {int(r["step"]): float(r["train/loss"]) for r in rows}
    windows, last = WINDOWS[accumulate]
    assert sorted(written) == sorted(windows)
    for step, window in windows.items():
        expected = sum(recorder.losses[i] for i in window) / len(window)
        assert written[step] == pytest.approx(expected, rel=1e-5)
    # the epoch-end value is what callbacks and the progress bar see last
    expected_last = sum(recorder.losses[i] for i in last) / len(last)
    assert float(cli.trainer.callback_metrics["train/loss"]) == pytest.approx(expected_last, rel=1e-5)
    assert "train/acc" in cli.trainer.callback_metrics  # once per epoch, over all its batches


def test_progress_bar_reads_metrics_at_most_refresh_rate_times_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[bool] = []
    original = RichProgressBar.get_metrics

    def counting(self: RichProgressBar, trainer: Any, pl_module: Any) -> dict[str, Any]:
        reads.append(trainer.training)
        return original(self, trainer, pl_module)

    monkeypatch.setattr(RichProgressBar, "get_metrics", counting)
    clock = iter(range(1_000_000))  # a clock that advances 1 s per call: every read is allowed
    cli = build_cli([*SHORT, "--trainer.callbacks+=kiln.callbacks.OverfitReport"], run=False)
    bar = callback(cli, ProgressBar)
    monkeypatch.setattr("kiln.callbacks.progress.time.monotonic", lambda: 0.0)  # frozen: reads only when forced
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    training_reads = reads.count(True)
    assert 0 < training_reads <= 2 * 2 + 1  # per epoch: the first batch and the epoch end, not 12 batches
    shown = bar.get_metrics(cli.trainer, cli.model)
    assert shown["train/loss"] == pytest.approx(float(cli.trainer.callback_metrics["train/loss"]))
    reads.clear()
    monkeypatch.setattr("kiln.callbacks.progress.time.monotonic", lambda: float(next(clock)))
    cli.trainer.fit_loop.max_epochs = 3
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert reads.count(True) >= 12  # with time passing, every batch reads again


def test_each_logged_test_says_which_weights_it_scored(tmp_path: Path) -> None:
    """run.test_ckpt both logged two test rows under the same epoch and step, with nothing telling them apart."""
    callbacks = tmp_path / "worst_is_best.yaml"  # the list replaces the default's: best is an early epoch
    callbacks.write_text("trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
                         "      init_args: {monitor: val/loss, mode: max}\n    - kiln.callbacks.LastCheckpoint\n"
                         "    - kiln.callbacks.RunMetrics\n")  # fmt: skip
    worst_is_best = ["-c", str(callbacks)]
    cli = build_cli(["fit", *SHORT[:-2], "--trainer.max_epochs", "3", "--trainer.logger", "kiln.training.loggers.Csv",
                     "--run.test_ckpt", "both", *worst_is_best])  # fmt: skip
    run_dir = Path(cli.trainer.default_root_dir)
    tested = json.loads((run_dir / "metrics.json").read_text())["test"]
    with (run_dir / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("test/acc")]
    assert len(tested) == 2 and tested[0]["step"] < tested[1]["step"]
    assert [int(float(r["test/weights_step"])) for r in rows] == [t["step"] for t in tested]
    assert [float(r["test/acc"]) for r in rows] == pytest.approx([t["metrics"]["test/acc"] for t in tested])
    assert all("test/weights_step" not in t["metrics"] for t in tested)  # metrics.json says it as `step`
