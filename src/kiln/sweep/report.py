"""What a sweep leaves: a trials table, ``best.yaml`` that reruns the best trial, and two pictures."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from PIL import Image, ImageDraw
from rich.console import Console
from rich.table import Table

from kiln.files import written_whole
from kiln.sweep.inprocess import describe
from kiln.sweep.space import Sweep


def _run_folder(trial: Any) -> Path | None:
    """The newest run folder of the trial (resumes continue in it)."""
    folder = Path(trial.user_attrs.get("run", ""))
    found = sorted(p for p in folder.glob("*") if (p / "config.yaml").is_file()) if folder.is_dir() else []
    return found[-1] if found else None


def portable(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A trial's ``config.yaml`` as a config of its own: without the sweep's reporter, and without any path into
    the trial's run folder (config.yaml leaves those out; an older kiln wrote them). A key is dropped, not set
    to null, so the CLI fills in the new run's folder (a logger's ``save_dir: null`` would not parse)."""
    inside = str(run_dir)

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if not _points_into(v, inside, run_dir.name)}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    cleaned = clean(config)
    cleaned.pop("ckpt_path", None)
    callbacks = cleaned.get("trainer", {}).get("callbacks") or []
    cleaned["trainer"]["callbacks"] = [c for c in callbacks if "TrialReporter" not in str(c.get("class_path", c))]
    return cleaned


def _points_into(value: Any, inside: str, name: str) -> bool:
    return isinstance(value, str) and (inside in value or value.endswith(f"/{name}"))


def best_run(study: Any) -> tuple[Any, Path, dict[str, Any]] | None:
    """The best trial, its run folder and its ``config.yaml``, read once; ``None`` before any trial completed."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    run_dir = _run_folder(best)
    return (best, run_dir, yaml.safe_load((run_dir / "config.yaml").read_text())) if run_dir is not None else None


def write_best(best: Any, run_dir: Path, config: dict[str, Any], sweep: Sweep, sweep_dir: Path) -> Path:
    """``best.yaml``: the best trial's own config, so ``kiln fit -c best.yaml`` trains it again."""
    config = portable(config, run_dir)
    config.setdefault("run", {})["name"] = f"{sweep.name}-best"
    config["run"]["root"] = "runs"
    path = sweep_dir / "best.yaml"
    header = f"# trial {best.number} of sweep {sweep.name}: {sweep.metric} {best.value:.6g}\n"
    with written_whole(path) as partial:
        partial.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


def _chart(bars: list[tuple[str, float]], title: str, width: int = 480) -> Image.Image:
    """Horizontal bars with their labels and values."""
    row = 18
    canvas = Image.new("RGB", (width, 30 + row * max(1, len(bars))), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((6, 6), title, fill="black")
    top = max((v for _, v in bars), default=1.0) or 1.0
    for i, (label, value) in enumerate(bars):
        y = 26 + i * row
        draw.rectangle((200, y, 200 + int((width - 260) * value / top), y + row - 4), fill=(90, 120, 200))
        draw.text((6, y), label[-32:], fill="black")
        draw.text((width - 54, y), f"{value:.3f}", fill="black")
    return canvas


def history_image(values: list[tuple[int, float]], direction: str, width: int = 480, height: int = 240) -> Image.Image:
    """Each trial's value (dots) and the best so far (line), against the trial number."""
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    draw.text((6, 6), "optimisation history (dots: trials, line: best so far)", fill="black")
    if not values:
        return canvas
    low, high = min(v for _, v in values), max(v for _, v in values)
    span, last = (high - low) or 1.0, max(n for n, _ in values) or 1
    at = lambda n, v: (40 + (width - 60) * n / last, height - 20 - (height - 50) * (v - low) / span)  # noqa: E731
    best, line = math.inf if direction == "minimize" else -math.inf, []
    for n, v in values:
        best = min(best, v) if direction == "minimize" else max(best, v)
        line.append(at(n, best))
        x, y = at(n, v)
        draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=(90, 120, 200))
    if len(line) > 1:
        draw.line(line, fill=(200, 60, 60), width=2)
    draw.text((4, 24), f"{high:.4g}", fill="black")
    draw.text((4, height - 18), f"{low:.4g}", fill="black")
    return canvas


def _wandb_project(config: dict[str, Any]) -> str | None:
    """The W&B project a trial logged to (from its config), or ``None`` when W&B was off."""
    if os.environ.get("WANDB_MODE") == "disabled":
        return None
    logger = (config.get("trainer") or {}).get("logger")
    if not isinstance(logger, dict) or "Wandb" not in str(logger.get("class_path", "")):
        return None
    return str((logger.get("init_args") or {}).get("project") or "kiln")


def log_to_wandb(study: Any, config: dict[str, Any], sweep: Sweep, sweep_dir: Path, pictures: list[Path]) -> None:
    """The pictures and the trials table in one W&B run of the sweep's group, when the trials logged to W&B."""
    project = _wandb_project(config)
    if project is None:
        return
    from kiln.wandb_mode import ensure_wandb_mode, finish_wandb

    if notice := ensure_wandb_mode():
        print(notice, file=sys.stderr)
    import wandb

    finish_wandb()  # a run left open in this process (a notebook's fit) would take the report instead
    mode: Any = os.environ.get("WANDB_MODE")  # given per run: W&B reads the variable once per process
    run = wandb.init(project=project, group=sweep.name, name=f"{sweep.name}/report", job_type="sweep-report",
                     dir=str(sweep_dir), mode=mode)  # fmt: skip
    columns: list[str | int] = ["trial", "state", sweep.metric, *(param.key for param in sweep.space)]
    rows = [[t.number, t.state.name, t.value, *(t.params.get(param.key) for param in sweep.space)]
            for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("surplus")]  # fmt: skip
    run.log({**{f"sweep/{p.stem}": wandb.Image(str(p)) for p in pictures if p.is_file()},
             "sweep/trials": wandb.Table(columns=columns, data=rows)})  # fmt: skip
    run.finish()


def report(study: Any, sweep: Sweep, sweep_dir: Path) -> None:
    """Print the trials table; write ``best.yaml``, ``history.png`` and ``importance.png`` in the sweep folder."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    table = Table(title=f"Sweep {sweep.name}: {sweep.metric} ({sweep.direction})", title_justify="left")
    for column in ("trial", "state", sweep.metric, "seconds", "parameters / note"):
        table.add_column(column, justify="right" if column in (sweep.metric, "seconds") else "left")
    for t in trials:
        if t.user_attrs.get("surplus"):
            continue
        note = t.user_attrs.get("error") or describe(t.params)
        value = f"{t.value:.4f}" if t.value is not None else "-"
        table.add_row(str(t.number), t.state.name, value, str(t.user_attrs.get("seconds", "-")), note)
    Console(file=sys.stderr).print(table)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    complete = [(t.number, float(t.value)) for t in trials if t.state.name == "COMPLETE" and t.value is not None]
    with written_whole(sweep_dir / "history.png") as partial:
        history_image(complete, sweep.direction).save(partial)
    if len(complete) >= 2 and sweep.space:
        try:
            importances = optuna.importance.get_param_importances(study)
        except (RuntimeError, ValueError):  # too few distinct values to tell
            importances = {}
        with written_whole(sweep_dir / "importance.png") as partial:
            _chart(sorted(importances.items(), key=lambda kv: -kv[1]), "parameter importance (fANOVA)").save(partial)
    found = best_run(study)
    if found is None:
        return
    best, run_dir, config = found
    log_to_wandb(study, config, sweep, sweep_dir, [sweep_dir / "history.png", sweep_dir / "importance.png"])
    path = write_best(best, run_dir, config, sweep, sweep_dir)
    print(f"best: trial {best.number}, {sweep.metric} {best.value:.6g}; rerun it with kiln fit -c {path}",
          file=sys.stderr)  # fmt: skip
