"""Seeded splits of a dataset's indices: by fractions, stratified by class, and into k folds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from kiln.errors import CallError


def seeded_split(n: int, fractions: Sequence[float], seed: int) -> list[Tensor]:
    """Split ``range(n)`` into index tensors of the given fractions; same seed, same split."""
    if n < 0 or any(not 0 <= f <= 1 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise CallError(f"seeded_split({n}, {tuple(fractions)}, {seed}): the fractions must each be in [0, 1] and add "
                        "up to at most 1 (the last part takes the rest), and n at least 0")  # fmt: skip
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sizes = [round(f * n) for f in fractions[:-1]]
    sizes.append(n - sum(sizes))
    return list(torch.split(order, sizes))


def stratified_split(labels: Sequence[int], fractions: Sequence[float], seed: int) -> list[list[int]]:
    """Indices split so each class keeps the same ``fractions`` in every part; the rest comes first.

    Same seed, same split: the order within each class is a seeded permutation.
    """
    g = torch.Generator().manual_seed(seed)
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    for c in sorted(set(labels)):
        members = [i for i, label in enumerate(labels) if label == c]
        order = [members[i] for i in torch.randperm(len(members), generator=g).tolist()]
        start = 0
        for part, fraction in enumerate(fractions, start=1):
            count = round(fraction * len(members))
            parts[part] += order[start : start + count]
            start += count
        parts[0] += order[start:]
    return parts


def k_folds(labels: Sequence[Any], k: int, seed: int, stratified: bool = True) -> Tensor:
    """The fold (0..k-1) of each sample, seeded: stratified (each class spread evenly over the folds), or for
    targets that are not classes, a seeded permutation cut evenly."""
    g = torch.Generator().manual_seed(seed)
    folds = torch.empty(len(labels), dtype=torch.long)
    for c in sorted(set(labels)) if stratified else [None]:
        members = torch.tensor([i for i, label in enumerate(labels) if c is None or label == c])
        members = members[torch.randperm(len(members), generator=g)]
        folds[members] = torch.arange(len(members)) % k
    return folds
