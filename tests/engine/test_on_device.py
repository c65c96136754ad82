"""The on-device data path: the same samples as the DataLoader path, augmented a batch at a time."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from kiln.data import BatchRandomAffine, DeviceLoader
from kiln.data.sampling import ResumableSampler
from research.data import DigitsDataModule


def epoch_batches(loader: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]  # type: ignore[attr-defined]


def test_batches_equal_the_dataloader_path_when_augmentation_is_the_identity() -> None:
    loader_path = DigitsDataModule(batch_size=64, num_workers=0, train_transforms=[])
    with warnings.catch_warnings():  # built in Python (a notebook): no advice meant for a LightningModule
        warnings.simplefilter("error")
        device_path = DigitsDataModule(batch_size=64, on_device=True, batch_augment=BatchRandomAffine())
    for dm in (loader_path, device_path):
        dm.setup()
    for split in ("train_dataloader", "val_dataloader", "test_dataloader"):
        expected, got = epoch_batches(getattr(loader_path, split)()), epoch_batches(getattr(device_path, split)())
        assert len(expected) == len(got) == len(getattr(device_path, split)())
        for (xe, ye), (xg, yg) in zip(expected, got, strict=True):
            assert torch.equal(ye, yg)  # same samples, same order (shuffled the same way for training)
            torch.testing.assert_close(xg, xe, atol=1e-5, rtol=0)  # same normalisation


def shifted(image: torch.Tensor, dx: int, dy: int) -> torch.Tensor:
    """``image`` moved by (dx, dy) whole pixels, uncovered pixels 0."""
    padded = F.pad(image, (8, 8, 8, 8))
    h, w = image.shape[-2:]
    return padded[..., 8 - dy : 8 - dy + h, 8 - dx : 8 - dx + w]


def test_whole_pixel_shifts_and_flips_are_exact_copies_and_differ_per_sample() -> None:
    images = torch.rand(64, 3, 32, 32)
    out = BatchRandomAffine(translate=4 / 32, flip=0.5, whole_pixels=True)(images, torch.Generator().manual_seed(0))
    found = []
    for x, y in zip(images, out, strict=True):
        matches = [(dx, dy, flip) for flip in (False, True) for dx in range(-4, 5) for dy in range(-4, 5)
                   if torch.allclose(shifted(x.flip(-1) if flip else x, dx, dy), y, atol=1e-5)]  # fmt: skip
        assert matches, "an output is not a shifted (and maybe flipped) copy of its input"
        found.append(matches[0])
    assert len(set(found)) > 20  # drawn per sample, not once per batch
    assert 10 < sum(flip for _, _, flip in found) < 54  # flips with probability 1/2


def line_angles(images: torch.Tensor) -> torch.Tensor:
    """The direction (degrees) of the pixel mass's principal axis in each image."""
    size = images.shape[-1]
    ys, xs = torch.meshgrid(torch.arange(size) - size // 2, torch.arange(size) - size // 2, indexing="ij")
    w = images[:, 0]
    cov_xx, cov_yy, cov_xy = ((w * a * b).sum((1, 2)) for a, b in ((xs, xs), (ys, ys), (xs, ys)))
    return torch.rad2deg(0.5 * torch.atan2(2 * cov_xy, cov_xx - cov_yy))


def test_rotation_turns_each_image_by_its_own_angle_within_the_range() -> None:
    image = torch.zeros(1, 1, 33, 33)
    image[..., 16, 4:29] = 1.0  # a horizontal line through the centre
    out = BatchRandomAffine(degrees=30)(image.repeat(64, 1, 1, 1), torch.Generator().manual_seed(0))
    assert torch.all(out[:, 0, 16, 16] > 0.9)  # the centre stays put
    angles = line_angles(out)
    assert angles.abs().max() <= 31 and angles.max() - angles.min() > 45  # spread over [-30, 30]
    assert line_angles(BatchRandomAffine()(image)).abs().max() < 0.5  # no rotation asked, none done


def test_augmentation_is_seeded_by_epoch_and_batch_and_resumes_aligned() -> None:
    dm = DigitsDataModule(batch_size=64, on_device=True)
    dm.setup()
    loader = dm.train_dataloader()
    assert isinstance(loader, DeviceLoader) and isinstance(loader.sampler, ResumableSampler)
    first, again = epoch_batches(loader), epoch_batches(loader)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))  # same epoch, same batches
    loader.sampler.set_epoch(1)
    second = epoch_batches(loader)
    assert not torch.equal(first[0][1], second[0][1])  # a new order
    dm.resume_position = (1, 3 * 64)  # what ExactResume hands over: epoch 1, 3 batches (in samples) done
    resumed = epoch_batches(dm.train_dataloader())
    assert len(resumed) == len(second) - 3
    for (xr, yr), (xs, ys) in zip(resumed, second[3:], strict=True):
        assert torch.equal(yr, ys) and torch.equal(xr, xs)  # the same batches, augmented the same way


def test_ranks_split_the_training_set() -> None:
    images, labels = torch.rand(10, 1, 4, 4), torch.arange(10)
    seen = []
    for rank in (0, 1):
        sampler = ResumableSampler(images, seed=0, num_replicas=2, rank=rank)
        seen += [int(i) for _, y in DeviceLoader(images, labels, 2, (0.5,), (0.5,), sampler=sampler) for i in y]
    assert sorted(seen) == list(range(10))


def test_per_sample_transforms_with_on_device_are_refused_naming_the_fix() -> None:
    from torchvision.transforms import v2

    with pytest.raises(ValueError, match=r"data\.batch_augment"):
        DigitsDataModule(on_device=True, train_transforms=[v2.RandomHorizontalFlip()])


@pytest.mark.slow
def test_on_device_training_reaches_the_dataloader_accuracy() -> None:
    from kiln.cli import build_cli

    args = ["fit", "--data.on_device", "true", "--trainer.max_epochs", "12", "--trainer.logger", "false"]
    cli = build_cli(args)
    assert isinstance(cli.datamodule.train_dataloader(), DeviceLoader)
    assert cli.test_metrics is not None and cli.test_metrics["test/acc"] >= 0.97


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_device_batches_live_on_the_gpu_and_training_learns() -> None:
    from helpers import CONFIGS

    from kiln.cli import build_cli

    args = ["fit", "-c", str(CONFIGS / "trainer" / "gpu.yaml"), "-c", str(CONFIGS / "data" / "on_device.yaml")]
    cli = build_cli([*args, "--trainer.max_epochs", "12", "--trainer.logger", "false"])
    loader = cli.datamodule.train_dataloader()
    assert isinstance(loader, DeviceLoader) and loader.inputs.is_cuda
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda
    assert cli.test_metrics is not None and cli.test_metrics["test/acc"] >= 0.97


def test_a_dataset_too_big_for_the_gpu_is_refused_with_sizes_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.data.on_device import check_fits
    from kiln.errors import DeviceMemoryError

    images = torch.zeros(1024, 3, 32, 32, dtype=torch.uint8)  # 3 MiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * 2**20, 80 * 2**30))
    with pytest.raises(DeviceMemoryError, match=r"needs 3 MiB but cuda:0 has 4 MiB free.*on_device=false"):
        check_fits([images], torch.device("cuda", 0))  # 3 MiB of 4 MiB free: over half
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**20, 80 * 2**30))
    check_fits([images], torch.device("cuda", 0))  # fits in half of 8 MiB
    check_fits([images], torch.device("cpu"))  # host memory already holds it
