"""SIGTERM and SIGUSR1 in a Lightning stage: stop at a step or batch boundary, having saved what resumes the run.

Under DDP every rank stops at the same training step: the ranks agree on it with one small all-reduce per step
(training steps are the same on every rank; evaluation batches need not be, so evaluation stops where each rank
is). Lightning's own SIGTERM handler is replaced there: it broadcasts from inside the handler, once per signal a
rank receives, and a rank that gets the signal twice (from its process group, and forwarded by rank 0) sends one
broadcast more than the others: every rank then waits forever.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException

from kiln.callbacks.last import LastCheckpoint, save_last
from kiln.console import say
from kiln.errors import Preempted
from kiln.process import stop_signals

VALIDATION_PROGRESS = "epoch_loop.val_loop.batch_progress"  # Lightning's loop state (docs/development.md: private APIs)
TRAINING_PROGRESS = "epoch_loop.batch_progress"
SIGNALS = (None, "SIGUSR1", "SIGTERM")  # by precedence: when both came, the stop that does not requeue


def agreed_stop(trainer: Trainer) -> str | None:
    """The stop signal any rank has noted (a collective under DDP: call it where every rank does)."""
    local = stop_signals.received()
    if trainer.world_size == 1:
        return local
    code = torch.tensor(SIGNALS.index(local), device=trainer.strategy.root_device)
    return SIGNALS[int(trainer.strategy.reduce(code, reduce_op="max"))]


def _take_over_sigterm(trainer: Trainer) -> None:
    """SIGTERM is noted (and passed on to the ranks rank 0 started), never broadcast from the handler (DDP), and
    training stops where a step begins, not inside a gradient accumulation (Lightning stops at any batch's end)."""
    if threading.current_thread() is not threading.main_thread():
        return
    launcher = trainer.strategy.launcher

    def note(signum: int, frame: Any) -> None:
        if stop_signals.received() is None and launcher is not None:
            launcher.kill(signum)  # the ranks it started, if a signal reached this process only
        stop_signals.note(signum)

    signal.signal(signal.SIGTERM, note)


def _stage(trainer: Trainer) -> str:
    return trainer.state.stage.value if trainer.state.stage else "evaluation"  # "test", not "RunningStage.TESTING"


def _ours(name: str | None, trainer: Trainer) -> str | None:
    """The stop kiln acts on: none for a SIGTERM Lightning's own handler took (one process), which stops its loop."""
    return None if name == "SIGTERM" and trainer.received_sigterm else name


def _last_checkpoint(trainer: Trainer) -> LastCheckpoint | None:
    return next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)  # type: ignore[attr-defined]


def _undo_validation_restart(trainer: Trainer) -> None:
    """A save at a batch's start that Lightning's restart takes for one written at a validation's end (the epoch's
    first batch, with every count 0, or a batch after a mid-epoch validation): it then runs an empty iteration that
    counts one logging step more, and every later row of the loggers lands one step off. One step less here evens it.
    """
    # private: docs/development.md, private APIs
    loop, fetcher = trainer.fit_loop.epoch_loop, trainer.fit_loop._data_fetcher
    if fetcher is not None and loop.restarting and loop._should_check_val_fx(fetcher):
        loop._batches_that_stepped -= 1


def _requeue(trainer: Trainer) -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if job and trainer.is_global_zero and shutil.which("scontrol"):
        subprocess.run(["scontrol", "requeue", job], check=False)
        say(f"requeued SLURM job {job}")


class PreemptionCheckpoint(Callback):
    """SIGTERM or SIGUSR1, in any subcommand: stop at the next step or batch boundary, saying what was kept.

    In ``fit``, ``checkpoints/last.ckpt`` is saved at the end of the current step (with
    :class:`ExactResume`'s state), through :class:`~kiln.callbacks.LastCheckpoint` when present,
    so the same command with ``--ckpt_path last`` continues exactly. Lightning alone saves nothing
    on SIGTERM and exits 0, and on SIGUSR1 under SLURM saves inside the signal handler, mid-step.
    SIGTERM exits with 143; SIGUSR1 (``sbatch --signal=SIGUSR1@90``) requeues the SLURM job when
    ``scontrol`` is there, and exits with 138. The signals are noted by :mod:`kiln.process.stop_signals`.
    """

    def __init__(self) -> None:
        self.saved: Path | None = None
        self._cut_validation = False
        self._before_batch = False  # saving at a batch's start: Lightning has fetched it, not begun it
        self._stopped = False  # this callback raised the stop (and saved, in fit): on_exception has nothing to add
        self._resumed_at_batch_start = False  # the checkpoint fit resumes from is such a save
        self.hint = stop_signals.RESUME_HINT  # none in a run that a sweep or multirun resumes by itself

    def _save(self, trainer: Trainer, signal_name: str) -> None:
        owner = _last_checkpoint(trainer)
        self.saved = owner.save(trainer) if owner is not None else save_last(trainer)
        self._say_saved(
            trainer, signal_name, " (in validation, which runs again on resume)" if self._cut_validation else ""
        )

    def _say_saved(self, trainer: Trainer, signal_name: str, where: str) -> None:
        say(f"{signal_name}: stopped after step {trainer.global_step}{where}, saved {self.saved}{self.hint}")

    def state_dict(self) -> dict[str, Any]:
        return {"at_batch_start": self._before_batch}  # true in the save a stop makes at a batch's start only

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed_at_batch_start = bool(state_dict.get("at_batch_start"))

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _take_over_sigterm(trainer)  # Lightning installs its handler as each stage begins

    on_validation_start = on_test_start = on_predict_start = on_sanity_check_start

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        _take_over_sigterm(trainer)
        if self._resumed_at_batch_start:  # the loops are restored, the first batch not yet fetched
            self._resumed_at_batch_start = False
            _undo_validation_restart(trainer)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        # a step boundary: the previous step is complete (and ExactResume has recorded it), this one not begun
        if batch_idx % trainer.accumulate_grad_batches:  # inside an accumulation: its gradients are in no checkpoint
            return  # (the same batch on every rank: DDP's ranks agree on the stop at the window's end)
        name = _ours(agreed_stop(trainer), trainer)
        if name is None:
            return  # no stop, or Lightning's handler stops its loop at the end of the step the signal came in
        owner = _last_checkpoint(trainer)
        if owner is not None and owner.holds(trainer):  # an epoch's first batch: its end wrote this very state
            self.saved = owner.path(trainer)  # (saved again here, Lightning would resume one logged step off)
            self._say_saved(trainer, name, ", at an epoch's end")
        else:
            self._before_batch = True
            try:
                self._save(trainer, name)
            finally:
                self._before_batch = False
        self._stopped = True
        if name == "SIGTERM":
            raise SIGTERMException
        _requeue(trainer)
        raise Preempted(f"SIGUSR1 after step {trainer.global_step}")

    def _stop_evaluation(self, trainer: Trainer, batch_idx: int) -> None:
        if trainer.state.fn == "fit":
            if trainer.world_size == 1 and stop_signals.received() == "SIGTERM":
                raise SIGTERMException  # saved in on_exception; the cut validation runs again on resume
            return  # under DDP (and for SIGUSR1), validation finishes and training stops at its next step
        name = _ours(stop_signals.received(), trainer)  # each rank where it is: its batch count may differ
        if name is None:
            return  # no stop, or Lightning's handler stops its loop at the end of this batch
        if name == "SIGTERM":  # came before the stage began, or under DDP
            raise SIGTERMException
        _requeue(trainer)
        stage = _stage(trainer)
        say(f"SIGUSR1: stopped {stage} at batch {batch_idx}; nothing to save")
        raise Preempted(f"SIGUSR1 during {stage}")

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._stop_evaluation(trainer, args[1])

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._stop_evaluation(trainer, args[1])

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._stop_evaluation(trainer, args[1])

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._before_batch:
            # the batch whose start this is was fetched ("ready") but never begun: saved as such, Lightning would
            # take the checkpoint for one written inside the previous batch and count that batch's step again
            # (a resumed run's logs one step off the uninterrupted run's, its val rows at 30, 40 for 29, 39)
            progress = checkpoint["loops"]["fit_loop"][TRAINING_PROGRESS]
            for part in ("total", "current"):
                progress[part]["ready"] = progress[part]["started"]
        if self._cut_validation:
            # Lightning resumes an evaluation cut inside a batch from its last completed batch, and one
            # cut between batches not at all; the metrics of the batches before the cut are not saved,
            # so the resume is marked as cut inside batch 0: the whole validation runs again
            cut = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
            progress = {"total": cut, "current": dict(cut), "is_last_batch": False}
            checkpoint["loops"]["fit_loop"][VALIDATION_PROGRESS] = progress

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or (self._stopped and trainer.state.fn == "fit"):
            return
        if trainer.state.fn == "fit":
            self._cut_validation = trainer.validating and not trainer.sanity_checking  # read by on_save_checkpoint
            try:
                self._save(trainer, "SIGTERM")
            finally:
                self._cut_validation = False  # only this save is marked
        else:
            say(f"SIGTERM: stopped {_stage(trainer)}; nothing to save")
