"""Pictures a user should look at: the first training batch as the net sees it, and the test confusion matrix
(drawn by ``kiln.runs.figures``, whose matplotlib is imported only when a picture is made)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer
from PIL import Image
from rich.console import Console
from rich.table import Table
from torch import Tensor

from kiln.console import LOG, say
from kiln.data.on_device import stats_view
from kiln.runs import figures


def log_image(trainer: Trainer, key: str, png: bytes) -> None:
    """Send a picture (PNG bytes) to every logger that takes pictures (W&B, TensorBoard)."""
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    takers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger | TensorBoardLogger)]
    image = Image.open(io.BytesIO(png)).convert("RGB") if takers else None
    for logger in takers:
        if isinstance(logger, WandbLogger):
            logger.log_image(key=key, images=[image], step=trainer.global_step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, np.asarray(image), trainer.global_step, dataformats="HWC")


def denormalised(trainer: Trainer, x: Tensor) -> Tensor:
    """A batch of samples as they were before the datamodule's normalisation: what a person can look at."""
    data = trainer.datamodule  # type: ignore[attr-defined]
    mean = stats_view(getattr(data, "mean", (0.0,)), x.shape[1:], "mean")
    std = stats_view(getattr(data, "std", (1.0,)), x.shape[1:], "std")
    return x * std + mean


def class_names(trainer: Trainer, num_classes: int) -> list[str]:
    names = getattr(trainer.datamodule, "class_names", None)  # type: ignore[attr-defined]
    return list(names) if names else [str(i) for i in range(num_classes)]


class BatchGrid(Callback):
    """Saves the first training batch, augmented and de-normalised, with labels: ``batch_grid.png``.

    Images (B, C, H, W) are drawn as a grid, 1-D samples (B, C, L) or (B, L) as small line plots;
    other inputs are skipped with one line.

    Args:
        max_images: Number of images shown.
        cell: Size of each image in the saved picture, in pixels (1-D samples get 1.5 times that).
    """

    def __init__(self, max_images: int = 32, cell: int = 96) -> None:
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
        names = class_names(trainer, int(y.max()) + 1)
        labels = [names[i] if i < len(names) else str(i) for i in y.tolist()]
        x = denormalised(trainer, x)
        if x.ndim == 4:
            figure = figures.image_grid(x, labels, cell=self.cell / figures.DPI)
        else:
            figure = figures.signal_grid(
                x if x.ndim == 3 else x.unsqueeze(1), labels, cell=1.5 * self.cell / figures.DPI
            )
        self.path = Path(trainer.default_root_dir) / "batch_grid.png"
        log_image(trainer, "batch_grid", figures.save(figure, self.path))


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
        # one file per tested checkpoint: the test after fit may score both the best and the last
        weights = Path(trainer.ckpt_path).stem if trainer.ckpt_path else None
        correct, total = int(self.matrix.diagonal().sum()), int(self.matrix.sum())
        title = f"test: {correct} of {total} right ({correct / max(total, 1):.4f}), weights {weights or 'in memory'}"
        self.path = Path(trainer.default_root_dir) / f"confusion_matrix{f'-{weights}' if weights else ''}.png"
        image = figures.save(figures.confusion_figure(self.matrix, names, title), self.path)
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
