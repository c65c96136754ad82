"""``kiln infer --model model.onnx <files or folders>``: predictions from an exported model, without torch.

Needs onnxruntime, numpy and Pillow only (``pip install kiln[onnx]`` on a serving machine). Images
are decoded and resized as the folder data does (``kiln.images``); arrays of samples are read from
``.npy`` files or ``.csv`` files (a sample per row); both are then scaled and normalised as
``preprocess.json`` beside the model says. ``predictions.csv`` gets a row per sample: a classifier's
class and probabilities, or any other model's values.
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
from kiln.files import MOST_COLUMNS, written_whole
from kiln.images import decoded, image_files

ARRAY_SUFFIXES = (".npy", ".csv")


def files(given: list[str], image: bool) -> list[Path]:
    """The files named, and those in the folders named (sorted, recursively): images, or ``.npy``/``.csv`` arrays."""
    found: list[Path] = []
    for name in given:
        path = Path(name)
        if path.is_dir():
            found += image_files(path) if image else sorted(p for p in path.rglob("*") if p.suffix in ARRAY_SUFFIXES)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"kiln infer: {path}: no such file or folder")
    if not found:
        kind = "image files" if image else f"{' or '.join(ARRAY_SUFFIXES)} files"
        raise UsageError(f"kiln infer: no {kind} in {', '.join(given)}")
    return found


def _normalised(raw: np.ndarray, spec: dict[str, Any], scale: float | None = None) -> np.ndarray:
    """Samples ``(N, *input_shape)`` scaled (by ``scale``, else the spec's) and normalised as the data did
    (statistics along axis 0 of a sample)."""
    x = raw.astype(np.float32) * np.float32(spec["scale"] if scale is None else scale)
    if spec.get("mean") is None:
        return x
    shape = (-1, *[1] * (raw.ndim - 2)) if spec.get("stats_axis") == 0 else (-1,)
    mean = np.asarray(spec["mean"], dtype=np.float32).reshape(shape if len(spec["mean"]) > 1 else ())
    std = np.asarray(spec["std"], dtype=np.float32).reshape(shape if len(spec["std"]) > 1 else ())
    return ((x - mean) / std).astype(np.float32)


def image_inputs(
    paths: list[Path], spec: dict[str, Any], batch_size: int, sizes: list[tuple[int, int]]
) -> tuple[list[Any], Iterator]:
    """An image model's input ``(N, C, H, W)`` in batches: image files decoded a batch at a time (a folder of photos
    never sits in memory whole; each one's own size to ``sizes``), ``.npy``/``.csv`` samples read whole, uint8 as
    pixels and floats as values in [0, 1], as kiln's datasets take them."""
    channels, height, width = spec["input_shape"]
    arrays = {path: array_samples(path, spec["input_shape"]) for path in paths if path.suffix in ARRAY_SUFFIXES}
    named = [(path, i) for path in paths for i in range(len(arrays[path]) if path in arrays else 1)]

    def unit(path: Path) -> list[np.ndarray]:
        if path in arrays:
            raw = arrays[path]
            return list(_normalised(raw, spec, 1 / 255 if raw.dtype == np.uint8 else 1.0))
        array, size = decoded(path, channels, (height, width))
        sizes.append(size)
        return list(_normalised(array[None], spec))

    def chunks() -> Iterator[np.ndarray]:
        pending: list[np.ndarray] = []
        for path in paths:
            pending += unit(path)
            while len(pending) >= batch_size:
                yield np.stack(pending[:batch_size])
                pending = pending[batch_size:]
        if pending:
            yield np.stack(pending)

    return named, chunks()


def array_samples(path: Path, shape: list[int]) -> np.ndarray:
    """The samples in a ``.npy`` file (``(N, *shape)`` or one ``shape``) or a ``.csv`` file (a sample per row,
    flattened; a first row that is not numbers is a header)."""
    try:
        if path.suffix == ".npy":
            raw = np.load(path, allow_pickle=False)
        else:
            rows = list(csv.reader(path.read_text().splitlines()))
            numeric = lambda row: all(_is_number(c) for c in row)  # noqa: E731
            raw = np.asarray([[float(c) for c in row] for row in rows[0 if rows and numeric(rows[0]) else 1 :] if row])
    except (OSError, ValueError) as err:
        raise UsageError(f"kiln infer: {path}: not readable as samples ({str(err).splitlines()[0]})") from None
    size = int(np.prod(shape))
    if raw.ndim == len(shape) and list(raw.shape) == shape:
        raw = raw[None]
    if raw.ndim < 1 or raw.size % size or (raw.ndim > 1 and int(np.prod(raw.shape[1:])) != size):
        raise UsageError(f"kiln infer: {path}: holds an array of shape {list(raw.shape)}, where the model takes "
                         f"samples of shape {shape} (N x {' x '.join(map(str, shape))})")  # fmt: skip
    return raw.reshape(-1, *shape)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def rows(outputs: list[np.ndarray], spec: dict[str, Any]) -> tuple[list[str], list[list[Any]], dict[str, np.ndarray]]:
    """The CSV's prediction columns: a classifier's class and probabilities, or any other model's values, each output
    of a model of several by name (``<output>`` or ``<output>_<i>``); an output of more than ``MOST_COLUMNS`` values a
    sample (a mask, a reconstruction) is returned as an array, its row named by the CSV's ``array_row``."""
    names = spec.get("output_names") or ["output"]
    if len(outputs) == 1 and spec.get("output") in ("logits", "probabilities"):  # a classifier's
        probs = softmax(outputs[0]) if spec.get("output") == "logits" else outputs[0]  # probabilities: older exports
        classes = spec.get("class_names") or [str(c) for c in range(probs.shape[1])]
        best = probs.argmax(axis=1)
        header = ["predicted", "class", *(f"p_{name}" for name in classes)]
        values = [[int(b), classes[b], *(f"{p:.6f}" for p in row)] for b, row in zip(best, probs, strict=True)]
        return header, values, {}
    header, columns, arrays = [], [], {}
    for name, out in zip(names, outputs, strict=True):
        flat = out.reshape(len(out), -1)
        if flat.shape[1] > MOST_COLUMNS:
            arrays[name] = out
            continue
        label = "prediction" if len(outputs) == 1 else name
        header += [label] if flat.shape[1] == 1 else [f"{label}_{i}" for i in range(flat.shape[1])]
        columns.append(flat)
    values = (
        [[f"{v:.6g}" for v in row] for row in np.concatenate(columns, axis=1)] if columns else [[]] * len(outputs[0])
    )
    if arrays:
        header, values = [*header, "array_row"], [[*row, n] for n, row in enumerate(values)]
    return header, values, arrays


def _inputs(
    paths: list[Path], spec: dict[str, Any], image: bool, batch_size: int, sizes: list[tuple[int, int]]
) -> tuple[list[Any], Iterator]:
    """``(path, sample)`` for each row, and the inputs in batches (array files read whole)."""
    if image:
        return image_inputs(paths, spec, batch_size, sizes)
    samples = [(path, array_samples(path, spec["input_shape"])) for path in paths]
    everything = _normalised(np.concatenate([array for _, array in samples]), spec)
    named = [(path, i) for path, array in samples for i in range(len(array))]
    return named, (everything[part] for part in batches(len(everything), batch_size))


def _resized(paths: list[Path], sizes: list[tuple[int, int]], spec: dict[str, Any]) -> str | None:
    """One line when images were resized to the model's input (the training data's loader resized them alike)."""
    height, width = spec["input_shape"][1:]
    other = [(path, size) for path, size in zip(paths, sizes, strict=True) if size != (width, height)]
    if not other:
        return None
    path, (w, h) = other[0]
    return f"resized {len(other)} of {len(paths)} images to {width}x{height} ({spec.get('resize')}; {path}: {w}x{h})"


def infer(model: Path, given: list[str], output: Path, batch_size: int = 64) -> Path:
    """Write ``output`` (a CSV: file, sample, then the prediction's columns) for the files given, and beside it
    ``<output>-<name>.npy`` for each output too large for columns."""
    spec_file = model.parent / "preprocess.json"
    if not model.is_file() or not spec_file.is_file():
        raise UsageError(f"kiln infer: {model} and its preprocess.json are needed (what `kiln export` writes)")
    spec = json.loads(spec_file.read_text())
    image = spec.get("source", "image") == "image" and len(spec["input_shape"]) == 3
    if not image and spec.get("dtype", "float32") != "float32":
        raise UsageError(
            f"kiln infer: {model} takes {spec['dtype']} ids of shape {spec['input_shape']}, made by the data (a "
            "tokenizer), not files: predict with `kiln predict --ckpt_path`, or feed such ids to onnxruntime"
        )
    paths = files(given, image)
    session = _session(model)
    sizes: list[tuple[int, int]] = []  # each image's own, as it is decoded
    named, chunks = _inputs(paths, spec, image, batch_size, sizes)
    ran = [session.run(None, {spec["input"]: chunk}) for chunk in chunks]
    header, values, arrays = rows([np.concatenate(parts) for parts in zip(*ran, strict=True)], spec)
    for name, array in arrays.items():  # each whole before the CSV names its rows
        with written_whole(output.with_name(f"{output.stem}-{name}.npy")) as partial, partial.open("wb") as f:
            np.save(f, array)
    numbered = not image or any(path.suffix in ARRAY_SUFFIXES for path in paths)  # a file of several samples
    with written_whole(output) as partial, partial.open("w", newline="") as f:  # never a half-written file
        writer = csv.writer(f)
        writer.writerow(["path", *(["sample"] if numbered else []), *header])
        for (path, i), row in zip(named, values, strict=True):
            writer.writerow([str(path), *([i] if numbered else []), *row])
    pictures = [path for path in paths if path.suffix not in ARRAY_SUFFIXES]
    if image and (line := _resized(pictures, sizes, spec)):
        print(line, file=sys.stderr)
    return output


def _session(model: Path) -> Any:
    """onnxruntime's session of ``model`` on the CPU; a file it cannot read is one line."""
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own errors (a truncated or damaged file): InvalidProtobuf, Fail
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UsageError(f"kiln infer: {model}: not a readable ONNX model ({reason}): export it again") from None


def infer_command(args: list[str]) -> None:
    """``kiln infer --model model.onnx [--output predictions.csv] [--batch_size 64] <images or folders>``."""
    parser = OneLineParser(prog="kiln infer", description="Predict with an exported model, without torch.")
    parser.add_argument("--model", required=True, help="model.onnx from `kiln export`")
    parser.add_argument("--output", type=Path, default=Path("predictions.csv"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("inputs", nargs="+", help="image files, .npy or .csv files of samples, and folders of them")
    options = parser.parse_args(args)
    if options.batch_size < 1:
        raise UsageError(f"kiln infer: --batch_size {options.batch_size}: give 1 or more")
    if not options.model.strip():
        raise UsageError("kiln infer: --model is empty: give model.onnx from `kiln export`")
    if empty := [name for name in options.inputs if not name.strip()]:  # "" would be the current folder
        raise UsageError(f"kiln infer: an empty input path ({len(empty)} of them): name the files or folders")
    output = options.output
    if output.is_dir():
        raise UsageError(f"kiln infer: --output {output} is a folder: give a file, e.g. {output / 'predictions.csv'}")
    if not output.parent.is_dir():
        raise UsageError(f"kiln infer: --output {output}: its folder {output.parent} does not exist; create it first")
    written = infer(Path(options.model), options.inputs, output, options.batch_size)
    print(f"predictions: {written.resolve()}", file=sys.stderr)
