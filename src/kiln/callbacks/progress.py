"""Lightning's Rich progress bar without a metric read (and device sync) after every batch."""

from __future__ import annotations

import math
import time
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """The bar advances every batch; its metrics are read at most ``refresh_rate`` times a second.

    ``RichProgressBar`` turns every progress-bar metric into a Python float after every batch:
    a device sync per step on GPU, a cost per step on CPU too (benchmarks/README.md), for a
    display redrawn a few times a second. Here a batch reuses the metrics read less than
    ``1 / refresh_rate`` s earlier, and every epoch and evaluation end reads them afresh.

    Args:
        refresh_rate: Redraws (and metric reads) per second; 0 hides the bar.
        **kwargs: ``leave``, ``theme``, ``console_kwargs`` of ``RichProgressBar``.
    """

    def __init__(self, refresh_rate: int = 10, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._metrics: dict[str, int | str | float | dict[str, float]] | None = None
        self._read_at = -math.inf

    def get_metrics(
        self, trainer: Trainer, pl_module: LightningModule
    ) -> dict[str, int | str | float | dict[str, float]]:
        now = time.monotonic()
        if self._metrics is None or not trainer.training or now - self._read_at >= 1 / max(self.refresh_rate, 1e-9):
            self._metrics, self._read_at = super().get_metrics(trainer, pl_module), now
        return self._metrics

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._read_at = -math.inf  # show the epoch's final values
        super().on_train_epoch_end(trainer, pl_module)

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hide(self.test_progress_bar_id)  # the summary says what the test found
        super().on_test_end(trainer, pl_module)

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._hide(self.predict_progress_bar_id)
        super().on_predict_end(trainer, pl_module)

    def _hide(self, task: Any) -> None:
        if self.progress is not None and task is not None:
            self.progress.update(task, advance=0, visible=False)
            self.refresh()
