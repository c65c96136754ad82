"""The bare-Lightning baseline: the template's network and batches under a plain LightningModule and a Trainer with
Lightning's defaults (its logger, checkpointing, progress bar and model summary), so that kiln's own cost per step
and at start can be told from Lightning's (benchmarks/README.md)."""

from __future__ import annotations

import math
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F


class StepTimer(pl.Callback):
    """Seconds from the process's start to the first step's end; steps per second from the second epoch on."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first_step: float | None = None
        self.timed_from = self.steps_before = self.rate = 0.0
        self.device: Any = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.first_step is None:
            self.first_step = time.time() - self.started

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch == 1:
            _sync(pl_module.device)
            self.timed_from, self.steps_before = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _sync(pl_module.device)
        self.rate = (trainer.global_step - self.steps_before) / (time.perf_counter() - self.timed_from)
        self.device = pl_module.device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Plain(pl.LightningModule):
    """The template's classifier as a newcomer writes it: cross-entropy, accuracy logged, AdamW with warm-up and
    cosine decay stepped every batch (the template's settings)."""

    def __init__(self, total_steps: int) -> None:
        super().__init__()
        from research.nets import SmallCNN

        self.net, self.total_steps = SmallCNN(in_channels=1, num_classes=10, width=32), total_steps

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01, fused=True)
        total, warm = self.total_steps, max(1, int(0.05 * self.total_steps))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / total))
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def run_lightning(epochs: int, started: float, small: bool = False, wandb: bool = False) -> dict[str, float]:
    """One fit of ``Plain`` on the template's digits batches; its steps/s and first step, as the other kinds
    (``small``: a few batches an epoch, as ``--smoke`` runs every kind; ``wandb``: Lightning's W&B logger, offline,
    in place of its default logger, as the template logs)."""
    from research.data import DigitsDataModule

    data = DigitsDataModule(batch_size=64, num_workers=0)
    data.setup("fit")
    timer = StepTimer(started)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-lightning-") as root:
        few = 4 if small else None  # batches an epoch
        logger = pl.loggers.WandbLogger(save_dir=root, offline=True) if wandb else None
        trainer = pl.Trainer(max_epochs=epochs, default_root_dir=root, callbacks=[timer], accelerator="cpu",
                             limit_train_batches=few, limit_val_batches=few, logger=logger)  # fmt: skip
        trainer.fit(Plain(epochs * len(data.train_dataloader())), datamodule=data)
    assert timer.first_step is not None
    return {"steps_per_s": timer.rate, "first_step_s": timer.first_step}
