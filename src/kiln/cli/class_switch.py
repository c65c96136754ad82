"""A ``class_path`` switched by a ``-c`` file or flag keeps the default config's init_args that the
new class also accepts (jsonargparse's merge, documented in the README): say which, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace

from kiln.cli.config_errors import Source, skeleton

SWITCHABLE = ("model", "model.init_args.net", "model.init_args.optimizer", "model.init_args.scheduler", "data")


def _node(value: Any, path: str) -> Any:
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Namespace | dict) else None
    return value


def carried_over(config: Namespace, default_file: Path, written: list[Source]) -> list[str]:
    """One line per switched class that kept default values nobody wrote for it (``written``: the
    ``-c`` files and flags after the default config)."""
    defaults = yaml.safe_load(default_file.read_text()) or {}
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
