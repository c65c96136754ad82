"""Which optimizer steps Lightning writes logs at: one rule for every place that logs per step."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from lightning.pytorch import Trainer
from torch import Tensor


def writes_logs_after(trainer: Trainer, step: int) -> bool:
    """Whether Lightning writes logs at the end of optimizer step ``step`` (0-based): every
    ``log_every_n_steps``-th step, and every step under ``fast_dev_run``. Logging only there keeps
    ``self.log`` off the other steps (its cost: benchmarks/README.md, "Costs behind the code")."""
    every = getattr(trainer, "log_every_n_steps", 50)  # set by Lightning's logger connector
    return (step + 1) % every == 0 or bool(getattr(trainer, "fast_dev_run", False))


def write_now(trainer: Trainer, metrics: Mapping[str, Tensor | float], step: int) -> None:
    """Write ``metrics`` to every logger at ``step`` alone (rank 0; one host sync). A value ``self.log`` gives on
    a step Lightning does not write is written at the epoch's later logging steps as if measured there, or, at
    the epoch's end, never."""
    if not metrics or not trainer.loggers or not trainer.is_global_zero:
        return
    device = next((v.device for v in metrics.values() if isinstance(v, Tensor)), None)
    values = torch.stack([torch.as_tensor(v, device=device).detach().float() for v in metrics.values()]).tolist()
    written = {**dict(zip(metrics, values, strict=True)), "epoch": trainer.current_epoch}
    for logger in trainer.loggers:
        logger.log_metrics(written, step=step)
