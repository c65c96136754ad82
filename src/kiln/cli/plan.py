"""A command line made into one plan before anything is built: the arguments as given and as parsed, and the
checkpoint ``--ckpt_path`` names, resolved once (``kiln.runs.reference``: a file, ``best``, ``last``, ``wandb:``,
under ``run.root``) and read once, with the run folder a resume goes on in."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from jsonargparse import ArgumentError, Namespace
from jsonargparse._actions import _ActionPrintConfig  # docs/development.md: private APIs
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from kiln.callbacks.last import finished_training
from kiln.cli.class_switch import own_defaults
from kiln.cli.config_errors import check_config_files, describe, sources
from kiln.cli.configs import config_dir
from kiln.cli.from_checkpoint import BUILT_FROM_KEY, read_checkpoint, saved_config, weight_shapes
from kiln.cli.resume_check import average_line
from kiln.errors import AlreadyFinished, UsageError
from kiln.runs.folders import read_metrics
from kiln.runs.picking import Pick, partial_data
from kiln.runs.reference import PASSED_ON, resolve
from kiln.wandb import checkpoints as wandb_checkpoints

Parse = Callable[[ArgsType], Namespace]  # the CLI's parse of a command line (parse_config)


class Trained(NamedTuple):
    """What validate/test/predict read of a checkpoint the CLI wrote: the model is rebuilt from it."""

    hyper_parameters: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    path: str
    left_out: tuple[str, ...] = ()  # the callbacks the run left out (run.without): its evaluation does too


@dataclass
class RunPlan:
    """One command, resolved: ``given`` as written; ``parsed`` with a checkpoint's saved config inserted as the first
    ``-c``; ``checkpoint`` read once (memory-mapped) until the CLI applies it; ``resume_dir``, the run folder a
    ``fit`` goes on in; ``trained``, set when an evaluation rebuilds the model and data the checkpoint was trained
    with."""

    given: list[str]
    parsed: list[str] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = None
    resume_dir: Path | None = None
    trained: Trained | None = None

    def __post_init__(self) -> None:
        self.parsed = self.parsed or self.given


def resolve_plan(plan: RunPlan, args: ArgsType, parse: Parse) -> Namespace:
    """The config of ``args``, its ``--ckpt_path`` resolved into ``plan``; unreadable or finished checkpoints are
    refused up front."""
    check_config_files(plan.given)
    if (named := evaluated_file(plan.given)) is not None:  # validate/test/predict --ckpt_path <file>:
        plan.checkpoint = read_checkpoint(named[1])  # parsed once, with its model and data
        if (rebuilt := _rebuilt(plan, parse, *named)) is not None:  # first, so flags of its data fit
            return rebuilt
    config = parse(args)
    subcommand = config.get("subcommand")
    if not subcommand:
        return config
    ckpt_path = config[subcommand].get("ckpt_path")
    if ckpt_path in PASSED_ON or (ckpt_path == "best" and subcommand == "fit"):
        return config
    run = config[subcommand].run
    pick = Pick(partial_data(config[subcommand].trainer), fit=subcommand == "fit")  # never a debug run for a real one
    found = resolve(ckpt_path, run.root, run.name, subcommand, pick)
    config[subcommand].ckpt_path = str(found.path) if found.path else None
    if found.path is not None and plan.checkpoint is None:
        plan.checkpoint = read_checkpoint(found.path)  # a one-line CheckpointError naming the file
    if found.run_dir is not None and subcommand == "fit" and plan.checkpoint is not None:
        refuse_finished(plan.checkpoint, config.fit, found.run_dir)
    if found.run_dir is not None:  # it goes on in that run's folder
        print(f"resuming from {found.path}", file=sys.stderr)
    plan.resume_dir = found.run_dir
    if subcommand != "fit" and plan.checkpoint is not None:
        config = _rebuilt(plan, parse, subcommand, str(config[subcommand].ckpt_path)) or config
    return config


def _rebuilt(plan: RunPlan, parse: Parse, subcommand: str, ckpt_path: str) -> Namespace | None:
    """The config parsed with the model and data the checkpoint was trained with as the first ``-c``: the default
    data never meets another run's weights, and what the command gives still applies over it. None for a checkpoint
    the CLI did not write (Lightning's own reading of its hyper-parameters applies)."""
    assert plan.checkpoint is not None
    saved = saved_config(plan.checkpoint, ckpt_path)
    if saved is None or subcommand not in plan.given:
        return None
    at = plan.given.index(subcommand) + 1
    plan.parsed = [*plan.given[:at], "-c", saved, *plan.given[at:]]
    with argv_hidden():  # LightningCLI warns when it sees both args and sys.argv
        config = parse(plan.parsed)
    config[subcommand].ckpt_path = ckpt_path
    left_out = (plan.checkpoint.get(BUILT_FROM_KEY) or {}).get("left_out") or ()
    plan.trained = Trained(plan.checkpoint.get("hyper_parameters", {}), weight_shapes(plan.checkpoint), ckpt_path,
                           tuple(left_out))  # fmt: skip
    print(f"model and data as {ckpt_path} was trained (with this command's settings over them)", file=sys.stderr)
    if line := average_line(plan.checkpoint, config[subcommand].trainer.callbacks, subcommand, ckpt_path):
        print(line, file=sys.stderr)
    return config


def refuse_finished(checkpoint: dict[str, Any], config: Namespace, run_dir: Path) -> None:
    """Rerunning a finished run trains nothing; it tests, if its test after fit never completed."""
    limits = config.trainer
    why = finished_training(checkpoint, limits.max_epochs, limits.max_steps, limits.get("max_time"))
    tested = "test" in read_metrics(run_dir)
    if why is None or (config.run.test_after_fit and not tested):
        return
    more = "--trainer.max_time" if "time limit" in why else "--trainer.max_epochs or --trainer.max_steps"
    raise AlreadyFinished(
        f"{run_dir} is complete ({why}{'; tested' if tested else ''}): nothing to do. "
        f"Raise {more} to train on, or drop --ckpt_path for a new run"
    )


def command_line(args: ArgsType) -> list[str]:
    """The command line's arguments as written: ``args``, or the process's own when it is ``None``."""
    return [str(a) for a in (sys.argv[1:] if args is None else args if isinstance(args, list) else [])]


def named_subcommand(args: ArgsType) -> str | None:
    """The Lightning subcommand (fit, validate, test, predict) a command line names, if any."""
    return next((a for a in command_line(args) if a in LightningCLI.subcommands()), None)


def subcommands_for(named: str | None) -> dict[str, set[str]]:
    """LightningCLI's subcommands and the arguments each skips: only ``named``'s when there is one."""
    every = LightningCLI.subcommands()
    return {named: every[named]} if named else every


def evaluated_file(given: list[str]) -> tuple[str, str] | None:
    """``(subcommand, file)`` when the command line is validate/test/predict with ``--ckpt_path <file>``
    (not ``best``, ``last`` or a ``wandb:`` version, which need the parsed config to be found)."""
    command = named_subcommand(given)
    if command in (None, "fit"):
        return None
    for i, token in enumerate(given):
        key, has_value, value = token.partition("=")
        if key == "--ckpt_path":
            value = value if has_value else (given[i + 1] if i + 1 < len(given) else "")
            found = value not in ("", "best", "last", "hpc", "null", "None")
            return (command, value) if found and not wandb_checkpoints.names_a_version(value) else None
    return None


def parse_config(cli: Any, parser: LightningArgumentParser, args: ArgsType) -> Namespace:
    """LightningCLI's parse into ``cli.config``; a parse error is one line (kiln.cli.config_errors), a switched class
    gets its own defaults (kiln.cli.class_switch) before anything reads the config, then ``--print_config``."""
    own_argv = argv_hidden() if args is not None else contextlib.nullcontext()  # a notebook's: no warning
    try:  # --print_config is printed below, once a switched class has its own defaults
        with _ActionPrintConfig.skip_print_config(), own_argv:
            LightningCLI.parse_arguments(cli, parser, args)
    except ArgumentError as err:  # `exit_on_error=False`: one line instead of usage plus nested errors
        known = getattr(cli, "_subcommand_parsers", {}).get(cli.named, parser)  # a LightningCLI attribute
        raise UsageError(describe(str(err), cli.plan.given, parser.default_config_files,
                                  lambda: list(known.get_defaults().keys()))) from None  # fmt: skip
    subcommand = cli.config.get("subcommand")
    own_defaults(cli.config[subcommand] if subcommand else cli.config, config_dir() / "train.yaml",
                 sources(cli.plan.parsed, []))  # fmt: skip
    _ActionPrintConfig.print_config_if_requested(parser, cli.config)  # `--print_config`: prints, then exits
    return cli.config


@contextmanager
def argv_hidden() -> Iterator[None]:
    """``sys.argv[1:]`` empty for a parse given its own arguments: LightningCLI warns when it sees both,
    and W&B records ``sys.argv`` as a run's command."""
    command, sys.argv[1:] = sys.argv[1:], []
    try:
        yield
    finally:
        sys.argv[1:] = command
