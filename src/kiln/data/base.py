"""The DataModule for tensors in memory, of any sample shape, and the DataLoader hygiene every kiln DataModule
shares (its datasets: ``kiln.data.datasets``; its splits: ``kiln.data.splits``)."""

from __future__ import annotations

from typing import Any

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from lightning.pytorch.accelerators import CUDAAccelerator
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from kiln.console import quiet_worker_hint
from kiln.data import loaders
from kiln.data.datasets import InMemoryDataset, SampleDataset, Transform, check_labels, global_rngs_kept
from kiln.data.splits import k_folds
from kiln.errors import ConfigError, DataError
from kiln.process.stop_signals import worker_init_fn
from kiln.training.hparams import save_config


def _check_options(num_folds: int | None, fold: int, on_device: bool, train_transforms: list | None) -> None:
    """Options that cannot go together stop before any data is read."""
    if num_folds is not None and not (num_folds >= 2 and fold < num_folds):
        raise ConfigError(f"data.num_folds {num_folds}, data.fold {fold}: need num_folds >= 2 and fold < num_folds")
    if on_device and train_transforms:
        raise ConfigError(
            "data.train_transforms run per sample in the DataLoader path and do not apply with "
            "data.on_device=true: set data.batch_augment (e.g. kiln.data.BatchRandomAffine) instead"
        )


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
        save_config(self, logger=False)  # under the CLI, its config of the data: a checkpoint rebuilds it
        _check_options(num_folds, fold, on_device, train_transforms)
        self.num_folds, self.fold, self.fold_seed = num_folds, int(fold), fold_seed
        self.batch_size = int(batch_size)  # plain ints: checkpoints (a streaming loader's state) load safely
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.num_workers = loaders.default_num_workers() if num_workers is None else int(num_workers)
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
        loaders.refuse_empty(self, dataset, train)
        return self._new_loader(dataset, train)

    def _new_loader(self, dataset: Dataset, train: bool) -> Any:
        """A DataLoader (with ``on_device`` a DeviceLoader); for ``train`` shuffled, resumable, split over ranks."""
        sampler = loaders.sampler(self, dataset, train)
        if self.on_device:
            return loaders.device_loader(self, dataset, sampler, train)
        if isinstance(dataset, InMemoryDataset) and self.num_workers == 0:
            quiet_worker_hint()
        trainer = self.trainer
        return DataLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            pin_memory=trainer is not None and isinstance(trainer.accelerator, CUDAAccelerator),  # host-to-GPU only
            persistent_workers=self.num_workers > 0,  # keep workers alive between epochs
            generator=torch.Generator().manual_seed(self.seed),  # never draw from the global RNG
            worker_init_fn=worker_init_fn(),  # a process-group SIGTERM is the main process's to handle
        )

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

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)
