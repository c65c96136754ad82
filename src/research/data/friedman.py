"""Friedman's regression problem (1991), generated: a real-valued target from ten features, no download."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kiln.data import TensorDataModule, seeded_split


def friedman(n: int, noise: float, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` samples ``x ~ U[0, 1]^10`` and ``y = 10 sin(pi x0 x1) + 20 (x2 - 0.5)^2 + 10 x3 + 5 x4 + noise * e``:
    features 5 to 9 carry nothing, so the best possible mean squared error is ``noise ** 2``."""
    g = torch.Generator().manual_seed(seed)  # its own generator: the global RNGs stay as they are
    x = torch.rand(n, 10, generator=g)
    y = 10 * torch.sin(math.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
    return x, y + noise * torch.randn(n, generator=g)


class FriedmanDataModule(TensorDataModule):
    """Regression on feature vectors: ``(10,)`` samples, one real-valued target each (float32, never rounded).

    Generated from ``split_seed`` with a generator of its own, so every run scores on the same test set.

    Args:
        num_samples: Samples in all, split into train/val/test.
        noise: Std of the Gaussian noise on the target (the root of the best reachable mean squared error).
        val_fraction: Share used for validation.
        test_fraction: Share held out for the final test.
        split_seed: Seed of the generation and the split.
        **kwargs: Loader options of :class:`TensorDataModule`.
    """

    input_shape = (10,)
    num_outputs = 1  # one value per sample: what the network's last layer gives
    default_mean = (0.5,)  # of U[0, 1]
    default_std = (0.2887,)

    def __init__(
        self,
        num_samples: int = 4000,
        noise: float = 1.0,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_samples, self.noise, self.split_seed = num_samples, noise, split_seed
        self.fractions = (1 - val_fraction - test_fraction, val_fraction, test_fraction)

    def load(self) -> None:
        x, y = friedman(self.num_samples, self.noise, self.split_seed)
        train, val, test = seeded_split(len(y), self.fractions, self.split_seed)
        self.train_set = self.make_dataset(x[train], y[train], train=True)
        self.val_set = self.make_dataset(x[val], y[val], train=False)
        self.test_set = self.make_dataset(x[test], y[test], train=False)
