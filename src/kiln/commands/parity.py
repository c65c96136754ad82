"""Whether an exported model computes what the eager module does: every output, per batch size, on the test
split (``parity.json``); for a classifier also the share of samples whose top class agrees."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from kiln.errors import KilnError
from kiln.process import stop_signals


def agreement(result: dict[str, float], tolerance: float) -> str:
    """A parity result in words: max |difference|, and top-1 agreement for a classifier."""
    text = f"max |difference| {result['max_abs_diff']:.2e} (tolerance {tolerance:g})"
    return text + (f", top-1 agreement {result['top1_agreement']:.2%}" if "top1_agreement" in result else "")


def named_outputs(outputs: Any) -> dict[str, Tensor] | None:
    """A forward's outputs by name: one tensor is ``output``; a tuple or list ``output0``, ``output1``, …; a dict of
    tensors keeps its keys, in order. None for anything else (a tensor inside another structure, a number)."""
    if isinstance(outputs, Tensor):
        return {"output": outputs}
    if isinstance(outputs, tuple | list) and outputs and all(isinstance(t, Tensor) for t in outputs):
        return {f"output{i}": t for i, t in enumerate(outputs)}
    if isinstance(outputs, dict) and outputs and all(isinstance(k, str) and isinstance(t, Tensor)
                                                      for k, t in outputs.items()):  # fmt: skip
        return dict(outputs)
    return None


def _run(run: Any, chunk: Tensor, traced: int) -> Any:
    """The exported model on one batch; one that takes only the traced batch size stops in one line."""
    try:
        return run(chunk)
    except Exception as err:
        if len(chunk) == traced:
            raise
        raise KilnError(
            f"the exported model takes batches of {traced} only (it failed on {len(chunk)}: "
            f"{str(err).splitlines()[0][:120]}): the forward fixes the batch dimension, as reshape(len(x), …) or "
            "x.shape[0] in a view does; write -1 (or flatten) there, then export again; nothing was written"
        ) from None


def parity(run: Any, eager: nn.Module, inputs: Tensor, example: Tensor, batch_sizes: Sequence[int],
           classifier: bool) -> dict[str, Any]:  # fmt: skip
    """Max |difference| of every output of ``run`` (an exported model, its outputs in the eager forward's order)
    against ``eager``, per batch size; for a classifier also the share of samples whose top class agrees."""
    found: dict[str, Any] = {}
    with torch.inference_mode():
        for size in batch_sizes:
            worst, agree = 0.0, 0
            for chunk in inputs.split(size):
                stop_signals.stop_here("kiln export stopped; nothing was written")
                wanted = named_outputs(eager(chunk)) or {}
                got = _run(run, chunk, len(example))
                outs = [torch.as_tensor(out) for out in got]
                for want, out in zip(wanted.values(), outs, strict=True):
                    worst = max(worst, (want - out).abs().max().item())
                if classifier:  # one output, the logits
                    agree += int((wanted["output"].argmax(-1) == outs[0].argmax(-1)).sum())
            found[str(size)] = {
                "max_abs_diff": worst,
                **({"top1_agreement": agree / len(inputs)} if classifier else {}),
            }
    return found
