"""A checkpoint is enough: ``validate``/``test``/``predict`` and ``kiln export`` rebuild the model and the data it was
trained with, one way.

The CLI writes what it built both from into every checkpoint (``config``: each one's class path and
arguments), whatever the module saves of itself; older checkpoints hold them as hyper-parameters.
For the CLI's commands they go in as the first config after the defaults, so a ``-c`` file or flag
the user gives still wins; an override the weights cannot load into stops in one line naming the
setting and both values. :func:`rebuild` makes both without a Trainer (export, a notebook).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from kiln.cli.links import DataLinks, drop_link_targets, link_targets
from kiln.cli.resume_check import flat, init_only, saved_model
from kiln.errors import UsageError
from kiln.files import dump_yaml, load_yaml
from kiln.process.secrets import REDACTED
from kiln.runs.folders import layout, run_of
from kiln.training.checkpointing import load_checkpoint_file

BUILT_FROM = ("model", "data")
BUILT_FROM_KEY = "config"  # in a checkpoint: {"model": {class_path, init_args}, "data": {…}}
HPARAMS = {"model": "hyper_parameters", "data": "datamodule_hyper_parameters"}


def completed(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint with each hyper-parameter dict holding everything its config says (a module that saves
    none of itself, or ignores its injected ``net``, included); what the module saved wins where both have it."""
    built = checkpoint.get(BUILT_FROM_KEY)
    if not isinstance(built, dict):
        return checkpoint
    for section, key in HPARAMS.items():
        config = built.get(section)
        if isinstance(config, dict) and config.get("class_path"):
            own = dict(checkpoint.get(key) or {})
            from_config = {"_class_path": config["class_path"], **(config.get("init_args") or {})}
            checkpoint[key] = {**from_config, **{k: v for k, v in own.items() if k != "_instantiator"}}
    return checkpoint


def _section(hparams: dict[str, Any] | None) -> dict[str, Any] | None:
    """One ``class_path``/``init_args`` section from saved hyper-parameters (none if not saved by the CLI)."""
    if not hparams or not hparams.get("_class_path"):
        return None
    init = {k: copy.deepcopy(v) for k, v in hparams.items() if not k.startswith("_") and v != REDACTED}
    return {"class_path": hparams["_class_path"], "init_args": init}


def net_without_init_only(net: Any) -> Any:
    """A network's saved config without the arguments that only initialise its weights (``Timm``'s
    ``weights``, in its ``init_only``): the checkpoint holds every weight, so the file need not exist."""
    if not isinstance(net, dict) or not isinstance(net.get("init_args"), dict):
        return net
    unused = init_only(net.get("class_path"))
    return {**net, "init_args": {k: None if k in unused else v for k, v in net["init_args"].items()}}


def _run_place(ckpt_path: Path) -> dict[str, str] | None:
    """The experiment name in the run folder's ``config.yaml``, and the root its folder sits under: results go
    beside the run's own (a multirun's seed folder, a moved run), not under the default root."""
    run_dir = run_of(ckpt_path).resolve()
    try:
        name = ((load_yaml(layout(run_dir).config.read_text()) or {}).get("run") or {}).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if not name:
        return None
    parts = Path(name).parts
    placed = run_dir.parent.parts[-len(parts) :] == parts
    return {"name": name, "root": str(Path(*run_dir.parent.parts[: -len(parts)]))} if placed else {"name": name}


def saved_config(checkpoint: dict[str, Any], ckpt_path: str | Path) -> str | None:
    """The model and data the checkpoint was trained with (and its experiment name), as YAML for ``-c``;
    None for a checkpoint the CLI did not write."""
    config: dict[str, Any] = {
        key: section
        for key, section in (
            ("model", _section(checkpoint.get("hyper_parameters"))),
            ("data", _section(checkpoint.get("datamodule_hyper_parameters"))),
        )
        if section is not None
    }
    if "model" in config:
        drop_link_targets(config["model"]["init_args"])  # set again from the data
        if "net" in config["model"]["init_args"]:
            config["model"]["init_args"]["net"] = net_without_init_only(config["model"]["init_args"]["net"])
    if config and (place := _run_place(Path(ckpt_path))):
        config["run"] = place
    return dump_yaml(config) if config else None


def weight_shapes(checkpoint: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in checkpoint.get("state_dict", {}).items() if hasattr(v, "shape")}


def refuse_unloadable(hparams: dict[str, Any], shapes: dict[str, tuple[int, ...]], model: nn.Module, ckpt: str) -> None:
    """Stop before running when the model this command built cannot take the checkpoint's weights,
    naming the setting that differs (a flag, a ``-c`` file, or the data's number of classes)."""
    here = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    bad = sorted({*shapes} ^ {*here} | {k for k in shapes.keys() & here.keys() if shapes[k] != here[k]})
    if not bad or not shapes:
        return
    first = bad[0]
    weights = f"{first}: {list(shapes[first]) if first in shapes else 'absent'} in the checkpoint, " + (
        f"{list(here[first])} here" if first in here else "absent here"
    )
    saved, given = saved_model(hparams), flat(dict(getattr(model, "hparams", {})), "model.init_args.")
    given = {k: v for k, v in given.items() if not k.rpartition(".")[2].startswith("_")}
    changed = [(k, saved[k], v) for k, v in given.items() if k in saved and saved[k] != v]
    if changed:
        key, before, after = changed[0]
        source = " (from the data)" if key in link_targets() else ""
        raise UsageError(
            f"{key}{source}: the checkpoint {ckpt} was trained with {before!r}, this command gives {after!r}; "
            f"its weights do not fit ({weights}): drop the override, or train a new model"
        )
    raise UsageError(f"the checkpoint {ckpt} does not fit the model this command builds ({weights})")


def read_checkpoint(path: str | Path, mmap: bool = True) -> dict[str, Any]:
    """A checkpoint file read safely (one line for a bad one), with what it was built from."""
    return completed(load_checkpoint_file(path, mmap=mmap))


def rebuild(ckpt_path: str | Path) -> tuple[Any, Any]:
    """The model (the checkpoint's weights, in eval mode, on the CPU) and the datamodule (set up for ``test``) the
    checkpoint was trained with: built from its config as ``kiln fit`` built them, the data's declarations
    linked in, without a Trainer or a run folder. A checkpoint no kiln command wrote: one line."""
    import warnings

    from lightning.pytorch import LightningDataModule, LightningModule
    from lightning.pytorch.cli import LightningArgumentParser

    checkpoint = read_checkpoint(ckpt_path)
    saved = saved_config(checkpoint, "")
    if saved is None or set(load_yaml(saved)) < {"model", "data"}:
        raise UsageError(f"{ckpt_path}: not written by `kiln fit` (no model or data config in it)")
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningModule, "model", required=True)
    parser.add_subclass_arguments(LightningDataModule, "data", required=True)
    links = DataLinks()
    links.add_to(parser)
    try:
        config = parser.parse_string(saved)
    except Exception as err:  # a class that no longer imports, or takes other arguments now
        raise UsageError(f"{ckpt_path}: its model or data no longer builds here ({str(err).splitlines()[0]})") from None
    links.note(config, [])
    with warnings.catch_warnings():  # jsonargparse's own deprecation of the call LightningCLI also makes
        warnings.filterwarnings("ignore", message=r"\s*``instantiate_classes`` was deprecated")
        warnings.filterwarnings("ignore", message=r"\s*By default only one JsonargparseDeprecationWarning")
        built = parser.instantiate_classes(config)
    model, data = built.model, built.data
    refuse_unloadable(checkpoint.get("hyper_parameters", {}), weight_shapes(checkpoint), model, str(ckpt_path))
    model.load_state_dict(checkpoint["state_dict"])
    data.setup("test")
    return model.eval(), data
