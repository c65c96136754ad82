"""Fine-tuning: ``kiln fit --init_from <checkpoint>`` starts a new run from another run's weights only.

Weights whose name and shape match are loaded; the rest keep their fresh initialisation (a
classifier head for another number of classes), and one line says which. The optimizer, the
schedule, the epoch and the run folder are new: that is what separates it from ``--ckpt_path``.
A checkpoint of another network class is refused, as its weights would match only by chance
(batch-norm tensors of the same name and size), unless ``--init_partial`` asks for exactly that.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from kiln.cli.classes import import_class
from kiln.cli.from_checkpoint import read_checkpoint
from kiln.errors import UsageError


def _names(keys: list[str], most: int = 4) -> str:
    return ", ".join(keys[:most]) + (f" (+{len(keys) - most} more)" if len(keys) > most else "")


def _network(checkpoint: dict[str, Any]) -> str | None:
    """The class path of the network a checkpoint written by ``kiln fit`` was trained with."""
    net = (checkpoint.get("hyper_parameters") or {}).get("net")
    return net.get("class_path") if isinstance(net, dict) else None


def _other_network(checkpoint: dict[str, Any], model: nn.Module) -> str | None:
    """The checkpoint's network class path when it is not the class of ``model.net`` (None: the same, or unknown)."""
    saved, net = _network(checkpoint), getattr(model, "net", None)
    if saved is None or net is None:
        return None
    return None if import_class(saved) is type(net) else saved


def load_weights(model: nn.Module, path: str, partial: bool = False) -> str:
    """Load the checkpoint's weights that fit ``model``; the one line that says what was loaded and what is new.
    ``partial``: also from another network class (what matches by name and shape)."""
    checkpoint = read_checkpoint(path, mmap=False)
    saved = checkpoint.get("state_dict") or {}
    own = model.state_dict()
    fitting = {k: v for k, v in saved.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    other = _other_network(checkpoint, model)
    if other is not None and not partial:
        net = getattr(model, "hparams", {}).get("net")  # as the config names it
        here = net.get("class_path") if isinstance(net, dict) else None
        here = here or f"{type(model.net).__module__}.{type(model.net).__qualname__}"
        raise UsageError(
            f"--init_from {path}: it holds a {other}, this run trains a {here}; weights of another network fit "
            f"only by chance ({len(fitting)} of {len(own)} here by name and shape). Fine-tune the same network, "
            "or add --init_partial true to load whatever fits"
        )
    if not fitting:
        raise UsageError(
            f"--init_from {path}: none of its {len(saved)} weights fit this model (by name and shape: "
            f"{_names(sorted(saved))} there, {_names(sorted(own))} here); it holds another network"
        )
    model.load_state_dict(fitting, strict=False)
    line = f"--init_from {path}: {len(fitting)} of {len(own)} weights loaded"
    if other is not None:
        line += f" from a {other} (--init_partial)"
    reshaped = [k for k in own if k in saved and k not in fitting]
    missing = [k for k in own if k not in saved]
    unexpected = [k for k in saved if k not in own]
    for what, keys in (("new, as their shape differs", reshaped), ("new, not in the checkpoint", missing),
                       ("left out, not in this model", unexpected)):  # fmt: skip
        if keys:
            line += f"; {what}: {_names(keys)}"
    return line


def apply_init_from(model: nn.Module, config: Any, subcommand: str | None) -> None:
    """``--init_from``: a new ``fit`` from the weights of another run's checkpoint, said in one line; a resume of the
    run itself (``--ckpt_path``) goes on from its own weights instead."""
    if not config.get("init_from"):
        return
    if subcommand not in (None, "fit"):
        raise UsageError(f"--init_from starts a new `fit` from a checkpoint's weights; for {subcommand}, "
                         "name the checkpoint with --ckpt_path")  # fmt: skip
    if config.get("ckpt_path"):  # the same command with `--ckpt_path last` goes on after a stop
        print(f"--init_from {config.init_from}: not applied, the run resumes its own checkpoint", file=sys.stderr)
    else:
        print(load_weights(model, config.init_from, partial=config.init_partial), file=sys.stderr)
