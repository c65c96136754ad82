"""The export itself: a checkpoint's network as ONNX and torch.export files, with ``preprocess.json`` and
``parity.json``, written whole or not at all (``kiln export`` and ``kiln serve --ckpt_path``)."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kiln.cli.from_checkpoint import rebuild
from kiln.commands.parity import agreement, named_outputs, parity
from kiln.errors import KilnError, UsageError
from kiln.files import folder_written_whole
from kiln.process import stop_signals
from kiln.training.contracts import classes, declared, sample_shape, statistics, stored_dtype


def classifier_of(model: nn.Module, data: Any, outputs: Tensor) -> int | None:
    """The number of classes where the model is a classifier: the data declares classes, one logit each."""
    count = classes(data)
    return count if count is not None and outputs.ndim == 2 and outputs.shape[1] == count else None


def preprocess(data: Any, example: Tensor, classifier: bool) -> dict[str, Any]:
    """What a sample needs before the network, as the data module did it, and nothing it did not: for images
    (C, H, W) a file is decoded, resized and its pixels scaled to [0, 1]; other float samples are scaled as
    the data stored them (uint8 to [0, 1], floats as they are); both are then normalised with the data's
    statistics where it declares them. Integer samples (token ids) go in as they are."""
    shape = list(sample_shape(data) or example.shape[1:])
    stats = statistics(data)
    names = list(declared(data, "class_names") or []) or None  # a classifier's, or a segmentation's classes
    common = {"input_shape": shape, "input": "input", "output": "logits" if classifier else "output",
              "class_names": names}  # fmt: skip
    if not torch.is_floating_point(example):
        recipe = f"x = the sample's integer ids ({str(example.dtype).removeprefix('torch.')}), as the data gives them"
        return {"source": "array", "dtype": str(example.dtype).removeprefix("torch."), "scale": None, "mean": None,
                "std": None, "stats_axis": None, "resize": None, "recipe": recipe, **common}  # fmt: skip
    image = len(shape) == 3
    stored = stored_dtype(data) or torch.float32
    scale = 1 / 255 if image or stored == torch.uint8 else 1.0
    mean, std = stats if stats is not None else (None, None)
    axis = 0 if stats is not None and (len(stats[0]) > 1 or len(stats[1]) > 1) else None
    per = "channel" if len(shape) > 1 else "feature"
    along = f"along axis 0 of a sample (one per {per})" if axis == 0 else "(one value for every element)"
    source = "an image file, decoded to uint8 pixels and resized to H x W (bilinear)" if image else (
        f"an array of shape {shape} ({str(stored).removeprefix('torch.')}, as the training data held it)")  # fmt: skip
    normalise = f" - mean) / std, with mean and std {along}" if stats is not None else ") (not normalised)"
    return {
        "source": "image" if image else "array",
        "dtype": "float32",
        "scale": scale,
        "mean": mean,
        "std": std,
        "stats_axis": axis,
        "resize": "bilinear" if image else None,
        "recipe": f"x = (sample * scale{normalise}; sample: {source}",
        **common,
    }


def test_inputs(data: Any, limit: int) -> Tensor:
    """Up to ``limit`` test inputs, in order, as the model takes them (normalised floats, or integer ids)."""
    batches, n = [], 0
    for batch in data.test_dataloader():
        x = batch[0] if isinstance(batch, list | tuple) else batch
        batches.append(x)
        n += len(x)
        if n >= limit:
            break
    inputs = torch.cat(batches)[:limit]
    return inputs.float() if torch.is_floating_point(inputs) else inputs


@contextmanager
def _quiet_export_logs() -> Iterator[None]:
    """torch.export's loggers at ERROR while exporting (its serialiser warns of symbols it drops)."""
    logger = logging.getLogger("torch._export")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _write_formats(served: nn.Module, example: Tensor, staging: Path, formats: list[str], inputs: Tensor,
                   batch_sizes: Sequence[int], report: dict[str, Any], classifier: bool) -> None:  # fmt: skip
    """Export each format into ``staging`` (the module's own forward: nothing added; several outputs named as
    ``named_outputs`` names them) and add its parity against ``served`` to ``report``."""
    batch = torch.export.Dim("batch", min=1)
    stop_signals.stop_here("kiln export stopped; nothing was written")
    if "onnx" in formats:
        import onnxruntime

        torch.onnx.export(served, (example,), staging / "model.onnx", dynamo=True, verbose=False,
                          external_data=False, input_names=["input"], output_names=report["output_names"],
                          dynamic_shapes=({0: batch},))  # fmt: skip
        session = onnxruntime.InferenceSession(staging / "model.onnx", providers=["CPUExecutionProvider"])
        run = lambda x: session.run(None, {"input": x.numpy()})  # noqa: E731
        report["onnx"] = parity(run, served, inputs, example, batch_sizes, classifier)
    if "pt2" in formats:
        stop_signals.stop_here("kiln export stopped; nothing was written")
        program = torch.export.export(served, (example,), dynamic_shapes=({0: batch},))
        torch.export.save(program, staging / "model.pt2")
        reloaded = torch.export.load(staging / "model.pt2").module()
        run = lambda x: list((named_outputs(reloaded(x)) or {}).values())  # noqa: E731
        report["pt2"] = parity(run, served, inputs, example, batch_sizes, classifier)


def export(ckpt_path: str, output: Path, formats: list[str], batch_sizes: Sequence[int], tolerance: float,
           samples: int, version: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the formats, ``preprocess.json`` and ``parity.json`` to ``output``; above ``tolerance``, nothing.
    ``version``: the ``wandb:`` reference ``ckpt_path`` was resolved from, recorded beside it."""
    served, data = rebuild(ckpt_path)
    stop_signals.stop_here("kiln export stopped; nothing was written")
    inputs = test_inputs(data, samples)
    example = inputs[: max(2, min(7, len(inputs)))]
    with torch.inference_mode():
        outputs = served(example)
    if (names := named_outputs(outputs)) is None:
        raise UsageError(f"kiln export: {type(served).__name__}.forward returns a {type(outputs).__name__}; "
                         "an export takes a forward that returns a tensor, or a tuple or dict of them")  # fmt: skip
    classifier = isinstance(outputs, Tensor) and classifier_of(served, data, outputs) is not None
    _check_disk(served, formats, output)
    report: dict[str, Any] = {"checkpoint": str(ckpt_path), "samples": len(inputs), "tolerance": tolerance,
                              "output": "logits" if classifier else "output", "output_names": list(names)}  # fmt: skip
    if version is not None:
        report["checkpoint_version"] = version
    caught: list[warnings.WarningMessage] = []
    with folder_written_whole(output) as staging:
        with warnings.catch_warnings(record=True) as caught, _quiet_export_logs():  # torch's exporters warn
            warnings.simplefilter("always")  # about their own internals: dozens of lines for a GRU
            _write_formats(served, example, staging, formats, inputs, batch_sizes, report, classifier)
        if caught:
            first = sorted({str(w.message).splitlines()[0][:100] for w in caught})[0]
            print(f"torch's exporters warned {len(caught)} times (the first: {first}); the parity check "
                  "says whether the files are right", file=sys.stderr)  # fmt: skip
        spec = {**preprocess(data, example, classifier), "output_names": list(names)}
        (staging / "preprocess.json").write_text(json.dumps(spec, indent=2))
        (staging / "parity.json").write_text(json.dumps(report, indent=2))
        _refuse_disagreement(report, formats, tolerance)
    return report


def _check_disk(served: nn.Module, formats: list[str], output: Path) -> None:
    """Room for every format's weights, before writing: the ONNX writer aborts the process on a full disk (C++),
    past any except."""
    output.parent.mkdir(parents=True, exist_ok=True)
    weights = sum(t.numel() * t.element_size() for t in served.state_dict().values())
    needed, free = len(formats) * weights + 16 * 2**20, shutil.disk_usage(output.parent).free  # + graphs, reports
    if needed > free:
        raise UsageError(
            f"kiln export: {output.parent} has {free / 2**20:.0f} MiB free, the export needs about "
            f"{needed / 2**20:.0f} MiB: free some, or give another --output"
        )


def _refuse_disagreement(report: dict[str, Any], formats: list[str], tolerance: float) -> None:
    """An exported file that answers otherwise than the eager model stops the export: nothing is written."""
    bad = [(fmt, size, r) for fmt in formats for size, r in report[fmt].items()
           if r["max_abs_diff"] > tolerance or r.get("top1_agreement", 1.0) < 1.0]  # fmt: skip
    if bad:
        fmt, size, r = bad[0]
        raise KilnError(
            f"{fmt} export differs from the eager model at batch size {size}: {agreement(r, tolerance)}; "
            "nothing was written"
        )


def say_exported(report: dict[str, Any], output: Path, formats: list[str], tolerance: float) -> None:
    """Each file's parity in a line, then how to use it (``kiln infer``, ``kiln serve``)."""
    for fmt in formats:
        for size, r in report[fmt].items():
            print(f"{fmt} batch {size}: {agreement(r, tolerance)} on {report['samples']} test samples",
                  file=sys.stderr)  # fmt: skip
    spec = json.loads((output / "preprocess.json").read_text())
    model = output / "model.onnx"
    kind = "ids" if spec["dtype"] != "float32" else "samples"
    given = (
        "<images or folder>"
        if spec["source"] == "image"
        else f"<.npy or .csv files of {kind} of shape {spec['input_shape']}>"
    )
    print(
        f"exported to {output}: `kiln infer --model {model} {given}`, or `kiln serve --model {model}`", file=sys.stderr
    )
