"""Generated 1-D signals: a non-image example that needs no download, for sequences and time series."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kiln.data import TensorDataModule, seeded_split

SHAPES = ("sine", "square", "triangle", "sawtooth")


def waveforms(n: int, length: int, noise: float, seed: int) -> tuple[Tensor, Tensor]:
    """``n`` noisy periodic signals ``(n, length)``, an equal share of each shape in :data:`SHAPES`,
    with random frequency (1-4 cycles), phase, amplitude and offset; and their labels."""
    g = torch.Generator().manual_seed(seed)  # its own generator: the global RNGs stay as they are
    labels = torch.arange(n) % len(SHAPES)
    cycles = 1 + 3 * torch.rand(n, 1, generator=g)
    phase = torch.rand(n, 1, generator=g)
    t = (torch.arange(length) / length * cycles + phase) % 1.0  # position in the cycle, in [0, 1)
    wave = torch.stack(
        [
            torch.sin(2 * math.pi * t),
            torch.where(t < 0.5, 1.0, -1.0),
            1 - 4 * (t - 0.5).abs(),
            2 * t - 1,
        ]
    )[labels, torch.arange(n)]
    amplitude = 0.75 + 0.5 * torch.rand(n, 1, generator=g)
    offset = torch.randn(n, 1, generator=g) * 0.5
    return amplitude * wave + offset + noise * torch.randn(n, length, generator=g), labels


class WaveformsDataModule(TensorDataModule):
    """Sine, square, triangle and sawtooth waves under noise: classify the shape.

    Samples are ``(1, length)`` (one channel, for 1-D convolutions) or, with ``channel=false``,
    ``(length,)`` (for :class:`~research.nets.MLP` or sequence models). Generated from ``split_seed``
    with a generator of its own, so every run scores on the same test signals.

    Args:
        num_samples: Signals in all, split into train/val/test.
        length: Points per signal.
        noise: Std of the Gaussian noise added to each point.
        channel: Give each sample a channel dimension.
        val_fraction: Share used for validation.
        test_fraction: Share held out for the final test.
        split_seed: Seed of the generation and the split.
        **kwargs: Loader and transform options of :class:`TensorDataModule`.
    """

    num_classes = len(SHAPES)
    class_names = SHAPES

    def __init__(
        self,
        num_samples: int = 2000,
        length: int = 64,
        noise: float = 0.1,
        channel: bool = True,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.num_samples, self.length, self.noise = num_samples, length, noise
        self.input_shape = (1, length) if channel else (length,)
        self.fractions = (1 - val_fraction - test_fraction, val_fraction, test_fraction)
        self.split_seed = split_seed

    def load(self) -> None:
        signals, labels = waveforms(self.num_samples, self.length, self.noise, self.split_seed)
        signals = signals.view(len(signals), *self.input_shape)
        train, val, test = seeded_split(len(labels), self.fractions, self.split_seed)
        self.train_set = self.make_dataset(signals[train], labels[train], train=True)
        self.val_set = self.make_dataset(signals[val], labels[val], train=False)
        self.test_set = self.make_dataset(signals[test], labels[test], train=False)
