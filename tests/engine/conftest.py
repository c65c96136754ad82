"""The engine suite's data fixtures: small files in the real formats of MNIST and CIFAR-10."""

from __future__ import annotations

from pathlib import Path

import pytest
from dataset_files import write_cifar10, write_mnist


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    """A data folder holding small MNIST and FashionMNIST files in the real idx format."""
    root = tmp_path / "data"
    write_mnist(root / "MNIST" / "raw", n_train=96, n_test=48, seed=0)
    write_mnist(root / "FashionMNIST" / "raw", n_train=96, n_test=48, seed=1)
    return root


@pytest.fixture
def cifar_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder holding small CIFAR-10 batches in the real pickle format.

    torchvision checks each file's md5 against the official release; synthetic files cannot
    match, so only that check is bypassed.
    """
    from torchvision.datasets import cifar

    root = tmp_path / "data"
    write_cifar10(root / "cifar-10-batches-py", n_per_batch=20, seed=2)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    return root
