"""How a kiln DataModule builds its loaders: the training order (seeded, resumable, split over ranks), the
evaluation shards, the on-device loader, and the refusal of an empty split (``data``: a ``TensorDataModule``)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset

from kiln.data.datasets import InMemoryDataset, check_labels
from kiln.data.on_device import DeviceLoader, check_fits
from kiln.data.sampling import EvaluationShard, ResumableSampler
from kiln.errors import ConfigError, DataError


def default_num_workers() -> int:
    """One worker per available core, leaving one for the main process, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores - 1))


def sampler(data: Any, dataset: Dataset, train: bool) -> ResumableSampler | EvaluationShard | None:
    """Training: a seeded, resumable order split over the ranks; evaluation over several ranks: every sample once,
    never a padded repeat; else the dataset's own order."""
    trainer = data.trainer
    if train:  # only training data is shuffled; evaluation order stays fixed
        ranks = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        order = ResumableSampler(dataset, seed=data.seed, num_replicas=ranks[0], rank=ranks[1])  # type: ignore[arg-type]
        if data.resume_position is not None:  # the loader may be built, and started, before the loops restore
            epoch, samples = data.resume_position
            order.set_epoch(epoch)
            order.skip, data.resume_position = samples, None
        return order
    if trainer is not None and trainer.world_size > 1:
        return EvaluationShard(dataset, trainer.world_size, trainer.global_rank)  # type: ignore[arg-type]
    return None


def refuse_empty(data: Any, dataset: Dataset, train: bool) -> None:
    """An empty split would train nothing (then test the untrained network), or choose the best
    checkpoint on no data, or report a test on nothing: each stops here, in one line."""
    if len(dataset) > 0:  # type: ignore[arg-type]
        return
    split = "training" if train else "validation" if dataset is data.val_set else "evaluation"
    if split == "validation" and data.trainer is not None and data.trainer.limit_val_batches == 0:
        return  # validation turned off on purpose
    fix = "check the data files and the split fractions"
    if split == "validation":
        fix += "; to train without validation: --trainer.limit_val_batches 0 and a ModelCheckpoint without monitor"
    raise DataError(f"{type(data).__name__}: the {split} set is empty; {fix}")


def device_loader(
    data: Any, dataset: Dataset, sampler: ResumableSampler | EvaluationShard | None, train: bool
) -> DeviceLoader:
    """Every split moved to the device once (or a clear error); batches sliced, augmented and normalised there."""
    if not isinstance(dataset, InMemoryDataset):
        raise ConfigError(
            f"data.on_device: {type(data).__name__} reads {type(dataset).__name__} samples, not tensors in memory: "
            "set data.init_args.cache=true to decode them once into memory, or on_device=false"
        )
    device = data.trainer.strategy.root_device if data.trainer is not None else torch.device("cpu")
    if not data._device_copies:  # before the first copy: every split, or a clear error
        splits = [d for d in (data.train_set, data.val_set, data.test_set) if isinstance(d, InMemoryDataset)]
        check_fits([t for d in splits for t in (d.inputs, d.targets)], device)
    if id(dataset) not in data._device_copies:  # moved once, kept for every epoch and stage
        if data.num_classes is not None and not torch.is_floating_point(dataset.targets):  # on the host, once
            check_labels(dataset.targets, data.num_classes, f"{type(data).__name__} data")
        data._device_copies[id(dataset)] = (dataset.inputs.to(device), dataset.targets.to(device))
    inputs, targets = data._device_copies[id(dataset)]
    augment = None
    if train:
        augment = data.batch_augment if data.batch_augment is not None else data.default_batch_augment()
    return DeviceLoader(
        inputs,
        targets,
        data.batch_size if train else data.eval_batch_size,
        data.mean,
        data.std,
        sampler=sampler,
        augment=augment.to(device) if augment is not None else None,
        seed=data.seed,
    )
