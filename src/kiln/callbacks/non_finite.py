"""Stop (or skip) a training step whose loss or gradients are NaN/Inf, before it touches the weights."""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer

from kiln.callbacks.grad_norm import total_gradient_norm
from kiln.errors import HealthCheckError


def _has_grad_scaler(trainer: Trainer) -> bool:
    """fp16 mixed precision: the GradScaler skips overflowing steps itself and lowers its scale."""
    return getattr(trainer.precision_plugin, "scaler", None) is not None


class NonFiniteGuard(Callback):
    """Checks each step's loss and gradients just before the optimizer step.

    Lightning by default trains on with NaN weights. Here a non-finite step either stops the run
    with an error naming the step, the loss and the first parameter with a non-finite gradient
    (``action="stop"``), or is skipped, counted and logged as ``health/skipped_steps``
    (``action="skip"``) until more than ``max_skips`` steps were skipped. The weights and every
    checkpoint keep the last finite state. One device sync per step: the price of stopping in time
    (``action="off"`` removes it).

    Args:
        action: ``stop`` at the first non-finite step, ``skip`` it, or ``off``.
        max_skips: With ``skip``: the number of skipped steps tolerated before stopping.
    """

    def __init__(self, action: Literal["stop", "skip", "off"] = "stop", max_skips: int = 10) -> None:
        self.action = action
        self.max_skips = max_skips
        self.skipped = 0
        self._loss: Tensor | None = None

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Tensor) -> None:
        self._loss = loss.detach() if self.action != "off" else None

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer) -> None:
        if self.action == "off":
            return
        norm = None if _has_grad_scaler(trainer) else total_gradient_norm(trainer, optimizer)
        if norm is None and self._loss is None:
            return
        # one scalar: NaN or Inf in the loss or any gradient makes the sum non-finite
        total = (norm if norm is not None else 0.0) + (self._loss.float() if self._loss is not None else 0.0)
        if bool(torch.isfinite(torch.as_tensor(total))):
            return
        message = self._describe(trainer, pl_module)
        if self.action == "skip" and self.skipped < self.max_skips:
            self.skipped += 1
            optimizer.zero_grad(set_to_none=True)  # parameters without gradients are left untouched
            pl_module.log("health/skipped_steps", float(self.skipped), on_step=True, on_epoch=False)
            return
        if self.action == "skip":
            message += f"; {self.skipped} steps were already skipped (max_skips={self.max_skips})"
        raise HealthCheckError(message)

    def _describe(self, trainer: Trainer, pl_module: LightningModule) -> str:
        loss = float(self._loss) if self._loss is not None else float("nan")
        bad = next(
            (n for n, p in pl_module.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()),
            None,
        )
        grads = f"first non-finite gradient: {bad}" if bad else "gradients finite"
        return (
            f"non-finite training step {trainer.global_step} (epoch {trainer.current_epoch}, "
            f"batch {trainer.fit_loop.epoch_loop.batch_idx}): loss={loss}, {grads}. The weights were not "
            "updated and no checkpoint holds this step. Try a lower learning rate, gradient clipping, or "
            "`-c configs/debug/anomaly.yaml` to find the operation that produced it"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped = state_dict["skipped"]
