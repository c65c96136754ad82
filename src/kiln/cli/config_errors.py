"""A config that does not parse, as one line: the file (or the command line), the full key, the value, the fix.

jsonargparse reports a nested mistake (``monitr:`` in a callback, ``lr: fast``, a misspelt
``class_path``) as 15-30 lines under the parent key only (``Parser key "trainer.callbacks"``),
never naming the file, and echoes whole argument dicts, secrets included. Its message still holds
the chain of keys and classes down to the mistake; this reads that chain and finds the setting in
the sources the user wrote.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kiln.cli.classes import import_class, parameters
from kiln.errors import UsageError, nearest
from kiln.files import load_yaml
from kiln.process.secrets import REDACTED, is_secret_name, redact_text, secret_values

KEY = re.compile(r'Parser key "([^"]+)"')
CLASS = re.compile(r"Problem with given class_path '([^']+)'")
UNKNOWN_OPTION = re.compile(r"Option '([^']+)' is not accepted")
NO_ATTRIBUTE = re.compile(r"module '([^']+)' has no attribute '([^']+)'")
NO_MODULE = re.compile(r"No module named '([^']+)'")
UNKNOWN_KEY = re.compile(r"does not accept option '([^']+)'|unrecognized arguments: --([^\s=]+)")
GIVEN = re.compile(
    r"^Given value: (.*?)(?:\. Got value: .*)?$|Not of type \w+: (.*) does not conform|"
    r"Expected an? <class '[^']+'>\. Got value: (.*)$"
)  # a kiln option's own value (non_finite.*)
EXPECTED = re.compile(r"Expected an? (?:<class '([^']+)'>|([A-Z]\w+))|Not of type (\w+)")
YAML_PROBLEM = "Problems parsing config"
MISSING_FILE = re.compile(r"File does not exist: '([^']+)'")
COMMAND_LINE = "the command line"


@dataclass
class Source:
    """Settings as the user wrote them: a YAML file, or the command line, each entry a (path, value)."""

    name: str
    entries: list[tuple[str, Any]] = field(default_factory=list)
    problem: yaml.YAMLError | None = None  # why the file is not valid YAML, if it is not


@dataclass
class Mistake:
    """The innermost problem in a jsonargparse message, with the keys and classes that lead to it."""

    kind: str
    found: tuple[str, ...]
    keys: list[str]
    classes: list[str]
    expected: list[str]


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every node of loaded YAML as (dotted path with ``[i]`` for list items, value)."""
    if path:
        yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _walk(child, f"{path}[{i}]")


NESTED_ARG = re.compile(r"NestedArg\(key='([^']+)', val=(.*)\)")
INLINE = "the checkpoint's config"  # validate/test/predict --ckpt_path: its model and data, given as the first -c


def _inline(text: str) -> dict[str, Any] | None:
    """A ``-c`` value that is YAML text rather than a file name (jsonargparse takes both)."""
    if "\n" not in text:
        return None
    try:
        loaded = load_yaml(text)
    except yaml.YAMLError:
        return None
    return loaded if isinstance(loaded, dict) else None


def sources(args: list[str], default_files: Iterable[str]) -> list[Source]:
    """Where the settings came from, in the order they apply: default files, then ``-c`` files and flags."""
    found = [Source(str(path)) for path in default_files]
    flags = Source(COMMAND_LINE)
    tokens = iter(args)
    for token in tokens:
        if not token.startswith("-"):
            continue
        key, _, value = token.lstrip("-").partition("=")
        if not _:
            value = next(tokens, "")
        if key in ("c", "config"):
            found.append(Source(value))
        else:
            flags.entries.append((key.rstrip("+"), value))
    for source in found:
        try:
            source.entries = list(_walk(load_yaml(Path(source.name).read_text())))
        except yaml.YAMLError as err:
            source.problem = err
        except OSError:  # not a file: a config given inline (a checkpoint's), or one jsonargparse names as missing
            inline = _inline(source.name)
            if inline is not None:
                source.name, source.entries = INLINE, list(_walk(inline))
    return [*found, flags]


def check_config_files(args: list[str]) -> None:
    """Each ``-c`` file is UTF-8 YAML holding a mapping of settings: else one line naming the file (jsonargparse
    says "Unexpected config" without the file, or fails deep in its reader on other bytes)."""
    tokens = iter(args)
    for token in tokens:
        key, has_value, value = token.partition("=")
        if key not in ("-c", "--config"):
            continue
        path = Path(value if has_value else next(tokens, ""))
        if not path.is_file():
            continue  # a missing file is named by jsonargparse's own error; inline YAML is parsed by it
        try:
            loaded = load_yaml(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise UsageError(
                f"{path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at position {err.start}): save it as UTF-8"
            ) from None
        except yaml.YAMLError:
            continue  # named with its line and column by describe()
        if loaded is None:
            raise UsageError(f"{path}: no settings in it (empty, or only comments): add some, or leave out -c {path}")
        if not isinstance(loaded, dict):
            raise UsageError(
                f"{path}: holds a {type(loaded).__name__}, where a mapping of settings is needed (trainer: …, model: …)"
            )


def skeleton(path: str) -> tuple[str, ...]:
    """A key path without list positions, ``init_args`` and an appending ``+``: the same setting however it was
    written (``callbacks+:`` in a file adds to the list as ``callbacks:`` sets it)."""
    parts = re.sub(r"\[\d+\]", "", path).split(".")
    return tuple(part.removesuffix("+") for part in parts if part not in ("init_args", "dict_kwargs"))


def where_written(settings: list[Source], match: Callable[[str, Any], bool], path: str) -> str:
    """Where the last matching setting (the one that applied) was written: ``file: key`` or ``--key``; else ``path``."""
    for source in reversed(settings):
        for written, value in reversed(source.entries):
            if match(written, value):
                return f"--{written}" if source.name == COMMAND_LINE else f"{source.name}: {written}"
    return path


def read_mistake(message: str) -> Mistake | None:
    """The innermost problem of a jsonargparse message: nested alternatives are indented under their key."""
    stack: list[tuple[int, str, str]] = []  # (indent, "key" | "class", name)
    expected: list[str] = []
    candidates: list[Mistake] = []
    for line in message.splitlines():
        text = line.strip(" -")
        if not text:
            continue
        indent = len(line) - len(line.lstrip(" "))  # a "- " alternative nests under the line above it
        while stack and stack[-1][0] >= indent:
            stack.pop()
        for kind, pattern in (("key", KEY), ("class", CLASS)):
            if found := pattern.search(text):
                stack.append((indent, kind, found.group(1)))
                expected = []
        keys = [name for _, kind, name in stack if kind == "key"]
        classes = [name for _, kind, name in stack if kind == "class"]
        if found := EXPECTED.search(text):
            expected.append(next(g for g in found.groups() if g))
        for kind, pattern in (
            ("option", UNKNOWN_OPTION), ("class", NO_ATTRIBUTE), ("module", NO_MODULE),
            ("key", UNKNOWN_KEY), ("value", GIVEN),
        ):  # fmt: skip
            if found := pattern.search(text):
                groups = tuple(g for g in found.groups() if g is not None)
                candidates.append(Mistake(kind, groups, keys, classes, [e for e in expected if e != "NoneType"]))
    order = ["option", "class", "module", "key", "value"]
    candidates.sort(key=lambda m: (order.index(m.kind), -len(m.keys) - len(m.classes)))
    return candidates[0] if candidates else None


def _under(prefix: str, classes: list[str]) -> str | None:
    """The class path given (of those the message names) that lies under ``prefix``, if one does."""
    return next((c for c in reversed(classes) if c.startswith(prefix)), None)


def describe(message: str, args: list[str], default_files: Iterable[str], known_keys: Callable[[], list[str]]) -> str:
    """One line for a jsonargparse error ``message``: where, which key, what is wrong, the nearest valid choice."""
    settings = sources(args, default_files)
    line = _describe(message, settings, known_keys)
    secrets = [s for source in settings for path, value in source.entries for s in secret_values({path: value})]
    return redact_text(line, secrets)


def _describe(message: str, settings: list[Source], known_keys: Callable[[], list[str]]) -> str:
    if (line := _file_problem(message, settings)) is not None:
        return line
    mistake = read_mistake(message)
    if mistake is None:
        return " ".join(message.split())
    return (
        _value_mistake(mistake, settings) if mistake.kind == "value" else _name_mistake(mistake, settings, known_keys)
    )


def _file_problem(message: str, settings: list[Source]) -> str | None:
    """The line for a config file that is empty-named, not YAML, or absent (None: the files are fine)."""
    broken = next((s for s in settings if s.problem is not None), None)
    if message.strip() == "Unexpected config:":  # jsonargparse's word for `-c ""`
        return "-c: an empty file name: give a YAML file, or leave -c out"
    if YAML_PROBLEM in message and broken is not None:
        mark = getattr(broken.problem, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        return f"{broken.name}: {where}not valid YAML ({getattr(broken.problem, 'problem', None) or broken.problem})"
    if missing := MISSING_FILE.search(message):  # named as the user wrote it, not as jsonargparse resolved it
        absent = Path(missing.group(1)).resolve()
        name = next((s.name for s in settings if Path(s.name).resolve() == absent), str(absent))
        return f"{name}: no such file"
    return None


def _name_mistake(mistake: Mistake, settings: list[Source], known_keys: Callable[[], list[str]]) -> str:
    """The line for a name that does not exist: an argument, a class, a module, a setting."""
    path = ".init_args.".join(mistake.keys)
    if mistake.kind == "option":
        (option,) = mistake.found
        owner = mistake.classes[-1] if mistake.classes else ""
        target = skeleton(f"{path}.{option}")
        where = where_written(settings, lambda p, v: skeleton(p) == target, f"{path}.init_args.{option}")
        hint = nearest(option, parameters(import_class(owner)))
        return f"{where}: {owner.rsplit('.', 1)[-1]} has no argument {option}{hint}"
    if mistake.kind == "class" and (deeper := _under(f"{'.'.join(mistake.found)}.", mistake.classes)):
        return f"{where_written(settings, lambda p, v: v == deeper, f'{path}.class_path')}: no class {deeper}"
    if mistake.kind == "class":  # the module imported, the name is not in it
        module, name = mistake.found
        given = f"{module}.{name}"
        names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
        hint = nearest(name, names).replace("mean ", f"mean {module}.")
        return f"{where_written(settings, lambda p, v: v == given, f'{path}.class_path')}: no class {given}{hint}"
    if mistake.kind == "module":
        given = next((c for c in reversed(mistake.classes) if c.startswith(mistake.found[0])), mistake.found[0])
        return f"{where_written(settings, lambda p, v: v == given, f'{path}.class_path')}: no class {given}"
    key = mistake.found[0]  # kind "key"
    where = where_written(settings, lambda p, v: skeleton(p) == skeleton(key), key)
    return f"{where}: no such setting{nearest(key, known_keys())}"


def _value_mistake(mistake: Mistake, settings: list[Source]) -> str:
    """The line for a value of the wrong kind, with what was expected."""
    path = ".init_args.".join(mistake.keys)
    (value,) = mistake.found
    shown = repr(value)
    if nested := NESTED_ARG.fullmatch(str(value)):  # a flag of a nested class: jsonargparse shows its internal repr
        path, shown = f"{path}.init_args.{nested.group(1)}", "null" if nested.group(2) == "None" else nested.group(2)
    where = where_written(settings, lambda p, v: skeleton(p) == skeleton(path), path)
    shown = REDACTED if is_secret_name(path) else shown
    if not mistake.expected:
        return f"{where}: {shown} is not accepted"
    return f"{where}: {shown} given, expected {' or '.join(dict.fromkeys(mistake.expected))}"
