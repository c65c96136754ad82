"""The datasets kiln's DataModules hand their loaders: samples of any shape, gathered a batch at a time, with
seeded augmentation and normalisation."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from kiln.data.on_device import augmentation_seed, normalised, seeded_augmentation, stats_view, to_unit_float
from kiln.errors import HealthCheckError

Transform = Callable[[Tensor], Tensor]


class SampleDataset(Dataset):
    """Samples (and targets, or ``None`` for unlabelled data) with seeded augmentation and normalisation.

    Each batch is gathered by :meth:`_gather` (a tensor slice, or files decoded), converted to
    float, augmented (train only), then normalised, so augmentation fills with true black and
    normalisation statistics stay those of the raw values; integer inputs other than uint8 pixels
    (token ids) pass as they are. Targets keep their dtype: class indices, real values, token ids.
    Given ``(epoch, index)`` keys (see :class:`ResumableSampler`), the augmentation is seeded from
    ``(seed, epoch, index)`` of the item, or of a batch's first item when the DataLoader asks for a
    whole batch (``__getitems__``): the same augmentation in any worker, after any restart.
    """

    def __init__(
        self,
        targets: Tensor | None,
        sample_shape: Sequence[int],
        mean: Sequence[float],
        std: Sequence[float],
        transform: Transform | None = None,
        seed: int = 0,
    ) -> None:
        self.targets = targets
        self.mean = stats_view(mean, sample_shape, "mean")
        self.std = stats_view(std, sample_shape, "std")
        self.transform = transform
        self.seed = seed

    def __len__(self) -> int:
        return len(self.targets) if self.targets is not None else 0

    def _gather(self, index: Tensor) -> Tensor:
        """The raw samples at ``index``, stacked (uint8 images, floats, or integer ids)."""
        raise NotImplementedError

    def raw(self, i: int) -> tuple[Tensor, Any]:
        """Sample ``i`` as stored (before augmentation and normalisation) and its target (``None``: none)."""
        target = self.targets[i] if self.targets is not None else None
        return self._gather(torch.tensor([i]))[0], target.item() if target is not None and not target.ndim else target

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        x, y = self._batch([key])
        return x[0] if y is None else (x[0], y[0])

    def __getitems__(self, keys: list[int | tuple[int, int]]) -> list[Any]:
        """A whole batch in a few tensor operations: one gather, one seeding, one normalisation."""
        x, y = self._batch(keys)
        return list(x.unbind(0)) if y is None else list(zip(x.unbind(0), y.unbind(0), strict=True))

    def _batch(self, keys: list[int | tuple[int, int]]) -> tuple[Tensor, Tensor | None]:
        pairs = [key if isinstance(key, tuple) else (None, key) for key in keys]
        index = torch.tensor([i for _, i in pairs], dtype=torch.long)
        with torch.inference_mode():  # no autograd bookkeeping: per-sample transforms run ~20% faster
            x = self._augmented(self._gather(index), *pairs[0])
        # outside inference mode, so the batch is an ordinary tensor that autograd may save
        return normalised(x, self.mean, self.std), self.targets[index] if self.targets is not None else None

    def _augmented(self, inputs: Tensor, epoch: int | None, first: int) -> Tensor:
        x = to_unit_float(inputs)
        if self.transform is None or not torch.is_floating_point(x):
            return x
        with seeded_augmentation(augmentation_seed(self.seed, epoch, first) if epoch is not None else None):
            return torch.stack([self.transform(sample) for sample in x])


class InMemoryDataset(SampleDataset):
    """Samples held as one ``N x ...`` tensor (images ``N x C x H x W`` as uint8 or float in [0, 1],
    signals ``N x C x L`` or ``N x L``, features ``N x F``, token ids ``N x T``), with their targets."""

    def __init__(
        self,
        inputs: Tensor,
        targets: Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        transform: Transform | None = None,
        seed: int = 0,
    ) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} samples but {len(targets)} targets")
        super().__init__(targets, inputs.shape[1:], mean, std, transform, seed)
        self.inputs = inputs
        self.targets: Tensor = targets

    def _gather(self, index: Tensor) -> Tensor:
        return self.inputs[index]


@contextmanager
def global_rngs_kept() -> Iterator[None]:
    """Put Python's, NumPy's and torch's global RNG states back afterwards: a dataset that reseeds
    them while loading (many generators call ``np.random.seed``) leaves the run's seeding alone."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


def check_labels(labels: Tensor, num_classes: int, where: str) -> None:
    """Stop with one line naming the batch and the sample whose label is outside ``[0, num_classes)``."""
    bad = ((labels < 0) | (labels >= num_classes)).nonzero()
    if len(bad):
        first = tuple(int(i) for i in bad[0])  # a dense label (a mask's pixel) also names where in the sample
        at = f"sample {first[0]}" + (f" at {first[1:]}" if len(first) > 1 else "")
        raise HealthCheckError(
            f"{where}: label {int(labels[first])} of {at} is outside [0, {num_classes}) "
            f"({len(bad)} such labels); fix the labels or num_classes"
        )
