"""An exported model and its ``preprocess.json``: what ``kiln infer`` and ``kiln serve`` share, so a served answer
is what ``kiln infer`` writes for the same input (numpy and onnxruntime only, no torch)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from kiln.errors import UsageError, first_line
from kiln.files import MOST_COLUMNS
from kiln.images import decoded


@dataclass
class Exported:
    """``model.onnx`` in an onnxruntime session on the CPU, with the spec of what a sample needs before it."""

    path: Path
    spec: dict[str, Any]
    session: Any

    @property
    def image(self) -> bool:
        return self.spec.get("source", "image") == "image" and len(self.spec["input_shape"]) == 3

    @property
    def ids(self) -> bool:
        """Integer inputs (token ids): they go in as they are."""
        return self.spec.get("dtype", "float32") != "float32"

    def run(self, batch: np.ndarray) -> list[np.ndarray]:
        return self.session.run(None, {self.spec["input"]: batch})

    def image_sample(self, source: Path | IO[bytes]) -> tuple[np.ndarray, tuple[int, int]]:
        """An image file (or its bytes) as the network's sample, decoded and resized as the folder data does, and the
        image's own width and height."""
        channels, height, width = self.spec["input_shape"]
        pixels, size = decoded(source, channels, (height, width))
        return self.samples(pixels[None], pixels=True)[0], size

    def samples(self, raw: np.ndarray, pixels: bool = False) -> np.ndarray:
        """Samples ``(N, *input_shape)`` as the network takes them: ids as the data gives them; an image model's
        uint8 as pixels, its floats as values in [0, 1] (``pixels``: decoded pixels), other samples as stored."""
        if self.ids:
            return raw.astype(self.spec["dtype"])
        if self.image:
            return normalised(raw, self.spec, 1 / 255 if pixels or raw.dtype == np.uint8 else 1.0)
        return normalised(raw, self.spec)


def load(model: Path, command: str, spin: bool = True) -> Exported:
    """``model`` and the ``preprocess.json`` beside it; either missing, or a file onnxruntime cannot read, is one
    line. ``spin``: onnxruntime's threads spin between calls (its default: the fastest back-to-back batches)."""
    spec_file = model.parent / "preprocess.json"
    if not model.is_file() or not spec_file.is_file():
        raise UsageError(f"kiln {command}: {model} and its preprocess.json are needed (what `kiln export` writes)")
    import onnxruntime

    try:
        options = onnxruntime.SessionOptions()
        if not spin:  # its threads sleep between calls, leaving the cores to a server's HTTP processes
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own errors (a truncated or damaged file): InvalidProtobuf, Fail
        reason = first_line(err)
        raise UsageError(f"kiln {command}: {model}: not a readable ONNX model ({reason}): export it again") from None
    return Exported(model, json.loads(spec_file.read_text()), session)


def normalised(raw: np.ndarray, spec: dict[str, Any], scale: float | None = None) -> np.ndarray:
    """Samples ``(N, *input_shape)`` scaled (by ``scale``, else the spec's) and normalised as the data did
    (statistics along axis 0 of a sample)."""
    x = raw.astype(np.float32) * np.float32(spec["scale"] if scale is None else scale)
    if spec.get("mean") is None:
        return x
    shape = (-1, *[1] * (raw.ndim - 2)) if spec.get("stats_axis") == 0 else (-1,)
    mean = np.asarray(spec["mean"], dtype=np.float32).reshape(shape if len(spec["mean"]) > 1 else ())
    std = np.asarray(spec["std"], dtype=np.float32).reshape(shape if len(spec["std"]) > 1 else ())
    return ((x - mean) / std).astype(np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def rows(outputs: list[np.ndarray], spec: dict[str, Any]) -> tuple[list[str], list[list[Any]], dict[str, np.ndarray]]:
    """The prediction columns: a classifier's class and probabilities, or any other model's values, each output
    of a model of several by name (``<output>`` or ``<output>_<i>``); an output of more than ``MOST_COLUMNS`` values a
    sample (a mask, a reconstruction) is returned as an array, its row named by the ``array_row`` column."""
    names = spec.get("output_names") or ["output"]
    if len(outputs) == 1 and spec.get("output") in ("logits", "probabilities"):  # a classifier's
        probs = softmax(outputs[0]) if spec.get("output") == "logits" else outputs[0]  # probabilities: older exports
        classes = spec.get("class_names") or [str(c) for c in range(probs.shape[1])]
        best = probs.argmax(axis=1)
        header = ["predicted", "class", *(f"p_{name}" for name in classes)]
        return header, [[int(b), classes[b], *map(float, row)] for b, row in zip(best, probs, strict=True)], {}
    header, columns, arrays = [], [], {}
    for name, out in zip(names, outputs, strict=True):
        flat = out.reshape(len(out), -1)
        if flat.shape[1] > MOST_COLUMNS:
            arrays[name] = out
            continue
        label = "prediction" if len(outputs) == 1 else name
        header += [label] if flat.shape[1] == 1 else [f"{label}_{i}" for i in range(flat.shape[1])]
        columns.append(flat)
    values = np.concatenate(columns, axis=1).tolist() if columns else [[] for _ in outputs[0]]
    if arrays:
        header, values = [*header, "array_row"], [[*row, n] for n, row in enumerate(values)]
    return header, values, arrays


def describe(model: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """What ``/info`` says: the model file, the checkpoint it was exported from, that run's folder and the hash of
    its config, the input it takes and the outputs it gives, and kiln's version."""
    from importlib.metadata import PackageNotFoundError, version

    parity = model.parent / "parity.json"
    checkpoint = json.loads(parity.read_text()).get("checkpoint") if parity.is_file() else None
    run = next((p for p in Path(checkpoint).parents if (p / "config.yaml").is_file()), None) if checkpoint else None
    try:
        kiln = version("kiln")
    except PackageNotFoundError:
        kiln = None
    return {
        "model": str(model.resolve()), "checkpoint": checkpoint, "run": str(run) if run else None,
        "config_sha256": hashlib.sha256((run / "config.yaml").read_bytes()).hexdigest() if run else None,
        "input": {k: spec.get(k) for k in ("input_shape", "dtype", "source", "resize", "recipe")},
        "output": spec.get("output"), "output_names": spec.get("output_names"), "class_names": spec.get("class_names"),
        "kiln": kiln,
    }  # fmt: skip
