"""Class paths that moved: a checkpoint saved before the move still loads, and a config names the new path.

The examples' networks, LightningModules and datasets left ``kiln`` for the research package (``kiln.nets.SmallCNN``
is now ``<research>.nets.SmallCNN``); kiln's own modules moved into folders by job (``MODULES``).
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import yaml

from kiln.cli.classes import import_class, parameters
from kiln.errors import KilnError
from kiln.files import load_yaml

ENGINE = {"kiln.models.WarmupCosineLR": "kiln.training.schedules.WarmupCosineLR"}
# kiln's modules that moved into folders by job (a config names their classes: loggers, checkpoint I/O, callbacks)
MODULES = {
    "kiln.models.schedules": "kiln.training.schedules", "kiln.checkpointing": "kiln.training.checkpointing",
    "kiln.loggers": "kiln.training.loggers", "kiln.sweep.reporting": "kiln.commands.sweep.reporting",
    "kiln.sweep.sampling": "kiln.commands.sweep.sampling", "kiln.shapes": "kiln.cli.links",
}  # fmt: skip
# a model's arguments that became engine callbacks: (the callback, its argument if one took the model's, the value
# that meant "off"); they change speed, no number
ARGUMENTS = {"compile": ("kiln.callbacks.Compile", None, False),
             "compile_mode": ("kiln.callbacks.Compile", "mode", None),
             "compile_dynamic": ("kiln.callbacks.Compile", "dynamic", False),
             "channels_last": ("kiln.callbacks.ChannelsLast", None, False)}  # fmt: skip
RESEARCH_FOLDERS = ("nets", "models", "data")  # what the research package holds, under the same folder names
CLASS_KEYS = ("class_path", "_class_path")


@cache
def research_packages() -> tuple[str, ...]:
    """The packages the default config's model and data come from (the research package), never kiln."""
    from kiln.cli.configs import config_dir

    try:
        defaults = load_yaml((config_dir() / "train.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError, KilnError):  # no readable default config: no research package known
        return ()
    found = [str((defaults.get(key) or {}).get("class_path", "")).split(".")[0] for key in ("model", "data")]
    return tuple(dict.fromkeys(p for p in found if p and p != "kiln"))


def new_home(path: str) -> str | None:
    """Where the class an old ``kiln.…`` path named lives now; None if it did not move (or never existed)."""
    module, _, name = path.rpartition(".")
    if path in ENGINE or module in MODULES:
        return ENGINE.get(path) or f"{MODULES[module]}.{name}"
    parts = path.split(".")
    if len(parts) < 3 or parts[0] != "kiln" or parts[1] not in RESEARCH_FOLDERS:
        return None
    for package in research_packages():
        candidate = f"{package}.{parts[1]}.{parts[-1]}"
        if import_class(candidate) is not None:
            return candidate
    return None


def _rehome(node: Any, found: dict[str, str]) -> Any:
    """``node`` with every class path that moved replaced by its new one (recorded in ``found``)."""
    if isinstance(node, dict):
        return {
            key: _moved(value, found) if key in CLASS_KEYS and isinstance(value, str) else _rehome(value, found)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rehome(value, found) for value in node]
    return node


def _moved(path: str, found: dict[str, str]) -> str:
    if not path.startswith("kiln.") or import_class(path) is not None:
        return path
    new = new_home(path)
    if new is None:
        return path
    found[path] = new
    return new


_said: set[tuple[str, str]] = set()


def moved_argument(name: str) -> str | None:
    """``; it is the callback X now: …`` for a model argument that became an engine callback, else None."""
    if name not in ARGUMENTS:
        return None
    callback, argument, _ = ARGUMENTS[name]
    now = f"{callback}'s {argument}" if argument else callback
    return f"; it is {now} now: add the callback to trainer.callbacks (--trainer.callbacks+ {callback})"


def _without_moved_arguments(hparams: dict[str, Any], name: str) -> dict[str, Any]:
    """Saved model arguments without those that became callbacks and the class no longer takes (one line where one
    was on: the command runs without it unless the callback is added)."""
    cls = import_class(str(hparams.get("_class_path")))
    if cls is None:
        return hparams
    accepts = parameters(cls)
    gone = [key for key in ARGUMENTS if key in hparams and key not in accepts]
    for key in gone:
        if hparams[key] != ARGUMENTS[key][2] and (name, key) not in _said:
            _said.add((name, key))
            hint = moved_argument(key) or ""
            print(f"{name} was trained with model {key}={hparams[key]!r}{hint}", file=sys.stderr)
    return {k: v for k, v in hparams.items() if k not in gone}


def rehome_checkpoint(checkpoint: dict[str, Any], name: str) -> dict[str, Any]:
    """A checkpoint saved before the move, read with its classes' new paths (one line says which, once)."""
    found: dict[str, str] = {}
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        if isinstance(checkpoint.get(key), dict) and (rehomed := _rehome(checkpoint[key], found)) != checkpoint[key]:
            checkpoint[key] = type(checkpoint[key])(rehomed)
    if isinstance(checkpoint.get("hyper_parameters"), dict):
        hparams = checkpoint["hyper_parameters"]
        checkpoint["hyper_parameters"] = type(hparams)(_without_moved_arguments(dict(hparams), name))
    for old, new in found.items():
        if (name, old) not in _said:
            _said.add((name, old))
            print(f"{name} names {old}, which moved: read as {new}", file=sys.stderr)
    return checkpoint
