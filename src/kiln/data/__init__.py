"""LightningDataModules: one per data source, all yielding ``(input, label)`` batches."""

from kiln.data.base import TensorDataModule
from kiln.data.digits import DigitsDataModule
from kiln.data.folder import FolderDataModule
from kiln.data.hf import HFDataModule
from kiln.data.on_device import BatchRandomAffine, DeviceLoader
from kiln.data.streaming import StreamingDataModule
from kiln.data.synthetic import SyntheticDataModule
from kiln.data.torchvision import CIFAR10DataModule, FashionMNISTDataModule, MNISTDataModule, TorchvisionDataModule
from kiln.data.waveforms import WaveformsDataModule

__all__ = [
    "BatchRandomAffine",
    "CIFAR10DataModule",
    "DeviceLoader",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "FolderDataModule",
    "HFDataModule",
    "MNISTDataModule",
    "StreamingDataModule",
    "SyntheticDataModule",
    "TensorDataModule",
    "TorchvisionDataModule",
    "WaveformsDataModule",
]
