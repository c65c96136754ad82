"""The UCI handwritten digits, shipped inside the package: a real dataset that needs no download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torchvision.transforms import v2

from kiln.data import BatchRandomAffine, TensorDataModule, seeded_split

DIGITS_FILE = Path(__file__).with_name("digits.npz")


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The images (1797, 8, 8) with pixel values 0..16, and their labels (1797,)."""
    with np.load(DIGITS_FILE, allow_pickle=False) as arrays:
        return torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"]).long()


class DigitsDataModule(TensorDataModule):
    """1,797 8x8 grey-scale digits (UCI optdigits, CC BY 4.0: ``digits.LICENSE.md``) in ``digits.npz``.

    Split into train/val/test by ``split_seed``, independent of the training seed, so every run
    of every seed is scored on the same held-out test images.

    Args:
        val_fraction: Share of the images used for validation.
        test_fraction: Share of the images held out for the final test.
        split_seed: Seed of the split permutation.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    num_classes = 10
    input_shape = (1, 8, 8)
    default_mean = (0.3053,)
    default_std = (0.3760,)

    def __init__(
        self,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if not (val_fraction > 0 and test_fraction > 0 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} must be > 0 and sum to < 1"
            )
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.split_seed = split_seed

    def default_train_transforms(self) -> list[nn.Module]:
        # one-pixel shifts and small rotations: the variation handwriting has at this resolution
        return [v2.RandomAffine(degrees=10, translate=(0.125, 0.125))]

    def default_batch_augment(self) -> nn.Module:
        return BatchRandomAffine(degrees=10, translate=0.125)

    def load(self) -> None:
        images, labels = load_digits()
        images = images.float().div_(16).unsqueeze(1)  # values 0..16 -> [0, 1]
        train_fraction = 1 - self.val_fraction - self.test_fraction
        train, val, test = seeded_split(
            len(labels), (train_fraction, self.val_fraction, self.test_fraction), self.split_seed
        )
        self.train_set = self.make_dataset(images[train], labels[train], train=True)
        self.val_set = self.make_dataset(images[val], labels[val], train=False)
        self.test_set = self.make_dataset(images[test], labels[test], train=False)
