"""``kiln tune lr``'s range test: the rate set in every parameter group before each step, the loss recorded."""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback

BETA = 0.98  # the loss's smoothing


class RangeTest(Callback):
    """Sets every parameter group's rate before each step, exponentially from ``min_lr`` to ``max_lr`` (over any
    schedule the model configures), and records the step's loss; stops when the smoothed loss passes 4x its
    lowest, or is not finite."""

    def __init__(self, min_lr: float, max_lr: float, steps: int) -> None:
        self.rates = [min_lr * (max_lr / min_lr) ** (i / (steps - 1)) for i in range(steps)]
        self.lrs: list[float] = []
        self.losses: list[float] = []  # raw, per optimizer step
        self.smoothed: list[float] = []
        self._average = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        rate = self.rates[min(trainer.global_step, len(self.rates) - 1)]
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = rate

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step <= len(self.lrs):
            return  # an accumulation batch
        loss = float(outputs["loss"] if isinstance(outputs, dict) else outputs)
        self.lrs.append(self.rates[len(self.lrs)])
        self.losses.append(loss)
        self._average = BETA * self._average + (1 - BETA) * loss
        self.smoothed.append(self._average / (1 - BETA ** len(self.losses)))  # bias-corrected: the first is the loss
        if not math.isfinite(self.smoothed[-1]) or self.smoothed[-1] > 4 * min(self.smoothed):
            trainer.should_stop = True

    def suggestion(self) -> float | None:
        """The rate where the smoothed loss falls fastest per decade, between the 10th step and its lowest."""
        finite = [(lr, loss) for lr, loss in zip(self.lrs, self.smoothed, strict=True) if math.isfinite(loss)]
        lowest = min(range(len(finite)), key=lambda i: finite[i][1]) if finite else 0
        window = finite[: lowest + 1]
        if len(window) < 12:
            return None
        slopes = [(window[i + 1][1] - window[i - 1][1]) / math.log10(window[i + 1][0] / window[i - 1][0])
                  for i in range(10, len(window) - 1)]  # fmt: skip
        return window[10 + min(range(len(slopes)), key=slopes.__getitem__)][0] if slopes else None
