"""Predictions with too many values a sample for CSV columns (a mask, a reconstruction), kept as ``.npy`` arrays,
and a segmentation's class maps as images too."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kiln.files import MOST_COLUMNS
from kiln.images import class_maps
from kiln.training.contracts import declared_classes


def dense(values: Any, n: int) -> bool:
    """Whether ``n`` samples' values hold too many a sample for CSV columns (an array file keeps them)."""
    return isinstance(values, Tensor) and len(values) == n and values[0].numel() > MOST_COLUMNS


class ArrayRows:
    """Each output's rows, batch by batch into a staging folder (memory stays one batch), joined at the end into
    ``<stem>-<name>.npy`` beside the CSV: row ``i`` of every array is the CSV's ``array_row`` ``i``."""

    def __init__(self, folder: Path, stem: str, classes: int | None = None) -> None:
        """``classes``: the data's number of classes, for class maps as images (``class_maps``); None for none."""
        self.folder, self.stem, self.classes = folder, stem, classes
        self.staging = folder / f".{stem}-arrays.partial"
        self.batches: dict[str, list[Path]] = {}

    def add(self, arrays: dict[str, Tensor]) -> None:
        self.staging.mkdir(exist_ok=True)
        for name, values in arrays.items():
            batch = self.staging / f"{name}-{len(self.batches.get(name, []))}.npy"
            values = values.detach().cpu()
            np.save(batch, (values.float() if values.dtype == torch.bfloat16 else values).numpy())  # numpy has no bf16
            self.batches.setdefault(name, []).append(batch)

    def finish(self) -> list[str]:
        """Join each output's batches into its file; what was written, in words."""
        written = []
        for name, batches in self.batches.items():
            parts = [np.load(b, mmap_mode="r") for b in batches]
            path = self.folder / f"{self.stem}-{name}.npy"
            partial = path.with_name(f".{path.name}.partial")
            joined = np.lib.format.open_memmap(partial, mode="w+", dtype=parts[0].dtype,
                                               shape=(sum(len(p) for p in parts), *parts[0].shape[1:]))  # fmt: skip
            start = 0
            for part in parts:
                joined[start : start + len(part)] = part
                start += len(part)
            joined.flush()
            del joined
            partial.replace(path)
            written.append(f"{path.name} {tuple(int(d) for d in (start, *parts[0].shape[1:]))}")
            if self.classes is not None and (maps := class_maps(path, self.classes)):
                written.append(f"{maps} class maps in {path.stem}/")
        self.discard()
        return written

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.batches = {}


def map_classes(trainer: Any, wanted: bool) -> int | None:
    """The data's classes, where class maps are ``wanted``: data that declares none gets one line."""
    if not wanted:
        return None
    if (count := declared_classes(trainer)) is None:
        print("PredictionWriter: class_maps needs data that declares num_classes; no class maps", file=sys.stderr)
    return count
