"""Shared fixtures: every test runs in its own folder with W&B off and no API key in sight."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dataset_files import write_cifar10, write_mnist


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in ``tmp_path``; no W&B key, no inherited run folder, W&B disabled unless a test says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["kiln"])  # the CLI gets its args from the test, not pytest's argv
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    for var in ("KILN_RUN_DIR", "LOCAL_RANK", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


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
