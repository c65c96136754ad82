"""``kiln tune lr``: a learning-rate range test on the configured optimizer, whatever its class.

    kiln tune lr [--min_lr 1e-7] [--max_lr 1] [--num_training 100] -- -c configs/experiment/digits.yaml

The rate is set in the optimizer's parameter groups before each step (a callback), so no ``lr`` attribute on the
model is needed, which Lightning's finder wants and an optimizer given as a callable in YAML does not have. The
suggestion is where the smoothed loss falls fastest per decade of rate (Lightning's finder differentiates by the
rate itself and corrects its smoothing one step off). The test trains a copy in a folder that is removed after,
with the global random states put back, so a ``kiln fit`` after it is bitwise what it would have been without
it. Writes ``lr_find.csv``, ``lr_find.png`` and ``tuned.yaml`` (the suggestion under the
optimizer's key, for ``kiln fit … -c tuned.yaml``) into ``runs/<name>/tune-<timestamp>/``.
"""

from __future__ import annotations

import csv
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.commands.arguments import OneLineParser, parse_command, resolved_config
from kiln.errors import UsageError
from kiln.files import dump_yaml, load_yaml, written_whole
from kiln.runs.folders import DEFAULT_ROOT

if TYPE_CHECKING:
    from kiln.callbacks.range_test import RangeTest  # Lightning: imported where the test runs, not for --help


def parse(args: list[str]) -> tuple[Any, list[str]]:
    parser = OneLineParser(prog="kiln tune lr", description="A learning-rate range test; the fit arguments follow --.")
    parser.add_argument("--min_lr", type=float, default=1e-7, help="the rate the test starts at")
    parser.add_argument("--max_lr", type=float, default=1.0, help="the rate it ends at (or stops before: loss x4)")
    parser.add_argument("--num_training", type=int, default=100, help="optimizer steps of the test")
    if args[:1] in (["-h"], ["--help"]):
        parser.parse_args(["--help"])  # its usage, exit 0: lr is the one thing it tunes
    if not args[:1] == ["lr"]:
        raise UsageError("kiln tune: say what to tune: `kiln tune lr [options] -- <kiln fit arguments>`")
    options, fit_args = parse_command(parser, args[1:])
    if not 0 < options.min_lr < options.max_lr or options.num_training < 10:
        raise UsageError("kiln tune lr: need 0 < --min_lr < --max_lr and --num_training of at least 10")
    return options, fit_args


def range_test(fit_args: list[str], min_lr: float, max_lr: float, num_training: int) -> tuple[RangeTest, Any]:
    """The range test on the model and data the fit arguments build, trained in a scratch run folder (removed
    after) without validation, checkpoints or the non-finite guard, the global random states put back."""
    from kiln.callbacks.range_test import RangeTest
    from kiln.cli import argv_hidden, build_cli
    from kiln.data.datasets import global_rngs_kept
    from kiln.process.process_group import check_one_process

    scratch = Path(tempfile.mkdtemp(prefix="kiln-tune-"))
    test = RangeTest(min_lr, max_lr, num_training)
    settings = ["--trainer.logger", "false", "--run.root", str(scratch), "--trainer.max_steps", str(num_training),
                "--trainer.max_epochs", "-1", "--trainer.limit_val_batches", "0", "--non_finite.action", "off",
                "--trainer.num_sanity_val_steps", "0", "--trainer.enable_progress_bar", "false",
                "--trainer.enable_model_summary", "false",
                "--trainer.enable_checkpointing", "false", "--run.without", "[BatchGrid, GradNormMonitor]"]  # fmt: skip
    try:
        with global_rngs_kept(), argv_hidden():
            cli = build_cli([*fit_args, *settings], run=False)
            devices = cli.trainer.num_devices * cli.trainer.num_nodes
            check_one_process(devices, "kiln tune lr", "it runs one process; add --trainer.devices 1 after -- "
                              "(the rate it suggests is then for one process's batch)")  # fmt: skip
            cli.trainer.callbacks.append(test)  # type: ignore[attr-defined]
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return test, cli


def optimizer_name(cli: Any) -> str:
    """The optimizer class the config names (a callable's ``class_path``)."""
    return str(getattr(cli.config.get("model.init_args.optimizer"), "class_path", None) or "the configured optimizer")


def write_results(folder: Path, test: RangeTest, suggestion: float, optimizer: str, min_lr: float,
                  max_lr: float) -> None:  # fmt: skip
    """``lr_find.csv`` (rate, loss, smoothed), ``lr_find.png`` (the curve, the suggestion marked), ``tuned.yaml``."""
    from kiln.runs import figures

    lrs, losses = test.lrs, test.smoothed
    folder.mkdir(parents=True, exist_ok=True)
    with written_whole(folder / "lr_find.csv") as partial, partial.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lr", "loss", "smoothed_loss"])
        writer.writerows(zip(lrs, test.losses, losses, strict=True))
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4), layout="constrained")
    ax = figure.subplots()
    ax.plot(lrs, losses)
    ax.set_xscale("log")
    ax.axvline(suggestion, color="tab:red", linestyle="--", label=f"suggested {suggestion:.3g}")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss (smoothed)")
    ax.set_title(f"learning-rate range test of {optimizer.rsplit('.', 1)[-1]}, {len(lrs)} steps")
    ax.legend()
    figures.save(figure, folder / "lr_find.png")
    header = (f"# kiln tune lr: the steepest descent of the smoothed loss in a range test of {optimizer}\n"
              f"# from {min_lr:g} to {max_lr:g} ({len(lrs)} steps, lr_find.csv)\n"
              f"# use: kiln fit … -c {folder}/tuned.yaml\n")  # fmt: skip
    tuned = {"model": {"init_args": {"optimizer": {"init_args": {"lr": float(f"{suggestion:.3g}")}}}}}
    with written_whole(folder / "tuned.yaml") as partial:
        partial.write_text(header + dump_yaml(tuned))


def tune_command(args: list[str]) -> None:
    """``kiln tune lr …``: run the range test and write what it found."""
    from datetime import datetime

    options, fit_args = parse(args)
    print(f"learning-rate range test: {options.num_training} steps from {options.min_lr:g} to {options.max_lr:g}",
          file=sys.stderr)  # fmt: skip
    test, cli = range_test(fit_args, options.min_lr, options.max_lr, options.num_training)
    suggestion = test.suggestion()
    if suggestion is None:
        raise UsageError(f"kiln tune lr: no suggestion from {len(test.lrs)} steps (the loss never fell); "
                         "raise --num_training or --max_lr")  # fmt: skip
    run = (load_yaml(resolved_config(fit_args)) or {}).get("run") or {}  # where the fit would write
    folder = Path(run.get("root") or DEFAULT_ROOT) / str(run.get("name") or cli.config.run.name)
    folder = folder / datetime.now().strftime("tune-%Y-%m-%d_%H-%M-%S")
    write_results(folder, test, suggestion, optimizer_name(cli), options.min_lr, options.max_lr)
    command = " ".join(["kiln fit", *fit_args, "-c", str(folder / "tuned.yaml")])
    print(f"suggested learning rate {suggestion:.3g} ({folder / 'lr_find.png'}); train with it: {command}",
          file=sys.stderr)  # fmt: skip
