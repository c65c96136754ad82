"""The engine stays one a maintainer can read in one sitting: a size budget that a feature's lines must fit in
(a simplification pays for what it adds), short modules and functions, and no import loop, lazy ones included."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ENGINE = Path(__file__).resolve().parents[2] / "src" / "kiln"
BUDGET = 12_700  # lines of src/kiln; the goal is 10,000 (docs/development.md)
MODULE_LINES, FUNCTION_LINES = 280, 40


def sources() -> dict[str, str]:
    """Every engine module's text by its dotted name (a package by its ``__init__``'s)."""
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        parts = path.relative_to(ENGINE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text()
    return found


def imported(tree: ast.Module, known: dict[str, Any]) -> set[str]:
    """The engine modules a module imports anywhere in it (inside a function too): ``from kiln.a import b`` is
    ``kiln.a.b`` where that is a module, else ``kiln.a``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kiln"):
            found |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            }
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kiln")}
    return found


def loop(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of the graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (found := walk(other, [*path, other])):
                return found
        state[module] = 2
        return None

    return next((found for m in sorted(graph) if m not in state and (found := walk(m, [m]))), None)


def names(node: ast.AST) -> list[str]:
    """The modules an import statement names (``from a import b``: ``a``)."""
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [a.name for a in node.names] if isinstance(node, ast.Import) else []


def test_the_engine_keeps_to_its_budget_of_lines_module_and_function_sizes_and_has_no_import_loop() -> None:
    texts = sources()
    known = {m: ast.parse(text) for m, text in texts.items()}
    lines = {m: len(text.splitlines()) for m, text in texts.items()}
    assert sum(lines.values()) <= BUDGET, f"{sum(lines.values())} lines: what a feature adds, a simplification pays"
    assert not {m: n for m, n in lines.items() if n > MODULE_LINES}
    functions = [(m, f) for m, tree in known.items() for f in ast.walk(tree)
                 if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]  # fmt: skip
    assert not [f"{m}.{f.name}" for m, f in functions if (f.end_lineno or 0) - f.lineno + 1 > FUNCTION_LINES]
    graph = {m: {i for i in imported(tree, known) if i != m and i in known} for m, tree in known.items()}
    assert loop(graph) is None
    research = {
        n for tree in known.values() for node in ast.walk(tree) for n in names(node) if n.startswith("research")
    }
    assert not research  # the engine serves any project: it never imports the research package
