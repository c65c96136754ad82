"""The numbers a run contributes to a comparison, each named by the weights behind it (best, last)."""

from __future__ import annotations

from pathlib import Path

from kiln.runs.folders import read_metrics


def weights(label: str) -> list[str]:
    """The weights a test result scored, as ``best`` and/or ``last`` (``best = last``: both, one step)."""
    if label == "final weights":  # nothing was saved: the weights at the end of training
        return ["last"]
    return [part.strip() for part in label.split("=")]


def run_metrics(run_dir: Path) -> dict[str, float]:
    """The numbers a run contributes, each named by the weights behind it: the validation metrics at the
    best epoch (``val/acc @best``) and every tested checkpoint's test metrics (``test/acc @best``, ``@last``)."""
    data = read_metrics(run_dir)
    best = (data.get("val") or {}).get("best") or {}
    found = {f"{k} @best": v for k, v in best.items() if k != "epoch"}
    for result in data.get("test") or []:
        for which in weights(result["label"]):
            found.update({f"{k} @{which}": v for k, v in result["metrics"].items()})
    return found
