"""A training sampler whose order depends only on (seed, epoch), and which can restart mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import DistributedSampler


class ResumableSampler(DistributedSampler):
    """Seeded per-epoch shuffling, split across ranks, that can skip what a resumed run already trained on.

    Yields ``(epoch, index)`` so the dataset can seed each sample's augmentation from the pair:
    augmentation then no longer depends on worker count, worker seeds or where a run restarted.
    Being a ``DistributedSampler``, Lightning keeps it as is under DDP (it would otherwise swap in
    its own), and calls :meth:`set_epoch` at every epoch start.

    Args:
        dataset: The training set.
        seed: Seed of the order (same seed, same order every epoch e).
        num_replicas: Number of ranks sharing the data.
        rank: This process's rank.
        shuffle: Shuffle (else dataset order).
        pairs: Yield ``(epoch, index)`` (else the index alone, for a dataset of the user's own).
    """

    def __init__(
        self, dataset: Sized, seed: int, num_replicas: int = 1, rank: int = 0, shuffle: bool = True, pairs: bool = True
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.skip = 0  # samples of this rank to leave out at the start of the next pass
        self.pairs = pairs

    def __iter__(self) -> Iterator[Any]:
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        epoch = self.epoch
        return iter([(epoch, i) for i in indices[skip:]] if self.pairs else indices[skip:])


class EvaluationShard(DistributedSampler):
    """This rank's share of a validation or test set, in order and without padding: every sample counted once.

    Lightning's ``DistributedSampler`` pads the set to a multiple of the ranks, repeating samples: on 2 ranks
    the 359 test digits were scored as 360. Ranks may get one sample more or less; torchmetrics and
    epoch-level ``self.log`` reduce over what each holds. Being a ``DistributedSampler``, Lightning keeps it.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)  # type: ignore[arg-type]
        self.num_samples = len(range(rank, len(dataset), num_replicas))
        self.total_size = len(dataset)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.total_size, self.num_replicas))


def repeated_samples(loader: object) -> tuple[int, int] | None:
    """``(samples, counted)`` when ``loader`` draws through a ``DistributedSampler`` that pads its set with repeats
    (Lightning's own, under DDP, for a loader that brought no distributed sampler); else None (an ``EvaluationShard``
    counts each sample once)."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    samples = len(sampler.dataset)  # type: ignore[arg-type]
    return (samples, sampler.total_size) if sampler.total_size > samples else None
