"""Random images of a chosen shape: for benchmarks and smoke tests, where data content does not matter."""

from __future__ import annotations

import torch

from kiln.data.base import TensorDataModule


class SyntheticDataModule(TensorDataModule):
    """``num_samples`` random uint8 images (e.g. CIFAR-shaped 3x32x32) with random labels, made in memory.

    Args:
        num_samples: Training images (validation and test get a tenth each).
        channels: Image channels.
        size: Image height and width.
        num_classes: Number of label values.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    default_mean = (0.5,)
    default_std = (0.29,)

    def __init__(
        self, num_samples: int = 50_000, channels: int = 3, size: int = 32, num_classes: int = 10, **kwargs
    ) -> None:
        kwargs.setdefault("train_transforms", [])
        super().__init__(**kwargs)
        self.num_samples, self.num_classes = num_samples, num_classes
        self.input_shape = (channels, size, size)

    def load(self) -> None:
        g = torch.Generator().manual_seed(0)
        n_eval = max(1, self.num_samples // 10)
        sets = []
        for n in (self.num_samples, n_eval, n_eval):
            images = torch.randint(0, 256, (n, *self.input_shape), generator=g, dtype=torch.uint8)
            sets.append((images, torch.randint(0, self.num_classes or 1, (n,), generator=g)))
        self.train_set = self.make_dataset(*sets[0], train=True)
        self.val_set = self.make_dataset(*sets[1], train=False)
        self.test_set = self.make_dataset(*sets[2], train=False)
