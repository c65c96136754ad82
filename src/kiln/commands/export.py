"""``kiln export --ckpt_path FILE --format onnx,pt2``: the trained network for serving, checked against itself.

Writes ``model.onnx`` (dynamic batch; ``kiln infer`` runs it without torch), ``model.pt2``
(``torch.export``), ``preprocess.json`` (what an input needs before the network) and ``parity.json``:
max absolute difference and top-1 agreement against the eager model on the test split, per batch
size. Above the tolerance nothing is kept. Everything is written to a temporary folder first.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kiln.cli.classes import import_class
from kiln.cli.from_checkpoint import net_without_init_only
from kiln.commands.arguments import OneLineParser
from kiln.commands.sweep.inprocess import parse_command
from kiln.errors import KilnError, UsageError
from kiln.process import stop_signals
from kiln.training.checkpointing import load_checkpoint_file
from kiln.wandb import checkpoints as wandb_checkpoints

FORMATS = ("onnx", "pt2")


class Probabilities(nn.Module):
    """The model as served: class probabilities, as ``predict`` writes them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x).softmax(dim=-1)


def load_trained(ckpt_path: str) -> tuple[Any, Any]:
    """The model and the datamodule as the checkpoint's run built them (their classes imported first:
    Lightning refuses to import a class a checkpoint names)."""
    from lightning import LightningDataModule, LightningModule

    checkpoint = load_checkpoint_file(ckpt_path, mmap=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        dotted = (checkpoint.get(key) or {}).get("_class_path")
        if not dotted:
            raise UsageError(f"{ckpt_path}: not written by `kiln fit` of this version (no model or data config in it)")
        if import_class(dotted) is None:
            raise UsageError(f"{ckpt_path}: its class {dotted} cannot be imported here")
    with warnings.catch_warnings():  # Lightning rebuilds them through jsonargparse's deprecated instantiate_classes
        warnings.filterwarnings("ignore", message=r"\s*``instantiate_classes`` was deprecated")
        warnings.filterwarnings("ignore", message=r"\s*By default only one JsonargparseDeprecationWarning")
        net = net_without_init_only((checkpoint.get("hyper_parameters") or {}).get("net"))
        model = LightningModule.load_from_checkpoint(ckpt_path, map_location="cpu", **({"net": net} if net else {}))
        model.eval()
        data = LightningDataModule.load_from_checkpoint(ckpt_path)
    data.setup("test")
    return model, data


def preprocess(data: Any) -> dict[str, Any]:
    """What a sample needs before the network, as the data module did it: for images (C, H, W) a file is
    decoded, resized and its pixels scaled to [0, 1]; other samples are scaled as the data stored them
    (uint8 to [0, 1], floats as they are); then both are normalised."""
    shape = list(data.input_shape)
    image = len(shape) == 3
    stored = data.test_set.raw(0)[0].dtype if data.test_set is not None and len(data.test_set) else torch.float32
    scale = 1 / 255 if image or stored == torch.uint8 else 1.0
    axis = 0 if len(data.mean) > 1 or len(data.std) > 1 else None
    per = "channel" if len(shape) > 1 else "feature"
    along = f"along axis 0 of a sample (one per {per})" if axis == 0 else "(one value for every element)"
    source = "an image file, decoded to uint8 pixels and resized to H x W (bilinear)" if image else (
        f"an array of shape {shape} ({str(stored).removeprefix('torch.')}, as the training data held it)")  # fmt: skip
    return {
        "source": "image" if image else "array",
        "input_shape": shape,  # one sample; the network takes a batch of them, batch first
        "dtype": "float32",
        "scale": scale,
        "mean": list(data.mean),
        "std": list(data.std),
        "stats_axis": axis,
        "resize": "bilinear" if image else None,
        "recipe": f"x = (sample * scale - mean) / std, with mean and std {along}; sample: {source}",
        "class_names": list(data.class_names) if data.class_names else None,
        "input": "input",
        "output": "probabilities",
    }


def test_inputs(data: Any, limit: int) -> Tensor:
    """Up to ``limit`` normalised test inputs, in order."""
    batches, n = [], 0
    for batch in data.test_dataloader():
        x = batch[0] if isinstance(batch, list | tuple) else batch
        batches.append(x)
        n += len(x)
        if n >= limit:
            break
    return torch.cat(batches)[:limit].float()


def parity(run: Any, eager: nn.Module, inputs: Tensor, batch_sizes: list[int]) -> dict[str, dict[str, float]]:
    """Max |difference| and top-1 agreement of ``run`` (an exported model) against ``eager``, per batch size."""
    found = {}
    with torch.inference_mode():
        for size in batch_sizes:
            worst, agree = 0.0, 0
            for chunk in inputs.split(size):
                stop_signals.stop_here("kiln export stopped; nothing was written")
                want, got = eager(chunk), torch.as_tensor(run(chunk))
                worst = max(worst, (want - got).abs().max().item())
                agree += int((want.argmax(-1) == got.argmax(-1)).sum())
            found[str(size)] = {"max_abs_diff": worst, "top1_agreement": agree / len(inputs)}
    return found


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
                   batch_sizes: list[int], report: dict[str, Any]) -> None:  # fmt: skip
    """Export each format into ``staging`` and add its parity against ``served`` to ``report``."""
    batch = torch.export.Dim("batch", min=1)
    stop_signals.stop_here("kiln export stopped; nothing was written")
    if "onnx" in formats:
        import onnxruntime

        torch.onnx.export(served, (example,), staging / "model.onnx", dynamo=True, verbose=False,
                          external_data=False, input_names=["input"], output_names=["probabilities"],
                          dynamic_shapes={"x": {0: batch}})  # fmt: skip
        session = onnxruntime.InferenceSession(staging / "model.onnx", providers=["CPUExecutionProvider"])
        report["onnx"] = parity(lambda x: session.run(None, {"input": x.numpy()})[0], served, inputs, batch_sizes)
    if "pt2" in formats:
        stop_signals.stop_here("kiln export stopped; nothing was written")
        program = torch.export.export(served, (example,), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, staging / "model.pt2")
        reloaded = torch.export.load(staging / "model.pt2").module()
        report["pt2"] = parity(reloaded, served, inputs, batch_sizes)


def export(ckpt_path: str, output: Path, formats: list[str], batch_sizes: list[int], tolerance: float,
           samples: int, version: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Write the formats, ``preprocess.json`` and ``parity.json`` to ``output``; above ``tolerance``, nothing.
    ``version``: the ``wandb:`` reference ``ckpt_path`` was resolved from, recorded beside it."""
    model, data = load_trained(ckpt_path)
    stop_signals.stop_here("kiln export stopped; nothing was written")
    served = Probabilities(model).eval()
    inputs = test_inputs(data, samples)
    example = inputs[: max(2, min(7, len(inputs)))]
    output.parent.mkdir(parents=True, exist_ok=True)
    weights = sum(t.numel() * t.element_size() for t in served.state_dict().values())
    needed, free = len(formats) * weights + 16 * 2**20, shutil.disk_usage(output.parent).free  # + graphs, reports
    if needed > free:  # the ONNX writer aborts the process on a full disk (C++), past any except
        raise UsageError(
            f"kiln export: {output.parent} has {free / 2**20:.0f} MiB free, the export needs about "
            f"{needed / 2**20:.0f} MiB: free some, or give another --output"
        )
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    report: dict[str, Any] = {"checkpoint": str(ckpt_path), "samples": len(inputs), "tolerance": tolerance}
    if version is not None:
        report["checkpoint_version"] = version
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught, _quiet_export_logs():  # torch's exporters warn
            warnings.simplefilter("always")  # about their own internals: dozens of lines for a GRU
            _write_formats(served, example, staging, formats, inputs, batch_sizes, report)
        if caught:
            first = sorted({str(w.message).splitlines()[0][:100] for w in caught})[0]
            print(f"torch's exporters warned {len(caught)} times (the first: {first}); the parity check "
                  "says whether the files are right", file=sys.stderr)  # fmt: skip
        (staging / "preprocess.json").write_text(json.dumps(preprocess(data), indent=2))
        (staging / "parity.json").write_text(json.dumps(report, indent=2))
        bad = [(fmt, size, r) for fmt in formats for size, r in report[fmt].items()
               if r["max_abs_diff"] > tolerance or r["top1_agreement"] < 1.0]  # fmt: skip
        if bad:
            fmt, size, r = bad[0]
            raise KilnError(
                f"{fmt} export differs from the eager model at batch size {size}: max |difference| "
                f"{r['max_abs_diff']:.2e} (tolerance {tolerance:g}), top-1 agreement {r['top1_agreement']:.2%}; "
                "nothing was written"
            )
        staging.rename(output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def export_command(args: list[str]) -> None:
    """``kiln export --ckpt_path FILE [--format onnx,pt2] [--output DIR] [--batch_sizes 1,64] [--tolerance 1e-4]``."""
    parser = OneLineParser(prog="kiln export", description="Export a trained model for serving.")
    parser.add_argument(
        "--ckpt_path",
        required=True,
        help="a checkpoint `kiln fit` wrote, or wandb:<entity>/<project>/<artifact>:<alias>",
    )
    parser.add_argument("--format", default="onnx,pt2", help="onnx, pt2 or both (comma-separated)")
    parser.add_argument("--output", type=Path, help="default: export/ in the checkpoint's run folder")
    parser.add_argument("--batch_sizes", default="1,64", help="batch sizes the parity check runs")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest max |difference| allowed")
    parser.add_argument("--samples", type=int, default=1024, help="test samples the parity check uses")
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
    version = options.ckpt_path if wandb_checkpoints.names_a_version(options.ckpt_path) else None
    ckpt_path = str(wandb_checkpoints.resolve(version, "runs")) if version else options.ckpt_path
    folder = Path(ckpt_path).resolve().parent  # a run's checkpoints/, or a downloaded W&B version's folder
    output = options.output or (folder.parent if folder.name == "checkpoints" else folder) / "export"
    if output.exists():
        raise UsageError(f"kiln export: {output} exists; remove it or give another --output")
    report = export(ckpt_path, output, formats, sizes, options.tolerance, options.samples, version)
    for fmt in formats:
        for size, r in report[fmt].items():
            print(f"{fmt} batch {size}: max |difference| {r['max_abs_diff']:.2e}, top-1 agreement "
                  f"{r['top1_agreement']:.2%} on {report['samples']} test samples", file=sys.stderr)  # fmt: skip
    spec = json.loads((output / "preprocess.json").read_text())
    if spec["source"] == "image":
        print(f"exported to {output}: `kiln infer --model {output / 'model.onnx'} <images or folder>`", file=sys.stderr)
    else:  # kiln infer reads image files only
        print(f"exported to {output}: inputs of shape {spec['input_shape']}, prepared as preprocess.json's recipe "
              "says, go to model.onnx through onnxruntime (kiln infer reads image files)", file=sys.stderr)  # fmt: skip
