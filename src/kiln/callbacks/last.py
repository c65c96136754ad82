"""``checkpoints/last.ckpt``: always the newest training state, so ``--ckpt_path last`` never goes back in time."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, Timer

from kiln.runs.folders import layout


def save_last(trainer: Trainer) -> Path:
    """Write the full training state to the run's ``last.ckpt`` (all ranks call this; rank 0 writes)."""
    path = layout(trainer.default_root_dir).last
    trainer.save_checkpoint(path, weights_only=False)  # the full state (unset, Lightning says so every save)
    return path


def _limit(value: int | None) -> float:
    return math.inf if value is None or value < 0 else value


def epoch_limit(max_epochs: int | None, max_steps: int | None) -> float:
    """``max_epochs`` as Lightning resolves it: unset means 1000 epochs, unless ``max_steps`` is set."""
    if max_epochs is None:
        return 1000 if _limit(max_steps) == math.inf else math.inf
    return _limit(max_epochs)


def time_limit(max_time: Any) -> float | None:
    """``--trainer.max_time`` in seconds, as Lightning's Timer reads it (``DD:HH:MM:SS``, a dict, a timedelta)."""
    if max_time is None:
        return None
    try:
        return Timer(duration=max_time).time_remaining("train")  # nothing elapsed yet: the whole limit
    except Exception:  # a malformed value: the Trainer says so in its own words
        return None


def finished_training(
    checkpoint: dict[str, Any], max_epochs: int | None, max_steps: int | None, max_time: Any = None
) -> str | None:
    """Why resuming ``checkpoint`` with these limits would train nothing, or ``None``. A run its time limit
    stopped is finished until ``max_time`` is raised: Lightning's Timer counts the time trained before a resume."""
    finished = checkpoint.get("callbacks", {}).get(LastCheckpoint.__qualname__, {}).get("finished")
    if not finished:
        return None
    if "max_time" in finished:
        limit = time_limit(max_time)
        if limit is None or limit > finished["max_time"]:
            return None
        return (f"training stopped at its time limit, --trainer.max_time {finished['max_time']:.0f} s, at epoch "
                f"{finished['epochs']}, step {checkpoint.get('global_step')}")  # fmt: skip
    more_epochs = epoch_limit(max_epochs, max_steps) > epoch_limit(finished["max_epochs"], finished["max_steps"])
    if more_epochs or _limit(max_steps) > _limit(finished["max_steps"]):
        return None
    return f"training finished at epoch {finished['epochs']}, step {checkpoint.get('global_step')}"


class LastCheckpoint(Checkpoint):
    """Writes ``last.ckpt`` at every epoch end and at the end of training, never as ``last-v1.ckpt``.

    Lightning's ``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` only on epochs that saved
    a top-k file, and versions it when the file on disk is not the one its state remembers (after
    a crash, or a preemption save). Here one callback owns the file: :class:`PreemptionCheckpoint`
    saves through it, and its state records whether training ran to its end, so rerunning a
    finished run does nothing. A ``Checkpoint`` subclass, so Lightning runs it after
    ``ModelCheckpoint`` and the file holds that epoch's best-model bookkeeping.
    """

    def __init__(self) -> None:
        self.finished: dict[str, Any] | None = None  # the limits training ended under, once it has
        self._saved_step = -1

    def save(self, trainer: Trainer) -> Path:
        """Write the current state to ``last.ckpt``, remembering its step (no second write at epoch end)."""
        path = save_last(trainer)
        self._saved_step = trainer.global_step
        return path

    def holds(self, trainer: Trainer) -> bool:
        """Whether ``last.ckpt`` already holds this step's state (written at the end of the epoch it ended)."""
        return self._saved_step == trainer.global_step

    def path(self, trainer: Trainer) -> Path:
        return layout(trainer.default_root_dir).last

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.finished = None  # a resumed run with higher limits is not finished any more

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not getattr(trainer, "fast_dev_run", False) and trainer.global_step != self._saved_step:
            self.save(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if getattr(trainer, "fast_dev_run", False):
            return
        limits = {"max_epochs": trainer.max_epochs, "max_steps": trainer.max_steps}
        self.finished = {**limits, "epochs": trainer.current_epoch, **self._out_of_time(trainer)}
        self.save(trainer)

    @staticmethod
    def _out_of_time(trainer: Trainer) -> dict[str, float]:
        """``{"max_time": seconds}`` when the Trainer's time limit ended training, else nothing."""
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)  # type: ignore[attr-defined]
        left = timer.time_remaining("train") if timer is not None else None
        if timer is None or left is None or left > 0:
            return {}
        return {"max_time": left + timer.time_elapsed("train")}

    def state_dict(self) -> dict[str, Any]:
        return {"finished": self.finished}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.finished = state_dict.get("finished")
