"""torchvision's MNIST, FashionMNIST and CIFAR-10, read from their real on-disk formats."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn
from torchvision import datasets
from torchvision.transforms import v2

from kiln.data.base import TensorDataModule
from kiln.data.on_device import BatchRandomAffine
from kiln.data.splits import seeded_split
from kiln.errors import MissingDataError

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


class TorchvisionDataModule(TensorDataModule):
    """A torchvision classification dataset, decoded once into an in-memory uint8 tensor.

    Decoding once (instead of a PIL image per sample) keeps workers cheap and lets the whole set
    move to a device. The validation split is carved from the official training set by
    ``split_seed``; the official test set stays the test set.

    Args:
        data_dir: Root folder of the dataset files.
        download: Fetch missing files (needs network); offline, missing files are an error.
        val_fraction: Share of the official training set used for validation.
        split_seed: Seed of the train/val split.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    dataset_class: ClassVar[type[datasets.VisionDataset]]
    folder: ClassVar[str]  # where torchvision keeps the files, relative to data_dir
    files: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        data_dir: str | Path = "data",
        download: bool = False,
        val_fraction: float = 0.1,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
        self.data_dir = Path(data_dir).expanduser()
        self.download = download
        self.val_fraction = val_fraction
        self.split_seed = split_seed

    @property
    def files_dir(self) -> Path:
        return self.data_dir / self.folder

    def missing_files(self) -> list[str]:
        return [name for name in self.files if not (self.files_dir / name).is_file()]

    def prepare_data(self) -> None:
        """Download once per node if asked; otherwise fail early, naming what is missing and where."""
        missing = self.missing_files()
        if not missing:
            return
        name = self.dataset_class.__name__
        where = f"{name} files missing in {self.files_dir.resolve()} (expected: {', '.join(missing)})"
        if not self.download:
            raise MissingDataError(f"{where}: copy them there, or set data.init_args.download=true to fetch them")
        try:
            for train in (True, False):
                self.dataset_class(str(self.data_dir), train=train, download=True)
        except (OSError, RuntimeError) as err:  # urllib errors are OSErrors; torchvision raises RuntimeError
            said = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
            reason = said[0].rstrip(":") + (f": {said[-1]}" if len(said) > 1 else "")  # torchvision's: the last cause
            raise MissingDataError(f"{where} and the download failed ({reason}): copy them there") from None

    def _load(self, train: bool) -> tuple[Tensor, Tensor]:
        try:
            dataset = self.dataset_class(str(self.data_dir), train=train, download=False)
        except RuntimeError as err:  # CIFAR: a file whose MD5 is not the release's ("not found or corrupted")
            raise MissingDataError(
                f"{self.dataset_class.__name__} files in {self.files_dir.resolve()} fail torchvision's check against "
                f"the official release ({str(err).splitlines()[0]}): replace them with the release's files, or "
                "delete them and set data.init_args.download=true"
            ) from None
        images = torch.as_tensor(dataset.data)
        images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
        return images.contiguous(), torch.as_tensor(dataset.targets)

    def load(self) -> None:
        self.prepare_data()  # a no-op when the files are there; covers use without a Trainer
        images, labels = self._load(train=True)
        train, val = seeded_split(len(labels), (1 - self.val_fraction, self.val_fraction), self.split_seed)
        self.train_set = self.make_dataset(images[train], labels[train], train=True)
        self.val_set = self.make_dataset(images[val], labels[val], train=False)
        self.test_set = self.make_dataset(*self._load(train=False), train=False)


class MNISTDataModule(TorchvisionDataModule):
    """MNIST handwritten digits, 28x28 grey-scale."""

    dataset_class = datasets.MNIST
    folder = "MNIST/raw"
    files = _MNIST_FILES
    num_classes = 10
    input_shape = (1, 28, 28)
    default_mean = (0.1307,)
    default_std = (0.3081,)

    def default_train_transforms(self) -> list[nn.Module]:
        return [v2.RandomAffine(degrees=10, translate=(0.1, 0.1))]

    def default_batch_augment(self) -> nn.Module:
        return BatchRandomAffine(degrees=10, translate=0.1)


class FashionMNISTDataModule(MNISTDataModule):
    """Zalando's FashionMNIST, 28x28 grey-scale clothing (same file format as MNIST)."""

    dataset_class = datasets.FashionMNIST
    folder = "FashionMNIST/raw"
    default_mean = (0.2860,)
    default_std = (0.3530,)
    class_names = ("T-shirt", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Boot")

    def default_train_transforms(self) -> list[nn.Module]:
        return [v2.RandomHorizontalFlip(), v2.RandomAffine(degrees=0, translate=(0.1, 0.1))]

    def default_batch_augment(self) -> nn.Module:
        return BatchRandomAffine(translate=0.1, flip=0.5)


class CIFAR10DataModule(TorchvisionDataModule):
    """CIFAR-10, 32x32 colour images in 10 classes."""

    dataset_class = datasets.CIFAR10
    folder = "cifar-10-batches-py"
    files = (
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
        "batches.meta",
    )
    num_classes = 10
    input_shape = (3, 32, 32)
    default_mean = (0.4914, 0.4822, 0.4465)
    default_std = (0.2470, 0.2435, 0.2616)
    class_names = ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

    def default_train_transforms(self) -> list[nn.Module]:
        return [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()]

    def default_batch_augment(self) -> nn.Module:
        return BatchRandomAffine(translate=4 / 32, flip=0.5, whole_pixels=True)  # the same, a batch at a time
