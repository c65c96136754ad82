"""EMA weights: Lightning's ``EMAWeightAveraging`` held to the template's guarantees (configs/callbacks/ema.yaml)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch import Tensor

from kiln.callbacks.non_finite import NonFiniteGuard


class EMA(EMAWeightAveraging):
    """An exponential moving average of the weights (and buffers), updated once per optimizer step.

    What Lightning's callback gives: validation, the checkpoints' ``state_dict`` (so test, predict, export and
    ``--init_from``) and the weights after training are the average; ``current_model_state`` and
    ``averaging_state`` in each checkpoint carry the raw weights and the average's count, so a resume goes on
    exactly. What this adds: a step the non-finite guard skipped (``non_finite.action skip``) leaves the average
    as it was, on the host and, with a fused optimizer on a GPU, on the device without a sync; and the
    checkpoint written after training keeps the trained weights as ``current_model_state`` (Lightning's would
    hold the average there, and a longer resume would go on from it).

    Args:
        decay: The average's weight per step: ``average = decay * average + (1 - decay) * weights``.
        update_every_n_steps: Update every this many optimizer steps.
        update_starting_at_step: The first optimizer step (0-based) that updates; before it the average is the
            first weights it saw.
    """

    def __init__(self, decay: float = 0.999, update_every_n_steps: int = 1,
                 update_starting_at_step: int | None = None) -> None:  # fmt: skip
        super().__init__(decay=decay, update_every_n_steps=update_every_n_steps,
                         update_starting_at_step=update_starting_at_step)  # fmt: skip
        self.decay = decay
        self._kwargs["avg_fn"] = self._average  # Lightning's EMA step, unless the guard skipped the step
        self._skipped: bool | Tensor = False
        self._raw_at_end: dict[str, Tensor] | None = None  # the weights trained, once the model holds the average
        self._guard: NonFiniteGuard | None = None  # whose verdict on each step the average follows

    def _average(self, average: Tensor, current: Tensor, count: Tensor | int) -> Tensor:
        updated = self.decay * average + (1.0 - self.decay) * current
        if isinstance(self._skipped, Tensor):
            return torch.where(self._skipped.to(average.device), average, updated)
        return average if self._skipped else updated

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._skipped = self._guard.step_skipped if self._guard is not None else False
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raw_at_end = None
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        self._guard = next((c for c in callbacks if isinstance(c, NonFiniteGuard)), None)  # looked up once a fit

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The model takes the average; the trained weights stay for the checkpoints written after (``last.ckpt``
        at the end of training, whose ``current_model_state`` a longer resume goes on from, not the average)."""
        self._raw_at_end = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_at_end is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = self._raw_at_end
