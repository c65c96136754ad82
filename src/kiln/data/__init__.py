"""LightningDataModules: one per data source, all yielding ``(image, label)`` batches."""

from kiln.data.base import ImageDataModule
from kiln.data.digits import DigitsDataModule
from kiln.data.on_device import BatchRandomAffine, DeviceLoader
from kiln.data.synthetic import SyntheticDataModule
from kiln.data.torchvision import CIFAR10DataModule, FashionMNISTDataModule, MNISTDataModule, TorchvisionDataModule

__all__ = [
    "BatchRandomAffine",
    "CIFAR10DataModule",
    "DeviceLoader",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageDataModule",
    "MNISTDataModule",
    "SyntheticDataModule",
    "TorchvisionDataModule",
]
