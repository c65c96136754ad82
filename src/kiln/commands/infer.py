"""``kiln infer --model model.onnx <files or folders>``: predictions from an exported model, without torch.

Needs onnxruntime, numpy and Pillow only (the ``serve`` extra on a serving machine). Images are decoded and
resized as the folder data does (``kiln.images``); arrays of samples (token ids too) are read from ``.npy`` files
or ``.csv`` files (a sample per row); both are then scaled and normalised as ``preprocess.json`` beside the model
says (kiln.commands.exported, which ``kiln serve`` shares). ``predictions.csv`` gets a row per sample: a
classifier's class and probabilities, or any other model's values.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln.commands.arguments import OneLineParser
from kiln.commands.exported import Exported, load, rows
from kiln.errors import UsageError
from kiln.files import written_whole
from kiln.images import class_maps, image_files

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


def inputs(model: Exported, paths: list[Path], batch_size: int, sizes: list[tuple[int, int]]) -> tuple[list, Iterator]:
    """``(path, sample)`` for each row, and the model's input in batches: image files decoded a batch at a time (a
    folder of photos never sits in memory whole; each one's own size to ``sizes``), array files read whole."""
    shape = model.spec["input_shape"]
    arrays = {path: array_samples(path, shape) for path in paths if path.suffix in ARRAY_SUFFIXES}
    named = [(path, i) for path in paths for i in range(len(arrays[path]) if path in arrays else 1)]

    def unit(path: Path) -> list[np.ndarray]:
        if path in arrays:
            return list(model.samples(arrays[path]))
        sample, size = model.image_sample(path)
        sizes.append(size)
        return [sample]

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


def _resized(paths: list[Path], sizes: list[tuple[int, int]], spec: dict[str, Any]) -> str | None:
    """One line when images were resized to the model's input (the training data's loader resized them alike)."""
    height, width = spec["input_shape"][1:]
    other = [(path, size) for path, size in zip(paths, sizes, strict=True) if size != (width, height)]
    if not other:
        return None
    path, (w, h) = other[0]
    return f"resized {len(other)} of {len(paths)} images to {width}x{height} ({spec.get('resize')}; {path}: {w}x{h})"


def _class_maps(array: Path, spec: dict[str, Any]) -> None:
    """An output's class maps as PNGs (as ``PredictionWriter(class_maps=true)`` writes them), said in one line."""
    classes = spec.get("class_names")
    count = class_maps(array, len(classes)) if classes else 0
    why = "the model's data declares no class names" if not classes else "not logits or class indices a pixel"
    print(f"{count} class maps in {array.stem}/" if count else f"{array.name}: no class maps ({why})", file=sys.stderr)


def cell(value: Any) -> Any:
    """A CSV cell: six significant digits of a number."""
    return f"{value:.6g}" if isinstance(value, float) else value


def infer(model: Path, given: list[str], output: Path, batch_size: int = 64, maps: bool = False) -> Path:
    """Write ``output`` (a CSV: file, sample, then the prediction's columns) for the files given, and beside it
    ``<output>-<name>.npy`` for each output too large for columns (and its class maps as PNGs, with ``maps``)."""
    exported = load(model, "infer")
    spec, image = exported.spec, exported.image
    paths = files(given, image)
    sizes: list[tuple[int, int]] = []  # each image's own, as it is decoded
    named, chunks = inputs(exported, paths, batch_size, sizes)
    ran = [exported.run(chunk) for chunk in chunks]
    header, values, arrays = rows([np.concatenate(parts) for parts in zip(*ran, strict=True)], spec)
    for name, array in arrays.items():  # each whole before the CSV names its rows
        path = output.with_name(f"{output.stem}-{name}.npy")
        with written_whole(path) as partial, partial.open("wb") as f:
            np.save(f, array)
        if maps:
            _class_maps(path, spec)
    numbered = not image or any(path.suffix in ARRAY_SUFFIXES for path in paths)  # a file of several samples
    with written_whole(output) as partial, partial.open("w", newline="") as f:  # never a half-written file
        writer = csv.writer(f)
        writer.writerow(["path", *(["sample"] if numbered else []), *header])
        for (path, i), row in zip(named, values, strict=True):
            writer.writerow([str(path), *([i] if numbered else []), *map(cell, row)])
    pictures = [path for path in paths if path.suffix not in ARRAY_SUFFIXES]
    if image and (line := _resized(pictures, sizes, spec)):
        print(line, file=sys.stderr)
    return output


def infer_command(args: list[str]) -> None:
    """``kiln infer --model model.onnx [--output predictions.csv] [--batch_size 64] <images or folders>``."""
    parser = OneLineParser(prog="kiln infer", description="Predict with an exported model, without torch.")
    parser.add_argument("--model", required=True, help="model.onnx from `kiln export`")
    parser.add_argument("--output", type=Path, default=Path("predictions.csv"))
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--class_maps", action="store_true", help="also write a segmentation's class maps as PNGs")
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
    written = infer(Path(options.model), options.inputs, output, options.batch_size, options.class_maps)
    print(f"predictions: {written.resolve()}", file=sys.stderr)
