"""``kiln infer --model model.onnx <images or folders>``: predictions from an exported model, without torch.

Needs onnxruntime, numpy and Pillow only (``pip install kiln[onnx]`` on a serving machine). The
images are decoded and resized as the folder data does (``kiln.images``), then scaled and
normalised as ``preprocess.json`` beside the model says; ``predictions.csv`` gets a row per file.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln.commands.arguments import OneLineParser
from kiln.errors import UsageError
from kiln.images import decode_array, image_files


def files(given: list[str]) -> list[Path]:
    """The image files named, and those in the folders named (sorted, recursively)."""
    found: list[Path] = []
    for name in given:
        path = Path(name)
        if path.is_dir():
            found += image_files(path)  # the kinds the folder data reads
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"kiln infer: {path}: no such file or folder")
    if not found:
        raise UsageError(f"kiln infer: no image files in {', '.join(given)}")
    return found


def inputs(paths: list[Path], spec: dict[str, Any]) -> np.ndarray:
    """The files as the network's normalised float32 input ``(N, C, H, W)``."""
    channels, height, width = spec["input_shape"]
    mean = np.asarray(spec["mean"], dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(spec["std"], dtype=np.float32).reshape(-1, 1, 1)
    arrays = np.stack([decode_array(path, channels, (height, width)) for path in paths])
    return ((arrays.astype(np.float32) * np.float32(spec["scale"]) - mean) / std).astype(np.float32)


def batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def infer(model: Path, given: list[str], output: Path, batch_size: int = 64) -> Path:
    """Write ``output`` (a CSV: path, predicted class, one probability per class) for the images given."""
    import onnxruntime

    spec_file = model.parent / "preprocess.json"
    if not model.is_file() or not spec_file.is_file():
        raise UsageError(f"kiln infer: {model} and its preprocess.json are needed (what `kiln export` writes)")
    spec = json.loads(spec_file.read_text())
    if spec.get("source", "image") != "image" or len(spec["input_shape"]) != 3:
        raise UsageError(
            f"kiln infer reads image files, but {model} takes samples of shape {spec['input_shape']}, not images "
            "(C, H, W): predict with `kiln predict --ckpt_path`, or feed arrays of that shape to onnxruntime"
        )
    paths = files(given)
    try:
        session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own errors (a truncated or damaged file): InvalidProtobuf, Fail
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"kiln infer: {model}: not a readable ONNX model ({reason}): export it again") from None
    probs = np.concatenate(
        [  # decoded a batch at a time: a folder of photos never sits in memory whole
            session.run(None, {spec["input"]: inputs(paths[part], spec)})[0] for part in batches(len(paths), batch_size)
        ]
    )
    names = spec["class_names"] or [str(c) for c in range(probs.shape[1])]
    partial = output.with_name(f".{output.name}.partial")
    with partial.open("w", newline="") as f:  # renamed when complete: never a half-written file
        writer = csv.writer(f)
        writer.writerow(["path", "predicted", "class", *(f"p_{name}" for name in names)])
        for path, row in zip(paths, probs, strict=True):
            best = int(row.argmax())
            writer.writerow([str(path), best, names[best], *(f"{p:.6f}" for p in row)])
    partial.replace(output)
    return output


def infer_command(args: list[str]) -> None:
    """``kiln infer --model model.onnx [--output predictions.csv] [--batch_size 64] <images or folders>``."""
    parser = OneLineParser(prog="kiln infer", description="Predict with an exported model, without torch.")
    parser.add_argument("--model", type=Path, required=True, help="model.onnx from `kiln export`")
    parser.add_argument("--output", type=Path, default=Path("predictions.csv"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("inputs", nargs="+", help="image files and folders of them")
    options = parser.parse_args(args)
    if options.batch_size < 1:
        raise UsageError(f"kiln infer: --batch_size {options.batch_size}: give 1 or more")
    written = infer(options.model, options.inputs, options.output, options.batch_size)
    print(f"predictions: {written.resolve()}", file=sys.stderr)
