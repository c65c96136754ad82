"""The few lines a user needs after ``fit``: test metrics and where they came from, run folder, W&B sync."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console


@dataclass
class TestResult:
    """The test metrics of one checkpoint (``None``: the weights in memory, when nothing was saved)."""

    label: str
    checkpoint: str | None
    step: int | None
    metrics: dict[str, float]


def wandb_sync_command(trainer: Any) -> str | None:
    """``wandb sync <dir>`` for an offline W&B run of this trainer, else ``None``."""
    from lightning.pytorch.loggers import WandbLogger

    from kiln.wandb import mode as wandb_mode

    for logger in trainer.loggers:
        if getattr(logger, "stopped", None):  # kiln's W&B logger after a failure mid-run: said then
            continue
        if isinstance(logger, WandbLogger) and wandb_mode.current() == "offline":
            return f"wandb sync {Path(logger.experiment.dir).parent}"
    return None


def print_summary(results: list[TestResult], run_dir: Path | None, wandb_sync: str | None) -> None:
    """Print one line per fact, unwrapped so paths can be copied; one column per tested checkpoint."""
    keys = sorted({key for result in results for key in result.metrics})
    lines = []
    if len(results) > 1:
        lines.append(" " * 10 + "".join(f"[bold]{r.label:>10}[/bold]" for r in results))
    for key in keys:
        values = "".join(f"{r.metrics.get(key, float('nan')):>10.4f}" for r in results)
        lines.append(f"[bold]{key:<10}[/bold]{values}" if len(results) > 1 else f"[bold]{key}[/bold] {values.strip()}")
    for r in results:
        if r.checkpoint:
            lines.append(f"[bold]tested {r.label}[/bold] {r.checkpoint} (step {r.step})")
        else:
            lines.append(f"[bold]tested the final weights[/bold] (step {r.step}; no checkpoint was saved)")
    _print(lines, run_dir, wandb_sync)


def print_untested(
    metrics: dict[str, float], weights: Path | None, run_dir: Path, wandb_sync: str | None, why: str | None = None
) -> None:
    """After a fit without its test: the last validation, the weights, and the command that tests them (or, ``why``,
    what a test lacks)."""
    lines = [f"[bold]{key}[/bold] {value:.4f} (last validation)" for key, value in sorted(metrics.items())]
    if why is not None:
        lines.append(f"[bold]not tested[/bold]: {why}; kiln test needs it")
    elif weights is not None:
        lines.append(f"[bold]not tested[/bold] (run.test_after_fit false): kiln test --ckpt_path {weights}")
    _print(lines, run_dir, wandb_sync)


def _print(lines: list[str], run_dir: Path | None, wandb_sync: str | None) -> None:
    """The summary's lines, then the run folder and the W&B upload command, under one rule."""
    lines = [*lines, f"[bold]run folder[/bold] {run_dir}"]
    if wandb_sync:
        lines.append(f"[bold]W&B offline; upload with[/bold] {wandb_sync}")
    console = Console(soft_wrap=True)
    console.rule("Run summary", align="left")
    for line in lines:
        console.print(line)
