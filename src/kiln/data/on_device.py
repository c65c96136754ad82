"""A data path for datasets that fit in device memory: no DataLoader, no workers, no copies per batch."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kiln.data.sampling import EvaluationShard, ResumableSampler
from kiln.errors import ConfigError, DeviceMemoryError


def check_fits(tensors: Sequence[Tensor], device: torch.device, share: float = 0.5) -> None:
    """Refuse, with the sizes and the fix, to move tensors that would take over ``share`` of the device's free memory.

    The rest stays for the model, activations and optimizer; a CUDA out-of-memory error halfway
    through moving the splits would say none of that.
    """
    if device.type != "cuda":
        return  # host memory already holds the data
    needed = sum(t.numel() * t.element_size() for t in tensors)
    free, _ = torch.cuda.mem_get_info(device)
    if needed > share * free:
        raise DeviceMemoryError(
            f"data.on_device: the data needs {_size(needed)} but {device} has {_size(free)} free "
            f"(at most {share:.0%} of it goes to data): set data.init_args.on_device=false to load batches with a "
            "DataLoader instead"
        )


def to_unit_float(inputs: Tensor) -> Tensor:
    """uint8 pixels to float in [0, 1]; floats as float32; other integers (token ids, indices) as they are,
    never normalised nor augmented. Used per batch by both data paths."""
    if inputs.dtype == torch.uint8:
        return inputs.float().div_(255)
    return inputs.float() if torch.is_floating_point(inputs) else inputs


def normalised(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """``(x - mean) / std`` for float inputs; integer ones (token ids) as they are (a copy: made outside inference
    mode, it is an ordinary tensor that autograd may save, as the float result is)."""
    return (x - mean) / std if torch.is_floating_point(x) else x.clone()


def stats_view(values: Sequence[float], sample_shape: Sequence[int], name: str) -> Tensor:
    """Normalisation statistics shaped to broadcast over one sample: one value for all, one per
    channel (dim 0 of a sample with 2+ dims), or one per feature of a 1-D sample. Used by both data paths."""
    stats = torch.tensor(tuple(values), dtype=torch.float32)
    if len(stats) == 1:
        return stats.reshape(())
    if len(sample_shape) and len(stats) == sample_shape[0]:
        return stats.view(-1, *[1] * (len(sample_shape) - 1))
    per = "channel" if len(sample_shape) > 1 else "feature"
    raise ConfigError(
        f"data.{name}: {len(stats)} values, but samples have shape {tuple(sample_shape)}: give 1 value, "
        f"or one per {per} ({sample_shape[0] if len(sample_shape) else 1})"
    )


def augmentation_seed(seed: int, epoch: int, position: int) -> int:
    """The seed of one augmentation draw, from (run seed, epoch, sample or batch number): the same in
    any worker and after any restart. Used by both data paths."""
    return hash((seed, epoch, position)) & 0x7FFF_FFFF_FFFF_FFFF


@contextmanager
def seeded_augmentation(seed: int | None) -> Iterator[None]:
    """Seed torch's default generator (what per-sample transforms draw from) for one draw, then put its
    state back, so the run's own random stream is untouched (cheaper than ``fork_rng`` plus a seed).
    ``None``: no seeding (a key without an epoch)."""
    if seed is None:
        yield
        return
    generator = torch.default_generator
    state = generator.get_state()
    generator.manual_seed(seed)
    try:
        yield
    finally:
        generator.set_state(state)


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.0f} MiB"


class BatchRandomAffine(nn.Module):
    """Per-sample random rotation, shift and horizontal flip of a whole batch in one ``grid_sample``.

    The batch counterpart of torchvision's per-sample ``RandomAffine``, ``RandomCrop(padding=p)``
    and ``RandomHorizontalFlip``: one kernel launch on the device instead of a Python call per image.
    Uncovered pixels are filled with 0 (black, before normalisation).

    Args:
        degrees: Rotation drawn uniformly from ``[-degrees, degrees]``.
        translate: Largest shift as a fraction of the height/width.
        flip: Probability of a horizontal flip.
        whole_pixels: Round shifts to whole pixels (with ``degrees=0`` the output is an exact
            shifted copy, like ``RandomCrop`` with zero padding).
    """

    def __init__(self, degrees: float = 0.0, translate: float = 0.0, flip: float = 0.0, whole_pixels: bool = False):
        super().__init__()
        self.degrees, self.translate, self.flip, self.whole_pixels = degrees, translate, flip, whole_pixels

    def forward(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if x.ndim != 4:
            raise ConfigError(
                f"data.batch_augment: BatchRandomAffine moves images (batch, channels, H, W), got a batch of shape "
                f"{tuple(x.shape)}: set data.init_args.batch_augment to an augmentation for these samples"
            )
        n, _, height, width = x.shape
        r = torch.rand(n, 4, generator=generator, device=x.device)
        angle = (2 * r[:, 0] - 1) * math.radians(self.degrees)
        shifts = []
        for column, size in ((1, width), (2, height)):
            if self.whole_pixels:  # uniform over the integers -m..m, then to grid units (2 / size per pixel)
                most = math.floor(self.translate * size)
                pixels = torch.floor(r[:, column] * (2 * most + 1)) - most
                shifts.append(pixels * 2 / size)
            else:
                shifts.append((2 * r[:, column] - 1) * self.translate * 2)
        mirror = torch.where(r[:, 3] < self.flip, -1.0, 1.0)
        cos, sin = torch.cos(angle), torch.sin(angle)
        theta = torch.stack(
            [torch.stack([cos * mirror, -sin, shifts[0]], 1), torch.stack([sin * mirror, cos, shifts[1]], 1)], 1
        )
        grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


class DeviceLoader:
    """Batches sliced from input and target tensors that already live on the training device.

    Stands in for a ``DataLoader`` (Lightning accepts any sized iterable and calls
    ``sampler.set_epoch`` through the ``sampler`` attribute). Images are kept as stored (uint8 for
    the torchvision sets: 4x less memory); each batch is converted to float, augmented as a whole
    and normalised on the device. The augmentation of batch ``b`` of epoch ``e`` is seeded from
    ``(seed, e, b)``, so a resumed run sees the same batches as an uninterrupted one.

    Args:
        inputs: ``N x ...`` samples (images as uint8, or float) on the device.
        targets: ``N`` targets on the same device (class indices, real values, token ids: as they are).
        batch_size: Samples per batch (the last batch may be smaller).
        mean: Normalisation mean (one value, or one per channel or feature; see ``stats_view``).
        std: Normalisation std, given like ``mean``.
        sampler: Training order (shuffled, split over ranks, resumable), or under DDP an evaluation set's share
            of this rank (``EvaluationShard``); ``None`` keeps dataset order.
        augment: Batch augmentation called as ``augment(images, generator)``; ``None`` for none.
        seed: Seed of the augmentation.
    """

    def __init__(
        self,
        inputs: Tensor,
        targets: Tensor,
        batch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        sampler: ResumableSampler | EvaluationShard | None = None,
        augment: nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        self.inputs, self.targets, self.batch_size = inputs, targets, batch_size
        self.mean = stats_view(mean, inputs.shape[1:], "mean").to(inputs.device)
        self.std = stats_view(std, inputs.shape[1:], "std").to(inputs.device)
        self.sampler, self.augment, self.seed = sampler, augment, seed
        self.batch_sampler = None  # what Lightning looks for next to `sampler`
        self.generator = torch.Generator(device=inputs.device)

    def __len__(self) -> int:
        samples = len(self.sampler) if self.sampler is not None else len(self.targets)
        return math.ceil(samples / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        epoch, first_batch = 0, 0
        if self.sampler is None:
            order = torch.arange(len(self.targets), device=self.inputs.device)
        elif isinstance(self.sampler, EvaluationShard):
            order = torch.tensor(list(self.sampler), dtype=torch.long).to(self.inputs.device)
        else:
            skipped = self.sampler.skip  # consumed by iterating the sampler; batches stay aligned
            keys = list(self.sampler)
            epoch, first_batch = self.sampler.epoch, skipped // self.batch_size
            order = torch.tensor([index for _, index in keys], dtype=torch.long).to(self.inputs.device)
        for number, start in enumerate(range(0, len(order), self.batch_size), start=first_batch):
            index = order[start : start + self.batch_size]
            with torch.inference_mode():  # not held across the yield: the training step needs autograd
                x = to_unit_float(self.inputs[index])
                if self.augment is not None and torch.is_floating_point(x):
                    self.generator.manual_seed(augmentation_seed(self.seed, epoch, number))
                    x = self.augment(x, self.generator)
            yield normalised(x, self.mean, self.std), self.targets[index]  # made outside inference mode: ordinary
