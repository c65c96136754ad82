"""Names the tests share (fixtures live in conftest.py): the configs folder, a short run, a callback lookup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LIMIT = ["-c", str(CONFIGS / "debug" / "limit.yaml")]  # a short, complete run


def callback(cli: Any, kind: type) -> Any:
    """The trainer's callback of this type."""
    return next(c for c in cli.trainer.callbacks if isinstance(c, kind))
