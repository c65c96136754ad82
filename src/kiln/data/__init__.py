"""Reusable LightningDataModules and their parts: tensors in memory, image folders, HF datasets, streaming."""

from kiln.data.base import TensorDataModule
from kiln.data.folder import FolderDataModule
from kiln.data.hf import HFDataModule
from kiln.data.on_device import BatchRandomAffine, DeviceLoader
from kiln.data.sampling import EvaluationShard, ResumableSampler
from kiln.data.splits import seeded_split
from kiln.data.streaming import StreamingDataModule
from kiln.data.synthetic import SyntheticDataModule
from kiln.data.torchvision import CIFAR10DataModule, FashionMNISTDataModule, MNISTDataModule, TorchvisionDataModule

__all__ = [
    "BatchRandomAffine",
    "CIFAR10DataModule",
    "DeviceLoader",
    "EvaluationShard",
    "FashionMNISTDataModule",
    "FolderDataModule",
    "HFDataModule",
    "MNISTDataModule",
    "ResumableSampler",
    "StreamingDataModule",
    "SyntheticDataModule",
    "TensorDataModule",
    "TorchvisionDataModule",
    "seeded_split",
]
