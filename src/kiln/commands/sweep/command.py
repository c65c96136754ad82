"""``kiln sweep``'s command line: the sweep file and its options, then a search (``driver``), a report only, or the
file for W&B's own sweeps."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.commands.arguments import OneLineParser, folder, parse_command
from kiln.commands.sweep.report import report
from kiln.commands.sweep.space import Sweep, read_sweep, wandb_config
from kiln.commands.sweep.study import open_study, storage_for
from kiln.errors import UsageError
from kiln.files import dump_yaml


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="kiln sweep", description="Hyper-parameter search over kiln fit runs.")
    parser.add_argument("-c", "--config", required=True, help="the sweep file (configs/sweep/<name>.yaml)")
    parser.add_argument(
        "--storage", help="an Optuna storage URL, or a .log/.journal file (default: SQLite in the sweep folder)"
    )
    parser.add_argument("--root", type=folder, default="runs/sweeps", help="where sweep folders go")
    parser.add_argument(
        "--subprocess", action="store_true", help="each trial its own `kiln fit` process (DDP and multi-GPU trials)"
    )
    parser.add_argument(
        "--report", action="store_true", help="only print the table and write best.yaml and the pictures"
    )
    parser.add_argument("--wandb", action="store_true", help="write wandb_sweep.yaml for `wandb sweep` instead")
    parser.add_argument("--n_trials", type=int, help="trials the study should hold, instead of the file's n_trials")
    parser.add_argument("--stale_after", type=float, default=300.0, help="seconds without a heartbeat after which "
                        "another driver's trial is taken for dead and resumed here (default 300)")  # fmt: skip
    return parser


def _sweep(options: argparse.Namespace, extra: list[str]) -> Sweep:
    """The sweep file, with the command line's ``kiln fit`` arguments and its overrides, checked."""
    sweep = read_sweep(options.config)
    sweep.args += extra
    if options.stale_after <= 0:
        raise UsageError(f"kiln sweep: --stale_after {options.stale_after:g}: give a number of seconds above 0")
    sweep.stale_after = options.stale_after
    if options.n_trials is not None:
        if options.n_trials < 1:
            raise UsageError(f"kiln sweep: --n_trials {options.n_trials}: give 1 or more")
        sweep.n_trials = options.n_trials
    return sweep


def _write_wandb_sweep(sweep: Sweep, root: Path) -> None:
    path = root / sweep.name / "wandb_sweep.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(wandb_config(sweep)))
    print(f"wrote {path}: `wandb sweep {path}`, then `wandb agent <the sweep id it prints>` on each machine")
    if sweep.pruner == "median":
        print("W&B has no median pruner: its hyperband early termination stops runs from the same epoch on")


def sweep_command(args: list[str]) -> None:
    """``kiln sweep -c FILE [--storage URL] [--root DIR] [--report | --wandb] [-- kiln fit arguments]``."""
    options, extra = parse_command(_parser(), args)
    sweep, root = _sweep(options, extra), Path(options.root)
    if options.wandb:
        _write_wandb_sweep(sweep, root)
        return
    if options.report:
        study = open_study(sweep, storage_for(root / sweep.name, options.storage))
    else:
        from kiln.commands.sweep.driver import run_sweep  # Lightning: not for --help

        study = run_sweep(sweep, root, options.storage, options.subprocess)
    report(study, sweep, root / sweep.name)
