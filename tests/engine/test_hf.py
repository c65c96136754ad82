"""Hugging Face datasets, written by the tests in the formats `datasets` itself writes (no hub)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import LIMIT, needs
from PIL import Image

from kiln.cli import build_cli
from kiln.data import HFDataModule
from kiln.errors import DataError
from research.data.digits import load_digits
from research.data.waveforms import waveforms

needs("datasets", reason="needs the data extra (make install; uv sync --extra data)")

DIGIT_NAMES = ["zero", "one", "two"]


def digit_rows(n: int) -> dict[str, list]:
    images, labels = load_digits()
    keep = (labels < 3).nonzero().flatten()[:n].tolist()
    pictures = [Image.fromarray((images[i].numpy() * 255 / 16).astype(np.uint8), mode="L") for i in keep]
    return {"image": pictures, "label": [int(labels[i]) for i in keep]}


@pytest.mark.slow
def test_a_saved_image_dataset_trains_with_names_from_its_class_label(tmp_path: Path) -> None:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=DIGIT_NAMES)})
    datasets.Dataset.from_dict(digit_rows(90), features=features).save_to_disk(str(tmp_path / "saved"))
    args = ["--data", "kiln.data.HFDataModule", "--data.path", str(tmp_path / "saved"), "--data.image_size", "8",
            "--data.channels", "1", "--data.num_workers", "0", "--data.batch_size", "16",
            "--trainer.logger", "false"]  # fmt: skip
    cli = build_cli(["fit", *LIMIT, *args])
    data = cli.datamodule
    assert data.class_names == tuple(DIGIT_NAMES) and cli.model.num_classes == 3 and cli.model.net.in_channels == 1
    assert data.input_shape == (1, 8, 8) and cli.trainer.state.finished
    assert [len(data.train_set), len(data.val_set), len(data.test_set)] == [72, 9, 9]  # its own 10% / 10%, not digits'
    assert "test/acc" in (cli.test_metrics or {})


def test_parquet_splits_of_signals_with_string_labels(tmp_path: Path) -> None:
    import datasets

    signals, labels = waveforms(120, 32, 0.1, seed=0)
    shapes = ["sine", "square", "triangle", "sawtooth"]
    for split, rows in (("train", slice(0, 100)), ("test", slice(100, 120))):
        table = {"signal": signals[rows].tolist(), "shape": [shapes[i] for i in labels[rows].tolist()]}
        datasets.Dataset.from_dict(table).to_parquet(str(tmp_path / f"{split}.parquet"))
    files = {"train": str(tmp_path / "train.parquet"), "test": str(tmp_path / "test.parquet")}
    data = HFDataModule(data_files=files, input_column="signal", label_column="shape", num_workers=0)
    data.setup()
    assert data.class_names == tuple(sorted(shapes)) and data.num_classes == 4 and data.input_shape == (32,)
    assert [len(data.train_set), len(data.val_set), len(data.test_set)] == [92, 8, 20]  # type: ignore[arg-type]  # 2 of each 25
    x, y = data.val_set[0]  # type: ignore[index]
    assert x.shape == (32,) and 0 <= int(y) < 4


def test_a_missing_column_names_the_columns_there_are(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"pixels": [[0.0, 1.0]] * 4, "label": [0, 1, 0, 1]}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"no column 'image' \(columns: pixels, label\); set data.init_args.input_co"):
        HFDataModule(path=tmp_path / "d")


def test_real_valued_labels_are_refused_not_read_as_one_class_per_value(tmp_path: Path) -> None:
    import datasets

    rows = {"x": [[0.0, 1.0]] * 4, "label": [0.25, 1.5, 0.25, 3.75]}  # a regression's targets: were 3 "classes"
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError, match=r"the label column 'label' holds real values \(0.25, …\); HFDataModule reads"):
        HFDataModule(path=tmp_path / "d", input_column="x")


def test_a_dataset_by_name_goes_through_load_dataset_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    signals, labels = waveforms(40, 16, 0.1, seed=1)
    folder = tmp_path / "my-dataset"
    folder.mkdir()
    datasets.Dataset.from_dict({"x": signals.tolist(), "label": labels.tolist()}).to_parquet(
        str(folder / "train.parquet")
    )
    data = HFDataModule(name=str(folder), input_column="x", num_workers=0)
    data.setup()
    assert data.num_classes == 4 and data.input_shape == (16,) and len(data.train_set) == 32  # type: ignore[arg-type]
