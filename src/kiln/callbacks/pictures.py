"""Pictures a user should look at: the first training batch as the net sees it, and the test confusion matrix
(drawn by ``kiln.runs.figures``, whose matplotlib is imported only when a picture is made)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from PIL import Image
from rich.console import Console
from rich.table import Table
from torch import Tensor

from kiln.console import LOG, say
from kiln.data.on_device import stats_view
from kiln.errors import Preempted
from kiln.runs import figures
from kiln.training.contracts import datamodule, declared_classes, declared_names, statistics


def log_image(trainer: Trainer, key: str, path: Path) -> None:
    """Send a saved picture to every logger that takes pictures (W&B copies the file: no decoding, no re-encoding)."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[str(path)], step=trainer.global_step)
        elif isinstance(logger, TensorBoardLogger):
            image = np.asarray(Image.open(path).convert("RGB"))
            logger.experiment.add_image(key, image, trainer.global_step, dataformats="HWC")


def denormalised(trainer: Trainer, x: Tensor) -> Tensor:
    """A batch of samples as they were before the datamodule's normalisation (where it declares one)."""
    stats = statistics(datamodule(trainer))
    if stats is None:
        return x
    return x * stats_view(stats[1], x.shape[1:], "std") + stats_view(stats[0], x.shape[1:], "mean")


def class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = declared_names(trainer)
    return list(names) if names else [str(i) for i in range(num_classes)]


def captions(trainer: Trainer, y: Any, n: int) -> list[str]:
    """One caption per sample: its class name (class data), its value (one real target), or none."""
    if not isinstance(y, Tensor) or len(y) != n or (y.ndim > 1 and y[0].numel() > 1):
        return [""] * n
    values = y.reshape(n)
    count = declared_classes(trainer)
    if count is not None and not torch.is_floating_point(values):
        names = class_names(trainer, count)
        return [names[i] if 0 <= i < len(names) else str(i) for i in values.tolist()]
    return [f"{v:.4g}" for v in values.tolist()]


class BatchGrid(Callback):
    """Saves the first training batch, augmented and de-normalised, with its targets: ``batch_grid.png``.

    Images (B, C, H, W) are drawn as a grid, 1-D samples (B, C, L) or (B, L) as small line plots, each
    captioned with its class name (class data) or its value (one real target); other inputs (token ids,
    batches that are not ``(inputs, targets)`` pairs) are skipped with one line.

    Args:
        max_images: Number of images shown.
        cell: Size of each image in the saved picture, in pixels (1-D samples get 1.5 times that).
    """

    def __init__(self, max_images: int = 32, cell: int = 96) -> None:
        self.max_images = max_images
        self.cell = cell
        self.done = False
        self.path: Path | None = None
        self._first: tuple[Tensor, Tensor | None] | None = None  # the batch, drawn once the first epoch ends

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.done:
            return
        self.done = True
        if not trainer.is_global_zero:
            return
        inputs = batch[0] if isinstance(batch, list | tuple) and batch else batch
        if not isinstance(inputs, Tensor) or not torch.is_floating_point(inputs) or inputs.ndim not in (2, 3, 4):
            kind = f"inputs of shape {tuple(inputs.shape)}, {inputs.dtype}" if isinstance(inputs, Tensor) else (
                f"{type(batch).__name__} batches")  # fmt: skip
            say(f"BatchGrid: no picture for {kind} (float images or 1-D samples only)")
            return
        target = (
            batch[1][: self.max_images].cpu().clone() if isinstance(batch, list | tuple) and len(batch) > 1 else None
        )
        self._first = (inputs[: self.max_images].detach().float().cpu().clone(), target)  # as the step got it

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Drawn and logged here, not at the first batch: matplotlib and W&B's media types (0.3-0.5 s) stay off the
        way to the first step."""
        self._draw(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException | Preempted):  # a run stopped inside its first epoch, to go on
            self._draw(trainer)

    def _draw(self, trainer: Trainer) -> None:
        if self._first is None:
            return
        inputs, target = self._first
        self._first = None
        x, labels = denormalised(trainer, inputs), captions(trainer, target, len(inputs))
        if x.ndim == 4:
            figure = figures.image_grid(x, labels, cell=self.cell / figures.DPI)
        else:
            figure = figures.signal_grid(
                x if x.ndim == 3 else x.unsqueeze(1), labels, cell=1.5 * self.cell / figures.DPI
            )
        self.path = Path(trainer.default_root_dir) / "batch_grid.png"
        figures.save(figure, self.path)
        log_image(trainer, "batch_grid", self.path)


class ConfusionMatrixReport(Callback):
    """At test end: ``confusion_matrix-<checkpoint>.png`` in the run folder and the logger, per-class accuracy logged.

    For data that declares ``num_classes``: counts what the module's ``test_step`` returns (logits or
    probabilities, ``(batch, num_classes)``) against the batch's labels, over every DDP rank. Other modules
    (a regression, a language model) are left alone; a classifier whose ``test_step`` returns nothing
    of that shape gets one line.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.matrix: Tensor | None = None
        self._counts: Any = None  # this test's torchmetrics confusion matrix, for class data
        self._unusable: str | None = None  # why the test's outputs cannot be counted, once

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        classes = declared_classes(trainer)
        self._counts, self._unusable = None, None
        if classes is not None:
            from torchmetrics.classification import MulticlassConfusionMatrix

            self._counts = MulticlassConfusionMatrix(classes).to(pl_module.device)

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self._counts is None or self._unusable:
            return
        labels = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else None
        if not (isinstance(outputs, Tensor) and isinstance(labels, Tensor) and outputs.shape == (
                len(labels), self._counts.num_classes)):  # fmt: skip
            shape = tuple(outputs.shape) if isinstance(outputs, Tensor) else type(outputs).__name__
            self._unusable = f"test_step returns {shape}, not (batch, {self._counts.num_classes}) class scores"
            return
        self._counts.update(outputs.detach(), labels)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._unusable:
            say(f"ConfusionMatrixReport: no confusion matrix, as {self._unusable}")
        if self._counts is None or self._unusable or not self._counts.update_called:
            return
        self.matrix = self._counts.compute().cpu()  # summed over DDP ranks
        if not trainer.is_global_zero:
            return
        names = class_names(trainer, len(self.matrix))
        # one file per tested checkpoint: the test after fit may score both the best and the last
        weights = Path(trainer.ckpt_path).stem if trainer.ckpt_path else None
        correct, total = int(self.matrix.diagonal().sum()), int(self.matrix.sum())
        title = f"test: {correct} of {total} right ({correct / max(total, 1):.4f}), weights {weights or 'in memory'}"
        self.path = Path(trainer.default_root_dir) / f"confusion_matrix{f'-{weights}' if weights else ''}.png"
        figures.save(figures.confusion_figure(self.matrix, names, title), self.path)
        log_image(trainer, "test/confusion_matrix", self.path)
        self._print_table(self.matrix, names, f" ({weights}.ckpt)" if weights else "")

    @staticmethod
    def _print_table(matrix: Tensor, names: Sequence[str], weights: str) -> None:
        table = Table(title=f"Per-class test accuracy{weights}", title_justify="left")
        for column in ("class", "support", "correct", "accuracy"):
            table.add_column(column, justify="left" if column == "class" else "right")
        for i, name in enumerate(names):
            support, correct = int(matrix[i].sum()), int(matrix[i, i])
            table.add_row(name, str(support), str(correct), f"{correct / support:.3f}" if support else "-")
        text = io.StringIO()
        Console(width=100, file=text, force_terminal=False).print(table)
        LOG.info("\n" + text.getvalue())  # console.log (and the console with -v): the picture shows it
