"""``kiln diff RUN RUN``: what differs between two runs (config keys, environment, code), one line a difference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kiln.commands.arguments import OneLineParser
from kiln.errors import UsageError
from kiln.results import UNSET, changed, config, flat
from kiln.runs.folders import layout


def environment(run_dir: Path) -> dict[str, Any]:
    """A run's ``env.json``, flattened (the command start time and machine load left out: they always differ)."""
    path = layout(run_dir).environment
    record = json.loads(path.read_text()) if path.is_file() else {}
    record.pop("started", None)
    return {k: v for k, v in flat(record).items() if not k.startswith("code.")}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``key: a -> b`` for each key whose values differ (``(unset)`` where one lacks it); a class switched, added
    or removed (a logger, a callback) in one line, ``trainer.callbacks[EarlyStopping]: (unset) -> …(patience=5)``."""
    keys = changed(a, b)
    switched = [k.removesuffix(".class_path") for k in keys if k.endswith(".class_path")]
    lines, done = [], set()
    for k in keys:
        outer = next((p for p in switched if k.startswith(f"{p}.")), None)  # sorted: the outermost first
        if outer is None:
            lines.append(f"{k}: {a.get(k, UNSET)} -> {b.get(k, UNSET)}")
        elif outer not in done:
            done.add(outer)
            lines.append(f"{outer}: {called(a, outer)} -> {called(b, outer)}")
    return lines


def called(settings: dict[str, Any], element: str) -> str:
    """A list element's class and arguments as one call, ``EarlyStopping(monitor=val/loss, …)``; else unset."""
    if f"{element}.class_path" not in settings:
        return UNSET
    start = f"{element}.init_args."
    arguments = ", ".join(f"{k.removeprefix(start)}={v}" for k, v in settings.items() if k.startswith(start))
    return f"{settings[f'{element}.class_path']}({arguments})"


def code_differences(a: Path, b: Path) -> list[str]:
    """The commit, dirty flag and uncommitted changes (``code.diff``) of two runs, where they differ."""
    envs = [layout(d).environment for d in (a, b)]
    code = [json.loads(e.read_text()).get("code", {}) if e.is_file() else {} for e in envs]
    lines = differences({k: v for k, v in code[0].items() if k != "untracked"},
                        {k: v for k, v in code[1].items() if k != "untracked"})  # fmt: skip
    diffs = [(d / "code.diff").read_text() if (d / "code.diff").is_file() else "" for d in (a, b)]
    if diffs[0] != diffs[1]:
        sizes = [f"{len(d.splitlines())} lines" if d else "none" for d in diffs]
        lines.append(
            f"uncommitted changes (code.diff): {sizes[0]} -> {sizes[1]}; diff {a / 'code.diff'} {b / 'code.diff'}"
        )
    return lines


def diff_command(args: list[str]) -> None:
    """``kiln diff RUN_A RUN_B``: config, environment and code differences; exit 0 (1 when a folder is no run)."""
    parser = OneLineParser(prog="kiln diff", description="What differs between two run folders.")
    parser.add_argument("runs", nargs=2, type=Path, metavar="RUN", help="two run folders (runs/<name>/<timestamp>)")
    first, second = parser.parse_args(args).runs
    for run_dir in (first, second):
        if not layout(run_dir).config.is_file():
            raise UsageError(f"{run_dir}: not a run folder (no config.yaml); give two folders under runs/<name>/")
    sections = {
        "config": differences(config(first), config(second)),
        "environment": differences(environment(first), environment(second)),
        "code": code_differences(first, second),
    }
    if not (layout(first).environment.is_file() and layout(second).environment.is_file()):
        sections["environment"].insert(0, "(a run without env.json: written by an older kiln)")
    print(f"{first} -> {second}")
    for name, lines in sections.items():
        print(f"{name}: {'no differences' if not lines else ''}")
        for line in lines:
            print(f"  {line}")
