"""Shared DataModule machinery: in-memory tensors of any sample shape, seeded splits and DataLoader hygiene."""

from __future__ import annotations

import inspect
import os
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from lightning.pytorch.accelerators import CUDAAccelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from kiln.console import quiet_worker_hint
from kiln.data.on_device import (
    DeviceLoader,
    augmentation_seed,
    check_fits,
    normalised,
    seeded_augmentation,
    stats_view,
    to_unit_float,
)
from kiln.data.sampling import EvaluationShard, ResumableSampler
from kiln.errors import CallError, ConfigError, DataError, HealthCheckError
from kiln.process.stop_signals import worker_init_fn

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


def default_num_workers() -> int:
    """One worker per available core, leaving one for the main process, at most 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores - 1))


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


def _built(value: Any) -> bool:
    """A hyper-parameter that is a built object (a module, a function), or a list of them, not a config."""
    items = value if isinstance(value, list | tuple) else [value]
    return any(isinstance(v, nn.Module) or callable(v) for v in items)


class TensorDataModule(LightningDataModule):
    """Base for data held as tensors, for any task: subclasses fill the splits in :meth:`load`.

    What the data produces is declared here once, and the CLI links it into the model and the
    network (``kiln.cli.links``): ``input_shape`` (one sample's shape: ``(C, H, W)`` images,
    ``(C, L)`` signals, ``(F,)`` features, ``(T,)`` token ids), for classification ``num_classes``
    and ``class_names``, and the normalisation statistics (applied to float inputs only). Targets
    keep their dtype; they are checked as class indices only where ``num_classes`` is declared.
    Health checks read the same declaration (``kiln.training.contracts``).

    Args:
        batch_size: Samples per training batch.
        eval_batch_size: Samples per validation/test/predict batch (defaults to ``batch_size``).
        num_workers: DataLoader worker processes; ``None`` picks one per spare CPU core.
        train_transforms: Augmentations for training only (e.g. torchvision ``v2`` transforms),
            applied to float samples (images in [0, 1]); ``None`` uses the dataset's default, ``[]`` none.
        mean: Normalisation mean: one value, or one per channel (per feature for 1-D samples);
            ``None`` uses the dataset's statistics.
        std: Normalisation std, given like ``mean``.
        on_device: Keep every split on the training device (as stored: uint8 for the torchvision
            sets) and slice, augment and normalise whole batches there: no DataLoader, no workers,
            no host-to-device copy per batch. For datasets that fit in device memory.
        batch_augment: With ``on_device``: the augmentation applied to whole training batches
            (e.g. :class:`~kiln.data.BatchRandomAffine`); ``None`` uses the dataset's default.
        num_folds: Cross-validation: merge the train and val splits and cut them into this many
            folds, stratified by class for class data (``None``: the splits as loaded). The test split stays.
        fold: Which fold validates (the others train).
        fold_seed: Seed of the fold assignment.
    """

    num_classes: int | None = None  # classification: the classes the targets index; None for other targets
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    default_mean: tuple[float, ...] = (0.0,)
    default_std: tuple[float, ...] = (1.0,)
    class_names: tuple[str, ...] | None = None  # shown in pictures and predictions; None: the class indices

    @property
    def num_outputs(self) -> int | None:
        """What a network gives per sample for these targets: a logit per class (other data declares its own)."""
        return self.num_classes

    @property
    def in_channels(self) -> int | None:
        """Channels of a sample with 2+ dimensions (``C`` of ``(C, H, W)`` or ``(C, L)``); ``None`` for 1-D samples."""
        return self.input_shape[0] if len(self.input_shape) >= 2 else None

    def __init__(
        self,
        batch_size: PositiveInt = 64,
        eval_batch_size: PositiveInt | None = None,
        num_workers: NonNegativeInt | None = None,
        train_transforms: list[nn.Module] | None = None,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        on_device: bool = False,
        batch_augment: nn.Module | None = None,
        num_folds: PositiveInt | None = None,
        fold: NonNegativeInt = 0,
        fold_seed: int = 0,
    ) -> None:
        super().__init__()
        # under the CLI, its config of the data: a checkpoint rebuilds it. The frame is passed, never stored:
        # Lightning's own lookup (and a local variable) keeps it in a reference cycle, which would hold this
        # module and its loaders' worker processes until a garbage collection, whose shutdown of them stalls
        with warnings.catch_warnings():  # Lightning's advice on `nn.Module`s is a LightningModule's; dropped below
            warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`")
            self.save_hyperparameters(logger=False, frame=inspect.currentframe())
        for key in [k for k, v in self.hparams.items() if _built(v)]:
            del self.hparams[key]  # objects built in Python (a notebook's transforms): not a config
        if num_folds is not None and not (num_folds >= 2 and fold < num_folds):
            raise ConfigError(f"data.num_folds {num_folds}, data.fold {fold}: need num_folds >= 2 and fold < num_folds")
        self.num_folds, self.fold, self.fold_seed = num_folds, int(fold), fold_seed
        if on_device and train_transforms:
            raise ConfigError(
                "data.train_transforms run per sample in the DataLoader path and do not apply with "
                "data.on_device=true: set data.batch_augment (e.g. kiln.data.BatchRandomAffine) instead"
            )
        self.batch_size = int(batch_size)  # plain ints: checkpoints (a streaming loader's state) load safely
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.num_workers = default_num_workers() if num_workers is None else int(num_workers)
        self.train_transforms = train_transforms
        self.seed = torch.initial_seed() & 0xFFFF_FFFF  # what seed_everything set: shuffling and augmentation follow it
        self.mean = tuple(mean) if mean is not None else self.default_mean
        self.std = tuple(std) if std is not None else self.default_std
        self.on_device = on_device
        self.batch_augment = batch_augment
        self._device_copies: dict[int, tuple[Tensor, Tensor]] = {}
        self._batches_seen: dict[tuple[str, int], int] = {}  # per (stage, epoch): names a bad batch
        self.resume_position: tuple[int, int] | None = None  # (epoch, samples done), from resume_at
        self.train_set: SampleDataset | None = None
        self.val_set: SampleDataset | None = None
        self.test_set: SampleDataset | None = None

    def resume_at(self, epoch: int, samples: int) -> None:
        """The next training loader starts at ``samples`` into epoch ``epoch``'s order (ExactResume calls it)."""
        self.resume_position = (epoch, samples)

    def load(self) -> None:
        """Fill ``train_set``, ``val_set`` and ``test_set`` (with :meth:`make_dataset`); override per dataset."""
        raise NotImplementedError(f"{type(self).__name__} must implement load()")

    def setup(self, stage: str | None = None) -> None:
        """Load once, leaving the global RNGs as they were (see :func:`global_rngs_kept`)."""
        if self.train_set is None:
            with global_rngs_kept():
                self.load()
            if self.num_folds is not None:
                self._use_fold()

    def _use_fold(self) -> None:
        """Train on all folds but ``fold`` of train+val, validate on ``fold``."""
        train, val = self.train_set, self.val_set
        if not (isinstance(train, InMemoryDataset) and isinstance(val, InMemoryDataset)):
            raise ConfigError(f"data.num_folds: {type(self).__name__} has no in-memory train and val splits to fold")
        inputs, targets = torch.cat([train.inputs, val.inputs]), torch.cat([train.targets, val.targets])
        by_class = self.num_classes is not None and targets.ndim == 1
        keys = targets.tolist() if by_class else list(range(len(targets)))
        held_out = k_folds(keys, self.num_folds or 0, self.fold_seed, stratified=by_class) == self.fold
        self.train_set = self.make_dataset(inputs[~held_out], targets[~held_out], train=True)
        self.val_set = self.make_dataset(inputs[held_out], targets[held_out], train=False)

    def default_train_transforms(self) -> list[nn.Module]:
        """The augmentation used when ``train_transforms`` is ``None``; override per dataset."""
        return []

    def default_batch_augment(self) -> nn.Module | None:
        """The whole-batch augmentation used with ``on_device`` when ``batch_augment`` is ``None``."""
        return None

    def train_transform(self) -> Transform | None:
        """The composed training augmentation, or ``None`` for none."""
        chosen = self.default_train_transforms() if self.train_transforms is None else self.train_transforms
        if len(chosen) <= 1:  # per sample, a module wrapper around one transform costs as much as the seeding
            return chosen[0] if chosen else None
        return nn.Sequential(*chosen)

    def make_dataset(self, inputs: Tensor, targets: Tensor, train: bool) -> InMemoryDataset:
        """Wrap tensors with this module's normalisation (and augmentation when ``train``)."""
        if tuple(inputs.shape[1:]) != tuple(self.input_shape):
            raise DataError(
                f"{type(self).__name__}: samples have shape {tuple(inputs.shape[1:])} but input_shape declares "
                f"{tuple(self.input_shape)}; make them agree (a missing channel dimension: inputs.unsqueeze(1))"
            )
        return InMemoryDataset(inputs, self._as_declared(targets), **self.sample_options(train))

    def _as_declared(self, targets: Tensor) -> Tensor:
        """Class indices as int64 where the data declares classes (a float target there stops in one line, never
        truncated); any other targets as they are."""
        if self.num_classes is None:
            return targets
        if torch.is_floating_point(targets):
            raise DataError(
                f"{type(self).__name__} declares num_classes {self.num_classes}, but its targets are {targets.dtype}: "
                "class indices are integers (give targets.long() if they are whole numbers), or declare no "
                "num_classes for real-valued targets"
            )
        return targets.long()

    def sample_options(self, train: bool) -> dict[str, Any]:
        """What each split's dataset gets from this module: normalisation; augmentation and its seed for ``train``."""
        return {"mean": self.mean, "std": self.std, "transform": self.train_transform() if train else None,
                "seed": self.seed}  # fmt: skip

    def _loader(self, dataset: Dataset | None, train: bool) -> Any:
        """The loader of a split that is set up and not empty (each stops here in one line otherwise)."""
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before asking for a dataloader")
        self._refuse_empty(dataset, train)
        return self._new_loader(dataset, train)

    def _new_loader(self, dataset: Dataset, train: bool) -> Any:
        """A DataLoader (with ``on_device`` a DeviceLoader); for ``train`` shuffled, resumable, split over ranks."""
        trainer = self.trainer
        on_cuda = trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator)
        sampler = None
        if train:  # only training data is shuffled; evaluation order stays fixed
            ranks = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
            sampler = ResumableSampler(dataset, seed=self.seed, num_replicas=ranks[0], rank=ranks[1])  # type: ignore[arg-type]
            if self.resume_position is not None:  # the loader may be built, and started, before the loops restore
                epoch, samples = self.resume_position
                sampler.set_epoch(epoch)
                sampler.skip, self.resume_position = samples, None
        shard = None
        if not train and trainer is not None and trainer.world_size > 1:  # every sample once, never a padded repeat
            shard = EvaluationShard(dataset, trainer.world_size, trainer.global_rank)  # type: ignore[arg-type]
        if self.on_device:
            return self._device_loader(dataset, sampler or shard, train)
        if isinstance(dataset, InMemoryDataset) and self.num_workers == 0:
            quiet_worker_hint()
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            sampler=sampler or shard,
            num_workers=self.num_workers,
            pin_memory=on_cuda,  # pinned host memory only helps host-to-GPU copies
            persistent_workers=self.num_workers > 0,  # keep workers alive between epochs
            generator=torch.Generator().manual_seed(self.seed),  # never draw from the global RNG
            worker_init_fn=worker_init_fn(),  # a process-group SIGTERM is the main process's to handle
        )

    def _refuse_empty(self, dataset: Dataset, train: bool) -> None:
        """An empty split would train nothing (then test the untrained network), or choose the best
        checkpoint on no data, or report a test on nothing: each stops here, in one line."""
        if len(dataset) > 0:  # type: ignore[arg-type]
            return
        split = "training" if train else "validation" if dataset is self.val_set else "evaluation"
        if split == "validation" and self.trainer is not None and self.trainer.limit_val_batches == 0:
            return  # validation turned off on purpose
        fix = "check the data files and the split fractions"
        if split == "validation":
            fix += "; to train without validation: --trainer.limit_val_batches 0 and a ModelCheckpoint without monitor"
        raise DataError(f"{type(self).__name__}: the {split} set is empty; {fix}")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Check class labels on the host, before a bad one becomes an IndexError (or a CUDA device-side assert)."""
        labels = batch[1] if isinstance(batch, list | tuple) and len(batch) > 1 else None
        if self.num_classes is None or not isinstance(labels, Tensor) or torch.is_floating_point(labels):
            return batch
        if labels.device.type == "cpu" and labels.numel():
            stage = self.trainer.state.stage.value if self.trainer is not None and self.trainer.state.stage else "?"
            epoch = self.trainer.current_epoch if self.trainer is not None else 0
            count = self._batches_seen[(stage, epoch)] = self._batches_seen.get((stage, epoch), -1) + 1
            check_labels(labels, self.num_classes, f"{stage} batch {count} of epoch {epoch}")
        return batch

    def _device_loader(
        self, dataset: Dataset, sampler: ResumableSampler | EvaluationShard | None, train: bool
    ) -> DeviceLoader:
        if not isinstance(dataset, InMemoryDataset):
            raise ConfigError(
                f"data.on_device: {type(self).__name__} reads {type(dataset).__name__} samples, not tensors in memory: "
                "set data.init_args.cache=true to decode them once into memory, or on_device=false"
            )
        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        if not self._device_copies:  # before the first copy: every split, or a clear error
            splits = [d for d in (self.train_set, self.val_set, self.test_set) if isinstance(d, InMemoryDataset)]
            check_fits([t for d in splits for t in (d.inputs, d.targets)], device)
        if id(dataset) not in self._device_copies:  # moved once, kept for every epoch and stage
            if self.num_classes is not None and not torch.is_floating_point(dataset.targets):  # on the host, once
                check_labels(dataset.targets, self.num_classes, f"{type(self).__name__} data")
            self._device_copies[id(dataset)] = (dataset.inputs.to(device), dataset.targets.to(device))
        inputs, targets = self._device_copies[id(dataset)]
        augment = None
        if train:
            augment = self.batch_augment if self.batch_augment is not None else self.default_batch_augment()
        return DeviceLoader(
            inputs,
            targets,
            self.batch_size if train else self.eval_batch_size,
            self.mean,
            self.std,
            sampler=sampler,
            augment=augment.to(device) if augment is not None else None,
            seed=self.seed,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)
