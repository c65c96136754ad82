"""Which run's checkpoint ``--ckpt_path last|best`` (and a multirun's or sweep's resume) takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.files import load_yaml
from kiln.runs.folders import RunLayout, job_id, layout, run_of

PARTIAL = ("fast_dev_run", "overfit_batches", "limit_train_batches", "limit_val_batches")


def partial_data(trainer: Any) -> str | None:
    """The Trainer setting with which a run trains or validates on part of the data (the debug presets,
    ``--trainer.limit_train_batches``), as ``key=value``; ``None`` for a run on all of it."""
    get = trainer.get if hasattr(trainer, "get") else lambda key, default=None: default
    for key in PARTIAL:
        value = get(key, None)
        if key in ("fast_dev_run", "overfit_batches"):
            full = value in (None, False, 0, 0.0)
        else:  # Lightning's 1.0 is all of the batches, its 1 (== 1.0 in Python) one batch
            full = value is None or (isinstance(value, float) and value == 1.0)
        if not full:
            return f"{key}={value}"
    return None


LIMITS = {"fit": ("max_epochs", "max_steps", "limit_train_batches"), "validate": ("limit_val_batches",),
          "test": ("limit_test_batches",), "predict": ("limit_predict_batches",)}  # fmt: skip


def nothing_to_run(subcommand: str | None, trainer: Any) -> str | None:
    """The Trainer setting with which the command would run no batch (``fit``: train nothing, then test an
    untrained network), if any."""
    for key in LIMITS.get(subcommand or "", ()):
        if trainer.get(key, None) in (0, 0.0):
            return f"trainer.{key} {trainer.get(key)}"
    return None


def run_partial_data(run_dir: Path) -> str | None:
    """:func:`partial_data` of the run in ``run_dir``, from its ``config.yaml`` (``None`` without one)."""
    import yaml

    config = layout(run_dir).config
    try:
        trainer = (load_yaml(config.read_text()) or {}).get("trainer") if config.is_file() else None
    except (OSError, yaml.YAMLError):
        return None
    return partial_data(trainer) if isinstance(trainer, dict) else None


class Pick:
    """Which runs ``--ckpt_path last|best`` may take for a command: a run on part of the data (a debug
    preset) is never taken for a run on all of it; a ``fit`` resumes only a run of its own kind."""

    def __init__(self, command_partial: str | None, fit: bool) -> None:
        self.command_partial, self.fit = command_partial, fit
        self.left_out: list[tuple[Path, str]] = []  # newer runs passed over, with why

    def accepts(self, run_dir: Path) -> bool:
        partial = run_partial_data(run_dir)
        taken = (partial is None) == (self.command_partial is None) if self.fit else (
            partial is None or self.command_partial is not None)  # fmt: skip
        if not taken:
            self.left_out.append((run_dir, partial or "all of the data"))
        return taken

    def note(self, option: str) -> str | None:
        """One line on the newer runs left out, if any."""
        if not self.left_out:
            return None
        runs = ", ".join(f"{run.name} ({why})" for run, why in self.left_out[:3])
        kind = "on part of the data" if self.command_partial is None else "on all of the data"
        more = f" and {len(self.left_out) - 3} more" if len(self.left_out) > 3 else ""
        return f"{option}: left out {len(self.left_out)} newer run(s) {kind}: {runs}{more}"


RESUMABLE = (RunLayout.LAST, "hpc_ckpt_*.ckpt")  # a run's training state: kiln's, and SLURM's requeue's


def latest_checkpoint(root: str | Path, name: str, pick: Pick | None = None, any_job: bool = False) -> Path | None:
    """The newest ``last.ckpt`` (or SLURM ``hpc_ckpt_*.ckpt``) of experiment ``name`` (of a run ``pick`` takes).

    Under a cluster job id only that job's own folder counts (a requeue keeps its id), so a second
    job with other settings never continues the first one's run; ``any_job``: every folder counts
    (a sweep or multirun resuming a run that another, cancelled, array task cut short).
    """
    job = None if any_job else job_id()
    folders = (Path(root).resolve() / name).glob(f"{job or '*'}/{RunLayout.CHECKPOINTS}")
    found = [file for folder in folders for pattern in RESUMABLE for file in folder.glob(pattern)]
    for checkpoint in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True):
        if pick is None or pick.accepts(run_of(checkpoint)):
            return checkpoint
    return None


def own_run(checkpoint: str | Path, root: str | Path, name: str) -> Path | None:
    """The run folder ``kiln fit --ckpt_path <checkpoint>`` goes on in, as ``--ckpt_path last`` does: the run's own,
    when the file is a run's training state (``last.ckpt``, ``hpc_ckpt_*``) under this ``root``/``name``."""
    path = Path(checkpoint).resolve()
    state = any(path.match(f"{RunLayout.CHECKPOINTS}/{pattern}") for pattern in RESUMABLE)
    return run_of(path) if state and run_of(path).parent == Path(root).resolve() / name else None


def best_checkpoint(root: str | Path, name: str, pick: Pick | None = None) -> Path | None:
    """The best checkpoint of experiment ``name``'s newest run (that ``pick`` takes), as its ``ModelCheckpoint``
    recorded it: the file of that name in the run's own folder, so a moved or copied run finds its own."""
    from kiln.training.checkpointing import load_checkpoint_file

    last = latest_checkpoint(root, name, pick)
    if last is None:
        return None
    states = load_checkpoint_file(last, mmap=True).get("callbacks", {})
    for key, state in states.items():
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") else None
        for candidate in (last.parent / Path(best).name, Path(best)) if best else ():
            if candidate.is_file():
                return candidate
    return None
