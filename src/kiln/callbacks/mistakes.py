"""The test's most confident mistakes, as a W&B table: what a model is sure of and wrong about."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from kiln.callbacks.pictures import class_names, denormalised
from kiln.console import say
from kiln.training.contracts import declared_classes


class ConfidentMistakes(Callback):
    """After testing, the ``count`` wrong predictions with the highest probability, with the input (as a picture
    for images), label, prediction and every class's probability, as the W&B table ``test/confident_mistakes``
    (one per tested checkpoint). Reads the class scores the module's ``test_step`` returns, ``(batch,
    num_classes)``, for data that declares ``num_classes``; other modules (a regression, a language model) are
    left alone, a classifier whose ``test_step`` returns nothing of that shape gets one line, and without a W&B
    logger it does nothing. Under DDP every rank keeps its own candidates and rank 0 takes the top of all of them: the
    table is the test set's, not rank 0's share of it.

    Args:
        count: Rows of the table.
    """

    def __init__(self, count: int = 16) -> None:
        self.count = count
        self.rows: list[tuple[float, Tensor, int, int, Tensor]] = []  # confidence, input, label, prediction, probs
        self._logger: Any = None  # this test's W&B logger, found once (every rank has one; rank 0's writes)
        self._classes: int | None = None  # what the data declares: the table is for class data only
        self._unusable: str | None = None  # why the test's outputs are not class scores, once

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from lightning.pytorch.loggers import WandbLogger

        self.rows, self._unusable, self._classes = [], None, declared_classes(trainer)
        wandb_logger = next((logger for logger in trainer.loggers if isinstance(logger, WandbLogger)), None)
        self._logger = wandb_logger if self._classes is not None else None

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self._logger is None or self._unusable:
            return
        x, y = (batch[0], batch[1]) if isinstance(batch, list | tuple) and len(batch) > 1 else (batch, None)
        if not (isinstance(outputs, Tensor) and isinstance(y, Tensor) and outputs.shape == (len(y), self._classes)):
            shape = tuple(outputs.shape) if isinstance(outputs, Tensor) else type(outputs).__name__
            self._unusable = f"test_step returns {shape}, not (batch, {self._classes}) class scores"
            return
        probabilities = outputs.detach().float().softmax(dim=-1)
        confidence, prediction = probabilities.max(dim=-1)
        confidence = torch.where(prediction != y, confidence, torch.full_like(confidence, -1.0))
        top = confidence.topk(min(self.count, len(confidence))).indices  # this batch's candidates only
        top = top[confidence[top] >= 0]  # mistakes only; one copy to the host of each below
        candidates = zip(confidence[top].tolist(), x[top].detach().float().cpu(), y[top].tolist(),
                         prediction[top].tolist(), probabilities[top].cpu(), strict=True)  # fmt: skip
        self.rows = sorted([*self.rows, *candidates], key=lambda row: -row[0])[: self.count]

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._unusable:  # the same on every rank: no rank gathers
            say(f"ConfidentMistakes: no table of mistakes, as {self._unusable}")
            return
        if self._logger is None:
            return
        if trainer.world_size > 1 and torch.distributed.is_initialized():  # every rank's candidates, on every rank
            shares: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(shares, self.rows)
            self.rows = sorted([row for share in shares for row in share], key=lambda row: -row[0])[: self.count]
        logger = self._logger
        if not trainer.is_global_zero or logger.experiment is None:
            return
        import wandb

        names = class_names(trainer, len(self.rows[0][4]) if self.rows else 0)
        images = bool(self.rows) and self.rows[0][1].ndim == 3  # as the net saw them, de-normalised
        shown = denormalised(trainer, torch.stack([row[1] for row in self.rows])).clamp(0, 1) if images else None
        table = []
        for i, (confidence, x, label, prediction, probabilities) in enumerate(self.rows):
            picture: Any = wandb.Image(shown[i]) if shown is not None else f"input of shape {tuple(x.shape)}"
            table.append([picture, names[label], names[prediction], round(confidence, 4),
                          {names[k]: round(float(p), 4) for k, p in enumerate(probabilities)}])  # fmt: skip
        columns = ["input", "label", "prediction", "confidence", "probabilities"]
        logger.log_table(key="test/confident_mistakes", columns=columns, data=table)
