"""``kiln multirun``: seeds, folds and small grids of ``kiln fit``, aggregated with confidence intervals.

    kiln multirun --seeds 0-4 --folds 5 --grid model.init_args.net.init_args.width=16,32 -- -c configs/…

Every run is an in-process ``kiln fit`` (``--subprocess``: its own process, for DDP) in
``<root>/<name>/<cell>/seed<S>[-fold<F>]``; a run that completed with the same resolved config is
skipped on a rerun (one with other settings is trained again beside it). ``results.md`` and
``results.csv`` give mean, sample std, 95% confidence interval (Student's t) and n per metric and
grid cell, each test metric once per set of weights the runs tested (``@best``, ``@last``).
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln import console
from kiln.commands.arguments import OneLineParser, folder, parse_command, resolved_config
from kiln.commands.sweep.aggregate import aggregate, describe_run
from kiln.commands.sweep.inprocess import fit, fit_process, short_key, under_policy
from kiln.commands.sweep.space import flags
from kiln.errors import KilnError, UsageError
from kiln.files import broken_archives, load_yaml
from kiln.process import stop_signals
from kiln.runs import folders

Planned = tuple[dict[str, str], str, list[str]]  # a run: its grid cell, its name under the root, its arguments


def _check_folds(fit_args: list[str]) -> None:
    """``--folds`` sets ``data.num_folds`` and ``data.fold``: the data class must take them."""
    from kiln.cli.classes import defaults, import_class

    path = str(((load_yaml(resolved_config(fit_args)) or {}).get("data") or {}).get("class_path", ""))
    found = import_class(path)
    if found is not None and not {"num_folds", "fold"} <= set(defaults(found)):
        raise UsageError(
            f"--folds: {path} takes no num_folds and fold; folds need a datamodule that cuts its train and val "
            "splits by them (kiln.data.TensorDataModule and its subclasses do)"
        )


def seeds(text: str) -> list[int]:
    """``0-4`` or ``1,3,7`` (or a mix) as a list of seeds."""
    found: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            found += list(range(int(low), int(high) + 1)) if high else [int(low)]
    except ValueError:
        raise UsageError(f"--seeds {text!r}: give a range (0-4) or a list (1,3,7)") from None
    if not found:
        raise UsageError(f"--seeds {text!r}: an empty range, nothing to run; give low-high with low <= high (0-4)")
    return found


def grid(items: list[str]) -> list[dict[str, str]]:
    """``KEY=V1,V2`` items as every combination of their values (one empty cell without items)."""
    axes = []
    for item in items:
        key, _, values = item.partition("=")
        if not key or not values:
            raise UsageError(f"--grid {item!r}: give KEY=VALUE1,VALUE2 (a dotted CLI key)")
        axes.append([(key, value) for value in values.split(",")])
    return [dict(cell) for cell in itertools.product(*axes)]


def cell_name(cell: dict[str, str]) -> str:
    return "-".join(f"{short_key(key)}={value}" for key, value in cell.items()) or "base"


CONFIG_FILE = "multirun.yaml"  # in a run folder: the config it was resolved to, what a rerun compares
QUIET_RUN = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--run.summary=false"]


def changed_keys(old: str, new: str, most: int = 3) -> str:
    """``trainer.max_epochs 2 -> 5, …``: the settings that differ between two resolved configs."""
    from kiln.results import UNSET, changed, flat

    before, after = flat(load_yaml(old) or {}), flat(load_yaml(new) or {})
    keys = changed(before, after)
    shown = [f"{k} {before.get(k, UNSET)} -> {after.get(k, UNSET)}" for k in keys[:most]]
    return ", ".join(shown) + (f" and {len(keys) - most} more" if len(keys) > most else "")


def finished(folder: Path, tested: bool, config: str) -> tuple[Path | None, str | None]:
    """The run folder under ``folder`` that completed (tested, when tests are on) with ``config``; else
    ``None`` and, when a completed run had other settings, which (it is never reused)."""
    other = None
    for run_dir in sorted(folder.glob("*"), reverse=True):
        data = folders.read_metrics(run_dir)
        if "val" not in data or ("test" not in data and tested):
            continue
        saved = run_dir / CONFIG_FILE
        if saved.is_file() and saved.read_text() == config:
            return run_dir, None
        if other is None:
            other = changed_keys(saved.read_text(), config) if saved.is_file() else "settings not recorded"
    return None, other


def stopped(folder: Path, config: str) -> Path | None:
    """The newest run folder under ``folder`` that a stop cut short with ``config``: its ``last.ckpt`` goes on."""
    for run_dir in sorted(folder.glob("*"), reverse=True):
        saved = run_dir / CONFIG_FILE
        if saved.is_file() and saved.read_text() == config and folders.layout(run_dir).last.is_file():
            return run_dir if "test" not in folders.read_metrics(run_dir) else None
    return None


def _sum_up_stopped(name: str, root: Path, cell_runs: dict[str, list[Path]]) -> None:
    """A stop in or before run ``name``: what finished before it is aggregated."""
    if cell_runs:
        print(f"kiln multirun stopped at {name}: the runs finished so far, aggregated:", file=sys.stderr)
        aggregate(root, cell_runs)


@contextmanager
def claimed(folder: Path, wait: bool) -> Iterator[bool]:
    """An exclusive lock on ``<folder>.lock`` while this multirun works on that run: multiruns on other machines
    sharing the folder take the other runs (``wait``: block until the holder is done). A run that left nothing
    leaves no lock file, nor a folder this made for it."""
    lock_path = folder.parent / f"{folder.name}.lock"
    created = folders.first_missing(lock_path.parent)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with lock_path.open("a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                if not folder.is_dir() or not any(folder.iterdir()):
                    lock_path.unlink(missing_ok=True)
    finally:
        if created is not None and not any(path.is_file() for path in created.rglob("*")):
            shutil.rmtree(created, ignore_errors=True)


def _note_config(folder: Path, before: set[Path], config: str) -> None:
    """The resolved config beside each run folder the run made: a rerun reuses a run only if it is the same."""
    for new in set(folder.glob("*")) - before:
        (new / CONFIG_FILE).write_text(config)


def _done_before(name: str, done: Path) -> Path:
    """A run that completed with the same config: skipped, saying so, and saying when its weights are lost."""
    print(f"{name}: done before with the same config ({done}), skipped", file=sys.stderr)
    if broken := broken_archives(folders.layout(done).checkpoints):
        print(f"{name}: its checkpoints {', '.join(broken)} no longer load (truncated or overwritten): its numbers "
              f"stand, its weights are lost; delete {done} to train it again", file=sys.stderr)  # fmt: skip
    return done


def _train(args: list[str], runs: Path, own_process: bool) -> None:
    """``kiln fit <args>``, in this process or its own (DDP)."""
    if own_process:
        fit_process(args, runs_under=runs)
    else:
        fit(args, inside="kiln multirun")


def _one_run(
    name: str, run: list[str], root: Path, tested: bool, own_process: bool, cell_runs: dict[str, list[Path]],
    failed: list[str],
) -> Path | None:  # fmt: skip
    """One planned run: skipped when done before, resumed when a stop cut it, else trained; its folder, if done."""
    if stop_signals.received():
        _sum_up_stopped(name, root, cell_runs)
        stop_signals.stop_here(f"kiln multirun stopped before {name}; the same command goes on from there")
    config = resolved_config(run)
    done, other = finished(root / name, tested, config)
    if done is not None:
        return _done_before(name, done)
    cut = stopped(root / name, config)
    if cut is not None:  # a stop cut it short: it goes on from its last.ckpt, in its own folder
        print(f"{name}: resuming the run a stop cut short ({cut}) from its last.ckpt", file=sys.stderr)
    elif other is not None:
        print(f"{name}: trained before with other settings ({other}): training again", file=sys.stderr)
    before = set((root / name).glob("*"))
    quiet = [] if console.verbose() else QUIET_RUN  # one line per run here, not a run's own console
    resume = [f"--ckpt_path={folders.layout(cut).last}"] if cut is not None else []  # any job's: a cancelled task's
    args = [*run, *quiet, *resume]

    def on_stop() -> None:
        _note_config(root / name, before, config)  # the same command resumes it
        _sum_up_stopped(name, root, cell_runs)

    def on_failure(line: str) -> None:
        print(f"{name}: failed: {line}", file=sys.stderr)
        failed.append(name)

    failures_before = len(failed)
    under_policy(name, lambda: _train(args, root / name, own_process), on_failure, on_stop)
    if len(failed) > failures_before:
        return None
    _note_config(root / name, before, config)
    done, _ = finished(root / name, tested, config)
    if done is not None:
        print(f"{name}: {describe_run(done)}", file=sys.stderr)
    return done


def _options(args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The multirun's own options, checked, and the ``kiln fit`` arguments after them."""
    parser = OneLineParser(prog="kiln multirun", description="Seeds, folds and grids of kiln fit.")
    parser.add_argument("--seeds", default="0", help="0-4, or 1,3,7")
    parser.add_argument("--folds", type=int, help="K: stratified folds of train+val (data.num_folds); test fixed")
    parser.add_argument("--grid", nargs="*", default=[], help="KEY=V1,V2 ... (every combination)")
    parser.add_argument("--name", type=folder, default="multirun", help="the folder under --root")
    parser.add_argument("--root", type=folder, default="runs/multirun")
    parser.add_argument("--subprocess", action="store_true", help="each run its own `kiln fit` process (DDP)")
    options, fit_args = parse_command(parser, args)
    if options.folds is not None and options.folds < 2:
        raise UsageError(f"--folds {options.folds}: give 2 or more")
    if options.folds is not None:
        _check_folds(fit_args)
    return options, fit_args


def _planned(
    options: argparse.Namespace, fit_args: list[str], root: Path
) -> list[tuple[dict[str, str], str, list[str]]]:
    """Every run of the multirun: its grid cell, its name under the root, its ``kiln fit`` arguments."""
    folds = list(range(options.folds)) if options.folds else [None]
    planned = []
    for cell in grid(options.grid):
        for seed, fold in itertools.product(seeds(options.seeds), folds):
            name = f"{cell_name(cell)}/seed{seed}" + (f"-fold{fold}" if fold is not None else "")
            fold_args = [f"--data.init_args.num_folds={options.folds}", f"--data.init_args.fold={fold}"]
            run = [*fit_args, *flags(cell), f"--seed_everything={seed}", *(fold_args if fold is not None else []),
                   f"--run.root={root}", f"--run.name={name}"]  # fmt: skip
            planned.append((cell, name, run))
    return planned


def multirun_command(args: list[str]) -> None:
    """``kiln multirun [--seeds 0-4] [--folds K] [--grid KEY=V1,V2 ...] [--name N] [-- kiln fit arguments]``."""
    options, fit_args = _options(args)
    root = Path(options.root) / options.name
    tested = "--run.test_after_fit=false" not in fit_args
    planned = _planned(options, fit_args, root)
    cell_runs: dict[str, list[Path]] = {}
    failed: list[str] = []

    def take(cell: dict[str, str], name: str, run: list[str], wait: bool) -> bool:
        """The run, unless another multirun holds it (``wait``: until it lets go); whether it was taken."""
        with claimed(root / name, wait) as mine:
            done = _one_run(name, run, root, tested, options.subprocess, cell_runs, failed) if mine else None
        if done is not None:
            cell_runs.setdefault(cell_name(cell), []).append(done)
        return mine

    waiting = []
    for cell, name, run in planned:
        if not take(cell, name, run, wait=False):
            print(f"{name}: another multirun is training it; taken up at the end", file=sys.stderr)
            waiting.append((cell, name, run))
    for cell, name, run in waiting:  # what another multirun trained meanwhile is done; what it left, trained here
        take(cell, name, run, wait=True)
    if cell_runs:
        aggregate(root, cell_runs)
    if failed and len(failed) == len(planned):
        raise KilnError(f"every run failed ({len(failed)}): nothing to aggregate; each run's line above says why")
    if failed:
        print(
            f"{len(failed)} of {len(planned)} runs failed ({', '.join(failed)}): left out of the table", file=sys.stderr
        )
