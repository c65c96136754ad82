"""A ``class_path`` switched by a ``-c`` file or flag keeps the default config's init_args that the
new class also accepts (jsonargparse's merge, documented in the README): say which, once. The old
class's own defaults, which nobody wrote, never stand in for the new class's (jsonargparse would
keep those too): the new class gets its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from kiln.cli.classes import REQUIRED, defaults, import_class
from kiln.cli.config_errors import Source, skeleton
from kiln.files import load_yaml

SWITCHABLE = ("model", "model.init_args.net", "model.init_args.optimizer", "model.init_args.scheduler", "data")


def _node(value: Any, path: str) -> Any:
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Namespace | dict) else None
    return value


def carried_over(config: Namespace, default_file: Path, written: list[Source]) -> list[str]:
    """One line per switched class that kept default values nobody wrote for it (``written``: the
    ``-c`` files and flags after the default config)."""
    defaults = load_yaml(default_file.read_text()) or {}
    by_user = {skeleton(path) for source in written for path, _ in source.entries}
    lines = []
    for path in SWITCHABLE:
        node, default = _node(config, path), _node(defaults, path)
        if not isinstance(node, Namespace) or not isinstance(default, dict):
            continue
        old, new = str(default.get("class_path", "")), str(node.get("class_path", ""))
        if not old or not new or old.rsplit(".", 1)[-1] == new.rsplit(".", 1)[-1]:
            continue
        given, before = node.get("init_args") or Namespace(), default.get("init_args") or {}
        kept = [
            f"{key}={given[key]!r}"
            for key, value in before.items()
            if not isinstance(value, dict) and key in given and given[key] == value
            and skeleton(f"{path}.{key}") not in by_user
        ]  # fmt: skip
        if kept:
            lines.append(
                f"{path}: {new.rsplit('.', 1)[-1]} keeps {', '.join(kept)} from {old.rsplit('.', 1)[-1]} in "
                f"{default_file.name}; set them to change them"
            )
    return lines


def own_defaults(config: Namespace, default_file: Path, written: list[Source]) -> None:
    """For each switched class, the arguments nobody wrote (in ``default_file`` or after it) set to the new class's
    own defaults, where the old class's defaults were carried over instead; switched data names the run, unless
    ``run.name`` was written."""
    defaults_file = load_yaml(default_file.read_text()) or {}
    by_user = {skeleton(path) for source in written for path, _ in source.entries}
    for path in SWITCHABLE:
        node, default = _node(config, path), _node(defaults_file, path)
        if not isinstance(node, Namespace) or not isinstance(default, dict):
            continue
        old, new = str(default.get("class_path", "")), str(node.get("class_path", ""))
        if not old or not new or old == new or not isinstance(node.get("init_args"), Namespace):
            continue
        own, in_file = defaults(import_class(new)), default.get("init_args") or {}
        for key, value in node.init_args.items():
            mine = own.get(key, REQUIRED)
            untouched = key not in in_file and skeleton(f"{path}.{key}") not in by_user
            if untouched and mine is not REQUIRED and not isinstance(value, Namespace) and value != mine:
                node.init_args[key] = mine
            elif type(value) not in (int, float, str, bool) and isinstance(value, int | float | str):
                node.init_args[key] = _plain(value)  # the old class's restricted type (PositiveInt): not the new's
    run, data = config.get("run"), str(_node(config, "data.class_path") or "")
    if (
        isinstance(run, Namespace)
        and data
        and data != _node(defaults_file, "data.class_path")
        and (("run", "name") not in by_user)
    ):
        run.name = run_name(data)  # runs of other data are not filed under the default experiment's name


def run_name(data_class_path: str) -> str:
    """The experiment name a data class gives its runs: ``FolderDataModule`` -> ``folder``."""
    name = data_class_path.rsplit(".", 1)[-1]
    for suffix in ("DataModule", "Data"):
        name = name.removesuffix(suffix) or name
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _plain(value: int | float | str) -> int | float | str:
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value
