"""Names the tests share (fixtures live in conftest.py): the configs folder, a short run, a callback lookup."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LIMIT = ["-c", str(CONFIGS / "debug" / "limit.yaml")]  # a short, complete run
# PYTHONPATH for a `kiln` subprocess that names the probes: this folder, then the caller's (a GPU machine: src/)
PROBES = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)


def callback(cli: Any, kind: type) -> Any:
    """The trainer's callback of this type."""
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))


def needs(*modules: str, reason: str) -> None:
    """Skip the calling test module unless ``modules`` are installed, without importing them: an import at
    collection (nbformat 1.9 CPU-s, timm 0.8, datasets 0.4) is paid by every worker, not only the one that runs
    the module's tests."""
    if any(importlib.util.find_spec(m) is None for m in modules):
        pytest.skip(reason, allow_module_level=True)
