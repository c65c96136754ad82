"""The accelerator a config asks for, against what this machine has: a fallback or one line, never a traceback."""

from __future__ import annotations

import os
from typing import Any

import torch

from kiln.cli.classes import is_a
from kiln.cli.config_errors import Source, where_written

GPU = ("gpu", "cuda")


def fall_back_from_bf16(trainer: Any) -> str | None:
    """On a CUDA GPU without bf16 (before Ampere), use fp16 autocast with gradient scaling instead."""
    if trainer.precision != "bf16-mixed" or trainer.accelerator not in (*GPU, "auto"):
        return None
    if not torch.cuda.is_available() or torch.cuda.is_bf16_supported():
        return None
    trainer.precision = "16-mixed"
    return f"{torch.cuda.get_device_name()} has no bf16: using precision 16-mixed (fp16 with gradient scaling)"


def missing_gpu(trainer: Any, settings: list[Source]) -> str | None:
    """Why a config that asks for a CUDA GPU cannot run here, naming where it asked (None: it can, or asks none)."""
    if str(trainer.accelerator) not in GPU or torch.cuda.is_available():
        return None
    where = where_written(settings, lambda path, value: path == "trainer.accelerator", "--trainer.accelerator")
    fix = "use --trainer.accelerator auto (or cpu)" if where.startswith("--") else "leave that file out (TRAINER=)"
    return (
        f"{where} asks for {trainer.accelerator}, but torch sees no CUDA GPU on this machine: {fix}, or run it "
        "where there is one"
    )


def sync_batchnorm_without_gpu(trainer: Any, settings: list[Source]) -> str | None:
    """Why ``sync_batchnorm`` cannot run here: torch's SyncBatchNorm works on CUDA modules only (a DDP preset for
    GPUs given a CPU node)."""
    on_gpu = str(trainer.accelerator) in GPU or (str(trainer.accelerator) == "auto" and torch.cuda.is_available())
    if not trainer.get("sync_batchnorm") or on_gpu:
        return None
    where = where_written(settings, lambda path, value: path == "trainer.sync_batchnorm", "--trainer.sync_batchnorm")
    return (
        f"{where} is true, but torch's SyncBatchNorm runs on CUDA GPUs only and this run is on the CPU: add "
        "--trainer.sync_batchnorm false, or run it where there is a GPU"
    )


def fsdp_without_gpu(trainer: Any, settings: list[Source]) -> str | None:
    """Why FSDP cannot run here: Lightning's shards a model across CUDA GPUs only (a ValueError deep in Lightning
    on a CPU machine)."""
    on_cpu = str(trainer.accelerator) == "cpu" or not torch.cuda.is_available()
    if "fsdp" not in str(trainer.get("strategy")).lower() or not on_cpu:
        return None
    where = where_written(settings, lambda path, value: path == "trainer.strategy", "--trainer.strategy")
    return (
        f"{where} asks for FSDP, which shards a model across CUDA GPUs, and this run is on the CPU: use ddp here "
        "(-c configs/trainer/ddp_cpu.yaml), or run it where there are GPUs"
    )


SLURM_RANKS = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")  # what SLURMEnvironment reads


def slurm_outside_a_job(trainer: Any, settings: list[Source]) -> str | None:
    """Why a config with Lightning's ``SLURMEnvironment`` cannot run here: it reads the ranks from a SLURM job
    step's variables (a ``KeyError`` deep in Lightning outside one)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    missing = [name for name in SLURM_RANKS if name not in os.environ]
    if not missing or not any(is_a(p, SLURMEnvironment) for p in trainer.get("plugins") or []):
        return None
    where = where_written(settings, lambda path, value: "SLURMEnvironment" in str(value), "trainer.plugins")
    return (
        f"{where} holds Lightning's SLURMEnvironment, which reads the ranks from a SLURM job step, and this "
        f"process has no {', '.join(missing)}: run it in one (scripts/slurm.sbatch runs kiln under srun), or "
        "leave that file out"
    )
