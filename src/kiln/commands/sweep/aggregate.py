"""A multirun's aggregate: mean, sample std, 95% confidence interval (Student's t) and n per metric and grid
cell, written to ``results.csv`` and ``results.md`` and printed; each run's test metrics by weights."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kiln.files import written_whole
from kiln.runs.folders import read_metrics
from kiln.runs.metrics import run_metrics

# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal's 1.96
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
       2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045,
       2.042)  # fmt: skip


def summary(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (n-1), the 95% interval's half-width, and n."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    t = T95[n - 2] if 1 < n <= len(T95) + 1 else 1.96
    return {"mean": mean, "std": std, "ci95": t * std / math.sqrt(n) if n > 1 else float("nan"), "n": n}


def describe_run(run_dir: Path) -> str:
    """One line for a finished run: its test metrics by weights, and its folder."""
    found = run_metrics(run_dir)
    tested = [f"{key} {value:.4f}" for key, value in sorted(found.items()) if key.startswith("test/")]
    return f"{', '.join(tested) or 'trained (no test)'} ({run_dir})"


def legend(run_dirs: list[Path]) -> str:
    """What ``@best`` and ``@last`` mean for these runs (the monitor their checkpoints were chosen by)."""
    monitor = next((m for d in run_dirs if (m := (read_metrics(d).get("val") or {}).get("monitor"))), "val/loss")
    return (
        f"@best: the checkpoint (and its epoch's validation) with the best {monitor}; "
        "@last: the final weights. Mean, sample std, 95% CI (Student's t) over n runs."
    )


def aggregate(root: Path, cell_runs: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """One row per (cell, metric): mean, std, ci95, n; written to results.csv and results.md and printed."""
    rows = []
    for cell, run_dirs in cell_runs.items():
        per_run = [run_metrics(d) for d in run_dirs]
        for metric in sorted({m for values in per_run for m in values}):
            values = [values[metric] for values in per_run if metric in values]
            rows.append({"cell": cell, "metric": metric, **summary(values)})
    note = legend([d for run_dirs in cell_runs.values() for d in run_dirs])
    with written_whole(root / "results.csv") as partial, partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["cell", "metric", "mean", "std", "ci95", "n"])
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| cell | metric | mean | std | 95% CI | n |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['cell']} | {r['metric']} | {r['mean']:.4f} | {r['std']:.4f} | ±{r['ci95']:.4f} | {r['n']} |"
              for r in rows]  # fmt: skip
    with written_whole(root / "results.md") as partial:
        partial.write_text("\n".join(lines) + f"\n\n{note}\n")
    table = Table(title=f"{root}: mean, std, 95% CI (t) over runs", title_justify="left", caption=note,
                  caption_justify="left")  # fmt: skip
    for column in ("cell", "metric", "mean", "std", "95% CI", "n"):
        table.add_column(column, justify="left" if column in ("cell", "metric") else "right")
    for r in rows:
        table.add_row(
            str(r["cell"]), str(r["metric"]), f"{r['mean']:.4f}", f"{r['std']:.4f}", f"±{r['ci95']:.4f}", str(r["n"])
        )
    Console(file=sys.stderr).print(table)
    return rows
