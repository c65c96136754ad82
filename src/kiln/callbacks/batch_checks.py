"""Check the first batches before they cost a run: shapes, NaN/Inf, and for class data label ranges and balance."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from kiln.console import say
from kiln.data.datasets import check_labels
from kiln.errors import HealthCheckError
from kiln.training.contracts import classes, datamodule, declared_classes, network_channels, sample_shape


def _shape_problem(x: Tensor, input_shape: Sequence[int] | None, channels: int | None) -> str | None:
    """Why a batch of this shape cannot be what the data declares (or the network takes), if it cannot."""
    got = tuple(x.shape)
    if input_shape is not None and got[1:] != tuple(input_shape):
        expected = f"the data declares samples of shape {tuple(input_shape)}"
        if len(input_shape) >= 2 and got[1:] == tuple(input_shape[1:]):
            return f"inputs have shape {got}, with no channel dimension; {expected}: add it (inputs.unsqueeze(1))"
        return f"inputs have shape {got}; {expected}, so batches of (batch, {', '.join(map(str, input_shape))})"
    if channels is not None and x.ndim >= 3 and got[1] != channels:
        return f"inputs have {got[1]} channels, the network expects {channels} (shape {got}): fix the data or the net"
    return None


def _non_finite(t: Tensor, what: str, where: str) -> None:
    """Stop on NaN/Inf in a float tensor, naming the samples (integers, such as token ids, have none)."""
    if not torch.is_floating_point(t) or t.ndim < 1:
        return
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = (~finite).reshape(len(t), -1).any(1).nonzero().flatten().tolist()
        raise HealthCheckError(f"{where}: {what} contain NaN/Inf in samples {bad[:10]}")


def check_batch(
    batch: Any,
    where: str,
    num_classes: int | None,
    input_shape: Sequence[int] | None = None,
    channels: int | None = None,
) -> list[str]:
    """Raise :class:`HealthCheckError` for a broken ``(inputs, targets)`` batch of any task; return warnings.

    Inputs: float (NaN/Inf checked) or integer ids. Targets: class indices in ``[0, num_classes)`` where the data
    declares classes; anything else (real values, token ids) as it comes, NaN/Inf checked. ``input_shape`` is
    one sample's shape as the data declares it; ``channels`` what the network takes, if it says.
    """
    x, y = batch
    if isinstance(x, list | tuple | Mapping):  # several inputs, or samples of different sizes: no batch shape
        for key, part in x.items() if isinstance(x, Mapping) else enumerate(x):
            if isinstance(part, Tensor) and torch.is_floating_point(part) and not bool(torch.isfinite(part).all()):
                raise HealthCheckError(f"{where}: input {key} holds NaN/Inf")
    else:
        _check_inputs(x, where, input_shape, channels)
    if not isinstance(y, Tensor):
        return []
    _non_finite(y, "targets", where)
    if num_classes is None:
        return []
    if torch.is_floating_point(y) or y.ndim == 0:
        raise HealthCheckError(
            f"{where}: labels have dtype {y.dtype} and shape {tuple(y.shape)}, but the data declares "
            f"{num_classes} classes: class labels are integers, one a sample or one per element of a dense target "
            "(or declare no num_classes)"
        )
    check_labels(y, num_classes, where)  # per sample, or per element of a mask
    warnings = []
    if y.ndim == 1 and len(y) > 1 and bool((y == y[0]).all()):
        warnings.append(f"{where}: all {len(y)} labels are {int(y[0])}: is the data sorted and not shuffled?")
    return warnings


def _check_inputs(x: Any, where: str, input_shape: Sequence[int] | None, channels: int | None) -> None:
    """Stop on inputs that are not a batch tensor of the declared shape, raw bytes, or hold NaN/Inf."""
    if not isinstance(x, Tensor) or x.ndim < 2:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise HealthCheckError(f"{where}: inputs have shape {shape}, expected (batch, ...)")
    if x.dtype == torch.uint8:  # integer ids are int64 (or int32); bytes are pixels nobody scaled
        raise HealthCheckError(f"{where}: inputs have dtype torch.uint8 (raw pixels?): convert them to float and "
                               "normalise them")  # fmt: skip
    if problem := _shape_problem(x, input_shape, channels):
        raise HealthCheckError(f"{where}: {problem}")
    _non_finite(x, "inputs", where)


def check_tensors(batch: Any, where: str) -> None:
    """A batch that is not an ``(inputs, targets)`` pair: NaN/Inf in any float tensor it holds."""
    found = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, list | tuple) else [batch]
    for i, value in enumerate(found):
        if isinstance(value, Tensor):
            _non_finite(value, f"its tensor {i}", where)


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
        self.said_kind = False  # the one line for batches that are not (inputs, targets) pairs

    def _check(self, trainer: Trainer, pl_module: LightningModule, batch: Any, where: str) -> None:
        if not (isinstance(batch, list | tuple) and len(batch) == 2):
            if not self.said_kind:
                self.said_kind = True
                say(f"BatchSanityCheck: batches are {type(batch).__name__}s, not (inputs, targets) pairs: only their "
                    "float tensors are checked (for NaN/Inf)")  # fmt: skip
            check_tensors(batch, where)
            return
        data = datamodule(trainer)
        found = check_batch(batch, where, classes(data), sample_shape(data), network_channels(pl_module))
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
        num_classes = declared_classes(trainer)
        if num_classes is None or batch[1].ndim != 1:  # a histogram of the classes of samples, not of a mask's pixels
            self.seen_train = self.histogram_batches
            return
        self.counts.update(batch[1].tolist())
        self.seen_train += 1
        if self.seen_train == self.histogram_batches or self.seen_train == trainer.num_training_batches:
            self._check_histogram(num_classes)
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
