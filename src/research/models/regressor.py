"""Regression around any injected ``nn.Module``: real-valued targets, mean squared error, value predictions."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

from kiln.training.hparams import save_config
from kiln.training.schedules import optimization


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-2)


class Regressor(LightningModule):
    """Mean squared error on one real value per sample; RMSE, MAE and R² on validation and test.

    Args:
        net: Any ``nn.Module`` mapping a batch of inputs to ``(batch, 1)`` or ``(batch,)`` values.
        optimizer: Builds the optimizer from the parameters (``class_path`` in YAML).
        scheduler: Builds an LR scheduler from the optimizer; ``None`` keeps the LR constant.
    """

    def __init__(
        self, net: nn.Module, optimizer: OptimizerCallable = _adamw, scheduler: LRSchedulerCallable | None = None
    ) -> None:
        super().__init__()
        save_config(self)  # the net's, optimizer's and scheduler's configs: load_from_checkpoint rebuilds them
        self.net, self.optimizer, self.scheduler = net, optimizer, scheduler
        metrics = MetricCollection(
            {"rmse": MeanSquaredError(squared=False), "mae": MeanAbsoluteError(), "r2": R2Score()}
        )
        self.val_metrics, self.test_metrics = metrics.clone(prefix="val/"), metrics.clone(prefix="test/")

    def setup(self, stage: str) -> None:
        shape = getattr(getattr(self.trainer, "datamodule", None), "input_shape", None)  # one sample's, declared
        if shape is not None and self.example_input_array is None:  # the model summary's FLOPs and sizes
            self.example_input_array = torch.zeros(1, *shape)

    def forward(self, x: Tensor) -> Tensor:
        """One value per sample, ``(batch,)`` (``flatten``, not ``reshape(len(x))``: an export keeps any batch size)."""
        return self.net(x).flatten()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)  # kiln's TrainLoss logs it (train/loss)

    def _evaluate(self, batch: tuple[Tensor, Tensor], metrics: MetricCollection, stage: str) -> Tensor:
        x, y = batch
        predicted = self(x)
        self.log(f"{stage}/loss", F.mse_loss(predicted, y), batch_size=len(y), sync_dist=True)
        metrics.update(predicted, y)
        return predicted

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_dict(self.val_metrics)  # Lightning computes (over every DDP rank) and resets them

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate(batch, self.test_metrics, "test")

    def on_test_epoch_end(self) -> None:
        self.log_dict(self.test_metrics)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self(batch[0] if isinstance(batch, list | tuple) else batch)

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.parameters())
        return optimization(self.trainer, optimizer, self.scheduler(optimizer) if self.scheduler else None)
