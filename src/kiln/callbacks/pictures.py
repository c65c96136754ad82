"""Pictures a user should look at: the first training batch as the net sees it, and the test confusion matrix.

Drawn with Pillow (already installed with torchvision) rather than matplotlib, which would add a
dependency and seconds of import time to every command.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer
from PIL import Image, ImageDraw
from rich.console import Console
from rich.table import Table
from torch import Tensor

from kiln.console import LOG, say
from kiln.data.on_device import stats_view
from kiln.files import written_whole

LABEL_HEIGHT = 14


def image_grid(images: Tensor, labels: Sequence[str], cell: int = 64, columns: int = 8) -> Image.Image:
    """Images in [0, 1] (N x C x H x W) scaled to ``cell`` pixels, each with its label underneath."""
    n = len(images)
    columns = min(columns, n)
    rows = math.ceil(n / columns)
    canvas = Image.new("RGB", (columns * cell, rows * (cell + LABEL_HEIGHT)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        pixels = (image.clamp(0, 1) * 255).round().byte()
        pixels = pixels.expand(3, -1, -1) if pixels.shape[0] == 1 else pixels[:3]
        tile = Image.fromarray(pixels.permute(1, 2, 0).cpu().numpy()).resize((cell, cell), Image.Resampling.NEAREST)
        x, y = (i % columns) * cell, (i // columns) * (cell + LABEL_HEIGHT)
        canvas.paste(tile, (x, y))
        draw.text((x + 2, y + cell + 1), label[: cell // 6], fill="black")
    return canvas


def signal_grid(signals: Tensor, labels: Sequence[str], cell: int = 96, columns: int = 8) -> Image.Image:
    """1-D samples (N x C x L) as small line plots, one colour per channel, each scaled to its own
    range (negative values kept, the zero line drawn grey), with its label underneath."""
    n = len(signals)
    columns = min(columns, n)
    rows = math.ceil(n / columns)
    canvas = Image.new("RGB", (columns * cell, rows * (cell + LABEL_HEIGHT)), "white")
    draw = ImageDraw.Draw(canvas)
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
    for i, (signal, label) in enumerate(zip(signals, labels, strict=True)):
        x0, y0 = (i % columns) * cell, (i // columns) * (cell + LABEL_HEIGHT)
        low, high = float(signal.min()), float(signal.max())
        top, scale = y0 + 2 + (cell - 5) * high / (high - low or 1.0), (cell - 5) / (high - low or 1.0)
        draw.rectangle((x0, y0, x0 + cell - 1, y0 + cell - 1), outline="lightgrey")
        if low < 0 < high:
            draw.line([(x0, top), (x0 + cell - 1, top)], fill="lightgrey")
        step = (cell - 5) / max(1, signal.shape[-1] - 1)
        for channel, values in enumerate(signal[:5]):
            points = [(x0 + 2 + k * step, top - scale * float(v)) for k, v in enumerate(values)]
            draw.line(points, fill=colours[channel], width=1)
        draw.text((x0 + 2, y0 + cell + 1), label[: cell // 6], fill="black")
    return canvas


def confusion_image(matrix: Tensor, class_names: Sequence[str], cell: int = 36) -> Image.Image:
    """Rows are true classes, columns predictions; shade = share of the row, number = count."""
    k = len(matrix)
    margin = 60
    canvas = Image.new("RGB", (margin + k * cell, margin + k * cell), "white")
    draw = ImageDraw.Draw(canvas)
    counts = matrix.cpu().long()
    shares = counts.float() / counts.sum(dim=1, keepdim=True).clamp(min=1)
    draw.text((margin, 2), "predicted ->", fill="black")
    draw.text((2, margin - 14), "true", fill="black")
    for i in range(k):
        draw.text((margin + i * cell + 2, margin - 14), class_names[i][:5], fill="black")
        draw.text((2, margin + i * cell + cell // 3), class_names[i][:9], fill="black")
        for j in range(k):
            level = int(255 * (1 - float(shares[i, j])))
            box = (margin + j * cell, margin + i * cell, margin + (j + 1) * cell - 1, margin + (i + 1) * cell - 1)
            draw.rectangle(box, fill=(level, level, 255), outline="grey")
            draw.text(
                (box[0] + 3, box[1] + cell // 3), str(int(counts[i, j])), fill="black" if level > 100 else "white"
            )
    return canvas


def log_image(trainer: Trainer, key: str, image: Image.Image) -> None:
    """Send a picture to every logger that takes pictures (W&B, TensorBoard)."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[image], step=trainer.global_step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, np.asarray(image), trainer.global_step, dataformats="HWC")


def class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = getattr(trainer.datamodule, "class_names", None)  # type: ignore[attr-defined]
    return list(names) if names else [str(i) for i in range(num_classes)]


class BatchGrid(Callback):
    """Saves the first training batch, augmented and de-normalised, with labels: ``batch_grid.png``.

    Images (B, C, H, W) are drawn as a grid, 1-D samples (B, C, L) or (B, L) as small line plots;
    other inputs are skipped with one line.

    Args:
        max_images: Number of images shown.
        cell: Pixel size of each image in the grid.
    """

    def __init__(self, max_images: int = 32, cell: int = 64) -> None:
        self.max_images = max_images
        self.cell = cell
        self.done = False
        self.path: Path | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.done:
            return
        self.done = True
        if not trainer.is_global_zero:
            return
        x, y = batch[0][: self.max_images].detach().float().cpu(), batch[1][: self.max_images].cpu()
        if x.ndim not in (2, 3, 4):
            shape = tuple(batch[0].shape)
            say(f"BatchGrid: no picture for inputs of shape {shape} (images or 1-D samples only)")
            return
        data = trainer.datamodule  # type: ignore[attr-defined]
        mean = stats_view(getattr(data, "mean", (0.0,)), x.shape[1:], "mean")
        std = stats_view(getattr(data, "std", (1.0,)), x.shape[1:], "std")
        names = class_names(trainer, int(y.max()) + 1)
        labels = [names[i] if i < len(names) else str(i) for i in y.tolist()]
        x = x * std + mean
        if x.ndim == 4:
            image = image_grid(x, labels, cell=self.cell)
        else:
            image = signal_grid(x if x.ndim == 3 else x.unsqueeze(1), labels, cell=self.cell * 3 // 2)
        self.path = Path(trainer.default_root_dir) / "batch_grid.png"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(self.path) as partial:
            image.save(partial)
        log_image(trainer, "batch_grid", image)


class ConfusionMatrixReport(Callback):
    """At test end: ``confusion_matrix-<checkpoint>.png`` in the run folder and the logger, per-class accuracy printed.

    Reads the module's ``test_confusion`` metric (a torchmetrics ``MulticlassConfusionMatrix``,
    synchronised across DDP ranks); modules without one are left alone.
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.matrix: Tensor | None = None

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        metric = getattr(pl_module, "test_confusion", None)
        if metric is None or not metric.update_called:
            return
        self.matrix = metric.compute().cpu()
        metric.reset()
        if not trainer.is_global_zero:
            return
        names = class_names(trainer, len(self.matrix))
        image = confusion_image(self.matrix, names)
        # one file per tested checkpoint: the test after fit may score both the best and the last
        weights = Path(trainer.ckpt_path).stem if trainer.ckpt_path else None
        self.path = Path(trainer.default_root_dir) / f"confusion_matrix{f'-{weights}' if weights else ''}.png"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(self.path) as partial:  # a full disk left a 0-byte PNG
            image.save(partial)
        log_image(trainer, "test/confusion_matrix", image)
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
