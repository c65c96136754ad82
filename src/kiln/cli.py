"""``kiln fit|validate|test|predict``: LightningCLI with the default experiment, run folders and a summary."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace, dict_to_namespace
from lightning.pytorch.cli import ArgsType, LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from kiln.callbacks.non_finite import NonFiniteGuard
from kiln.callbacks.resume import Preempted
from kiln.checkpointing import load_checkpoint_file
from kiln.errors import KilnError
from kiln.runs import RUN_DIR_ENV, latest_checkpoint, remove_if_empty, resolve_run_dir, wandb_run_id
from kiln.secrets import redact
from kiln.wandb_mode import ensure_wandb_mode, finish_wandb

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "train.yaml"


@dataclass
class RunOptions:
    """Where a run's folder goes and what happens after ``fit``.

    Args:
        name: Experiment name; runs land in ``<root>/<name>/<timestamp>``.
        root: Folder holding all runs.
        test_after_fit: Test the best checkpoint once ``fit`` ends and print a summary.
    """

    name: str = "default"
    root: str = "runs"
    test_after_fit: bool = True


def _class_nodes(value: Any) -> Iterator[Namespace]:
    """The ``class_path``/``init_args`` entries in a logger or callbacks config value."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, Namespace) and "class_path" in item:
            yield item


def _fall_back_from_bf16(trainer: Namespace) -> str | None:
    """On a CUDA GPU without bf16 (before Ampere), use fp16 autocast with gradient scaling instead."""
    if trainer.precision != "bf16-mixed" or trainer.accelerator not in ("gpu", "cuda", "auto"):
        return None
    import torch

    if not torch.cuda.is_available() or torch.cuda.is_bf16_supported():
        return None
    trainer.precision = "16-mixed"
    return f"{torch.cuda.get_device_name()} has no bf16: using precision 16-mixed (fp16 with gradient scaling)"


class WandbConfigSaver(SaveConfigCallback):
    """Saves ``config.yaml`` into the run folder and the same resolved config into the W&B run, secrets redacted."""

    def __init__(self, parser: LightningArgumentParser, config: Namespace, **kwargs: Any) -> None:
        super().__init__(parser, dict_to_namespace(redact(config.as_dict())), **kwargs)

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                config = json.loads(self.parser.dump(self.config, skip_none=False, format="json"))
                logger.experiment.config.update({"cli": config}, allow_val_change=True)


class KilnCLI(LightningCLI):
    """LightningCLI that gives every run its own folder and keeps W&B from prompting or hanging."""

    run_dir: Path | None = None
    resume_dir: Path | None = None  # the run folder of the checkpoint `--ckpt_path last` resumes
    test_metrics: dict[str, float] | None = None  # the best checkpoint's test results, after `fit`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            finish_wandb(exit_code=1)  # mark the W&B run failed; a later run in this process gets a new one
            raise
        if self.subcommand is not None:  # the command is done; without one (run=False) the caller trains next
            finish_wandb()

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Resolve ``--ckpt_path last`` across run folders, and refuse unreadable checkpoints up front."""
        super().parse_arguments(parser, args)
        if not self.config.get("subcommand"):
            return
        config = self.config[self.config.subcommand]
        ckpt_path = config.get("ckpt_path")
        if ckpt_path == "last":
            found = latest_checkpoint(config.run.root, config.run.name)
            where = Path(config.run.root).resolve() / config.run.name
            notice = f"resuming from {found}" if found else f"no checkpoint under {where}: starting a new run"
            print(notice, file=sys.stderr)
            config.ckpt_path = str(found) if found else None
            self.resume_dir = found.parent.parent if found else None
        elif ckpt_path not in (None, "best", "hpc"):
            load_checkpoint_file(ckpt_path, mmap=True)  # raises a one-line CheckpointError naming the file

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunOptions, "run")
        # always on, and configurable on its own (`--non_finite.action skip`) instead of by list position
        parser.add_lightning_class_args(NonFiniteGuard, "non_finite")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._dump_config()  # what checkpoints store as hyper-parameters (LightningCLI's own dump) ...
        self.config_dump = redact(self.config_dump)  # ... without secrets
        finish_wandb()  # a W&B run left open by earlier work in this process (a notebook) is not this run's
        self.run_dir = resolve_run_dir(config.run.root, config.run.name, resume=self.resume_dir)
        config.trainer.default_root_dir = str(self.run_dir)
        if notice := _fall_back_from_bf16(config.trainer):
            print(notice, file=sys.stderr)
        for logger in _class_nodes(config.trainer.logger):
            logger.init_args.save_dir = str(self.run_dir)
            if logger.class_path.rsplit(".", 1)[-1] in ("Wandb", "WandbLogger"):  # kiln's or Lightning's
                if notice := ensure_wandb_mode():
                    print(notice, file=sys.stderr)
                if logger.init_args.get("mode") is None:  # per run: W&B reads the variable once per process
                    logger.init_args.mode = os.environ.get("WANDB_MODE")
                if logger.init_args.get("name") is None:
                    logger.init_args.name = f"{config.run.name}/{self.run_dir.name}"
                if self.resume_dir is not None and logger.init_args.get("id") is None:
                    logger.init_args.id = wandb_run_id(self.run_dir)  # the resumed run continues its W&B run
                    logger.init_args.resume = "allow"
            else:  # CSV / TensorBoard: write straight into the run folder, no name/version_N nesting
                logger.init_args.name = ""
                logger.init_args.version = ""
        for profiler in _class_nodes(config.trainer.profiler):  # reports and traces go into the run folder too
            profiler.init_args.dirpath = str(self.run_dir)
        callbacks = list(_class_nodes(config.trainer.callbacks))
        for callback in callbacks:
            if callback.class_path.endswith("ModelCheckpoint"):
                callback.init_args.dirpath = str(self.run_dir / "checkpoints")
        if not config.trainer.logger:  # LearningRateMonitor refuses to start without a logger to write to
            config.trainer.callbacks = [c for c in callbacks if not c.class_path.endswith("LearningRateMonitor")]

    def after_fit(self) -> None:
        config = self.config[self.subcommand]
        trainer = self.trainer
        if config.run.test_after_fit and not trainer.interrupted:
            best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
            results = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best, verbose=False)
            self.test_metrics = dict(results[0]) if results else {}
            if trainer.is_global_zero:
                from kiln.summary import print_summary

                print_summary(trainer, self.test_metrics, best, self.run_dir)


def build_cli(args: ArgsType = None, run: bool = True) -> KilnCLI:
    """The CLI with the default experiment's config applied first.

    ``run=False`` (no subcommand) only builds model, datamodule and trainer: the way notebooks and
    tests get exactly what ``kiln fit`` would train.
    """
    defaults: dict[str, Any] = {
        "default_config_files": [str(DEFAULT_CONFIG)] if DEFAULT_CONFIG.is_file() else [],
        "allow_abbrev": False,  # argparse would take a typo like --trainer.max_epoch as --trainer.max_epochs
    }
    return KilnCLI(
        model_class=None,
        datamodule_class=None,
        save_config_callback=WandbConfigSaver,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,  # the model owns its optimizer and scheduler (kept in its hparams)
        parser_kwargs={"allow_abbrev": False, **{sub: defaults for sub in LightningCLI.subcommands()}}
        if run
        else defaults,
        args=args,
        run=run,
    )


def main(args: ArgsType = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 1."""
    try:
        build_cli(args)
    except KilnError as err:
        print(f"error: {err}", file=sys.stderr)
        remove_if_empty(Path(os.environ[RUN_DIR_ENV]) if RUN_DIR_ENV in os.environ else None)
        sys.exit(1)
    except SIGTERMException:
        sys.exit(128 + signal.SIGTERM)  # stopped from outside; PreemptionCheckpoint said where it saved
    except Preempted:
        sys.exit(128 + signal.SIGUSR1)
