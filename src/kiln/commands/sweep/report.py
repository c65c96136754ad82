"""What a sweep leaves: a trials table, ``best.yaml`` that reruns the best trial, and two pictures."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kiln.commands.sweep.inprocess import describe
from kiln.commands.sweep.space import Sweep
from kiln.files import dump_yaml, load_yaml, written_whole
from kiln.runs.folders import DEFAULT_ROOT, layout
from kiln.runs.provenance import argv_shown


def _run_folder(trial: Any) -> Path | None:
    """The newest run folder of the trial (resumes continue in it)."""
    folder = Path(trial.user_attrs.get("run", ""))
    found = sorted(p for p in folder.glob("*") if layout(p).config.is_file()) if folder.is_dir() else []
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
    return (best, run_dir, load_yaml(layout(run_dir).config.read_text())) if run_dir is not None else None


def write_best(best: Any, run_dir: Path, config: dict[str, Any], sweep: Sweep, sweep_dir: Path) -> Path:
    """``best.yaml``: the best trial's own config, so ``kiln fit -c best.yaml`` trains it again."""
    config = portable(config, run_dir)
    config.setdefault("run", {})["name"] = f"{sweep.name}-best"
    config["run"]["root"] = DEFAULT_ROOT  # the rerun is a run of its own, not a trial
    config["run"].pop("summary", None)  # trials leave the summary to the sweep; the rerun ends on its own
    given = " ".join(sweep.args).replace("test_after_fit ", "test_after_fit=")
    # trials skip the test (the sweep needs validation only); the rerun tests, unless the sweep's own args said no
    config["run"]["test_after_fit"] = "test_after_fit=false" not in given.lower()
    path = sweep_dir / "best.yaml"
    header = f"# trial {best.number} of sweep {sweep.name}: {sweep.metric} {best.value:.6g}\n"
    with written_whole(path) as partial:
        partial.write_text(header + dump_yaml(config))
    return path


def _pyplot() -> Any:
    """pyplot for Optuna's plots: drawn to files by a command (Agg), a notebook's own backend left as it is."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("agg")
    import matplotlib.pyplot as plt

    return plt


def sweep_figures(study: Any, sweep: Sweep) -> dict[str, Any]:
    """Optuna's own plots: the optimisation history and, from two finished trials on, the parameter importances
    (Optuna's default evaluator), titled with the sweep and its metric, parameters by their full keys; Optuna's
    style stays inside. Importances Optuna cannot tell apart (it warns they "will be equal") are not drawn."""
    import matplotlib
    import optuna
    from optuna.visualization import matplotlib as plots

    _pyplot()
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    drawings = {"history": lambda: plots.plot_optimization_history(study, target_name=sweep.metric)}
    if len(complete) >= 2 and sweep.space:
        drawings["importance"] = lambda: plots.plot_param_importances(study, target_name=sweep.metric)
    drawn = {}
    with matplotlib.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="No artists with labels found to put in legend")  # no trial done
        warnings.filterwarnings("error", message=".*Parameter importances will be equal")  # a picture of nothing
        for name, draw in drawings.items():
            try:
                ax = draw()
            except (RuntimeError, ValueError, UserWarning):  # too few distinct values to tell importances apart
                continue
            title = " ".join(ax.get_title(loc=loc) for loc in ("left", "center") if ax.get_title(loc=loc))
            for loc in ("left", "center"):  # Optuna titles one plot at the left, the other in the centre
                ax.set_title("", loc=loc)
            figure: Any = ax.figure
            figure.set_size_inches(9, 4.5)
            figure.suptitle(f"{title}: sweep {sweep.name}, {sweep.metric} ({sweep.direction})", x=0.01, ha="left")
            figure.tight_layout()  # the title and the parameters' full keys inside the picture, none cut at an edge
            drawn[name] = figure
    return drawn


def write_pictures(study: Any, sweep: Sweep, sweep_dir: Path) -> list[Path]:
    """``history.png`` and ``importance.png`` in the sweep folder (the figures closed once written)."""
    from kiln.runs import figures

    written = []
    for name, figure in sweep_figures(study, sweep).items():
        figures.save(figure, sweep_dir / f"{name}.png")
        _pyplot().close(figure)
        written.append(sweep_dir / f"{name}.png")
    return written


def _wandb_project(config: dict[str, Any]) -> str | None:
    """The W&B project a trial logged to (from its config), or ``None`` when W&B was off."""
    from kiln.wandb.mode import current

    if current() == "disabled":
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
    from kiln.console import verbose
    from kiln.wandb.mode import current, ensure_wandb_mode, finish_wandb

    if notice := ensure_wandb_mode():
        print(notice, file=sys.stderr)
    import wandb

    finish_wandb()  # a run left open in this process (a notebook's fit) would take the report instead
    mode: Any = current()  # given per run: W&B reads the variable once per process
    with argv_shown():  # the command W&B records: --storage without its password
        run = wandb.init(project=project, group=sweep.name, name=f"{sweep.name}/report", job_type="sweep-report",
                         dir=str(sweep_dir), mode=mode, settings=wandb.Settings(silent=not verbose()))  # fmt: skip
    columns: list[str | int] = ["trial", "state", sweep.metric, *(param.key for param in sweep.space)]
    rows = [[t.number, t.state.name, t.value, *(t.params.get(param.key) for param in sweep.space)]
            for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("surplus")]  # fmt: skip
    run.log({**{f"sweep/{p.stem}": wandb.Image(str(p)) for p in pictures if p.is_file()},
             "sweep/trials": wandb.Table(columns=columns, data=rows)})  # fmt: skip
    run.finish()


def report(study: Any, sweep: Sweep, sweep_dir: Path) -> None:
    """Print the trials table; write ``best.yaml``, ``history.png`` and ``importance.png`` in the sweep folder."""
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
    pictures = write_pictures(study, sweep, sweep_dir)
    found = best_run(study)
    if found is None:
        with contextlib.suppress(ValueError):  # no trial completed: the table says so
            best = study.best_trial
            print(f"no best.yaml: the best trial, {best.number}, left no config.yaml in a run folder (a fast_dev_run "
                  f"trial saves nothing); its parameters: {describe(best.params)}", file=sys.stderr)  # fmt: skip
        return
    best, run_dir, config = found
    log_to_wandb(study, config, sweep, sweep_dir, pictures)
    path = write_best(best, run_dir, config, sweep, sweep_dir)
    print(f"best: trial {best.number}, {sweep.metric} {best.value:.6g}; rerun it with kiln fit -c {path}",
          file=sys.stderr)  # fmt: skip
