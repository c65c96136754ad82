"""Classification around any injected ``nn.Module``: images, signals, sequences or feature vectors."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from kiln.console import say
from kiln.errors import ConfigError
from kiln.training.hparams import save_config
from kiln.training.schedules import WarmupCosineLR, optimization
from research.models.backbone import drop_gradients, hold_statistics, param_groups, split

Batch = tuple[Tensor, Tensor]


def _adamw(params: Any) -> torch.optim.Optimizer:
    """The default experiment's optimizer (configs/train.yaml), for a model built in Python."""
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=1e-2, fused=True)


def _warmup_cosine(optimizer: torch.optim.Optimizer) -> WarmupCosineLR:
    """The default experiment's schedule (configs/train.yaml), for a model built in Python."""
    return WarmupCosineLR(optimizer, warmup_fraction=0.05)


class Classifier(LightningModule):
    """Cross-entropy training, accuracy metrics and probability predictions for ``net``.

    Args:
        net: The architecture (any ``nn.Module`` mapping a batch of inputs to ``num_classes`` logits).
        num_classes: Number of classes; sizes the metrics. The CLI links it from the data.
        optimizer: Builds the optimizer from the parameters (``class_path`` in YAML).
        scheduler: Builds an LR scheduler from the optimizer; ``None`` keeps the LR constant.
        scheduler_interval: Step the scheduler every optimizer ``step`` or every ``epoch``.
        label_smoothing: Cross-entropy label smoothing.
        backbone_lr_ratio: Fine-tuning: the learning rate of the network's backbone (all but its
            ``head``) as a fraction of the head's, as two optimizer parameter groups that the
            LR monitor logs as ``lr-<Optimizer>/backbone`` and ``/head``; the schedule scales both.
        freeze_backbone_epochs: Fine-tuning: train only the head for this many epochs, with the
            backbone's weights and batch-norm statistics held as they are, then everything.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerCallable = _adamw,
        scheduler: LRSchedulerCallable | None = _warmup_cosine,
        scheduler_interval: Literal["step", "epoch"] = "step",
        label_smoothing: float = 0.0,
        backbone_lr_ratio: float = 1.0,
        freeze_backbone_epochs: int = 0,
    ) -> None:
        super().__init__()
        save_config(self)  # the net's, optimizer's and scheduler's configs: load_from_checkpoint rebuilds them
        self.net = net
        self.num_classes = num_classes
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing
        if backbone_lr_ratio <= 0 or freeze_backbone_epochs < 0:
            raise ConfigError(
                f"model.backbone_lr_ratio {backbone_lr_ratio}, model.freeze_backbone_epochs {freeze_backbone_epochs}: "
                "the ratio must be above 0 (to hold the backbone, freeze it) and the epochs 0 or more"
            )
        self.backbone_lr_ratio = backbone_lr_ratio
        self.freeze_backbone_epochs = freeze_backbone_epochs
        self._backbone: list[nn.Parameter] = []  # what freezing holds; a network without a head stops here
        if freeze_backbone_epochs or backbone_lr_ratio != 1:
            why = "model.freeze_backbone_epochs" if freeze_backbone_epochs else "model.backbone_lr_ratio"
            self._backbone = split(net, why)[0]
        # labels are range-checked by cross-entropy itself (and BatchSanityCheck): skip the per-step re-check
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        # per-sample mean losses, synced over ranks by torchmetrics; NaN is kept, not dropped
        self.val_loss = MeanMetric(nan_strategy="disable")
        self.test_loss = MeanMetric(nan_strategy="disable")

    def setup(self, stage: str) -> None:
        shape = getattr(getattr(self.trainer, "datamodule", None), "input_shape", None)  # one sample's, declared
        # an input of the data's shape: the model summary then shows real FLOPs and in/out sizes
        # (not for a net that declares other channels: BatchSanityCheck names that mismatch in one line)
        if shape is None or getattr(self.net, "in_channels", shape[0]) != shape[0]:
            return
        if self.example_input_array is None:
            self.example_input_array = torch.zeros(1, *shape)

    def _backbone_frozen(self) -> bool:
        return self.current_epoch < self.freeze_backbone_epochs

    def on_train_epoch_start(self) -> None:
        if self.freeze_backbone_epochs:
            hold_statistics(self.net, frozen=self._backbone_frozen())
            if self.current_epoch == self.freeze_backbone_epochs:
                say(f"epoch {self.current_epoch}: the backbone trains from now on (model.freeze_backbone_epochs)")

    def on_after_backward(self) -> None:
        if self.freeze_backbone_epochs and self._backbone_frozen():
            drop_gradients(self._backbone)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def _loss(self, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits, y, label_smoothing=self.label_smoothing)

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        logits = self(x)
        loss = self._loss(logits, y)
        self.train_acc.update(logits.detach(), y)  # logged once per epoch, not per step
        return loss  # kiln.callbacks.TrainLoss logs it as train/loss

    def on_train_epoch_end(self) -> None:
        self.log("train/acc", self.train_acc)  # computed over the epoch (and all ranks), then reset

    def _evaluate(self, batch: Batch, loss: MeanMetric, accuracy: MulticlassAccuracy) -> Tensor:
        """Accumulate on the device; the epoch-end hooks log once (no ``self.log`` per batch)."""
        x, y = batch
        logits = self(x)
        # each sample's loss: torchmetrics' MeanMetric drops `weight` under nan_strategy="disable", so a batch mean
        # weighted by its size would count the epoch's last, smaller batch as a full one
        loss.update(F.cross_entropy(logits, y, label_smoothing=self.label_smoothing, reduction="none"))
        accuracy.update(logits, y)
        return logits

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc)

    def on_validation_epoch_end(self) -> None:
        self.log("val/loss", self.val_loss)  # epoch means over every sample of every rank, then reset
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self._evaluate(batch, self.test_loss, self.test_acc)  # the logits, for kiln's confusion matrix

    def on_test_epoch_end(self) -> None:
        self.log("test/loss", self.test_loss)
        self.log("test/acc", self.test_acc, prog_bar=True)

    def predict_step(self, batch: Batch | Tensor, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Class probabilities; the Trainer already runs this under ``torch.inference_mode``."""
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(x).softmax(dim=-1)

    def configure_optimizers(self) -> Any:
        if self.backbone_lr_ratio == 1:
            optimizer = self.optimizer_factory(self.parameters())
        else:
            optimizer = self.optimizer_factory(param_groups(self.net, "model.backbone_lr_ratio"))
            optimizer.param_groups[0]["lr"] *= self.backbone_lr_ratio  # before the scheduler reads its base LRs
        scheduler = self.scheduler_factory(optimizer) if self.scheduler_factory is not None else None
        return optimization(self.trainer, optimizer, scheduler, self.scheduler_interval)
