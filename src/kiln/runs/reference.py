"""A checkpoint reference, resolved in one place for every command that takes one (fit, validate, test, predict,
export): ``best``, ``last``, ``wandb:<version>`` or a file, under ``run.root``/``run.name``."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import UsageError
from kiln.runs.folders import run_of
from kiln.runs.picking import Pick, best_checkpoint, latest_checkpoint, own_run

PASSED_ON = (None, "hpc")  # Lightning's own: no checkpoint, or SLURM's requeue state


@dataclass(frozen=True)
class Reference:
    """What ``--ckpt_path`` names, found."""

    path: Path | None  # the file; None for a ``fit --ckpt_path last`` that found none (a new run)
    run_dir: Path | None = None  # the run folder ``fit`` goes on in: ``last``'s, or a run's own ``last.ckpt``'s
    version: str | None = None  # the ``wandb:`` reference the file was fetched for


def resolve(given: str, root: str | Path, name: str, subcommand: str, pick: Pick) -> Reference:
    """``given`` as a file (``best`` and ``wandb:`` say which in one line); a reference that finds nothing is a
    ``UsageError`` naming where it looked (``fit --ckpt_path last`` starts a new run instead, and says so)."""
    from kiln.training.checkpointing import EMPTY, CheckpointError
    from kiln.wandb import checkpoints as wandb_checkpoints

    if not given.strip():  # Path("") would be the current folder
        raise CheckpointError(EMPTY)
    where = Path(root).resolve() / name
    if given == "best":
        best = best_checkpoint(root, name, pick)
        _note(pick, "--ckpt_path best")
        if best is None:
            raise UsageError(f"--ckpt_path best: no run under {where} recorded a best checkpoint; name the file")
        print(f"--ckpt_path best: {best}", file=sys.stderr)
        return Reference(best)
    if given == "last":
        last = latest_checkpoint(root, name, pick)
        _note(pick, "--ckpt_path last")
        if last is None and subcommand != "fit":
            raise UsageError(f"--ckpt_path last: no checkpoint under {where}; name the file, or train first")
        if last is None:
            print(f"no checkpoint under {where}: starting a new run", file=sys.stderr)
        return Reference(last, run_of(last) if last else None)  # found under root/name: its own run's
    if wandb_checkpoints.names_a_version(given):
        return Reference(wandb_checkpoints.resolve(given, root), version=given)
    return Reference(Path(given), own_run(given, root, name) if subcommand == "fit" else None)


def _note(pick: Pick, option: str) -> None:
    if note := pick.note(option):
        print(note, file=sys.stderr)
