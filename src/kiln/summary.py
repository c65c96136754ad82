"""The few lines a user needs after ``fit``: test metrics, best checkpoint, run folder, W&B sync."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console


def wandb_sync_command(trainer: Any) -> str | None:
    """``wandb sync <dir>`` for an offline W&B run of this trainer, else ``None``."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and os.environ.get("WANDB_MODE") == "offline":
            return f"wandb sync {Path(logger.experiment.dir).parent}"
    return None


def print_summary(trainer: Any, metrics: Mapping[str, float], best_ckpt: str | None, run_dir: Path | None) -> None:
    """Print one line per fact, unwrapped so paths can be copied."""
    lines = [f"[bold]{key}[/bold] {value:.4f}" for key, value in sorted(metrics.items())]
    lines.append(f"[bold]tested[/bold] {best_ckpt or 'final weights (no checkpoint was saved)'}")
    lines.append(f"[bold]run folder[/bold] {run_dir}")
    if sync := wandb_sync_command(trainer):
        lines.append(f"[bold]W&B offline; upload with[/bold] {sync}")
    console = Console(soft_wrap=True)
    console.rule("Run summary", align="left")
    for line in lines:
        console.print(line)
