"""Write ``predict`` outputs to a CSV file in the run folder, for any task."""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor

from kiln.errors import UsageError
from kiln.training.contracts import WritesPredictions, declared_classes, declared_names

MOST_COLUMNS = 64  # values per sample written as columns of their own; more need the module's prediction_columns


def _values(name: str, values: Any, n: int) -> dict[str, list[Any]]:
    """Columns for ``n`` samples' values: one column for one value each, ``name_i`` for a few each."""
    if not isinstance(values, Tensor) or len(values) != n:
        return {}
    flat = values.detach().float().cpu().reshape(n, -1) if values.is_floating_point() else values.cpu().reshape(n, -1)
    if flat.shape[1] > MOST_COLUMNS:
        shape = tuple(values.shape[1:])
        raise UsageError(
            f"PredictionWriter: {name}s of {flat.shape[1]} values per sample (shape {shape}) make no CSV columns: "
            "give the LightningModule prediction_columns(prediction, batch) returning the columns to write "
            "(kiln.training.contracts)"
        )
    rows = flat.tolist()
    if flat.shape[1] == 1:
        return {name: [_cell(row[0]) for row in rows]}
    return {f"{name}_{i}": [_cell(row[i]) for row in rows] for i in range(flat.shape[1])}


def _cell(value: Any) -> Any:
    return f"{value:.6g}" if isinstance(value, float) else value


def class_columns(probs: Tensor, labels: Any, names: list[str] | None) -> dict[str, list[Any]]:
    """A classifier's row: its label (when the batch has one), predicted class index and name, probabilities."""
    probs = probs.detach().float().cpu()
    n, predicted = len(probs), probs.argmax(dim=1).tolist()
    columns: dict[str, list[Any]] = {"label": labels.tolist() if isinstance(labels, Tensor) else [""] * n}
    columns["predicted"] = predicted
    if names:
        columns["class"] = [names[i] for i in predicted]
    keys = [f"p_{name}" for name in names] if names else [f"p{c}" for c in range(probs.shape[1])]
    for key, values in zip(keys, probs.T.tolist(), strict=True):
        columns[key] = [f"{p:.6f}" for p in values]
    return columns


def columns_of(module: LightningModule, trainer: Trainer, prediction: Any, batch: Any) -> Mapping[str, Sequence[Any]]:
    """What a batch's predictions write: the module's own columns, a classifier's, or values for anything else."""
    if isinstance(module, WritesPredictions):
        return module.prediction_columns(prediction, batch)
    target = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else None
    classes = declared_classes(trainer)
    if isinstance(prediction, Tensor) and prediction.ndim == 2 and classes == prediction.shape[1]:
        return class_columns(prediction, target, declared_names(trainer))
    n = len(prediction) if isinstance(prediction, Tensor) and prediction.ndim else 0
    return {**_values("target", target, n), **_values("prediction", prediction, n)}


class PredictionWriter(BasePredictionWriter):
    """One row per sample: dataset index, file path (for data read from files), then the module's own columns
    (``prediction_columns``, kiln.training.contracts), or for a classifier (data that declares classes, a
    prediction per class) label, predicted class index and name, probabilities, or for anything else the
    target and the prediction, a column per value (``prediction``, or ``prediction_0``, ``prediction_1``, …).

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
        columns = columns_of(pl_module, trainer, prediction, batch)
        n = len(next(iter(columns.values()))) if columns else 0
        if self._file is not None and self._file.tell() == 0:
            path = ["path"] if self._paths is not None else []
            self._writer.writerow(["index", *path, *columns])
        # Lightning gives indices for DataLoaders only; prediction order is never shuffled, so the
        # running count is the dataset index for other iterables (the on-device path)
        indices = list(batch_indices) if batch_indices else list(range(self._rows, self._rows + n))
        self._rows += n
        for i, index in enumerate(indices):
            path = [str(self._paths[index])] if self._paths is not None else []
            self._writer.writerow([index, *path, *(values[i] for values in columns.values())])

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
