"""A module's torchmetrics states through a checkpoint: a resumed epoch counts what the uninterrupted one did."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torchmetrics import Metric

KEY = "metric_states"  # in a checkpoint: {"epoch": …, "states": {metric name: {state: value}}}


def metrics_of(module: LightningModule) -> dict[str, Metric]:
    """Every torchmetrics ``Metric`` the module holds, by its attribute path (``train_acc``, ``val_metrics.rmse``)."""
    return {name: m for name, m in module.named_modules() if isinstance(m, Metric) and name}


def _copy(value: Any) -> Any:
    return [_copy(v) for v in value] if isinstance(value, list) else torch.as_tensor(value).detach().clone()


def _moved(value: Any, device: torch.device) -> Any:
    return [_moved(v, device) for v in value] if isinstance(value, list) else value.to(device)


def update_counts(module: LightningModule) -> dict[str, int]:
    return {name: metric.update_count for name, metric in metrics_of(module).items()}


def save(trainer: Trainer, module: LightningModule, checkpoint: dict[str, Any], since: dict[str, int]) -> None:
    """The states of the metrics updated so far (summed over DDP ranks: a collective, as every rank saves), but
    those updated since ``since`` was counted (a validation that a resume runs again)."""
    states = {}
    for name, metric in metrics_of(module).items():
        if not metric.update_called or metric.update_count != since.get(name, metric.update_count):
            continue
        with metric.sync_context():
            states[name] = {state: _copy(value) for state, value in metric.metric_state.items()}
    checkpoint[KEY] = {"epoch": trainer.current_epoch, "states": states}


def restore(trainer: Trainer, module: LightningModule, checkpoint: dict[str, Any]) -> int | None:
    """Put the saved states back (on rank 0: they hold every rank's counts); the epoch they belong to."""
    saved = checkpoint.get(KEY)
    if not saved:
        return None
    found = metrics_of(module)
    for name, states in saved["states"].items():
        metric = found.get(name)
        if metric is None or not trainer.is_global_zero:
            continue
        for state, value in states.items():
            setattr(metric, state, _moved(value, module.device))
    return int(saved["epoch"])


def reset(module: LightningModule, names: list[str]) -> None:
    found = metrics_of(module)
    for name in names:
        if name in found:
            found[name].reset()
