"""Names the tests share (fixtures live in conftest.py): the configs folder, a short run, a callback lookup."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LIMIT = ["-c", str(CONFIGS / "debug" / "limit.yaml")]  # a short, complete run
# PYTHONPATH for a `kiln` subprocess that names the probes: this folder, then the caller's (a GPU machine: src/)
PROBES = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)


def callback(cli: Any, kind: type) -> Any:
    """The trainer's callback of this type."""
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))
