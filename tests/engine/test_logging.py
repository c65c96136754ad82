"""What the template logs, and that it reads metrics no more often than someone can look at them."""

from __future__ import annotations

import csv
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
# 12 batches per epoch, Lightning writes every 5th optimizer step (steps 4, 9, ...)
WINDOWS = {
    1: ({4: range(0, 5), 9: range(5, 10), 14: range(12, 15), 19: range(15, 20)}, range(20, 24)),
    2: ({4: range(0, 10), 9: range(12, 20)}, range(20, 24)),  # 6 optimizer steps per epoch
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
