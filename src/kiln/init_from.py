"""Fine-tuning: ``kiln fit --init_from <checkpoint>`` starts a new run from another run's weights only.

Weights whose name and shape match are loaded; the rest keep their fresh initialisation (a
classifier head for another number of classes), and one line says which. The optimizer, the
schedule, the epoch and the run folder are new: that is what separates it from ``--ckpt_path``.
"""

from __future__ import annotations

from torch import nn

from kiln.checkpointing import load_checkpoint_file
from kiln.errors import UsageError


def _names(keys: list[str], most: int = 4) -> str:
    return ", ".join(keys[:most]) + (f" (+{len(keys) - most} more)" if len(keys) > most else "")


def load_weights(model: nn.Module, path: str) -> str:
    """Load the checkpoint's weights that fit ``model``; the one line that says what was loaded and what is new."""
    saved = load_checkpoint_file(path).get("state_dict") or {}
    own = model.state_dict()
    fitting = {k: v for k, v in saved.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    if not fitting:
        raise UsageError(
            f"--init_from {path}: none of its {len(saved)} weights fit this model (by name and shape: "
            f"{_names(sorted(saved))} there, {_names(sorted(own))} here); it holds another network"
        )
    model.load_state_dict(fitting, strict=False)
    line = f"--init_from {path}: {len(fitting)} of {len(own)} weights loaded"
    reshaped = [k for k in own if k in saved and k not in fitting]
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    for what, keys in (("new, as their shape differs", reshaped), ("new, not in the checkpoint", missing),
                       ("left out, not in this model", unexpected)):  # fmt: skip
        if keys:
            line += f"; {what}: {_names(keys)}"
    return line
