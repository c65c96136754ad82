"""Data: seeded splits, loader hygiene, the real MNIST/CIFAR formats, and the missing-data error."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from dataset_files import write_cifar10, write_mnist
from torch.utils.data import SequentialSampler

from kiln.commands.boundary import main
from kiln.data import CIFAR10DataModule, FashionMNISTDataModule, MNISTDataModule, SyntheticDataModule
from kiln.data.sampling import ResumableSampler
from kiln.errors import DataError, MissingDataError
from research.data import DigitsDataModule
from research.models import Classifier
from research.nets import SmallCNN


def test_digits_split_is_seeded_disjoint_and_complete() -> None:
    a, b, c = DigitsDataModule(split_seed=3), DigitsDataModule(split_seed=3), DigitsDataModule(split_seed=4)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.test_set.targets, b.test_set.targets)  # type: ignore[union-attr, arg-type]
    assert torch.equal(a.test_set.inputs, b.test_set.inputs)  # type: ignore[union-attr]
    assert not torch.equal(a.test_set.inputs, c.test_set.inputs)  # type: ignore[union-attr]
    sizes = [len(s) for s in (a.train_set, a.val_set, a.test_set)]  # type: ignore[arg-type]
    assert sum(sizes) == 1797 and sizes[2] == round(0.2 * 1797)
    rows = lambda ds: {tuple(x.flatten().tolist()) for x in ds.inputs}  # noqa: E731
    assert not rows(a.train_set) & rows(a.test_set)


def test_loader_hygiene_on_cpu() -> None:
    dm = DigitsDataModule(batch_size=16, eval_batch_size=100, num_workers=2)
    dm.setup()
    train, val, test = dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()
    assert isinstance(train.sampler, ResumableSampler) and train.sampler.shuffle  # only training data is shuffled
    assert isinstance(val.sampler, SequentialSampler) and isinstance(test.sampler, SequentialSampler)
    assert train.batch_size == 16 and val.batch_size == 100
    assert not train.pin_memory  # no CUDA here: pinning would only cost
    assert train.persistent_workers and train.num_workers == 2
    no_workers = DigitsDataModule(num_workers=0)
    no_workers.setup()
    assert not no_workers.train_dataloader().persistent_workers


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to hand out")
def test_default_workers_follow_the_cores_the_job_was_given_and_leave_one_for_training() -> None:
    from research.data import DigitsDataModule

    mine = os.sched_getaffinity(0)
    given = {}
    try:  # this thread limited to fewer cores than the machine has, as a SLURM job or a container is
        for n in (1, 2):
            os.sched_setaffinity(0, sorted(mine)[:n])
            given[n] = DigitsDataModule().num_workers
    finally:
        os.sched_setaffinity(0, mine)
    assert given == {1: 0, 2: 1}


@pytest.mark.slow
def test_a_script_that_ends_holding_a_loader_with_workers_exits() -> None:
    script = (
        "from research.data import DigitsDataModule\n"
        "dm = DigitsDataModule(batch_size=64, num_workers=2)\n"
        "dm.setup()\n"
        "batches = iter(dm.train_dataloader())\n"  # its workers ignore SIGTERM: multiprocessing's exit would wait
        "next(batches)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_datamodule_and_a_model_are_freed_when_dropped_with_their_saved_config() -> None:
    def dropped(make: Callable[[], Any], key: str, value: object) -> weakref.ref:
        made = make()
        assert made.hparams[key] == value  # what a checkpoint records of it
        return weakref.ref(made)

    gc.disable()  # freed by reference counting: loader workers and device memory go with them, not at a collection
    try:
        data = dropped(lambda: DigitsDataModule(batch_size=32, num_workers=0), "batch_size", 32)
        net = SmallCNN(num_classes=10, in_channels=1)
        model = dropped(lambda: Classifier(net=net, num_classes=10, label_smoothing=0.1), "label_smoothing", 0.1)
        assert data() is None and model() is None
    finally:
        gc.enable()


def test_augmentation_only_in_training() -> None:
    dm = DigitsDataModule()
    dm.setup()
    assert dm.train_set.transform is not None  # type: ignore[union-attr]
    assert dm.val_set.transform is None and dm.test_set.transform is None  # type: ignore[union-attr]
    off = DigitsDataModule(train_transforms=[])
    off.setup()
    assert off.train_set.transform is None  # type: ignore[union-attr]


def test_mnist_reads_real_format_and_normalises(tmp_path: Path) -> None:
    written = write_mnist(tmp_path / "data" / "MNIST" / "raw", n_train=50, n_test=20, seed=7)
    dm = MNISTDataModule(
        data_dir=tmp_path / "data", val_fraction=0.2, batch_size=10, num_workers=0, train_transforms=[]
    )
    dm.prepare_data()
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (40, 10, 20)  # type: ignore[arg-type]
    x, y = next(iter(dm.test_dataloader()))
    assert x.shape == (10, 1, 28, 28) and x.dtype == torch.float32
    assert y.dtype == torch.int64
    images, labels = written[False]
    expected = (torch.from_numpy(images[:10]).float().unsqueeze(1) / 255 - 0.1307) / 0.3081
    torch.testing.assert_close(x, expected)
    assert torch.equal(y, torch.from_numpy(labels[:10]).long())


def test_fashion_mnist_and_cifar10_shapes(mnist_root: Path, cifar_root: Path) -> None:
    fashion = FashionMNISTDataModule(data_dir=mnist_root, batch_size=8, num_workers=0)
    cifar = CIFAR10DataModule(data_dir=cifar_root, batch_size=8, num_workers=0)
    for dm, shape in ((fashion, (8, 1, 28, 28)), (cifar, (8, 3, 32, 32))):
        dm.prepare_data()
        dm.setup()
        x, y = next(iter(dm.train_dataloader()))
        assert x.shape == shape and y.shape == (8,)
        assert int(y.max()) < 10
    assert len(cifar.test_set) == 20  # type: ignore[arg-type]


def test_missing_files_error_is_one_line_naming_folder_and_files(tmp_path: Path) -> None:
    dm = MNISTDataModule(data_dir=tmp_path / "nowhere", download=False)
    with pytest.raises(MissingDataError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert "\n" not in message
    assert str((tmp_path / "nowhere" / "MNIST" / "raw").resolve()) in message
    assert "train-images-idx3-ubyte" in message and "t10k-labels-idx1-ubyte" in message
    assert "download=true" in message


def test_failed_download_is_the_same_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchvision's own message, from a mirror that refuses the connection: its first line ended in a colon."""
    from torchvision import datasets

    with socket.socket() as closed:  # a port nothing listens on once this block ends
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(datasets.MNIST, "mirrors", [f"http://127.0.0.1:{port}/"])
    dm = MNISTDataModule(data_dir=tmp_path / "data", download=True)
    with pytest.raises(MissingDataError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert "\n" not in message and "download failed" in message and "MNIST/raw" in message
    assert "(Error downloading train-images-idx3-ubyte.gz: <urlopen error [Errno 111] Connection refused>)" in message


def test_synthetic_data_is_cifar_shaped_and_repeatable() -> None:
    a, b = SyntheticDataModule(num_samples=40, batch_size=8, num_workers=0), SyntheticDataModule(num_samples=40)
    a.setup()
    b.setup()
    assert torch.equal(a.train_set.inputs, b.train_set.inputs)  # type: ignore[union-attr]
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and int(y.max()) < 10
    assert (len(a.train_set), len(a.val_set), len(a.test_set)) == (40, 4, 4)  # type: ignore[arg-type]


def test_training_batches_do_not_depend_on_worker_count_and_follow_the_epoch() -> None:
    def epoch(workers: int, number: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        dm = DigitsDataModule(batch_size=64, num_workers=workers)
        dm.setup()
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(number)  # type: ignore[attr-defined]
        return list(loader)

    in_process, in_workers = epoch(0, 0), epoch(2, 0)
    for (xa, ya), (xb, yb) in zip(in_process, in_workers, strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)  # same order, same augmentation
    assert not torch.equal(in_process[0][0], epoch(0, 1)[0][0])  # a new epoch draws anew


def test_a_batch_fetch_equals_item_by_item_without_augmentation() -> None:
    dm = DigitsDataModule(batch_size=64, num_workers=0)
    dm.setup()
    assert dm.val_set is not None
    batch = dm.val_set.__getitems__([3, 1, 4])
    for key, (x, y) in zip([3, 1, 4], batch, strict=True):
        x1, y1 = dm.val_set[key]
        assert torch.equal(x, x1) and torch.equal(y, y1)


@pytest.mark.parametrize("on_device", [False, True])
def test_batches_are_built_without_autograd_but_train_like_any_tensor(on_device: bool) -> None:
    """Augmentation runs under inference_mode for speed; the batch that leaves it must still be trainable."""
    dm = DigitsDataModule(batch_size=16, num_workers=0, on_device=on_device)
    dm.setup()
    x, y = next(iter(dm.train_dataloader()))
    assert dm.train_set is not None
    item = dm.train_set[0]  # a sample on its own (a notebook), with no collate to copy it
    assert not any(t.is_inference() for t in (x, y, *item))
    conv = torch.nn.Conv2d(1, 4, 3)  # saves its input for the weight gradient: refused for inference tensors
    loss = torch.nn.functional.cross_entropy(conv(x).mean((2, 3)), y % 4)
    loss.backward()
    assert conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()


def test_float_targets_of_data_that_declares_classes_stop_in_one_line_never_truncated() -> None:
    data = DigitsDataModule()
    with pytest.raises(DataError, match=r"declares num_classes 10, but its targets are torch.float32: class indices"):
        data.make_dataset(torch.zeros(4, 1, 8, 8), torch.tensor([0.5, 1.0, 2.7, 3.0]), train=True)
    kept = SyntheticDataModule(num_samples=8, num_classes=3)
    kept.num_classes = None  # no classes declared: real-valued targets stay as they are
    dataset = kept.make_dataset(torch.zeros(4, 3, 32, 32), torch.tensor([0.5, 1.0, 2.7, 3.0]), train=False)
    assert dataset.targets.dtype == torch.float32 and dataset[2][1].item() == pytest.approx(2.7)


def test_cifar_files_that_fail_torchvisions_md5_check_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """It was an internal error (RuntimeError: Dataset not found or corrupted)."""
    write_cifar10(tmp_path / "data" / "cifar-10-batches-py", n_per_batch=20, seed=0)  # not the release's bytes
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--data", "kiln.data.CIFAR10DataModule", f"--data.init_args.data_dir={tmp_path / 'data'}",
              "--trainer.fast_dev_run=true", "--trainer.logger=false"])  # fmt: skip
    assert stop.value.code != 0
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "fail torchvision's check against the official release" in line and "internal error" not in line
