"""Report how far the loss fell in an overfit-one-batch check."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from kiln.console import say


class OverfitReport(Callback):
    """Prints the first and final training loss; a healthy model drives it towards zero.

    Args:
        target: Final loss below which the check counts as passed.
    """

    def __init__(self, target: float = 0.05) -> None:
        self.target = target
        self.first: float | None = None
        self.last: float | None = None
        self.message = ""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.last = float(outputs["loss"])  # a sync per step: fine for a one-batch debug run
        if self.first is None:
            self.first = self.last

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.first is None or self.last is None:
            return
        verdict = "passed" if self.last < self.target else f"FAILED (target < {self.target})"
        self.message = f"overfit check {verdict}: training loss {self.first:.4f} -> {self.last:.4f}"
        say(self.message)
