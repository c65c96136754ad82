"""Write ``predict`` outputs to a CSV file in the run folder."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import IO, Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor


class PredictionWriter(BasePredictionWriter):
    """One row per sample: dataset index, file path (for data read from files), label (when the batch
    has one), predicted class index and name (when the data names its classes), probabilities.

    Rows are written batch by batch, so memory stays flat and DDP ranks each write their own file
    (``predictions.csv`` on rank 0, ``predictions-rank<N>.csv`` on the others).

    Args:
        output_dir: Folder of the CSV; ``None`` means the run folder (``trainer.default_root_dir``).
        filename: Name of rank 0's file.
    """

    def __init__(self, output_dir: str | None = None, filename: str = "predictions.csv") -> None:
        super().__init__(write_interval="batch")
        self.output_dir = output_dir
        self.filename = filename
        self.path: Path | None = None
        self._partial = Path()
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._rows = 0  # rows written: the dataset index where Lightning knows none
        self._paths: list[Any] | None = None  # the predicted dataset's files, if it reads files
        self._names: list[str] | None = None  # class names, if the data declares them

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = Path(self.output_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        rank = trainer.global_rank
        name = self.filename if rank == 0 else self.filename.replace(".csv", f"-rank{rank}.csv")
        self.path = folder / name
        self._partial = folder / f".{name}.partial"  # renamed when complete: never a half-written file
        self._file = self._partial.open("w", newline="")
        self._writer = csv.writer(self._file)
        self._rows = 0
        loaders = trainer.predict_dataloaders
        self._paths = getattr(getattr(loaders, "dataset", None), "paths", None)
        names = getattr(trainer.datamodule, "class_names", None)  # type: ignore[attr-defined]
        self._names = list(names) if names else None

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        probs: Tensor = prediction.float().cpu()
        paths, names = self._paths, self._names
        if self._file is not None and self._file.tell() == 0:
            columns = [f"p_{name}" for name in names] if names else [f"p{c}" for c in range(probs.shape[1])]
            path = ["path"] if paths is not None else []
            self._writer.writerow(["index", *path, "label", "predicted", *(["class"] if names else []), *columns])
        n = len(probs)
        labels = batch[1].tolist() if isinstance(batch, (tuple, list)) and len(batch) > 1 else [""] * n
        # Lightning gives indices for DataLoaders only; prediction order is never shuffled, so the
        # running count is the dataset index for other iterables (the on-device path)
        indices = list(batch_indices) if batch_indices else list(range(self._rows, self._rows + n))
        self._rows += n
        predicted = probs.argmax(dim=1).tolist()
        for index, label, pred, row in zip(indices, labels, predicted, probs.tolist(), strict=True):
            path = [str(paths[index])] if paths is not None else []
            name = [names[pred]] if names else []
            self._writer.writerow([index, *path, label, pred, *name, *(f"{p:.6f}" for p in row)])

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self._partial.replace(self.path or self._partial)
            if trainer.is_global_zero:
                print(f"predictions: {self.path} ({self._rows} rows)", file=sys.stderr)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._file is not None:  # stopped or failed mid-way: no partial predictions.csv stays behind
            self._file.close()
            self._file = None
            self._partial.unlink(missing_ok=True)
