"""Runs, sweeps and multiruns as tables and plots, read from the files they wrote (no server, no logger needed):
the API behind ``notebooks/results.ipynb``.

    from kiln import results
    table = results.runs()                                  # one row per run folder under runs/
    results.plot_curves(table.path[:3], "val/loss")         # learning curves, overlaid
    results.config_diff(table.path[0], table.path[1])       # the settings that differ
    study = results.sweep("digits"); results.trials(study)  # a sweep's Optuna study and its trials
    results.multirun("width")                               # a multirun's mean ± 95% CI per cell
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.files import broken_archives, load_yaml
from kiln.runs.folders import DEFAULT_ROOT, in_use, layout, read_metrics
from kiln.runs.metrics import run_metrics
from kiln.runs.picking import partial_data

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from matplotlib.axes import Axes

STEP, EPOCH = "trainer/global_step", "epoch"
UNSET = "(unset)"  # a key one of two configs lacks


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"model.init_args.optimizer.init_args.lr": 0.001, …}``; a list of classes (the
    callbacks) by class name, ``trainer.callbacks[EarlyStopping].init_args.patience``, so that one callback
    added or changed is its own keys, not the whole list."""
    if isinstance(node, dict) and node:
        return {k: v for key, value in node.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    if node and isinstance(node, list) and all(isinstance(item, dict) and "class_path" in item for item in node):
        return {k: v for name, item in by_class(node) for k, v in flat(item, f"{prefix.rstrip('.')}[{name}].").items()}
    return {prefix.rstrip("."): node}


def by_class(items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each ``class_path`` item named by its class, ``ModelCheckpoint``, then ``ModelCheckpoint#2`` for a second."""
    named: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for item in items:
        name = str(item["class_path"]).rsplit(".", 1)[-1]
        seen[name] = seen.get(name, 0) + 1
        named.append((name if seen[name] == 1 else f"{name}#{seen[name]}", item))
    return named


def changed(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys, sorted, whose values differ between two flattened configs (a key one lacks counts as ``UNSET``)."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k, UNSET) != b.get(k, UNSET))


def _raw_config(run_dir: str | Path) -> dict[str, Any]:
    path = layout(run_dir).config
    return (load_yaml(path.read_text()) or {}) if path.is_file() else {}


def config(run_dir: str | Path) -> dict[str, Any]:
    """A run's settings (its ``config.yaml``), flattened to dotted keys."""
    return flat(_raw_config(run_dir))


def status(run_dir: str | Path) -> tuple[str, str]:
    """How the run's last command ended, and its line: ``finished``, ``failed``, ``interrupted`` or ``running``
    as recorded, ``stopped`` for a ``running`` whose process is gone (killed without a word); for a folder without
    a record, ``finished`` when it was tested, ``failed`` when it left a traceback, ``resumable`` when it saved a
    training state."""
    run = layout(run_dir)
    if run.status.is_file():
        record = json.loads(run.status.read_text())
        if record["status"] == "running" and not in_use(run.root):  # its command's process is gone
            return "stopped", "ended without a word: killed (kill -9, out of memory), or built and never run"
        return str(record["status"]), str(record.get("detail", ""))
    if "test" in read_metrics(run.root):
        return "finished", ""
    if errors := sorted(run.root.glob("error-*.log")):
        return "failed", f"traceback in {errors[-1].name}"
    if run.last.is_file():
        return "resumable", ""
    return "unknown", ""


def run_folders(root: str | Path = DEFAULT_ROOT) -> list[Path]:
    """Every run folder under ``root`` (a folder with a ``config.yaml``: fits, trials, multirun runs), oldest first."""
    found = [p.parent for p in Path(root).glob(f"**/{layout('').config.name}") if "wandb" not in p.parts]
    return sorted(found, key=lambda p: (p.stat().st_mtime, str(p)))


def runs(root: str | Path = DEFAULT_ROOT, keys: str | Iterable[str] = "varying") -> pd.DataFrame:
    """One row per run: experiment, run, status, resumable, its checkpoints that no longer load (``broken``), what
    data it trained on, the logger files it left (``csv``, ``wandb``, ``tensorboard``: what :func:`history` reads),
    epochs, steps, seconds, its metrics by weights (``val/loss @best``, ``test/acc @best``, ``test/acc @last``) and
    config keys: ``"varying"`` (those that differ between the runs listed), ``"all"``, or the keys named; ``path``
    last."""
    import pandas as pd

    rows, configs, folders = [], [], run_folders(root)
    for run_dir in folders:
        state, detail = status(run_dir)
        data, raw = read_metrics(run_dir), _raw_config(run_dir)
        settings = flat(raw)
        partial = partial_data(raw.get("trainer") or {})
        rows.append({
            "experiment": str(run_dir.parent.relative_to(root)), "run": run_dir.name, "status": state,
            "detail": detail, "resumable": state != "finished" and layout(run_dir).last.is_file(),
            "broken": ", ".join(broken_archives(layout(run_dir).checkpoints)),  # weights lost, numbers stand
            "data": partial or "all", "logged": log_files(run_dir)[0], "epochs": data.get("epochs"),
            "steps": data.get("global_step"), "seconds": data.get("wall_seconds"), **run_metrics(run_dir),
        })  # fmt: skip
        configs.append(settings)
    table = pd.DataFrame(rows)
    settings = pd.DataFrame(configs).map(lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
    if isinstance(keys, str) and keys == "varying":
        chosen = [k for k in settings.columns if settings[k].astype(str).nunique(dropna=False) > 1]
    else:
        chosen = list(settings.columns) if isinstance(keys, str) and keys == "all" else list(keys)
    table = pd.concat([table, settings.reindex(columns=chosen)], axis=1)
    table["path"] = [str(p) for p in folders]
    return table


def history(run_dir: str | Path) -> pd.DataFrame:
    """Every logged step of a run, one row each (``trainer/global_step``, ``epoch`` and the metrics), read from
    what its logger wrote: ``metrics.csv`` (CSV), W&B's offline run file, or TensorBoard's event file."""
    import pandas as pd

    kind, files = log_files(run_dir)
    if kind == "csv":
        table = pd.read_csv(files[-1]).rename(columns={"step": STEP})
    elif kind == "wandb":
        from kiln.wandb.offline import history as wandb_history

        table = pd.DataFrame(wandb_history(files[-1]))
        table = table.drop(columns=[c for c in table.columns if c.startswith("_")])
    elif kind == "tensorboard":
        table = _tensorboard(files)
    else:
        raise FileNotFoundError(f"{run_dir}: no metrics.csv, W&B run file or TensorBoard events (logger off?)")
    return table.sort_values(STEP, kind="stable").reset_index(drop=True) if STEP in table else table


def log_files(run_dir: str | Path) -> tuple[str | None, list[Path]]:
    """What the run's logger wrote that holds its history: ``csv``, ``wandb`` or ``tensorboard``, and the files."""
    from kiln.wandb.offline import run_file

    run_dir = Path(run_dir)
    if csvs := sorted(run_dir.glob("**/metrics.csv")):
        return "csv", csvs
    if (found := run_file(run_dir)) is not None:
        return "wandb", [found]
    if events := sorted(run_dir.glob("**/events.out.tfevents.*")):
        return "tensorboard", events
    return None, []


def _tensorboard(files: list[Path]) -> pd.DataFrame:
    """The scalars of every event file of the run (TensorBoard starts one per command: fit's, the test's)."""
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    for events in files:
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags = accumulator.Tags()["scalars"]
        rows += [{STEP: e.step, tag: e.value} for tag in tags for e in accumulator.Scalars(tag)]
    return pd.DataFrame(rows).groupby(STEP, as_index=False).first() if rows else pd.DataFrame(columns=[STEP])


def curve(run_dir: str | Path, metric: str, x: str = STEP) -> pd.DataFrame:
    """One metric of a run against ``x`` (``trainer/global_step`` or ``epoch``): the logged points only."""
    table = history(run_dir)
    if metric not in table:
        logged = sorted(c for c in table.columns if c not in (STEP, EPOCH))
        raise KeyError(f"{run_dir}: {metric!r} was never logged; it logged {', '.join(logged)}")
    return table[[x, metric]].dropna().drop_duplicates(subset=[x], keep="last")


def plot_curves(
    run_dirs: Iterable[str | Path], metric: str, x: str = STEP, ax: Axes | None = None, labels: Iterable[str] = ()
) -> Axes:
    """``metric`` of each run against ``x``, overlaid; each line labelled by ``labels``, else by its run's path below
    the folder the runs share (``cnn/base/seed42/<run>`` and ``gru/base/seed42/<run>`` for two multiruns)."""
    if ax is None:
        from matplotlib.figure import Figure

        ax = Figure(figsize=(7, 4), layout="constrained").subplots()
    runs = [Path(run_dir).resolve() for run_dir in run_dirs]
    shared = os.path.commonpath([run.parent.parent for run in runs]) if runs else "/"  # at least <name>/<run>
    named = list(labels) or [str(run.relative_to(shared)) for run in runs]
    for run_dir, label in zip(runs, named, strict=True):
        points = curve(run_dir, metric, x)
        ax.plot(points[x], points[metric], marker="." if len(points) < 30 else None, label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} by {x}")
    ax.legend(fontsize=7)
    return ax


def pictures(run_dir: str | Path) -> list[Path]:
    """The pictures a run drew (batch grid, a confusion matrix per tested checkpoint), oldest first."""
    return sorted(Path(run_dir).glob("*.png"), key=lambda p: p.stat().st_mtime)


def config_diff(a: str | Path, b: str | Path) -> pd.DataFrame:
    """The settings that differ between two runs, one row per key (``(unset)`` where one run lacks it)."""
    import pandas as pd

    left, right = config(a), config(b)
    keys = changed(left, right)
    names = (Path(a).name, Path(b).name) if Path(a).name != Path(b).name else (str(a), str(b))
    return pd.DataFrame({"key": keys, names[0]: [left.get(k, UNSET) for k in keys],
                         names[1]: [right.get(k, UNSET) for k in keys]}).set_index("key")  # fmt: skip


def sweep(name: str | Path, root: str | Path = "runs/sweeps") -> optuna.Study:
    """A sweep's Optuna study, by its name under ``root`` or its folder; read only, never a new one."""
    import optuna

    folder = Path(name) if Path(name).is_dir() else Path(root) / str(name)
    database = folder / "study.db"
    if not database.is_file():
        raise FileNotFoundError(f"{database}: no sweep there (kiln sweep -c configs/sweep/<name>.yaml makes one)")
    storage = optuna.storages.RDBStorage(f"sqlite:///{database}", skip_table_creation=True)
    studies = storage.get_all_studies()  # one: its own name (Optuna logs a notice when none is given)
    return optuna.load_study(study_name=studies[0].study_name if len(studies) == 1 else folder.name, storage=storage)


def trials(study: optuna.Study) -> pd.DataFrame:
    """A study's trials: number, state, value, duration, parameters and each trial's run folder."""
    table = study.trials_dataframe(attrs=("number", "state", "value", "duration", "params", "user_attrs"))
    return table.drop(columns=[c for c in table.columns if c.startswith("user_attrs_") and c != "user_attrs_run"])


def multirun(name: str | Path, root: str | Path = "runs/multirun", raw: bool = False) -> pd.DataFrame:
    """A multirun's results: ``mean ± ci95`` (95% CI, Student's t) per cell (rows) and metric (columns), the
    metrics named by their weights (``@best``, ``@last``); ``raw``: ``results.csv`` as it is (mean, std, ci95, n)."""
    import pandas as pd

    folder = Path(name) if Path(name).is_dir() else Path(root) / str(name)
    path = folder / "results.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no multirun results there (kiln multirun … --name <name> writes them)")
    table = pd.read_csv(path)
    if raw:
        return table
    shown = zip(table["mean"], table["ci95"], table["n"], strict=True)
    table["mean ± ci95"] = [f"{m:.4f} ± {c:.4f} (n={n})" if n > 1 else f"{m:.4f} (n=1)" for m, c, n in shown]
    return table.pivot(index="cell", columns="metric", values="mean ± ci95")
