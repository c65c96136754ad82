"""Resuming with changed model settings: refused in one line, never silently ignored."""

from __future__ import annotations

from typing import Any

from jsonargparse import Namespace

from kiln.config_errors import import_class
from kiln.errors import ConfigError
from kiln.secrets import REDACTED
from kiln.shapes import TARGETS

# settings that change speed or memory, not the computation: a resume may change them
RUNTIME_ONLY = {
    "compile",
    "compile_mode",
    "compile_dynamic",
    "channels_last",
    "fused",
    "foreach",
    "activation_checkpointing",
}


def init_only(class_path: Any) -> tuple[str, ...]:
    """A network class's arguments that only initialise its weights (``Timm``'s ``weights``): a checkpoint,
    which holds every weight, makes them irrelevant when it is loaded."""
    return tuple(getattr(import_class(str(class_path)), "init_only", ()))


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Namespace):
        value = value.as_dict()
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): list(value) if isinstance(value, tuple) else value}


def saved_model(hparams: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint hyper-parameters keyed as the CLI's ``model`` config is."""
    init = {k: v for k, v in hparams.items() if not k.startswith("_")}
    return flat({"class_path": hparams.get("_class_path"), "init_args": init}, "model.")


def refuse_changed_settings(hparams: dict[str, Any], model: Namespace, ckpt_path: str) -> None:
    """Stop before training when the command builds another model than the checkpoint's.

    Lightning would rebuild the checkpoint's model and ignore the command's values (and a restored
    optimizer keeps its old learning rate), so a change would be silently lost.
    """
    if not hparams.get("_class_path"):
        return  # not saved by the CLI: nothing to compare
    saved, given = saved_model(hparams), flat(model, "model.")
    weights_only = {
        f"model.init_args.net.init_args.{name}" for name in init_only(given.get("model.init_args.net.class_path"))
    }
    changed = [
        (key, saved[key], value)
        for key, value in given.items()
        if key in saved and saved[key] != value and saved[key] != REDACTED
        and key.rsplit(".", 1)[-1] not in RUNTIME_ONLY and key not in TARGETS  # linked from the data
        and key not in weights_only  # the weights a net starts from: the checkpoint's replace them
    ]  # fmt: skip
    if not changed:
        return
    key, before, after = changed[0]
    more = f" (and {len(changed) - 1} more: {', '.join(k for k, _, _ in changed[1:])})" if len(changed) > 1 else ""
    raise ConfigError(
        f"{key}: the checkpoint {ckpt_path} was trained with {before!r}, this command gives {after!r}{more}; "
        "a resume keeps the checkpoint's model and optimizer, so drop the change (or its -c file), "
        "or start a new run without --ckpt_path"
    )


def keep_given_secrets(hparams: dict[str, Any], given: Namespace, merged: Namespace) -> None:
    """Where the checkpoint holds a redacted secret, keep the value the command line gave."""
    for key, value in saved_model(hparams).items():
        if value == REDACTED:
            name = key.removeprefix("model.")
            if name in given:
                merged[name] = given[name]
