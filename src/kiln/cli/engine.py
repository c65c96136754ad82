"""``kiln fit|validate|test|predict``: LightningCLI with the default experiment, run folders and a summary."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI

from kiln import console
from kiln.cli.callback_list import add_kiln_callbacks
from kiln.cli.config_saver import WandbConfigSaver
from kiln.cli.configs import config_dir
from kiln.cli.from_checkpoint import refuse_unloadable
from kiln.cli.init_from import apply_init_from
from kiln.cli.instantiator import Instantiator
from kiln.cli.links import DataLinks, unwrap
from kiln.cli.numbers_type import register_numbers
from kiln.cli.parser import KilnArgumentParser, plain_config
from kiln.cli.plan import RunPlan, command_line, named_subcommand, parse_config, resolve_plan, subcommands_for
from kiln.cli.prepare import open_run, refuse, refuse_missing
from kiln.cli.resume_check import check_resume, keep_given_secrets
from kiln.cli.run_options import add_run_arguments
from kiln.console import quiet_lightning
from kiln.process import process_group, stop_signals
from kiln.process.secrets import load_env_file, redact, secret_values
from kiln.runs.provenance import argv_shown
from kiln.runs.record import RunRecord
from kiln.training.testing import after_fit
from kiln.wandb.mode import finish_wandb, start_runs

__all__ = ["KilnCLI", "build_cli"]


class KilnCLI(LightningCLI):
    """LightningCLI that gives every run its own folder and keeps W&B from prompting or hanging.

    Lightning calls its hooks in this order (``LightningCLI.__init__``); each applies one part of the run:

    1. ``subcommands``, ``add_arguments_to_parser``: the parser of the named subcommand only, with ``run``,
       ``non_finite``, ``init_from`` and the data's links.
    2. ``parse_arguments``: the plan (``kiln.cli.plan``): the config parsed, ``--ckpt_path`` resolved and read once.
    3. ``_parse_ckpt_path``: a resume refused where it changes what the checkpoint trained.
    4. ``before_instantiate_classes``: the hyper-parameters' dump, the refusals, the run folder (``kiln.cli.prepare``).
    5. ``instantiate_classes``: model, data and Trainer, kiln's callbacks added, ``--init_from`` applied.
    6. ``before_<subcommand>``: W&B's run started (and, for an evaluation, the data it needs checked).
    7. ``after_fit``: the test after fit and the run's summary.
    """

    run_dir: Path | None = None
    test_metrics: dict[str, float] | None = None  # the best checkpoint's test results, after `fit`

    def __init__(
        self, *args: Any, inside: str | None = None, callbacks: Sequence[Callback] = (),
        record: RunRecord | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        """``inside``: the command that runs this one in its own process (``kiln sweep``), if any; ``callbacks``:
        objects it adds to the trainer's (a sweep's reporter holding its trial); ``record``: the run folder's record
        the caller keeps (it removes the folder if the run fails unsaved), else the CLI's own."""
        self.inside, self.extra_callbacks = inside, list(callbacks)
        self.record = record if record is not None else RunRecord()
        self.named = named_subcommand(kwargs.get("args"))
        self.plan = RunPlan(given=[])
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
        return subcommands_for(self.named)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """The run's plan: the config parsed, ``--ckpt_path`` resolved and read once (``kiln.cli.plan``)."""
        self.plan = RunPlan(given=command_line(args))
        self.config = resolve_plan(self.plan, args, partial(parse_config, self, parser))

    def _dump_config(self) -> None:
        """LightningCLI's dump of the parsed config (the hyper-parameters checkpoints hold), without checking the
        config once more: parsing checked it, and the check took most of the dump's time. Overrides a private
        LightningCLI method (docs/development.md: private APIs relied on)."""
        if hasattr(self, "config_dump"):
            return
        self.config_dump = plain_config(self.parser, self.config, skip_link_targets=False, skip_unset=False)
        if "subcommand" in self.config:
            self.config_dump = self.config_dump[self.config.subcommand]

    def _parse_ckpt_path(self) -> None:
        """Lightning applies the checkpoint's model settings over the command line; kiln refuses a
        resume that changes them instead (they would be ignored) and never lets a redacted secret
        replace the real one. Overrides a private LightningCLI method (docs/development.md: private APIs relied on)."""
        checkpoint, self.plan.checkpoint = self.plan.checkpoint, None  # not held (nor its file mapped) for the run
        if checkpoint is None:  # no checkpoint file named (or `last` found none)
            return
        subcommand = self.config.subcommand
        if subcommand == "fit":
            check_resume(checkpoint, self.config.fit)  # the model and data are built from the command line
            return
        if self.plan.trained is not None:
            return  # parsed with the checkpoint's model and data under the command's own settings
        given = self.config[subcommand].clone()
        super()._parse_ckpt_path()
        keep_given_secrets(checkpoint.get("hyper_parameters", {}), given.model, self.config[subcommand].model)

    def _add_instantiators(self) -> None:
        """Lightning's two instantiators, as :class:`Instantiator` (overrides a private method: docs/development.md)."""
        for key in ("model", "data"):
            self.parser.add_instantiator(Instantiator(cli=self, key=key), LightningModule if key == "model" else
                                         LightningDataModule, subclasses=True)  # fmt: skip

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``run``, ``non_finite``, ``init_from`` and the data's links (``kiln.cli.run_options``)."""
        add_run_arguments(parser, self.links)

    def before_instantiate_classes(self) -> None:
        """The hyper-parameters checkpoints hold, without secrets; the command refused in one line or given its
        run folder (``kiln.cli.prepare``)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._dump_config()
        self.config_dump = redact(self.config_dump)
        self._secrets = secret_values(config)
        finish_wandb()  # a W&B run left open by earlier work in this process (a notebook) is not this run's
        refuse(config, self.subcommand, self.plan, self.links)
        run_paths, left_out = open_run(config, self.subcommand, self.plan, self.record)
        self.run_dir = run_paths.run_dir
        self.save_config_kwargs["left_out"] = left_out  # in every checkpoint: its evaluations leave them out too
        self.save_config_kwargs["run_paths"] = run_paths  # config.yaml leaves them out again
        self.save_config_kwargs["command"] = ["kiln", *self.plan.given]  # env.json: as given (secrets hidden there)

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except Exception as err:
            if (kiln_error := unwrap(err)) is not None:  # raised in a link: one line, not jsonargparse's chain
                raise kiln_error from None
            raise
        stop_signals.reclaim()  # the Trainer's MPI detection may have taken SIGUSR1 over
        add_kiln_callbacks(self.trainer.callbacks, self.extra_callbacks, self.inside, self.run_dir)  # type: ignore[attr-defined]
        self.links.prune(self.model.hparams)
        apply_init_from(self.model, self.config[self.subcommand] if self.subcommand else self.config, self.subcommand)
        if self.plan.trained is not None:
            refuse_unloadable(*self.plan.trained[:2], self.model, self.plan.trained.path)

    def before_fit(self) -> None:
        process_group.check_one_process(self.trainer.num_devices * self.trainer.num_nodes, self.inside)
        self._start_wandb()

    def _start_wandb(self) -> None:
        """W&B's run starts before training, offline or off when it cannot start online (one line says so)."""
        if self.trainer.is_global_zero:
            with argv_shown(self._secrets):  # W&B records the command line in its run's file
                start_runs(self.trainer.loggers)

    def before_validate(self) -> None:
        refuse_missing("validate", self.model, self.datamodule)
        self._start_wandb()

    def before_test(self) -> None:
        refuse_missing("test", self.model, self.datamodule)
        self._start_wandb()

    before_predict = _start_wandb

    def after_fit(self) -> None:
        """The test after fit (``kiln.training.testing``), unless the fit was stopped."""
        if not self.trainer.interrupted:
            self.test_metrics = after_fit(self.trainer, self.model, self.datamodule, self.config.fit.run)


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
