"""The test's most confident mistakes, as a W&B table: what a model is sure of and wrong about."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from kiln.callbacks.pictures import class_names
from kiln.data.on_device import stats_view


class ConfidentMistakes(Callback):
    """After testing, the ``count`` wrong predictions with the highest probability, with the input (as a picture
    for images), label, prediction and every class's probability, as the W&B table ``test/confident_mistakes``
    (one per tested checkpoint). Reads the logits the module's ``test_step`` returns; without a W&B logger it
    does nothing.

    Args:
        count: Rows of the table.
    """

    def __init__(self, count: int = 16) -> None:
        self.count = count
        self.rows: list[tuple[float, Tensor, int, int, Tensor]] = []  # confidence, input, label, prediction, probs

    def _wandb(self, trainer: Trainer) -> Any:
        from lightning.pytorch.loggers import WandbLogger

        return next((logger for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.rows = []

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if not isinstance(outputs, Tensor) or self._wandb(trainer) is None or not trainer.is_global_zero:
            return
        x, y = batch[0], batch[1]
        probabilities = outputs.detach().float().softmax(dim=-1)
        confidence, prediction = probabilities.max(dim=-1)
        confidence = torch.where(prediction != y, confidence, torch.full_like(confidence, -1.0))
        top = confidence.topk(min(self.count, len(confidence))).indices  # this batch's candidates only
        for i in top.tolist():
            if float(confidence[i]) >= 0:
                self.rows.append((float(confidence[i]), x[i].detach().float().cpu(), int(y[i]), int(prediction[i]),
                                  probabilities[i].cpu()))  # fmt: skip
        self.rows = sorted(self.rows, key=lambda row: -row[0])[: self.count]

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logger = self._wandb(trainer)
        if logger is None or not trainer.is_global_zero or logger.experiment is None:
            return
        import wandb

        data = trainer.datamodule  # type: ignore[attr-defined]
        names = class_names(trainer, len(self.rows[0][4]) if self.rows else 0)
        table = []
        for confidence, x, label, prediction, probabilities in self.rows:
            if x.ndim == 3:  # an image: as the net saw it, de-normalised
                mean = stats_view(getattr(data, "mean", (0.0,)), x.shape, "mean")
                std = stats_view(getattr(data, "std", (1.0,)), x.shape, "std")
                shown: Any = wandb.Image((x * std + mean).clamp(0, 1))
            else:
                shown = f"input of shape {tuple(x.shape)}"
            table.append([shown, names[label], names[prediction], round(confidence, 4),
                          {names[k]: round(float(p), 4) for k, p in enumerate(probabilities)}])  # fmt: skip
        columns = ["input", "label", "prediction", "confidence", "probabilities"]
        logger.log_table(key="test/confident_mistakes", columns=columns, data=table)
