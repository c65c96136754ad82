"""Hugging Face ``datasets``: a ``save_to_disk`` folder, parquet files, or a dataset in the local cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse.typing import PositiveInt
from torch import Tensor

from kiln.data.base import TensorDataModule
from kiln.data.datasets import SampleDataset
from kiln.data.folder import imagenet_stats, pixels
from kiln.data.splits import stratified_split
from kiln.errors import DataError, MissingDataError

SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid"), "test": ("test",)}


class HFSamples(SampleDataset):
    """Rows of an Arrow-backed (memory-mapped) dataset, read when a batch asks for them."""

    def __init__(self, table: Any, column: str, labels: Tensor, image: tuple[int, tuple[int, int]] | None, **kwargs):
        shape = (image[0], *image[1]) if image else tuple(torch.as_tensor(table[0][column]).shape)
        super().__init__(labels, shape, **kwargs)
        self.table, self.column, self.image = table, column, image

    def _gather(self, index: Tensor) -> Tensor:
        values = self.table[index.tolist()][self.column]
        if self.image is not None:
            return torch.stack([pixels(value, *self.image) for value in values])
        return torch.stack([torch.as_tensor(value, dtype=torch.float32) for value in values])


class HFDataModule(TensorDataModule):
    """A classification dataset of Hugging Face ``datasets``, read lazily from its Arrow files.

    Images (a ``datasets.Image`` column) are converted and resized per batch; any other input
    column (lists or arrays of numbers: signals, features) is taken as float tensors of its own
    shape. Class names come from a ``ClassLabel`` column, or the sorted label values. Splits named
    ``train``, ``validation``/``val`` and ``test`` are used as given; missing ones are split off
    the training rows, seeded and stratified.

    Args:
        path: A folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``.
        data_files: Parquet files instead: one path or glob, or ``{split: path or glob}``.
        name: A dataset name for ``datasets.load_dataset``, read from the local cache (set
            ``HF_DATASETS_OFFLINE=1`` to keep it from the network).
        input_column: The column holding images or arrays.
        label_column: The column holding class labels (``ClassLabel``, integers or strings).
        image_size: Height and width images are resized to (image columns only).
        channels: 3 (RGB) or 1 (grey-scale) for images.
        val_fraction: Share of each class split off for validation when there is no such split.
        test_fraction: Share of each class split off for the test when there is no such split.
        split_seed: Seed of those splits.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        data_files: str | dict[str, str] | None = None,
        name: str | None = None,
        input_column: str = "image",
        label_column: str = "label",
        image_size: PositiveInt | tuple[PositiveInt, PositiveInt] = 64,
        channels: Literal[1, 3] = 3,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        given = [k for k, v in (("path", path), ("data_files", data_files), ("name", name)) if v is not None]
        if len(given) != 1:
            raise DataError(f"data: give one of data.init_args.path, data_files or name (given: {given or 'none'})")
        self.splits_found = self._open(path, data_files, name)
        train = self.splits_found.get("train")
        if train is None:
            raise DataError(f"data: no train split among {sorted(self.splits_found)}")
        for column in (input_column, label_column):
            if column not in train.column_names:
                raise DataError(f"data: no column {column!r} (columns: {', '.join(train.column_names)}); "
                                "set data.init_args.input_column / label_column")  # fmt: skip
        feature = train.features[input_column]
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.image = (channels, size) if type(feature).__name__ == "Image" else None
        if self.image is not None:
            self.default_mean, self.default_std = imagenet_stats(channels)
        super().__init__(**kwargs)
        self.input_column, self.label_column = input_column, label_column
        self.fractions, self.split_seed = (val_fraction, test_fraction), split_seed
        self._read_classes(label_column)
        first = train[0][input_column]
        self.input_shape = (channels, *size) if self.image else tuple(torch.as_tensor(first).shape)

    def _read_classes(self, label_column: str) -> None:
        """The classes from the label column: a ClassLabel's names, integers 0..max, or the sorted strings."""
        names = getattr(self.splits_found["train"].features[label_column], "names", None)  # a ClassLabel column's
        values = sorted({v for split in self.splits_found.values() for v in split[label_column]})
        if any(isinstance(v, float) and not v.is_integer() for v in values):  # would be one class per value
            raise DataError(f"data: the label column {label_column!r} holds real values ({values[0]}, …); "
                            "HFDataModule reads class labels: for a regression, a TensorDataModule of your own "
                            "(README: A dataset)")  # fmt: skip
        self._codes = None  # label strings to class indices, for string labels
        if names is None and all(isinstance(v, int) for v in values):
            names = [str(i) for i in range(int(max(values)) + 1)]
        elif names is None:
            names = [str(v) for v in values]
            self._codes = {v: i for i, v in enumerate(values)}
        self.class_names = tuple(names)
        self.num_classes = len(names)

    @staticmethod
    def _open(path: str | Path | None, data_files: str | dict[str, str] | None, name: str | None) -> dict[str, Any]:
        """The splits, by kiln's names (train, val, test)."""
        import datasets  # an optional dependency (the `data` extra): imported when used

        try:
            if path is not None:
                loaded = datasets.load_from_disk(str(path))
            elif data_files is not None:
                loaded = datasets.load_dataset("parquet", data_files=data_files)
            else:
                loaded = datasets.load_dataset(name)
        except (FileNotFoundError, ConnectionError, ValueError) as err:
            what = path or data_files or name
            raise MissingDataError(f"data: cannot read the dataset {what} ({str(err).splitlines()[0]})") from None
        if isinstance(loaded, datasets.Dataset):
            return {"train": loaded}
        found = {}
        for ours, theirs in SPLIT_NAMES.items():
            split = next((s for s in theirs if s in loaded), None)
            if split is not None:
                found[ours] = loaded[split]
        return found

    def _labels(self, table: Any) -> Tensor:
        values = table[self.label_column]
        return torch.tensor([self._codes[v] for v in values] if self._codes else values, dtype=torch.long)

    def _samples(self, table: Any, train: bool) -> HFSamples:
        return HFSamples(table, self.input_column, self._labels(table), self.image, **self.sample_options(train))

    def load(self) -> None:
        splits = dict(self.splits_found)
        missing = [s for s in ("val", "test") if s not in splits]
        if missing:
            fractions = [self.fractions[0] if s == "val" else self.fractions[1] for s in missing]
            train = splits["train"]
            parts = stratified_split(self._labels(train).tolist(), fractions, self.split_seed)
            splits["train"] = train.select(parts[0])
            for split, part in zip(missing, parts[1:], strict=True):
                splits[split] = train.select(part)
        self.train_set = self._samples(splits["train"], train=True)
        self.val_set = self._samples(splits["val"], train=False)
        self.test_set = self._samples(splits["test"], train=False)
