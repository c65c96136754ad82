"""``kiln export --ckpt_path FILE --format onnx,pt2``: the trained network for serving, checked against itself.

Writes ``model.onnx`` (dynamic batch; ``kiln infer`` runs it without torch), ``model.pt2``
(``torch.export``): the module's own forward, nothing added (a classifier's logits stay logits);
``preprocess.json`` (what an input needs before the network, as the data does it) and ``parity.json``:
max absolute difference of every output against the eager model on the test split, per batch size,
and for a classifier top-1 agreement. Above the tolerance nothing is kept. Everything is written to
a temporary folder first.
"""

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
from kiln.commands.arguments import OneLineParser, parse_command, resolved_config
from kiln.commands.parity import agreement, named_outputs, parity
from kiln.errors import KilnError, UsageError
from kiln.files import folder_written_whole, load_yaml
from kiln.process import stop_signals
from kiln.runs.folders import layout, run_of
from kiln.runs.picking import Pick, partial_data
from kiln.runs.reference import Reference, resolve
from kiln.training.contracts import classes, declared, sample_shape, statistics, stored_dtype
from kiln.wandb import checkpoints as wandb_checkpoints

FORMATS = ("onnx", "pt2")
BATCH_SIZES, TOLERANCE, SAMPLES = (1, 64), 1e-4, 1024  # the parity check's: kiln export's flags, kiln serve's


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


def export(ckpt_path: str, output: Path, formats: list[str], batch_sizes: Sequence[int] = BATCH_SIZES,
           tolerance: float = TOLERANCE, samples: int = SAMPLES,
           version: str | None = None) -> dict[str, Any]:  # fmt: skip
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


def checkpoint(given: str, files: list[str], root: str | None, name: str | None) -> Reference:
    """``--ckpt_path`` through the one resolver every command uses; ``best``, ``last`` and ``wandb:`` under the
    run.root and run.name that ``kiln fit`` resolves from the same ``-c`` files and flags (a run on part of the
    data is taken only with a ``-c`` that trains on part of it, as ``kiln test`` takes it)."""
    if not (given in ("best", "last") or wandb_checkpoints.names_a_version(given)):
        return resolve(given, ".", "", "export", Pick(None, fit=False))
    flags = [*(f for file in files for f in ("-c", file)), *(["--run.root", root] if root else []),
             *(["--run.name", name] if name else [])]  # fmt: skip
    config = load_yaml(resolved_config(flags)) or {}
    pick = Pick(partial_data(config.get("trainer") or {}), fit=False)  # a debug run's, for a debug -c only
    return resolve(given, config["run"]["root"], config["run"]["name"], "export", pick)


def default_output(checkpoint: Path) -> Path:
    """``export/`` in the checkpoint's run folder (the one with its config.yaml), else beside the file (a downloaded
    W&B version): where ``kiln export`` writes and ``kiln serve --ckpt_path`` looks."""
    run = run_of(checkpoint)
    return (run if layout(run).config.is_file() else checkpoint.parent) / "export"


def export_command(args: list[str]) -> None:
    """``kiln export --ckpt_path FILE|best|last|wandb:… [-c FILE] [--run.root R] [--run.name N] [--format onnx,pt2]
    [--output DIR] [--batch_sizes 1,64] [--tolerance 1e-4]``."""
    parser = OneLineParser(prog="kiln export", description="Export a trained model for serving.")
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="a checkpoint `kiln fit` wrote, best, last, or wandb:<entity>/<project>/<artifact>:<alias>",
    )
    parser.add_argument("-c", "--config", action="append", default=[], help="for best and last: the experiment's "
                        "config files, as `kiln fit -c` takes them (their run.root and run.name)")  # fmt: skip
    parser.add_argument("--run.root", dest="root", help="for best and last: run.root, as kiln fit takes it")
    parser.add_argument("--run.name", dest="name", help="for best and last: run.name, as kiln fit takes it")
    parser.add_argument("--format", default="onnx,pt2", help="onnx, pt2 or both (comma-separated)")
    parser.add_argument("--output", type=Path, help="default: export/ in the checkpoint's run folder")
    parser.add_argument(
        "--batch_sizes", default=",".join(map(str, BATCH_SIZES)), help="batch sizes the parity check runs"
    )
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="largest max |difference| allowed")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="test samples the parity check uses")
    options, extra = parse_command(parser, args)
    if options.samples < 1:
        raise UsageError(f"kiln export: --samples {options.samples}: the parity check needs 1 or more test samples")
    formats = options.format.split(",")
    if extra or not formats or not set(formats) <= set(FORMATS):
        raise UsageError(f"kiln export: --format {options.format!r}: give {' or '.join(FORMATS)} (comma-separated)")
    try:
        sizes = [int(s) for s in options.batch_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise UsageError(f"kiln export: --batch_sizes {options.batch_sizes!r}: give positive integers, e.g. 1,64")
    found = checkpoint(options.ckpt_path, options.config, options.root, options.name)
    assert found.path is not None  # only `fit --ckpt_path last` finds none and goes on
    output = options.output or default_output(found.path)
    if output.exists():
        raise UsageError(f"kiln export: {output} exists; remove it or give another --output")
    report = export(str(found.path), output, formats, sizes, options.tolerance, options.samples, found.version)
    _say_exported(report, output, formats, options.tolerance)


def _say_exported(report: dict[str, Any], output: Path, formats: list[str], tolerance: float) -> None:
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
