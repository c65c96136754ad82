"""``train/loss`` for any LightningModule, logged as often as it is written and carried through a resume."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from kiln.training.logging_steps import write_now, writes_logs_after


def step_loss(outputs: Any) -> Tensor | None:
    """The loss ``training_step`` returned (a tensor, or a dict's ``loss``), if it returned one."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    return loss.detach() if isinstance(loss, Tensor) else None


class TrainLoss(Callback):
    """Logs the mean of ``training_step``'s loss over the batches since the last written step, on the steps
    Lightning writes and at each epoch end: summed on the device, so no step waits for the host (a
    ``self.log`` per step would: benchmarks/README.md). The open window goes into checkpoints, so a
    resumed run logs what the uninterrupted one does. A module that logs ``key`` itself leaves this out
    (``run.without: [TrainLoss]``).

    Args:
        key: The name it is logged under.
        prog_bar: Show it on the progress bar.
    """

    def __init__(self, key: str = "train/loss", prog_bar: bool = True) -> None:
        self.key, self.prog_bar = key, prog_bar
        self._sum: Tensor | None = None
        self._count = 0
        self._epoch = 0  # the epoch of the open window

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._count and self._epoch != trainer.current_epoch:
            self._sum, self._count = None, 0  # restored from a checkpoint saved once its epoch had ended

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = step_loss(outputs)
        if loss is None:
            return
        if pl_module.automatic_optimization:  # Lightning divided it by the accumulation
            loss = loss * trainer.accumulate_grad_batches
        self._sum = loss if self._sum is None else self._sum.to(loss.device) + loss
        self._count, self._epoch = self._count + 1, trainer.current_epoch
        last_batch = batch_idx + 1 >= trainer.num_training_batches
        if (batch_idx + 1) % trainer.accumulate_grad_batches and not last_batch:
            return  # mid-accumulation: the optimizer step (and any write) comes with a later batch
        written = writes_logs_after(trainer, trainer.global_step - 1)
        if written or last_batch:
            mean = self._sum / self._count
            pl_module.log(self.key, mean, prog_bar=self.prog_bar)  # the progress bar, callbacks that monitor it
            if not written:  # the epoch's last window: Lightning writes a step's value on its logging steps only
                write_now(trainer, {self.key: mean}, trainer.global_step - 1)
            self._sum, self._count = None, 0

    def state_dict(self) -> dict[str, Any]:
        return {"sum": self._sum, "count": self._count, "epoch": self._epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._sum, self._count, self._epoch = state_dict["sum"], state_dict["count"], state_dict["epoch"]
