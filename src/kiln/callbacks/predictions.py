"""Write ``predict`` outputs to a CSV file in the run folder, for any task."""

from __future__ import annotations

import csv
import heapq
import sys
from collections.abc import Iterator, Mapping, Sequence, Sized
from itertools import chain
from pathlib import Path
from typing import IO, Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from torch import Tensor
from torch.utils.data import DistributedSampler

from kiln.callbacks.prediction_arrays import MOST_COLUMNS, ArrayRows, dense, map_classes
from kiln.errors import UsageError
from kiln.training.contracts import WritesPredictions, declared_classes, declared_names


def _values(name: str, values: Any, n: int) -> dict[str, list[Any]]:
    """Columns for ``n`` samples' values: one column for one value each, ``name_i`` for a few each (none for more:
    :func:`rows_of` gives those as arrays)."""
    if not isinstance(values, Tensor) or len(values) != n or dense(values, n):
        return {}
    flat = values.detach().float().cpu().reshape(n, -1) if values.is_floating_point() else values.cpu().reshape(n, -1)
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


Rows = tuple[Mapping[str, Sequence[Any]], dict[str, Tensor]]  # CSV columns, and arrays too large a sample for them


def rows_of(module: LightningModule, trainer: Trainer, prediction: Any, batch: Any) -> Rows:
    """What a batch's predictions write: the module's own columns, a classifier's, or values for anything else, those
    of more than ``MOST_COLUMNS`` values a sample (a mask, a reconstruction) as arrays."""
    if isinstance(module, WritesPredictions):
        return module.prediction_columns(prediction, batch), {}
    target = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else None
    classes = declared_classes(trainer)
    if isinstance(prediction, Tensor) and prediction.ndim == 2 and classes == prediction.shape[1]:
        return class_columns(prediction, target, declared_names(trainer)), {}
    outputs = _outputs(prediction)
    n = len(next(iter(outputs.values()))) if outputs else 0
    if not n or any(len(values) != n for values in outputs.values()):
        raise UsageError(
            f"PredictionWriter: predict_step returned {_kind(prediction)}, which makes no rows: return a tensor, or a "
            "tuple or dict of tensors, with one row per sample, or give the LightningModule "
            "prediction_columns(prediction, batch) returning the columns to write (kiln.training.contracts)"
        )
    found = {"target": target, **outputs}
    columns = {key: column for name, values in found.items() for key, column in _values(name, values, n).items()}
    return columns, {name: values for name, values in found.items() if isinstance(values, Tensor) and dense(values, n)}


def _outputs(prediction: Any) -> dict[str, Tensor]:
    """A prediction's outputs by column name: a tensor's ``prediction``, a dict's keys, a tuple's ``prediction<k>``;
    none when any part is not a tensor of one row per sample."""
    if isinstance(prediction, Mapping):
        named = {str(key): value for key, value in prediction.items()}
    elif isinstance(prediction, list | tuple):
        named = {f"prediction{k}": value for k, value in enumerate(prediction)}
    else:
        named = {"prediction": prediction}
    return named if all(isinstance(v, Tensor) and v.ndim for v in named.values()) else {}


def _kind(prediction: Any) -> str:
    if isinstance(prediction, Tensor):
        return f"a tensor of shape {tuple(prediction.shape)}"
    return f"a {type(prediction).__name__}" + (f" of {len(prediction)}" if isinstance(prediction, Sized) else "")


class PredictionWriter(BasePredictionWriter):
    """One row per sample: dataset index, file path (for data read from files), then the module's own columns
    (``prediction_columns``, kiln.training.contracts), or for a classifier (data that declares classes, a
    prediction per class) label, predicted class index and name, probabilities, or for anything else the
    target and the prediction, a column per value (``prediction``, or ``prediction_0``, ``prediction_1``, …).

    Rows are written batch by batch, so memory stays flat. Under DDP each rank writes its share, then rank 0 merges
    them into one file in dataset order (each sample once); a rank file rank 0 cannot see (another machine's disk)
    stays as ``predictions-rank<N>.csv``, and the last line says so.

    Args:
        output_dir: Folder of the CSV; ``None`` means the run folder (``trainer.default_root_dir``).
        filename: Name of the CSV.
        class_maps: For data that declares classes, also write each sample's class map (a segmentation's logits
            ``(classes, H, W)`` by their argmax, or its ``(H, W)`` class indices) as a PNG, ``predictions-<output>/
            <row>.png``: a pixel's value is its class, shown in a colour a class.
    """

    def __init__(self, output_dir: str | None = None, filename: str = "predictions.csv", class_maps: bool = False):
        super().__init__(write_interval="batch")
        self.output_dir = output_dir
        self.filename, self.class_maps = filename, class_maps
        self.path: Path | None = None
        self._partial = Path()
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._rows = 0  # rows written: the dataset index where Lightning knows none
        self._paths: list[Any] | None = None  # the predicted dataset's files, if it reads files
        self._order: list[int] | None = None  # this rank's dataset indices in order, where its sampler says them
        self._ranks = 1
        self._arrays: ArrayRows | None = None  # outputs of too many values a sample for CSV columns

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = Path(self.output_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        rank, self._ranks = trainer.global_rank, trainer.world_size
        name = self.filename if rank == 0 else rank_file(self.filename, rank)
        self.path = folder / name
        self._partial = folder / f".{name}.partial"  # renamed when complete: never a half-written file
        self._file = self._partial.open("w", newline="")
        self._writer = csv.writer(self._file)
        self._rows = 0
        self._arrays = ArrayRows(folder, Path(self.filename).stem, map_classes(trainer, self.class_maps))
        loaders = trainer.predict_dataloaders
        self._paths = getattr(getattr(loaders, "dataset", None), "paths", None)
        sampler = getattr(loaders, "sampler", None)  # an on-device loader's EvaluationShard under DDP
        self._order = list(sampler) if isinstance(sampler, DistributedSampler) and not sampler.shuffle else None

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
        columns, arrays = rows_of(pl_module, trainer, prediction, batch)
        if arrays:
            columns = self._with_arrays(columns, arrays)
        n = len(next(iter(columns.values()))) if columns else 0
        indices = self._indices(batch_indices, n)
        if lengths := {name: len(values) for name, values in columns.items() if len(values) != len(indices)}:
            raise UsageError(
                f"PredictionWriter: for a batch of {len(indices)} samples, {type(pl_module).__name__}'s columns have "
                f"other lengths ({', '.join(f'{k}: {v}' for k, v in lengths.items())}): give prediction_columns one "
                "value per sample in every column"
            )
        if self._file is not None and self._file.tell() == 0:
            path = ["path"] if self._paths is not None else []
            self._writer.writerow(["index", *path, *columns])
        self._rows += n
        for i, index in enumerate(indices):
            path = [str(self._paths[index])] if self._paths is not None and index != "" else []
            self._writer.writerow([index, *path, *(values[i] for values in columns.values())])

    def _with_arrays(self, columns: Mapping[str, Sequence[Any]], arrays: dict[str, Tensor]) -> dict[str, Sequence[Any]]:
        """Keep ``arrays`` (a mask, a reconstruction) in ``.npy`` files; the CSV row says which row of them."""
        if self._ranks > 1:
            raise UsageError(f"PredictionWriter: {', '.join(arrays)} of more than {MOST_COLUMNS} values a sample go "
                             "to .npy files on one process: run kiln predict with --trainer.devices 1")  # fmt: skip
        assert self._arrays is not None
        self._arrays.add(arrays)
        n = len(next(iter(arrays.values())))
        return {"array_row": list(range(self._rows, self._rows + n)), **columns}

    def _indices(self, batch_indices: Any, n: int) -> list[Any]:
        """Dataset indices of a batch: Lightning's (DataLoaders), else the sampler's order, else (one process,
        prediction order is never shuffled) the running count; under DDP without either, none ("")."""
        if batch_indices:
            return list(batch_indices)
        if self._order is not None:
            return self._order[self._rows : self._rows + n]
        return list(range(self._rows, self._rows + n)) if self._ranks == 1 else [""] * n

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._file is None or self.path is None:
            return
        self._file.close()
        self._file = None
        if self._ranks == 1:
            self._partial.replace(self.path)
            arrays = self._arrays.finish() if self._arrays is not None else []
            beside = f"; arrays beside it: {', '.join(arrays)}" if arrays else ""
            print(f"predictions: {self.path} ({self._rows} rows{beside})", file=sys.stderr)
            return
        if not trainer.is_global_zero:
            self._partial.replace(self.path)  # this rank's share, complete
        trainer.strategy.barrier()  # every rank's share complete before rank 0 reads them
        if trainer.is_global_zero:  # its own share stays partial: predictions.csv is only ever the whole
            print(merged_line(self.path, self._partial, self._ranks), file=sys.stderr)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._file is not None:  # stopped or failed mid-way: no partial predictions.csv stays behind
            self._file.close()
            self._file = None
            self._partial.unlink(missing_ok=True)
        if self._arrays is not None:
            self._arrays.discard()


def rank_file(filename: str, rank: int) -> str:
    return filename.replace(".csv", f"-rank{rank}.csv")


def merged_line(path: Path, own: Path, ranks: int) -> str:
    """Rank 0's line, once its share (``own``) and every rank's file it can see are merged into ``path``."""
    parts = [path.with_name(rank_file(path.name, r)) for r in range(1, ranks)]
    seen = [p for p in parts if p.exists()]
    merged, order = merge_rank_files(path, [own, *seen])
    for part in [own, *seen]:
        part.unlink()
    line = f"predictions: {path} ({merged} rows from {len(seen) + 1} of {ranks} ranks, {order})"
    missing = [p.name for p in parts if p not in seen]
    return line + (f"; not on this disk: {', '.join(missing)} (written on their ranks' machines)" if missing else "")


def merge_rank_files(path: Path, parts: list[Path]) -> tuple[int, str]:
    """The ranks' files ``parts`` into ``path``, each sample once (a padded sampler repeats some): by dataset index,
    or rank by rank where rows have no index. Returns the rows written and the order they are in."""
    files = [p.open(newline="") for p in parts]
    try:
        readers = [csv.reader(f) for f in files]
        headers = [next(r, None) for r in readers]
        firsts = [next(r, None) for r in readers]
        tables = [_rows(first, reader) for first, reader in zip(firsts, readers, strict=True)]
        indexed = all(first is None or first[0] != "" for first in firsts)
        rows = _once(heapq.merge(*tables, key=lambda row: int(row[0]))) if indexed else chain(*tables)
        partial = path.with_name(f".{path.name}.merged.partial")
        count, last, ascending = 0, -1, True
        with partial.open("w", newline="") as out:
            writer = csv.writer(out)
            header = next((h for h in headers if h), None)  # none: no rank predicted anything, an empty file
            if header is not None:
                writer.writerow(header)
            for row in rows:
                writer.writerow(row)
                count += 1
                if indexed:
                    ascending, last = ascending and int(row[0]) > last, int(row[0])
        partial.replace(path)
    finally:
        for f in files:
            f.close()
    if not indexed:
        return count, "rank by rank: the loader gives no dataset index"
    return count, "in dataset order" if ascending else "by index as each rank's sampler ordered them"


def _rows(first: list[str] | None, rest: Iterator[list[str]]) -> Iterator[list[str]]:
    if first is not None:
        yield first
        yield from rest


def _once(rows: Iterator[list[str]]) -> Iterator[list[str]]:
    """Each index once: a padded sampler's repeat is the same sample, predicted again (possibly last of its rank)."""
    seen: set[str] = set()
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            yield row
