"""Your own images: a folder per class (torchvision's ImageFolder layout) or a CSV/JSON listing, decoded lazily."""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, cast

import torch
from jsonargparse.typing import PositiveInt
from lightning.fabric.utilities.rank_zero import rank_zero_only
from PIL import Image
from torch import Tensor
from torch.utils.data import DataLoader

from kiln.data.base import TensorDataModule
from kiln.data.datasets import SampleDataset
from kiln.data.splits import stratified_split
from kiln.errors import ConfigError, DataError
from kiln.images import IMAGE_SUFFIXES, decoded, image_files, pixel_array

SPLITS = ("train", "val", "test")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
Files = list[tuple[Path, int]]  # (image file, class index)


def imagenet_stats(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet's per-channel mean and std (their average for grey-scale): the usual start for photos."""
    if channels == 3:
        return IMAGENET_MEAN, IMAGENET_STD
    return (sum(IMAGENET_MEAN) / 3,), (sum(IMAGENET_STD) / 3,)


def pixels(image: Image.Image, channels: int, size: tuple[int, int]) -> Tensor:
    """A Pillow image as uint8 ``(channels, *size)`` (``kiln.images.pixel_array``, which ``kiln infer`` uses too)."""
    return torch.from_numpy(pixel_array(image, channels, size))


def decode(path: Path, channels: int, size: tuple[int, int]) -> Tensor:
    """One image file as uint8 ``(channels, *size)`` (``kiln.images.decoded``, which ``kiln infer`` uses
    too); one that does not decode raises ``DataError`` naming it."""
    return torch.from_numpy(decoded(path, channels, size)[0])


@rank_zero_only
def _say(*lines: str) -> None:
    """Notices about the data, once (not once per DDP rank)."""
    print(*lines, sep="\n", file=sys.stderr)


class ImageFiles(SampleDataset):
    """Image files decoded (and resized) when a batch asks for them; ``labels=None`` for unlabelled images."""

    def __init__(
        self, files: Sequence[Path], labels: Tensor | None, channels: int, size: tuple[int, int], **kwargs
    ) -> None:
        super().__init__(labels, (channels, *size), **kwargs)
        self.paths, self.channels, self.size = list(files), channels, size

    def __len__(self) -> int:
        return len(self.paths)

    def _gather(self, index: Tensor) -> Tensor:
        return torch.stack([decode(self.paths[i], self.channels, self.size) for i in index.tolist()])


class FolderDataModule(TensorDataModule):
    """Images in class folders or a listing file, split, checked and decoded on the fly.

    Layouts: ``root/<class>/*.png`` (split here: seeded and stratified by class), or
    ``root/train/<class>/…``, ``root/val/<class>/…`` and optionally ``root/test/<class>/…``; or a
    ``listing`` file. Class names come from the folder names (or the listing's labels), sorted.
    Before training, one scan decodes every file and names, one line each, unreadable or truncated
    files, empty classes and strongly imbalanced classes.

    Args:
        root: The folder of class folders (or of ``train/``, ``val/``, ``test/`` folders).
        listing: Instead of class folders: a ``.csv`` with ``path,label`` columns or a ``.json``
            list of ``{"path": …, "label": …}``; paths relative to the listing's folder, labels are
            class names.
        image_size: Height and width every image is resized to (one number: square).
        channels: 3 (RGB) or 1 (grey-scale): what every image is converted to.
        val_fraction: Share of each class used for validation, when the folders give no split.
        test_fraction: Share of each class held out for the test, when the folders give none.
        split_seed: Seed of that split.
        on_bad_file: ``fail`` (stop, naming every bad file) or ``skip`` (train on the rest, and say
            how many were left out). Empty classes count as bad files: ``skip`` drops them.
        imbalance: Warn when the largest class has more than this many times the images of the smallest.
        scan: Decode every file once before training (off: a bad file stops the run when its
            batch comes, for a large dataset you trust).
        cache: Decode once into memory as uint8 at ``image_size``; the on-device path then applies.
        predict_dir: Unlabelled images (every image file below it) for ``kiln predict``; ``None``
            predicts the test split. With it, predicting reads neither ``root`` nor ``listing``.
        classes: The class names in label order; ``None``: the folder names (or listing labels),
            sorted. A run records the ones it found here, so its checkpoint predicts with them
            even where the training images are gone, and a later scan that finds others stops.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    def __init__(
        self,
        root: str | Path | None = None,
        listing: str | Path | None = None,
        image_size: PositiveInt | tuple[PositiveInt, PositiveInt] = 64,
        channels: Literal[1, 3] = 3,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        on_bad_file: Literal["fail", "skip"] = "fail",
        imbalance: float = 10.0,
        scan: bool = True,
        cache: bool = False,
        predict_dir: str | Path | None = None,
        classes: list[str] | None = None,
        **kwargs,
    ) -> None:
        if (root is None) == (listing is None):
            raise ConfigError("data: give either data.init_args.root (class folders) or data.init_args.listing")
        self.default_mean, self.default_std = imagenet_stats(channels)  # data.mean/std: None (the CLI's) uses them
        super().__init__(**kwargs)
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.input_shape = (channels, *size)
        self.size, self.channels = size, channels
        self.fractions = (val_fraction, test_fraction)
        self.split_seed, self.on_bad_file, self.imbalance = split_seed, on_bad_file, imbalance
        self.scan, self.cache = scan, cache
        self.predict_dir = Path(predict_dir) if predict_dir is not None else None
        self.source = (Path(listing), "listing") if listing is not None else (Path(root), "root")  # type: ignore[arg-type]
        self.splits: dict[str, Files] | None = None
        if classes is None:  # the folders name them: read now, the model's size depends on them
            self.splits = self._scan()
        else:
            self.class_names, self.empty_classes = tuple(classes), cast(list[str], [])
        self.hparams["classes"] = list(self.class_names or ())  # what the checkpoint keeps
        self.num_classes = len(self.class_names or ())
        self.predict_set: ImageFiles | None = None

    def _scan(self) -> dict[str, Files]:
        """The labelled files of each split; the class names found must be those given (``classes``)."""
        given = getattr(self, "class_names", None)
        path, kind = self.source
        splits = self._listed(path) if kind == "listing" else self._folders(path)
        if given is not None and tuple(self.class_names or ()) != given:
            found = tuple(self.class_names or ())
            raise DataError(
                f"data.{kind}: {path} now holds classes {list(found)}, the run was trained on {list(given)} "
                "(data.init_args.classes): restore them, or train a new model on these"
            )
        return splits

    def _folders(self, root: Path) -> dict[str, Files]:
        """The files of each split given by folders (``train``/``val``/``test``), or of ``all``."""
        if not root.is_dir():
            raise DataError(f"data.root: {root.resolve()} is not a folder")
        split_dirs = {name: root / name for name in SPLITS if (root / name).is_dir()}
        if split_dirs and "train" not in split_dirs:
            raise DataError(f"{root}: has {', '.join(split_dirs)} folders but no train/; add it, or use class folders")
        top = split_dirs.get("train", root)
        names = sorted(p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not names:
            raise DataError(f"{top}: no class folders (expected {top}/<class name>/<images>)")
        folders = split_dirs or {"all": root}
        found = {split: {c: image_files(folder / c) for c in names} for split, folder in folders.items()}
        self.empty_classes = [c for c in names if not found["train" if split_dirs else "all"][c]]
        for folder in split_dirs.values():
            unknown = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name not in names)
            if unknown:
                raise DataError(f"{folder}: class folders {unknown} are not in {top}; every split needs the same ones")
        if self.on_bad_file == "skip":
            names = [c for c in names if c not in self.empty_classes]
        self.class_names = tuple(names)
        return {split: [(f, names.index(c)) for c in names for f in files[c]] for split, files in found.items()}

    def _listed(self, listing: Path) -> dict[str, Files]:
        """The files and labels of a CSV (``path,label``) or JSON listing, as one ``all`` split."""
        if not listing.is_file():
            raise DataError(f"data.listing: {listing.resolve()} does not exist")
        if listing.suffix.lower() == ".json":
            rows = [(str(r["path"]), str(r["label"])) for r in json.loads(listing.read_text())]
        else:
            with listing.open(newline="") as f:
                reader = csv.DictReader(f)
                if not reader.fieldnames or not {"path", "label"} <= set(reader.fieldnames):
                    raise DataError(f"{listing}: needs a header with columns path,label (found {reader.fieldnames})")
                rows = [(r["path"], r["label"]) for r in reader]
        self.empty_classes = []
        self.class_names = tuple(sorted({label for _, label in rows}))
        return {"all": [(listing.parent / path, self.class_names.index(label)) for path, label in rows]}

    def _split(self, files: Files, fractions: Sequence[float]) -> list[Files]:
        parts = stratified_split([c for _, c in files], fractions, self.split_seed)
        return [[files[i] for i in part] for part in parts]

    def _splits(self) -> dict[str, Files]:
        """train/val/test as the folders give them, else split here; a missing test/ is held out of train/."""
        if self.splits is None:
            self.splits = self._scan()
        if "all" in self.splits:
            return dict(zip(SPLITS, self._split(self.splits["all"], self.fractions), strict=True))
        splits = dict(self.splits)
        if "test" not in splits:
            splits["train"], splits["test"] = self._split(splits["train"], self.fractions[1:])
            _say(f"{type(self).__name__}: no test/ folder: {self.fractions[1]:.0%} of each class in train/ is held "
                 f"out as the test split (split_seed {self.split_seed})")  # fmt: skip
        return splits

    def _checked(self, splits: dict[str, Files]) -> tuple[dict[str, Files], dict[Path, Tensor]]:
        """Decode every file once: the bad ones, empty and imbalanced classes, one line each."""
        problems = [f"class {c!r} has no images" for c in self.empty_classes]
        decoded: dict[Path, Tensor] = {}
        bad: set[Path] = set()
        if self.scan or self.cache:
            for path, _ in (item for files in splits.values() for item in files):
                try:
                    image = decode(path, self.channels, self.size)
                except DataError as err:
                    problems.append(str(err))
                    bad.add(path)
                    continue
                if self.cache:
                    decoded[path] = image
        if problems and self.on_bad_file == "fail":
            lines = "\n".join(problems)
            raise DataError(
                f"{lines}\n{type(self).__name__}: {len(problems)} problem(s) above; fix them, or set "
                "data.init_args.on_bad_file=skip to train on the rest"
            )
        if problems:
            _say(f"{type(self).__name__}: skipped {len(bad)} unreadable file(s) and {len(self.empty_classes)} empty "
                 "class(es):", *problems)  # fmt: skip
        kept = {split: [item for item in files if item[0] not in bad] for split, files in splits.items()}
        counts = Counter(c for files in kept.values() for _, c in files)
        if counts:
            (big, most), (small, least) = counts.most_common()[0], counts.most_common()[-1]
            if least and most > self.imbalance * least:
                names = self.class_names or ()
                _say(f"{type(self).__name__}: class {names[small]!r} has {least} images, class {names[big]!r} has "
                     f"{most}: over {self.imbalance:g}x imbalance (weight the loss or resample)")  # fmt: skip
        return kept, decoded

    def _dataset(self, files: Files, decoded: dict[Path, Tensor], train: bool) -> SampleDataset:
        labels = torch.tensor([c for _, c in files], dtype=torch.long)
        if self.cache:
            images = torch.stack([decoded[p] for p, _ in files]) if files else torch.empty(0, *self.input_shape)
            return self.make_dataset(images.to(torch.uint8), labels, train=train)
        paths = [p for p, _ in files]
        return ImageFiles(paths, labels, self.channels, self.size, **self.sample_options(train))

    def load(self) -> None:
        kept, decoded = self._checked(self._splits())
        self.train_set = self._dataset(kept["train"], decoded, train=True)
        self.val_set = self._dataset(kept["val"], decoded, train=False)
        self.test_set = self._dataset(kept["test"], decoded, train=False)

    def setup(self, stage: str | None = None) -> None:
        """Predicting a ``predict_dir`` reads only that folder: never the training images, which may be gone."""
        if stage != "predict" or self.predict_dir is None:
            super().setup(stage)
        if stage == "predict" and self.predict_dir is not None and self.predict_set is None:
            files = image_files(self.predict_dir)
            if not files:
                kinds = ", ".join(IMAGE_SUFFIXES)
                raise DataError(f"data.predict_dir: no image files ({kinds}) below {self.predict_dir.resolve()}")
            self.predict_set = ImageFiles(files, None, self.channels, self.size, **self.sample_options(False))

    def predict_dataloader(self) -> DataLoader:
        if self.predict_dir is not None:
            self.setup("predict")
            return self._loader(self.predict_set, train=False)
        return self._loader(self.test_set, train=False)
