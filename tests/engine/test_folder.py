"""A researcher's own images: class folders or a listing, checked before training, predicted by file."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
from dataset_files import truncate, write_bomb_png, write_image_folder, write_png16
from helpers import CONFIGS, LIMIT

from kiln.cli import build_cli
from kiln.data.datasets import InMemoryDataset
from kiln.data.folder import FolderDataModule, ImageFiles, decode
from kiln.errors import DataError

NAMES = ["one", "two", "zero"]  # sorted folder names: the class order


def folder_args(root: Path, *extra: str) -> list[str]:
    return ["--data", "kiln.data.FolderDataModule", "--data.root", str(root), "--data.image_size", "8",
            "--data.channels", "1", "--data.num_workers", "0", "--data.batch_size", "16",
            "--trainer.logger", "false", *extra]  # fmt: skip


@pytest.fixture
def pngs(tmp_path: Path) -> Path:
    """3 classes x 20 PNG files."""
    write_image_folder(tmp_path / "images", classes=3, per_class=20)
    return tmp_path / "images"


@pytest.mark.slow
def test_a_folder_of_pngs_trains_with_class_names_from_folders_and_predicts_by_file(pngs: Path) -> None:
    fit = build_cli(["fit", *folder_args(pngs), "--trainer.fast_dev_run", "true"])
    data = fit.datamodule
    assert data.class_names == tuple(NAMES) and data.num_classes == 3 and fit.model.num_classes == 3
    assert isinstance(data.train_set, ImageFiles) and fit.trainer.global_step == 1
    sizes = [len(data.train_set), len(data.val_set), len(data.test_set)]
    assert sizes == [48, 6, 6]  # val 10%, test 10% of each class (its own defaults, not the digits'): stratified
    assert sorted(data.val_set.targets.tolist()) == [0, 0, 1, 1, 2, 2]
    assert sorted(data.test_set.targets.tolist()) == [0, 0, 1, 1, 2, 2]
    ckpt = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    fit.trainer.save_checkpoint(ckpt)
    unlabelled = pngs.parent / "unlabelled"
    unlabelled.mkdir()
    for source in sorted(pngs.rglob("*.png"))[::15]:
        (unlabelled / f"{source.parent.name}-{source.name}").write_bytes(source.read_bytes())
    predicted = build_cli(
        ["predict", *folder_args(pngs, "--data.predict_dir", str(unlabelled)), "--ckpt_path", str(ckpt)]
    )
    with (Path(predicted.trainer.default_root_dir) / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["path"] for row in rows] == [str(p) for p in sorted(unlabelled.glob("*.png"))]
    for row in rows:
        probabilities = [float(row[f"p_{name}"]) for name in NAMES]
        assert row["class"] == NAMES[max(range(3), key=probabilities.__getitem__)]
        assert sum(probabilities) == pytest.approx(1, abs=1e-4) and row["label"] == ""


@pytest.mark.slow
def test_a_truncated_file_and_an_empty_class_are_named_one_line_each_and_nothing_is_left(pngs: Path) -> None:
    bad = sorted((pngs / "two").glob("*.png"))[3]
    truncate(bad)
    (pngs / "empty").mkdir()
    cwd = pngs.parent / "cli"
    cwd.mkdir()
    done = forkserver.run(
        [sys.executable, "-m", "kiln", "fit", *LIMIT, *folder_args(pngs)], capture_output=True, text=True, cwd=cwd
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert "error: class 'empty' has no images" in lines
    assert any(line.startswith(f"{bad}: unreadable or truncated image (") for line in lines)
    assert "FolderDataModule: 2 problem(s) above; fix them, or set data.init_args.on_bad_file=skip" in done.stderr
    assert not any((cwd / "runs").rglob("*.ckpt")) and not any((cwd / "runs").glob("*/*"))


@pytest.mark.slow
def test_skip_mode_trains_on_the_rest_and_says_how_many_were_left_out(
    pngs: Path, capsys: pytest.CaptureFixture
) -> None:
    truncate(sorted((pngs / "two").glob("*.png"))[3])
    (pngs / "empty").mkdir()
    cli = build_cli(["fit", *LIMIT, *folder_args(pngs, "--data.on_bad_file", "skip")])
    assert cli.trainer.state.finished and cli.datamodule.class_names == tuple(NAMES)
    data = cli.datamodule
    assert len(data.train_set) + len(data.val_set) + len(data.test_set) == 59
    assert "FolderDataModule: skipped 1 unreadable file(s) and 1 empty class(es):" in capsys.readouterr().err
    # predicting new files needs only the checkpoint and their folder: not the training images, nor a -c file
    photos = pngs.parent / "photos"
    photos.mkdir()
    for source in sorted((pngs / "one").glob("*.png"))[:2]:
        (photos / source.name).write_bytes(source.read_bytes())
    pngs.rename(pngs.parent / "moved")  # the training folder is gone (its bad file and empty class with it)
    ckpt = Path(cli.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    predicted = build_cli(["predict", "--ckpt_path", str(ckpt), "--data.init_args.predict_dir", str(photos)])
    with (Path(predicted.trainer.default_root_dir) / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [Path(row["path"]).name for row in rows] == sorted(p.name for p in photos.iterdir())
    assert all(row["class"] in NAMES for row in rows) and f"p_{NAMES[0]}" in rows[0]  # the trained classes


def test_classes_the_run_recorded_must_be_what_the_folder_holds(pngs: Path) -> None:
    data = FolderDataModule(root=pngs, image_size=8, channels=1, classes=NAMES)
    data.setup("fit")
    assert data.class_names == tuple(NAMES) and data.hparams["classes"] == NAMES
    (pngs / "three").mkdir()
    write_image_folder(pngs.parent / "more", classes=1, per_class=1)
    for png in (pngs.parent / "more").rglob("*.png"):
        png.rename(pngs / "three" / png.name)
    with pytest.raises(DataError, match=r"now holds classes \['one', 'three', 'two', 'zero'\], the run was trained"):
        FolderDataModule(root=pngs, image_size=8, channels=1, classes=NAMES).setup("test")


def test_split_folders_listings_imbalance_and_cache(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for split, n in (("train", 12), ("val", 4), ("test", 4)):
        write_image_folder(tmp_path / "split" / split, classes=2, per_class=n)
    data = FolderDataModule(root=tmp_path / "split", image_size=8, channels=1, num_workers=0)
    data.setup()
    assert [len(data.train_set), len(data.val_set), len(data.test_set)] == [24, 8, 8]  # type: ignore[arg-type]

    files = write_image_folder(tmp_path / "listed", classes=2, per_class=11)
    (tmp_path / "listed" / "labels.csv").write_text(
        "path,label\n" + "".join(f"{p.relative_to(tmp_path / 'listed')},{p.parent.name}\n" for p in files)
    )
    rows = [{"path": str(p.relative_to(tmp_path / "listed")), "label": p.parent.name} for p in files[:12]]
    (tmp_path / "listed" / "labels.json").write_text(json.dumps(rows))  # 11 of one class, 1 of the other
    from_csv = FolderDataModule(listing=tmp_path / "listed" / "labels.csv", image_size=8, channels=1, cache=True)
    from_csv.setup()
    assert from_csv.class_names == ("one", "zero") and isinstance(from_csv.train_set, InMemoryDataset)
    assert from_csv.train_set.inputs.dtype == torch.uint8 and from_csv.train_set.inputs.shape[1:] == (1, 8, 8)
    from_json = FolderDataModule(listing=tmp_path / "listed" / "labels.json", image_size=8, channels=1)
    from_json.setup()
    assert "class 'one' has 1 images, class 'zero' has 11: over 10x imbalance" in capsys.readouterr().err


def test_bad_layouts_are_one_line() -> None:
    with pytest.raises(DataError, match=r"is not a folder"):
        FolderDataModule(root="nowhere")
    with pytest.raises(Exception, match=r"either data.init_args.root .* or data.init_args.listing"):
        FolderDataModule()


@pytest.mark.slow
def test_the_folder_preset_runs(pngs: Path) -> None:
    preset = ["-c", str(CONFIGS / "data" / "folder.yaml"), "-c", str(CONFIGS / "debug" / "fast_dev_run.yaml")]
    cli = build_cli(["fit", *preset, "--data.init_args.root", str(pngs), "--data.init_args.num_workers", "0"])
    assert cli.trainer.global_step == 1 and cli.model.net.in_channels == 3 and cli.model.num_classes == 3
    assert Path(cli.trainer.default_root_dir).parent.name == "folder"


@pytest.mark.slow
def test_cached_images_take_the_on_device_path(pngs: Path) -> None:
    cli = build_cli(["fit", *folder_args(pngs, "--data.cache", "true", "--data.on_device", "true"),
                     "--trainer.fast_dev_run", "true"])  # fmt: skip
    assert cli.trainer.global_step == 1 and isinstance(cli.datamodule.train_set, InMemoryDataset)
    assert type(cli.datamodule.train_dataloader()).__name__ == "DeviceLoader"


def test_the_cli_built_module_normalises_with_imagenet_statistics_unless_given(pngs: Path) -> None:
    rgb = ["--data", "kiln.data.FolderDataModule", "--data.root", str(pngs), "--trainer.logger", "false"]
    assert build_cli(rgb, run=False).datamodule.mean == (0.485, 0.456, 0.406)  # the CLI passes mean=None
    given = build_cli([*rgb, "--data.mean", "[0.5, 0.5, 0.5]", "--data.std", "[0.2, 0.2, 0.2]"], run=False)
    assert given.datamodule.mean == (0.5, 0.5, 0.5) and given.datamodule.std == (0.2, 0.2, 0.2)


def test_a_16_bit_png_keeps_its_range_and_a_decompression_bomb_is_a_bad_file(
    pngs: Path, capsys: pytest.CaptureFixture
) -> None:
    ramp = np.arange(64).reshape(8, 8) * 1000  # 0 … 63000 of 65535
    write_png16(pngs / "one" / "deep.png", ramp)
    pixels = decode(pngs / "one" / "deep.png", 1, (8, 8))[0].numpy()
    assert np.array_equal(pixels, np.round(ramp * 255 / 65535))  # was 0 and 255 only: Pillow clips I;16 at 255
    write_bomb_png(pngs / "two" / "bomb.png")  # its header claims 10^10 pixels
    with pytest.raises(DataError, match=r"bomb.png: refused, Image size \(10000000000 pixels\) exceeds limit"):
        FolderDataModule(root=pngs, image_size=8, channels=1, num_workers=0).setup("fit")
    data = FolderDataModule(root=pngs, image_size=8, channels=1, num_workers=0, on_bad_file="skip")
    data.setup("fit")
    assert "skipped 1 unreadable file(s)" in capsys.readouterr().err
    assert sum(len(s) for s in (data.train_set, data.val_set, data.test_set) if s is not None) == 61  # + 16-bit
