"""Export for serving: ONNX and torch.export files that agree with the eager model; `kiln infer` without torch."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
from dataset_files import write_image_folder
from helpers import CONFIGS, LIMIT, PROBES, needs

from kiln.cli import build_cli
from kiln.commands.boundary import main
from kiln.data.folder import decode
from research.data.waveforms import SHAPES

needs("onnx", "onnxscript", "onnxruntime", reason="needs the onnx extra (make install; uv sync --extra onnx)")

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.mark.slow
def test_export_agrees_with_the_eager_model_and_infer_runs_without_torch(tmp_path: Path) -> None:
    fit = build_cli(["fit", *LIMIT, *QUIET, "--run.root", str(tmp_path), "--run.test_after_fit=false"])
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    out = tmp_path / "served"
    main(["export", "--ckpt_path", best, "--output", str(out), "--batch_sizes", "1,7"])
    assert {p.name for p in out.iterdir()} == {"model.onnx", "model.pt2", "preprocess.json", "parity.json"}
    report = json.loads((out / "parity.json").read_text())
    assert report["samples"] == len(fit.datamodule.test_set)
    for fmt in ("onnx", "pt2"):
        for size in ("1", "7"):
            assert report[fmt][size]["max_abs_diff"] < 1e-4 and report[fmt][size]["top1_agreement"] == 1.0
    with pytest.raises(SystemExit) as stop:  # above the tolerance: one line, nothing written
        main(["export", "--ckpt_path", best, "--output", str(tmp_path / "strict"), "--tolerance=-1"])
    assert stop.value.code == 1 and not list(tmp_path.glob("*strict*"))
    model = fit.model.eval()
    x = torch.randn(5, 1, 8, 8)
    with torch.inference_mode():  # the module's own forward, logits: no softmax added
        assert torch.allclose(torch.export.load(out / "model.pt2").module()(x), model(x), atol=1e-6)
    assert json.loads((out / "preprocess.json").read_text())["output"] == "logits"

    images = write_image_folder(tmp_path / "images", classes=3, per_class=2)
    command = [sys.executable, "-X", "importtime", "-m", "kiln", "infer", "--model", str(out / "model.onnx"),
               "--output", str(tmp_path / "predictions.csv"), "--batch_size", "4",  # 6 images: 2 batches
               str(tmp_path / "images")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"predictions: {(tmp_path / 'predictions.csv').resolve()}" in done.stderr  # where it went
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "onnxruntime" in imported and not {m for m in imported if m == "torch" or m.startswith("torch.")}
    with (tmp_path / "predictions.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["path"] for row in rows] == [str(p) for p in sorted(images)]
    mean, std = fit.datamodule.mean, fit.datamodule.std
    with torch.inference_mode():
        inputs = torch.stack([decode(p, 1, (8, 8)).float() / 255 for p in sorted(images)])
        eager = model((inputs - mean[0]) / std[0]).softmax(-1)
    got = torch.tensor([[float(row[f"p_{c}"]) for c in range(10)] for row in rows])
    assert torch.allclose(got, eager, atol=2e-6)  # the CSV's 6 decimals
    assert [int(row["predicted"]) for row in rows] == eager.argmax(-1).tolist()


@pytest.mark.slow
def test_a_forward_of_several_named_outputs_exports_each_and_infer_writes_each_ones_columns(tmp_path: Path) -> None:
    """A multi-head model's forward (a dict: class scores and a box) was refused: "an export takes a forward that
    returns one tensor"."""
    import onnxruntime

    fit = build_cli(["fit", "--model", "probes.TwoHeads", *LIMIT, *QUIET, "--run.root", str(tmp_path),
                     "--run.test_after_fit=false"])  # fmt: skip
    out = tmp_path / "served"
    main(["export", "--ckpt_path", fit.trainer.checkpoint_callback.best_model_path,  # type: ignore[union-attr]
          "--output", str(out), "--batch_sizes", "1,7"])  # fmt: skip
    assert json.loads((out / "preprocess.json").read_text())["output_names"] == ["scores", "box"]
    model, x = fit.model.eval(), torch.randn(5, 1, 8, 8)
    with torch.inference_mode():
        want = model(x)
        pt2 = torch.export.load(out / "model.pt2").module()(x)
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["scores", "box"]
    for name, got in zip(["scores", "box"], session.run(None, {"input": x.numpy()}), strict=True):
        assert torch.allclose(torch.from_numpy(got), want[name], atol=1e-5) and torch.allclose(pt2[name], want[name])
    images = write_image_folder(tmp_path / "images", classes=2, per_class=2)
    main(["infer", "--model", str(out / "model.onnx"), "--output", str(tmp_path / "p.csv"), str(tmp_path / "images")])
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = [*(f"scores_{i}" for i in range(10)), "box_0", "box_1"]
    assert list(rows[0]) == ["path", *columns]
    mean, std = fit.datamodule.mean, fit.datamodule.std
    with torch.inference_mode():
        inputs = torch.stack([decode(p, 1, (8, 8)).float() / 255 for p in sorted(images)])
        eager = model((inputs - mean[0]) / std[0])
    got = torch.tensor([[float(row[c]) for c in columns] for row in rows])
    assert torch.allclose(got, torch.cat([eager["scores"], eager["box"]], dim=1), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_infer_writes_a_dense_output_as_an_array_beside_the_csv_and_says_which_images_it_resized(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`kiln infer` had only a CSV: two maps a pixel became 128 columns a row, and a resize went unsaid."""
    fit = build_cli(["fit", "--model", "probes.TwoMaps", *LIMIT, *QUIET, "--run.root", str(tmp_path),
                     "--run.test_after_fit=false"])  # fmt: skip
    out = tmp_path / "served"
    main(["export", "--ckpt_path", fit.trainer.checkpoint_callback.best_model_path,  # type: ignore[union-attr]
          "--output", str(out), "--format", "onnx"])  # fmt: skip
    write_image_folder(tmp_path / "images", classes=2, per_class=2)
    write_image_folder(tmp_path / "large", classes=1, per_class=1, size=12)
    capsys.readouterr()
    main(["infer", "--model", str(out / "model.onnx"), "--output", str(tmp_path / "p.csv"), str(tmp_path / "images"),
          str(tmp_path / "large")])  # fmt: skip
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["path", "array_row"] and [int(r["array_row"]) for r in rows] == list(range(5))
    mean, std = fit.datamodule.mean, fit.datamodule.std
    with torch.inference_mode():
        inputs = torch.stack([decode(Path(r["path"]), 1, (8, 8)).float() / 255 for r in rows])
        eager = fit.model.eval()((inputs - mean[0]) / std[0])
    maps = torch.from_numpy(np.load(tmp_path / "p-output.npy"))
    assert maps.shape == (5, 2, 8, 8) and torch.allclose(maps, eager, atol=1e-5)
    assert f"resized 1 of 5 images to 8x8 (bilinear; {tmp_path / 'large'}" in capsys.readouterr().err


@pytest.mark.slow
def test_preprocess_json_of_a_signal_model_prepares_raw_signals_as_training_did(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import numpy as np
    import onnxruntime

    stats = ["--data.init_args.mean=[0.5]", "--data.init_args.std=[2.0]"]  # a wrong recipe shows
    waves = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml"), *LIMIT, *QUIET, *stats]
    fit = build_cli(["fit", *waves, "--run.root", str(tmp_path), "--run.test_after_fit=false"])
    last = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"  # the weights fit.model holds
    out = tmp_path / "served"
    capsys.readouterr()
    main(["export", "--ckpt_path", str(last), "--output", str(out), "--format", "onnx"])
    assert "<.npy or .csv files of samples of shape [1, 64]>" in capsys.readouterr().err.splitlines()[-1]
    spec = json.loads((out / "preprocess.json").read_text())
    assert spec["source"] == "array" and spec["input_shape"] == [1, 64] and spec["resize"] is None
    assert spec["scale"] == 1.0 and spec["mean"] == [0.5] and spec["std"] == [2.0] and "x = (sample" in spec["recipe"]
    data = fit.datamodule
    raw = np.stack([data.test_set.raw(i)[0].numpy() for i in range(len(data.test_set))])  # as stored
    labels = data.test_set.targets.numpy()
    x = ((raw * spec["scale"] - np.asarray(spec["mean"])) / np.asarray(spec["std"])).astype(spec["dtype"])
    served = onnxruntime.InferenceSession(out / "model.onnx").run(None, {spec["input"]: x})[0]
    model = fit.model.eval()
    with torch.inference_mode():
        normalised = torch.cat([batch[0] for batch in data.test_dataloader()])  # the data module's own path
        eager = model(normalised).numpy()
    np.testing.assert_allclose(served, eager, atol=1e-5)
    assert (served.argmax(1) == labels).mean() == (eager.argmax(1) == labels).mean()
    np.save(tmp_path / "raw.npy", raw[:5])  # kiln infer: raw samples in, the data's recipe applied
    main(["infer", "--model", str(out / "model.onnx"), "--output", str(tmp_path / "p.csv"), str(tmp_path / "raw.npy")])
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [row["sample"] for row in rows] == ["0", "1", "2", "3", "4"]
    assert [int(row["predicted"]) for row in rows] == eager[:5].argmax(1).tolist()
    probabilities = torch.tensor(eager[:5]).softmax(-1)
    assert torch.allclose(torch.tensor([[float(row[f"p_{n}"]) for n in SHAPES] for row in rows]), probabilities,
                          atol=2e-6)  # fmt: skip


@pytest.mark.slow
def test_exporting_a_recurrent_net_prints_a_few_lines_not_torchs_warnings(tmp_path: Path) -> None:
    gru = "--model.init_args.net=probes.GRUNet"  # tests/probes.py
    waves = ["-c", str(CONFIGS / "experiment" / "waveforms.yaml"), *LIMIT, *QUIET, gru]
    fit = build_cli(["fit", *waves, "--run.root", str(tmp_path), "--run.test_after_fit=false"])
    last = Path(fit.trainer.default_root_dir) / "checkpoints" / "last.ckpt"
    command = [sys.executable, "-m", "kiln", "export", "--ckpt_path", str(last), "--output", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": PROBES}
    done = forkserver.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()  # was 44: torch's exporter warnings, each with its source line
    assert len(lines) <= 6 and "FutureWarning" not in done.stderr and lines[-1].startswith("exported to")


def test_export_refuses_to_replace_an_existing_folder_and_a_bad_format_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "served").mkdir()
    with pytest.raises(SystemExit) as stop:
        main(["export", "--ckpt_path", "x.ckpt", "--format", "tflite"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "error: kiln export: --format 'tflite': give onnx or pt2 (comma-separated)\n"
    with pytest.raises(SystemExit) as stop:
        main(["export", "--ckpt_path", "x.ckpt", "--output", str(tmp_path / "served")])
    assert stop.value.code == 2 and not any((tmp_path / "served").iterdir())
    said = capsys.readouterr().err
    assert said == f"error: kiln export: {tmp_path / 'served'} exists; remove it or give another --output\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--model", "m.onnx", ""], "an empty input path"), (["--model", "", "x.png"], "--model is empty"),
     (["--model", "m.onnx", "--output", "missing/p.csv", "x.png"], "its folder missing does not exist"),
     (["--model", "m.onnx", "--output", "here", "x.png"], "--output here is a folder")],
    ids=["empty_input", "empty_model", "missing_folder", "folder_as_file"],
)  # fmt: skip
def test_infer_paths_that_cannot_work_are_one_line(args: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    """An empty input predicted every image under the current folder; a missing or folder --output was a traceback."""
    Path("here").mkdir()
    with pytest.raises(SystemExit) as stop:
        main(["infer", *args])
    assert stop.value.code == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert says in line and not list(Path(".").glob("*.csv")) and not list(Path("here").iterdir())


@pytest.mark.slow
def test_an_export_killed_midway_leaves_a_folder_the_next_export_removes_and_a_finished_one_is_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """After a kill -9 during kiln export a staging folder with a partial model.onnx stayed, never named or cleaned;
    a finished export folder was mode 0700 (tempfile's), unreadable to a group on a shared disk."""
    fit = build_cli(["fit", *LIMIT, *QUIET, "--run.root", str(tmp_path), "--run.test_after_fit=false"])
    best = fit.trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    command = [sys.executable, "-m", "kiln", "export", "--ckpt_path", best, "--output", str(tmp_path / "served"),
               "--format", "onnx"]  # fmt: skip
    export = subprocess.Popen(command, stderr=subprocess.DEVNULL, env={**os.environ, "WANDB_MODE": "disabled"})
    for _ in range(1200):  # until it writes its staging folder
        if staged := [p for p in tmp_path.glob(".served.*.partial") if any(p.iterdir())]:
            break
        time.sleep(0.05)
    export.kill()
    export.wait(timeout=60)
    assert staged and staged[0].is_dir(), "the export never staged its files"
    main(["export", "--ckpt_path", best, "--output", str(tmp_path / "served"), "--format", "onnx"])
    assert f"removed {staged[0]}: a partial served a killed process left" in capsys.readouterr().err
    assert not list(tmp_path.glob(".served.*")) and (tmp_path / "served" / "model.onnx").is_file()
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "served").stat().st_mode & 0o777 == 0o777 & ~umask  # was 0o700
