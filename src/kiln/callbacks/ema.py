"""EMA weights: Lightning's ``EMAWeightAveraging`` held to the template's guarantees (configs/callbacks/ema.yaml)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torchmetrics import Metric

from kiln.callbacks.non_finite import NonFiniteGuard


class EMA(EMAWeightAveraging):
    """An exponential moving average of the weights (and buffers), updated once per optimizer step.

    What Lightning's callback gives: validation, the checkpoints' ``state_dict`` (so test, predict, export and
    ``--init_from``) and the weights after training are the average; ``current_model_state`` and
    ``averaging_state`` in each checkpoint carry the raw weights and the average's count, so a resume goes on
    exactly. What this adds: a step the non-finite guard skipped (``non_finite.action skip``) leaves the average
    as it was, on the host and, with a fused optimizer on a GPU, on the device without a sync; the checkpoint
    written after training keeps the trained weights as ``current_model_state`` (Lightning's would hold the
    average there, and a longer resume would go on from it); a test in the fit's Trainer tests the average
    (Lightning's callback loads the raw weights into the model there); and the raw weights' validation and test
    metrics are logged beside the average's, as ``val_raw/...`` and ``test_raw/...``.

    Args:
        decay: The average's weight per step: ``average = decay * average + (1 - decay) * weights``.
        update_every_n_steps: Update every this many optimizer steps.
        update_starting_at_step: The first optimizer step (0-based) that updates; before it the average is the
            first weights it saw.
        log_raw: Also evaluate the raw weights on each validation and test batch (its cost: one more forward
            pass per batch) and log their metrics beside the average's.
    """

    def __init__(self, decay: float = 0.999, update_every_n_steps: int = 1,
                 update_starting_at_step: int | None = None, log_raw: bool = True) -> None:  # fmt: skip
        super().__init__(decay=decay, update_every_n_steps=update_every_n_steps,
                         update_starting_at_step=update_starting_at_step)  # fmt: skip
        self.decay, self.log_raw = decay, log_raw
        self._kwargs["avg_fn"] = self._average  # Lightning's EMA step, unless the guard skipped the step
        self._skipped: bool | Tensor = False
        self._raw_at_end: dict[str, Tensor] | None = None  # the weights trained, once the model holds the average
        self._guard: NonFiniteGuard | None = None  # whose verdict on each step the average follows
        self._raw_state: dict[str, Tensor] | None = None  # a tested checkpoint's raw weights
        self._raw: LightningModule | None = None  # the raw weights' model while an evaluation runs
        self._raw_logged: dict[str, list[Tensor]] = {}

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

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Outside fit the model keeps the checkpoint's ``state_dict``, the average; its raw weights are kept aside."""
        if trainer.state.fn != TrainerFn.FITTING:
            self._raw_state = checkpoint.get("current_model_state")
            return
        super().on_load_checkpoint(trainer, pl_module, checkpoint)

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # `validate` after fit: the checkpoint's weights, not swapped
            return
        super().on_validation_epoch_start(trainer, pl_module)  # the model takes the average, the copy the raw
        if self.log_raw and not trainer.sanity_checking and self._average_model is not None:
            self._begin_raw(self._average_model.module)  # type: ignore[arg-type]  # a copy of the LightningModule

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._on_raw("validation_step", batch, batch_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        self._end_raw(pl_module, "on_validation_epoch_end")
        super().on_validation_epoch_end(trainer, pl_module)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.log_raw and self._raw_state is not None:
            raw = copy.deepcopy(pl_module)  # a LightningModule copies without its Trainer
            raw.load_state_dict(self._raw_state)
            self._begin_raw(raw)

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._on_raw("test_step", batch, batch_idx)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end_raw(pl_module, "on_test_epoch_end")
        self._raw_state = None

    def _begin_raw(self, raw: LightningModule) -> None:
        self._raw, self._raw_training, self._raw_logged = raw, raw.training, {}
        raw.eval()

    def _end_raw(self, pl_module: LightningModule, epoch_end: str) -> None:
        """Run the raw weights' model's epoch-end hook, then log what it logged, each name's mean (``val/acc`` as
        ``val_raw/acc``)."""
        if self._raw is None:
            return
        self._on_raw(epoch_end)
        for name, values in self._raw_logged.items():
            stage, slash, rest = name.partition("/")
            pl_module.log(f"{stage}_raw/{rest}" if slash else f"{name}_raw", torch.stack(values).mean(), sync_dist=True)
        self._raw.train(self._raw_training)
        self._raw, self._raw_logged = None, {}

    def _on_raw(self, hook: str, *args: Any) -> None:
        """The LightningModule hook ``hook`` of the raw weights' model, what it logs kept: a copy outside the
        Trainer cannot log (a metric object it logs is computed, then reset)."""
        raw = self._raw
        if raw is None:
            return

        def keep(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(value, Metric):
                value, _ = value.compute(), value.reset()
            self._raw_logged.setdefault(name, []).append(torch.as_tensor(value, dtype=torch.float32).detach())

        raw.log = keep  # type: ignore[method-assign]  # on this copy only, while its hook runs
        try:
            getattr(raw, hook)(*args)
        finally:
            del raw.log
