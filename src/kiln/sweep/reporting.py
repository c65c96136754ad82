"""The link between an in-process ``kiln fit`` and the Optuna trial it is: epoch-end values, pruning."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

current: Any = None  # the optuna Trial the running `kiln fit` belongs to (set by the sweep driver)


class TrialReporter(Callback):
    """Reports ``metric`` after each validation to the current trial (rank 0 only) and stops the run
    when the pruner says so. Without a sweep it does nothing.

    Args:
        metric: The logged metric the sweep optimises (e.g. ``val/loss``).
    """

    def __init__(self, metric: str = "val/loss") -> None:
        self.metric = metric
        self.pruned = False

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if current is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        value = trainer.callback_metrics.get(self.metric)
        if value is None:
            return
        current.report(float(value), step=trainer.current_epoch)
        if current.should_prune():
            self.pruned = True
            trainer.should_stop = True
