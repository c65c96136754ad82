"""Which optimizer steps Lightning writes logs at: one rule for every place that logs per step."""

from __future__ import annotations

from lightning.pytorch import Trainer


def writes_logs_after(trainer: Trainer, step: int) -> bool:
    """Whether Lightning writes logs at the end of optimizer step ``step`` (0-based): every
    ``log_every_n_steps``-th step, and every step under ``fast_dev_run``. Logging only there keeps
    ``self.log`` off the other steps (its cost: benchmarks/README.md, "Costs behind the code")."""
    every = getattr(trainer, "log_every_n_steps", 50)  # set by Lightning's logger connector
    return (step + 1) % every == 0 or bool(getattr(trainer, "fast_dev_run", False))
