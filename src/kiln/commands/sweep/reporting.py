"""The link between a ``kiln fit`` and the Optuna trial it is: epoch-end values, pruning."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from kiln.errors import UsageError, nearest

# set by `kiln sweep --subprocess` for the trial's own `kiln fit` process: the storage URL, password included, stays
# out of the command line and so out of the trial's config.yaml and checkpoints
TRIAL_ENV = "KILN_SWEEP_TRIAL"


class MetricNotLogged(UsageError):
    """The sweep's metric is not among what the run logs in validation: every trial would fail the same way."""


class TrialReporter(Callback):
    """Reports ``metric`` after each validation to the current trial (rank 0 only) and stops the run,
    on every rank, when the pruner says so. Without a sweep it does nothing.

    Args:
        metric: The logged metric the sweep optimises (e.g. ``val/loss``).
    """

    def __init__(self, metric: str = "val/loss") -> None:
        self.metric = metric
        self.active = False
        self.trial: Any = None  # the optuna Trial this run is

    @classmethod
    def of(cls, trial: Any, metric: str) -> TrialReporter:
        """The reporter of an in-process trial (``kiln sweep`` adds it to the trainer's callbacks)."""
        reporter = cls(metric)
        reporter.trial = trial
        return reporter

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.active = self.trial is not None or TRIAL_ENV in os.environ  # the same on every rank
        if self.trial is None and self.active and trainer.is_global_zero:  # a trial in its own process
            from kiln.commands.sweep.study import reopen_trial

            self.trial = reopen_trial(os.environ[TRIAL_ENV])

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self.active:
            return
        value = trainer.callback_metrics.get(self.metric)
        if value is None and (not trainer.sanity_checking or self.metric.startswith("val/")):  # at once, untrained
            logged = sorted(k for k in trainer.callback_metrics if k.startswith(("val/", "train/")))
            raise MetricNotLogged(
                f"the sweep's metric {self.metric!r} is not logged in validation ({', '.join(logged)} are)"
                f"{nearest(self.metric, logged)}: fix metric in the sweep file"
            )
        if trainer.sanity_checking:
            return
        prune = False
        if trainer.is_global_zero and value is not None:
            self.trial.report(float(value), step=trainer.current_epoch)
            prune = self.trial.should_prune()
            if prune:
                self.trial.set_user_attr("pruned", True)
        if trainer.strategy.broadcast(prune, src=0):  # every DDP rank stops at the same epoch
            trainer.should_stop = True
