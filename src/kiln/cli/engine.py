"""``kiln fit|validate|test|predict``: LightningCLI with the default experiment, run folders and a summary."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jsonargparse import ArgumentError, Namespace
from jsonargparse._actions import _ActionPrintConfig  # README: private APIs
from jsonargparse.typing import PositiveInt
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.cli import _InstantiatorFn as _InstantiatorFn  # README: private APIs
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from kiln import console
from kiln.callbacks.last import finished_training
from kiln.callbacks.monitored import MonitoredKeys
from kiln.callbacks.non_finite import NonFiniteGuard
from kiln.callbacks.preemption import PreemptionCheckpoint
from kiln.callbacks.spawned_ranks import SpawnedRanks
from kiln.cli.callback_list import chosen_callbacks
from kiln.cli.class_switch import carried_over, own_defaults
from kiln.cli.config_errors import check_config_files, describe, sources
from kiln.cli.configs import config_dir
from kiln.cli.devices import (
    fall_back_from_bf16,
    fsdp_without_gpu,
    missing_gpu,
    slurm_outside_a_job,
    sync_batchnorm_without_gpu,
)
from kiln.cli.from_checkpoint import (
    BUILT_FROM,
    BUILT_FROM_KEY,
    read_checkpoint,
    refuse_unloadable,
    saved_config,
    weight_shapes,
)
from kiln.cli.init_from import load_weights
from kiln.cli.links import DataLinks, unwrap
from kiln.cli.numbers_type import register_numbers
from kiln.cli.parser import KilnArgumentParser, plain_config
from kiln.cli.resume_check import (
    average_line,
    keep_given_secrets,
    keep_run_seed,
    keep_saved_stats,
    refuse_changed_data,
    refuse_changed_settings,
    refuse_dropped_average,
    refuse_fewer_epochs,
)
from kiln.cli.run_paths import RunPaths
from kiln.cli.whole_numbers import keep_whole_numbers
from kiln.console import quiet_lightning
from kiln.errors import AlreadyFinished, ConfigError, Preempted, UsageError
from kiln.files import dump_yaml, written_whole
from kiln.process import process_group, stop_signals
from kiln.process.secrets import load_env_file, redact, secret_values
from kiln.runs.folders import layout
from kiln.runs.picking import Pick, nothing_to_run, partial_data
from kiln.runs.provenance import argv_shown, write_environment
from kiln.runs.record import RunRecord
from kiln.runs.reference import PASSED_ON, resolve
from kiln.training.checkpointing import remove_stale_temporaries
from kiln.training.testing import TestChoice, missing_for, read_metrics, summarize_untested, test_after_fit
from kiln.wandb import checkpoints as wandb_checkpoints
from kiln.wandb.mode import finish_wandb, start_or_fall_back


@dataclass
class RunOptions:
    """Where a run's folder goes and what happens after ``fit``.

    Args:
        name: Experiment name; runs land in ``<root>/<name>/<timestamp>``.
        root: Folder holding all runs.
        test_after_fit: Test once ``fit`` ends, write ``metrics.json`` and print a summary.
        test_ckpt: What the test after fit scores: the ``best`` checkpoint (lowest ``val/loss`` by
            default), the ``last`` one (the final weights), or ``both`` (each once, when they differ).
        cpu_threads: torch's intra-op CPU threads (``None``: torch's default, one per core). Fewer
            are often faster for small models on a shared machine; the count changes the order of
            floating-point sums, so bitwise-repeatable CPU runs need the same count.
        without: Callbacks of ``trainer.callbacks`` to leave out, by class name (``[BatchGrid]``)
            or path; a subclass of a named class goes too. A preset drops (or, adding its own,
            replaces) one default callback this way without restating the whole list.
        summary: End on the run summary (``kiln sweep`` and ``kiln multirun`` turn it off for their runs: they print
            a line per run and their own table; ``-v`` prints it anyway).
    """

    name: str = "default"
    root: str = "runs"
    test_after_fit: bool = True
    test_ckpt: TestChoice = "both"
    cpu_threads: PositiveInt | None = None
    without: list[str] = field(default_factory=list)
    summary: bool = True


class WandbConfigSaver(SaveConfigCallback):
    """Saves ``config.yaml`` into the run folder and the same resolved config into the W&B run, secrets redacted;
    beside it ``env.json`` and ``code.diff`` (``kiln.runs.provenance``), also in the W&B config.

    Built with ``save_to_log_dir=False`` and writing the file itself: a redacted value (a marker in
    place of a number or a dict) would fail the type check Lightning's own save makes.
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        run_paths: RunPaths | None = None,
        command: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(parser, redact(config), **kwargs)
        self.run_paths, self.command = run_paths, command
        self.built_from: dict[str, Any] = {}  # the model's and the data's config: in every checkpoint

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:

        path = Path(trainer.default_root_dir) / self.config_filename  # the run folder, as every logger's
        path.parent.mkdir(parents=True, exist_ok=True)
        whole = plain_config(self.parser, self.config, skip_unset=False)
        dumped = copy.deepcopy(whole)  # config.yaml's, made portable in place; W&B gets `whole` (one dump: 0.03 s)
        self.built_from = {key: dumped[key] for key in BUILT_FROM if isinstance(dumped.get(key), dict)}
        if self.run_paths is not None:  # without this run's folder: `-c config.yaml` starts a run of its own
            dumped = self.run_paths.portable(dumped)
        with written_whole(path) as partial:
            partial.write_text(dump_yaml(dumped))
        environment = write_environment(path.parent, trainer.datamodule, self.command)  # env.json, code.diff
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.config.update({"cli": whole, "env": environment}, allow_val_change=True)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """What the model and the data were built from, whatever the module saves of itself: ``from_checkpoint``
        rebuilds them from it (a module that ignores its injected ``net`` in ``save_hyperparameters`` too)."""
        if self.built_from:
            checkpoint[BUILT_FROM_KEY] = self.built_from


class _Instantiator(_InstantiatorFn):
    """Lightning's instantiator, told only the links jsonargparse applied: a link into a network the chosen model
    does not take (a self-contained LightningModule) is ignored by jsonargparse, but Lightning would still write it
    into the hyper-parameters and fail there (``Expected key model.init_args.net… to be in data``)."""

    def __call__(self, class_type: Any, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        self.cli._dump_config()
        built = self.cli.config_dump.get(self.key, {})
        applied = {key: value for key, value in applied_instantiation_links.items() if _has_parent(built, key)}
        return super().__call__(class_type, *args, applied_instantiation_links=applied, **kwargs)


def _has_parent(config: dict[str, Any], key: str) -> bool:
    """Whether ``config`` (one section of the CLI's config) holds the node a link target ``key`` sits in."""
    node: Any = config
    for part in key.split(".")[1:-1]:  # after the section's own name, up to the argument
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, dict)


class KilnCLI(LightningCLI):
    """LightningCLI that gives every run its own folder and keeps W&B from prompting or hanging."""

    run_dir: Path | None = None
    resume_dir: Path | None = None  # the run folder of the checkpoint `--ckpt_path last` resumes
    _checkpoint: dict[str, Any] | None = None  # what `--ckpt_path` names, read once (memory-mapped) until used
    test_metrics: dict[str, float] | None = None  # the best checkpoint's test results, after `fit`
    # validate/test/predict from a CLI checkpoint: its hyper-parameters, weight shapes and path
    _trained: tuple[dict[str, Any], dict[str, tuple[int, ...]], str] | None = None

    def __init__(
        self, *args: Any, inside: str | None = None, callbacks: Sequence[Callback] = (),
        record: RunRecord | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        """``inside``: the command that runs this one in its own process (``kiln sweep``), if any; ``callbacks``:
        objects it adds to the trainer's (a sweep's reporter holding its trial); ``record``: the run folder's record
        the caller keeps (it removes the folder if the run fails unsaved), else the CLI's own."""
        self.inside, self.extra_callbacks = inside, list(callbacks)
        self.record = record if record is not None else RunRecord()
        self._named = named_subcommand(kwargs.get("args"))
        self._given: list[str] = []  # the command line's arguments, as written (parse_arguments)
        self._parsed: list[str] = []  # what was parsed: the command line, with a checkpoint's config inserted
        self.links = DataLinks()
        self._secrets: list[str] = []  # the config's secret values: W&B never reads them in sys.argv (_start_wandb)
        register_numbers()
        load_env_file()  # a notebook's build_cli reads the project's .env as the `kiln` command does
        quiet_lightning()
        console.begin_command()
        try:
            with process_group.released_after():  # an in-process DDP run's port and group: free for the next
                super().__init__(*args, **kwargs)
        except BaseException:
            self._end_command(exit_code=1)  # the W&B run is marked failed
            raise
        if self.subcommand is not None:  # the command is done; without one (run=False) the caller trains next
            self._end_command()

    def _end_command(self, exit_code: int = 0) -> None:
        """Close what the command held, so a later one in this process (a notebook) or another process starts
        clean: its W&B run, its run folder, its console."""
        finish_wandb(exit_code=exit_code)
        self.record.close()
        console.end_command()

    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Lightning's subcommands, or only the one the command line names: a subcommand's parser takes about
        0.1 s to build, and a command parses with its own alone."""
        return subcommands_for(self._named)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Resolve ``--ckpt_path`` (``kiln.runs.reference``), and refuse unreadable or finished checkpoints up front."""
        self._given = self._parsed = command_line(args)
        check_config_files(self._given)
        if (named := _evaluated_file(self._given)) is not None:  # validate/test/predict --ckpt_path <file>:
            self._checkpoint = read_checkpoint(named[1])  # parsed once, with its model and data
            if self._rebuild_from_checkpoint(parser, *named, self._checkpoint):  # first, so flags of its data fit
                return
        self._parse(parser, args)
        if not self.config.get("subcommand"):
            return
        subcommand = self.config.subcommand
        config = self.config[subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path in PASSED_ON or (ckpt_path == "best" and subcommand == "fit"):
            return
        pick = Pick(partial_data(config.trainer), fit=subcommand == "fit")  # never a debug run for a real one
        found = resolve(ckpt_path, config.run.root, config.run.name, subcommand, pick)
        config.ckpt_path = str(found.path) if found.path else None
        if found.path is not None and self._checkpoint is None:
            self._checkpoint = read_checkpoint(found.path)  # a one-line CheckpointError naming the file
        if found.run_dir is not None and subcommand == "fit" and self._checkpoint is not None:
            self._refuse_finished(self._checkpoint, config, found.run_dir)
        if found.run_dir is not None:  # it goes on in that run's folder
            print(f"resuming from {found.path}", file=sys.stderr)
        self.resume_dir = found.run_dir
        if subcommand != "fit" and self._checkpoint is not None:
            self._rebuild_from_checkpoint(parser, subcommand, str(self.config[subcommand].ckpt_path), self._checkpoint)

    def _parse(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse; a switched class gets its own defaults (kiln.cli.class_switch) before anything reads the config."""
        own_argv = argv_hidden() if args is not None else contextlib.nullcontext()  # a notebook's: no warning
        try:  # --print_config is printed below, once a switched class has its own defaults
            with _ActionPrintConfig.skip_print_config(), own_argv:
                super().parse_arguments(parser, args)
        except ArgumentError as err:  # `exit_on_error=False`: one line instead of usage plus nested errors
            given = self._given
            known = getattr(self, "_subcommand_parsers", {}).get(self._named, parser)  # a LightningCLI attribute

            def known_keys() -> list[str]:
                return list(known.get_defaults().keys())

            raise UsageError(f"{describe(str(err), given, parser.default_config_files, known_keys)}") from None
        subcommand = self.config.get("subcommand")
        own_defaults(self.config[subcommand] if subcommand else self.config, config_dir() / "train.yaml",
                     sources(self._parsed, []))  # fmt: skip
        _ActionPrintConfig.print_config_if_requested(parser, self.config)  # `--print_config`: prints, then exits

    def _rebuild_from_checkpoint(
        self, parser: LightningArgumentParser, subcommand: str, ckpt_path: str, checkpoint: dict[str, Any]
    ) -> bool:
        """Parse with the model and data the checkpoint was trained with as the first ``-c``: the default
        data never meets another run's weights, and what the command gives still applies over it. False
        for a checkpoint the CLI did not write (Lightning's own reading of its hyper-parameters applies)."""
        saved = saved_config(checkpoint, ckpt_path)
        if saved is None or subcommand not in self._given:
            return False
        at = self._given.index(subcommand) + 1
        self._parsed = [*self._given[:at], "-c", saved, *self._given[at:]]
        with argv_hidden():  # LightningCLI warns when it sees both args and sys.argv
            self._parse(parser, self._parsed)
        self.config[subcommand].ckpt_path = ckpt_path
        self._trained = (checkpoint.get("hyper_parameters", {}), weight_shapes(checkpoint), ckpt_path)
        print(f"model and data as {ckpt_path} was trained (with this command's settings over them)", file=sys.stderr)
        if line := average_line(checkpoint, self.config[subcommand].trainer.callbacks, subcommand, ckpt_path):
            print(line, file=sys.stderr)
        return True

    @staticmethod
    def _refuse_finished(checkpoint: dict[str, Any], config: Namespace, run_dir: Path) -> None:
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

    def _dump_config(self) -> None:
        """LightningCLI's dump of the parsed config (the hyper-parameters checkpoints hold), without checking the
        config once more: parsing checked it, and the check took most of the dump's time. Overrides a private
        LightningCLI method (README: private APIs relied on)."""
        if hasattr(self, "config_dump"):
            return
        self.config_dump = plain_config(self.parser, self.config, skip_link_targets=False, skip_unset=False)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def _parse_ckpt_path(self) -> None:
        """Lightning applies the checkpoint's model settings over the command line; kiln refuses a
        resume that changes them instead (they would be ignored) and never lets a redacted secret
        replace the real one. Overrides a private LightningCLI method (README: private APIs relied on)."""
        checkpoint, self._checkpoint = self._checkpoint, None  # not held (nor its file mapped) for the whole run
        if checkpoint is None:  # no checkpoint file named (or `last` found none)
            return
        subcommand = self.config.subcommand
        saved = checkpoint.get("hyper_parameters", {})
        if subcommand == "fit":
            refuse_changed_settings(saved, self.config.fit.model, self.config.fit.ckpt_path)
            keep_saved_stats(checkpoint.get("datamodule_hyper_parameters"), self.config.fit.data)
            refuse_changed_data(checkpoint.get("datamodule_hyper_parameters"), self.config.fit.data,
                                self.config.fit.ckpt_path)  # fmt: skip
            refuse_dropped_average(checkpoint, self.config.fit.trainer.callbacks, self.config.fit.ckpt_path)
            refuse_fewer_epochs(checkpoint, self.config.fit.trainer.max_epochs, self.config.fit.ckpt_path)
            keep_run_seed(self.config.fit, self.config.fit.ckpt_path)
            return  # the model and data are built from the command line, which matches the checkpoint
        if self._trained is not None:
            return  # parsed with the checkpoint's model and data under the command's own settings
        given = self.config[subcommand].clone()
        super()._parse_ckpt_path()
        keep_given_secrets(saved, given.model, self.config[subcommand].model)

    def _add_instantiators(self) -> None:
        """Lightning's two instantiators, as :class:`_Instantiator` (overrides a private method: README)."""
        for key in ("model", "data"):
            self.parser.add_instantiator(_Instantiator(cli=self, key=key), LightningModule if key == "model" else
                                         LightningDataModule, subclasses=True)  # fmt: skip

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        keep_whole_numbers(parser)  # the trainer's limit_*_batches, val_check_interval, overfit_batches
        parser.add_class_arguments(RunOptions, "run")
        # always on, and configurable on its own (`--non_finite.action skip`) instead of by list position
        parser.add_lightning_class_args(NonFiniteGuard, "non_finite")
        self.links.add_to(parser)  # num_classes, in_channels, input_shape: from the data, never restated
        parser.add_argument(
            "--init_from", type=str | None, default=None,
            help="fit: start a new run from this checkpoint's weights (fine-tuning): new optimizer, schedule, folder",
        )  # fmt: skip
        parser.add_argument(
            "--init_partial", type=bool, default=False,
            help="with --init_from: load what fits by name and shape even from another network class",
        )  # fmt: skip

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        default_file = config_dir() / "train.yaml"
        written = sources(self._parsed, [])
        for line in carried_over(config, default_file, written):
            print(line, file=sys.stderr)
        self._dump_config()  # what checkpoints store as hyper-parameters (LightningCLI's own dump) ...
        self.config_dump = redact(self.config_dump)  # ... without secrets
        self._secrets = secret_values(config)
        finish_wandb()  # a W&B run left open by earlier work in this process (a notebook) is not this run's
        settings = sources(self._parsed, [str(default_file)])
        self.links.note(config, settings)
        for check in (missing_gpu, fsdp_without_gpu, sync_batchnorm_without_gpu, slurm_outside_a_job):
            if why := check(config.trainer, settings):
                raise ConfigError(why)
        if self.subcommand in ("validate", "test", "predict") and not config.get("ckpt_path"):
            raise UsageError(
                f"kiln {self.subcommand}: no --ckpt_path, so it would score an untrained network; name the weights: "
                "--ckpt_path <file>, best, last, or wandb:<entity>/<project>/<artifact>:<alias>"
            )
        if setting := nothing_to_run(self.subcommand, config.trainer):
            why = "fit would train nothing and test an untrained network" if self.subcommand == "fit" else (
                f"kiln {self.subcommand} would run no batch")  # fmt: skip
            trained = " (`kiln test --ckpt_path <file>` tests a trained one)" if self.subcommand == "fit" else ""
            raise UsageError(f"{setting}: {why}; give a positive value{trained}")
        prefix = "" if self.subcommand in (None, "fit") else f"{self.subcommand}-"  # results apart from training runs
        self.run_dir = self.record.open(config.run.root, config.run.name, resume=self.resume_dir, prefix=prefix)
        console.to_run_folder(self.run_dir)
        run_paths = RunPaths(self.run_dir, self.resume_dir, config.run.root)
        run_paths.fill(config, config.run.name)
        self.save_config_kwargs["run_paths"] = run_paths  # config.yaml leaves them out again
        self.save_config_kwargs["command"] = ["kiln", *self._given]  # env.json: as given (secrets hidden there)
        for stale in remove_stale_temporaries(layout(self.run_dir).checkpoints):
            print(f"removed {stale}, left by a checkpoint write that was killed", file=sys.stderr)
        if notice := fall_back_from_bf16(config.trainer):
            print(notice, file=sys.stderr)
        if config.run.cpu_threads is not None:
            torch.set_num_threads(config.run.cpu_threads)
        config.trainer.callbacks = chosen_callbacks(config)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            if (kiln_error := unwrap(err)) is not None:  # raised in a link: one line, not jsonargparse's chain
                raise kiln_error from None
            raise
        stop_signals.reclaim()  # the Trainer's MPI detection may have taken SIGUSR1 over
        self.trainer.callbacks.extend(self.extra_callbacks)  # type: ignore[attr-defined]
        self.trainer.callbacks.insert(0, MonitoredKeys())  # type: ignore[attr-defined]  # before what saves or stops
        for callback in self.trainer.callbacks if self.inside else ():  # type: ignore[attr-defined]
            if isinstance(callback, PreemptionCheckpoint):  # the sweep or multirun says how it goes on
                callback.hint = ""
        self.links.prune(self.model.hparams)
        if self.run_dir is not None:  # the ranks ddp_spawn starts: their lines in console.log too
            self.trainer.callbacks.append(SpawnedRanks(self.run_dir))  # type: ignore[attr-defined]
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("init_from"):
            if self.subcommand not in (None, "fit"):
                raise UsageError(f"--init_from starts a new `fit` from a checkpoint's weights; for {self.subcommand}, "
                                 "name the checkpoint with --ckpt_path")  # fmt: skip
            if config.get("ckpt_path"):  # the same command with `--ckpt_path last` goes on after a stop
                print(
                    f"--init_from {config.init_from}: not applied, the run resumes its own checkpoint", file=sys.stderr
                )
            else:
                print(load_weights(self.model, config.init_from, partial=config.init_partial), file=sys.stderr)
        if self._trained is not None:
            refuse_unloadable(*self._trained[:2], self.model, self._trained[2])

    def before_fit(self) -> None:
        process_group.check_one_process(self.trainer.num_devices * self.trainer.num_nodes, self.inside)
        self._start_wandb()

    def _start_wandb(self) -> None:
        """W&B's run starts before training, offline or off when it cannot start online (one line says so)."""
        for logger in self.trainer.loggers:
            wandb = isinstance(logger, WandbLogger) and self.trainer.is_global_zero
            if not wandb:
                continue
            with argv_shown(self._secrets):  # W&B records the command line in its run's file
                notice = start_or_fall_back(logger)
            if notice:
                print(notice, file=sys.stderr)

    def before_validate(self) -> None:
        self._refuse_missing("validate")
        self._start_wandb()

    def before_test(self) -> None:
        self._refuse_missing("test")
        self._start_wandb()

    def _refuse_missing(self, stage: str) -> None:
        if missing := missing_for(stage, self.model, self.datamodule):
            split = "validation" if stage == "validate" else stage
            raise UsageError(f"kiln {stage}: {missing}; add it to evaluate a checkpoint on the {split} split")

    before_predict = _start_wandb

    def after_fit(self) -> None:
        config = self.config[self.subcommand]
        if self.trainer.interrupted:
            return
        summary = config.run.summary or console.verbose()
        missing = missing_for("test", self.model, self.datamodule)
        if not config.run.test_after_fit or missing:
            summarize_untested(self.trainer, summary, missing)
            return
        try:
            if (name := stop_signals.received()) is not None:  # came between fit and its test: no test begins
                raise SIGTERMException if name == "SIGTERM" else Preempted(f"{name} before the test after fit")
            self.test_metrics = test_after_fit(self.trainer, self.model, self.datamodule, config.run.test_ckpt, summary)
        except (SIGTERMException, Preempted):
            print(
                "the test after fit was stopped; training is complete: the same command with "
                "`--ckpt_path last` tests it without training",
                file=sys.stderr,
            )
            raise


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


def _evaluated_file(given: list[str]) -> tuple[str, str] | None:
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


@contextmanager
def argv_hidden() -> Iterator[None]:
    """``sys.argv[1:]`` empty for a parse given its own arguments: LightningCLI warns when it sees both,
    and W&B records ``sys.argv`` as a run's command."""
    command, sys.argv[1:] = sys.argv[1:], []
    try:
        yield
    finally:
        sys.argv[1:] = command


def build_cli(
    args: ArgsType = None, run: bool = True, inside: str | None = None, callbacks: Sequence[Callback] = (),
    record: RunRecord | None = None,
) -> KilnCLI:  # fmt: skip
    """The CLI with the default experiment's config applied first.

    ``run=False`` (no subcommand) only builds model, datamodule and trainer: the way notebooks and
    tests get exactly what ``kiln fit`` would train. ``inside``, ``callbacks`` and ``record``: see :class:`KilnCLI`.
    """
    top: dict[str, Any] = {
        "allow_abbrev": False,  # argparse would take a typo like --trainer.max_epoch as --trainer.max_epochs
        "exit_on_error": False,  # parse errors become one line (kiln.cli.config_errors), not usage plus nested errors
    }
    defaults = {**top, "default_config_files": [str(config_dir() / "train.yaml")]}
    each = {sub: defaults for sub in subcommands_for(named_subcommand(args))}
    return KilnCLI(
        model_class=None,
        datamodule_class=None,
        save_config_callback=WandbConfigSaver,
        parser_class=KilnArgumentParser,
        save_config_kwargs={"overwrite": True, "save_to_log_dir": False},
        auto_configure_optimizers=False,  # the model owns its optimizer and scheduler (kept in its hparams)
        parser_kwargs={**top, **each} if run else defaults,
        args=args,
        run=run,
        inside=inside,
        callbacks=callbacks,
        record=record,
    )
