"""Check the first batches before they cost a run: shapes, dtypes, NaN/Inf, label ranges, class balance."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from kiln.data.base import check_labels
from kiln.errors import HealthCheckError


def _expected(trainer: Trainer, pl_module: LightningModule, name: str) -> int | None:
    """``name`` (num_classes, in_channels) from the network, the module or the datamodule, if any declares it."""
    for owner in (getattr(pl_module, "net", None), pl_module, getattr(trainer, "datamodule", None)):
        value = getattr(owner, name, None)
        if isinstance(value, int):
            return value
    return None


def check_batch(batch: Any, where: str, num_classes: int | None, in_channels: int | None) -> list[str]:
    """Raise :class:`HealthCheckError` for a broken ``(images, labels)`` batch; return warnings."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise HealthCheckError(f"{where}: expected an (images, labels) pair, got {type(batch).__name__}")
    x, y = batch
    if not torch.is_floating_point(x):
        raise HealthCheckError(f"{where}: images have dtype {x.dtype}, expected a float dtype (normalise them)")
    if x.ndim != 4:
        raise HealthCheckError(f"{where}: images have shape {tuple(x.shape)}, expected (batch, channels, H, W)")
    if in_channels is not None and x.shape[1] != in_channels:
        raise HealthCheckError(
            f"{where}: images have {x.shape[1]} channels, the network expects {in_channels} "
            f"(shape {tuple(x.shape)}): set the net's in_channels or fix the data"
        )
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = (~finite).flatten(1).any(1).nonzero().flatten().tolist()
        raise HealthCheckError(f"{where}: images contain NaN/Inf in samples {bad[:10]}")
    if y.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8) or y.ndim != 1:
        raise HealthCheckError(
            f"{where}: labels have dtype {y.dtype} and shape {tuple(y.shape)}, expected 1-D integers"
        )
    if num_classes is not None:  # the network's num_classes; ImageDataModule checks every batch against its own
        check_labels(y, num_classes, where)
    warnings = []
    if len(y) > 1 and bool((y == y[0]).all()):
        warnings.append(f"{where}: all {len(y)} labels are {int(y[0])}: is the data sorted and not shuffled?")
    return warnings


class BatchSanityCheck(Callback):
    """Checks the first train and val batches before the first optimizer step, and the class mix.

    A broken batch stops the run with a message naming the batch, the field and the values. Label
    counts over the first ``histogram_batches`` training batches warn when a class is absent or
    holds more than ``dominant_fraction`` of the labels. After that the callback costs nothing.

    Args:
        histogram_batches: Training batches whose labels are counted.
        dominant_fraction: Share of labels above which one class is reported as dominating.
    """

    def __init__(self, histogram_batches: int = 20, dominant_fraction: float = 0.5) -> None:
        self.histogram_batches = histogram_batches
        self.dominant_fraction = dominant_fraction
        self.counts: Counter[int] = Counter()
        self.seen_train = 0
        self.checked_val = False
        self.warnings: list[str] = []

    def _check(self, trainer: Trainer, pl_module: LightningModule, batch: Any, where: str) -> None:
        num_classes = _expected(trainer, pl_module, "num_classes")
        found = check_batch(batch, where, num_classes, _expected(trainer, pl_module, "in_channels"))
        for message in found:
            rank_zero_warn(message)
        self.warnings += found

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self.checked_val:
            self.checked_val = True
            self._check(trainer, pl_module, batch, f"val batch {batch_idx}")

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self.seen_train >= self.histogram_batches:
            return
        if self.seen_train == 0:
            self._check(trainer, pl_module, batch, f"train batch {batch_idx} (epoch {trainer.current_epoch})")
        self.counts.update(batch[1].tolist())
        self.seen_train += 1
        if self.seen_train == self.histogram_batches or self.seen_train == trainer.num_training_batches:
            self._check_histogram(_expected(trainer, pl_module, "num_classes"))
            self.seen_train = self.histogram_batches

    def _check_histogram(self, num_classes: int | None) -> None:
        total = sum(self.counts.values())
        messages = []
        if num_classes is not None:
            absent = [c for c in range(num_classes) if self.counts[c] == 0]
            if absent:
                messages.append(f"classes {absent} never appear in the first {total} training labels")
        top, top_count = self.counts.most_common(1)[0]
        if top_count > self.dominant_fraction * total:
            messages.append(f"class {top} is {top_count / total:.0%} of the first {total} training labels")
        for message in messages:
            rank_zero_warn(message)
        self.warnings += messages

    def state_dict(self) -> dict[str, Any]:
        return {"seen_train": self.seen_train, "checked_val": self.checked_val}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.seen_train = state_dict["seen_train"]
        self.checked_val = state_dict["checked_val"]
