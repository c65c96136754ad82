"""What a parsed command needs before its classes are built: the checks that refuse it in one line, then its run
folder (made, or the resumed run's), its console log, its config's paths and the callbacks it runs with."""

from __future__ import annotations

import sys

import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningDataModule, LightningModule

from kiln import console
from kiln.cli.callback_list import chosen_callbacks
from kiln.cli.class_switch import carried_over
from kiln.cli.config_errors import sources
from kiln.cli.configs import config_dir
from kiln.cli.devices import (
    fall_back_from_bf16,
    fsdp_without_gpu,
    missing_gpu,
    slurm_outside_a_job,
    sync_batchnorm_without_gpu,
)
from kiln.cli.links import DataLinks
from kiln.cli.plan import RunPlan
from kiln.cli.run_paths import RunPaths
from kiln.errors import ConfigError, UsageError
from kiln.runs.folders import layout
from kiln.runs.picking import nothing_to_run
from kiln.runs.record import RunRecord
from kiln.training.checkpointing import remove_stale_temporaries
from kiln.training.testing import missing_for

EVALUATIONS = ("validate", "test", "predict")  # they score a checkpoint: one must be named


def refuse(config: Namespace, subcommand: str | None, plan: RunPlan, links: DataLinks) -> None:
    """One line for a command that cannot run as configured: a device the machine lacks, an evaluation without
    weights, limits under which nothing would run. Says which switched class's settings carried over."""
    default_file = config_dir() / "train.yaml"
    for line in carried_over(config, default_file, sources(plan.parsed, [])):
        print(line, file=sys.stderr)
    settings = sources(plan.parsed, [str(default_file)])
    links.note(config, settings)
    for check in (missing_gpu, fsdp_without_gpu, sync_batchnorm_without_gpu, slurm_outside_a_job):
        if why := check(config.trainer, settings):
            raise ConfigError(why)
    if subcommand in EVALUATIONS and not config.get("ckpt_path"):
        raise UsageError(
            f"kiln {subcommand}: no --ckpt_path, so it would score an untrained network; name the weights: "
            "--ckpt_path <file>, best, last, or wandb:<entity>/<project>/<artifact>:<alias>"
        )
    if setting := nothing_to_run(subcommand, config.trainer):
        why = "fit would train nothing and test an untrained network" if subcommand == "fit" else (
            f"kiln {subcommand} would run no batch")  # fmt: skip
        trained = " (`kiln test --ckpt_path <file>` tests a trained one)" if subcommand == "fit" else ""
        raise UsageError(f"{setting}: {why}; give a positive value{trained}")


def refuse_missing(stage: str, model: LightningModule, data: LightningDataModule | None) -> None:
    """``validate`` or ``test`` of a module or data without what that stage runs: one line."""
    if missing := missing_for(stage, model, data):
        split = "validation" if stage == "validate" else stage
        raise UsageError(f"kiln {stage}: {missing}; add it to evaluate a checkpoint on the {split} split")


def open_run(config: Namespace, subcommand: str | None, plan: RunPlan, record: RunRecord) -> tuple[RunPaths, list[str]]:
    """The run's folder, made (evaluations' prefixed by their name: results apart from training runs) or the resumed
    run's, with its console log; the config's paths filled under it; the trainer's callbacks chosen (and the class
    paths ``run.without`` left out, which its checkpoints record)."""
    prefix = "" if subcommand in (None, "fit") else f"{subcommand}-"
    run_dir = record.open(config.run.root, config.run.name, resume=plan.resume_dir, prefix=prefix)
    console.to_run_folder(run_dir)
    run_paths = RunPaths(run_dir, plan.resume_dir, config.run.root)
    run_paths.fill(config, config.run.name)
    for stale in remove_stale_temporaries(layout(run_dir).checkpoints):
        print(f"removed {stale}, left by a checkpoint write that was killed", file=sys.stderr)
    if notice := fall_back_from_bf16(config.trainer):
        print(notice, file=sys.stderr)
    if config.run.cpu_threads is not None:
        torch.set_num_threads(config.run.cpu_threads)
    as_trained = plan.trained.left_out if plan.trained is not None else ()
    config.trainer.callbacks, left_out = chosen_callbacks(config, as_trained)
    return run_paths, left_out
