"""The research package, its tests and the notebooks use only the engine's public surface (README): what
`cruft update` keeps stable. `research/nets/pretrained.py` imported `kiln.cli.config_errors.nearest`, the tests'
conftest `kiln.process.process_group.DDP_ENV`: an engine refactor broke the user's code."""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"kiln", "kiln.cli", "kiln.cli.from_checkpoint", "kiln.commands.boundary", "kiln.console", "kiln.data",
          "kiln.errors", "kiln.results",
          "kiln.runs.figures", "kiln.testing", "kiln.training.hparams", "kiln.training.schedules"}  # fmt: skip


def engine_imports(source: str) -> set[str]:
    """The ``kiln`` modules a piece of Python imports (``from kiln.x import y``, ``import kiln.x``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kiln":
            for alias in node.names:  # `from kiln.runs import figures` imports the module kiln.runs.figures
                module = f"{node.module}.{alias.name}"
                found.add(module if module in PUBLIC else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "kiln"}
    return found


def user_sources() -> dict[str, str]:
    """Every file of the user's side: the research package, its tests (not the engine's) and the notebooks' cells."""
    files = [*sorted((ROOT / "src" / "research").rglob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]
    sources = {str(f.relative_to(ROOT)): f.read_text() for f in files}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        sources[str(notebook.relative_to(ROOT))] = "\n".join(line for c in code for line in c.splitlines()
                                                              if not line.lstrip().startswith(("%", "!")))  # fmt: skip
    return sources


def test_the_research_package_its_tests_and_notebooks_import_only_the_engines_public_surface() -> None:
    sources = user_sources()
    assert len(sources) > 15 and any("kiln.data" in engine_imports(s) for s in sources.values())  # it looked
    beyond = {name: sorted(engine_imports(source) - PUBLIC) for name, source in sources.items()}
    assert {name: modules for name, modules in beyond.items() if modules} == {}


def test_every_public_module_exists_and_the_readme_names_it() -> None:
    readme = (ROOT / "README.md").read_text()
    for module in PUBLIC - {"kiln"}:
        assert (ROOT / "src" / Path(*module.split("."))).with_suffix(".py").is_file() or (
            ROOT / "src" / Path(*module.split(".")) / "__init__.py"
        ).is_file(), module
        assert f"`{module}" in readme, module


def test_only_the_contracts_module_reads_a_users_objects_by_a_contracts_name() -> None:
    """kiln.training.contracts says the engine reads them there only; getattr/hasattr probes for input_shape,
    class_names, in_channels, init_only, input_stats and test_set sat in five other modules (the engine's own
    datamodules, under kiln/data, implement the contracts and are left out)."""
    from kiln.training.contracts import CONTRACTS

    engine = ROOT / "src" / "kiln"
    probes = []
    for path in sorted(engine.rglob("*.py")):
        if path.name == "contracts.py" or path.relative_to(engine).parts[0] == "data":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if name := _probed(node):
                probes.append(f"{path.relative_to(engine)}:{node.lineno} {name}")  # type: ignore[attr-defined]
    assert [probe for probe in probes if probe.rsplit(" ", 1)[1] in CONTRACTS] == []


def _probed(node: ast.AST) -> str | None:
    """The attribute name a ``getattr(x, "name", …)`` or ``hasattr(x, "name")`` call reads, if it is one."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")):
        return None
    name = node.args[1] if len(node.args) >= 2 else None
    return name.value if isinstance(name, ast.Constant) and isinstance(name.value, str) else None
