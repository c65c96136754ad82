"""``metrics.json`` for every ``fit``: best and last validation metrics, epochs, steps and wall time; and
``status.json``: how the fit ended, also when a notebook calls ``trainer.fit`` outside a ``kiln`` command."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from kiln.console import say
from kiln.data.sampling import repeated_samples
from kiln.errors import Preempted, Stopped
from kiln.runs.folders import record_status
from kiln.training.testing import WEIGHTS_STEP, update_metrics, weights_step


class RunMetrics(Callback):
    """Keeps each epoch's validation metrics and writes the best and the last into ``metrics.json``.

    "Best" follows the run's ``ModelCheckpoint`` (its ``monitor`` and ``mode``; ``val/loss``, min,
    without one). Wall time adds up over resumes. The test after fit adds its own section.
    """

    def __init__(self) -> None:
        self.history: list[dict[str, float]] = []  # one entry per validation, with its epoch
        self.seconds = 0.0  # wall time of earlier runs of this fit (resumes)
        self._started: float | None = None
        self._repeats: dict[str, dict[str, int]] = {}  # split -> samples and how many its metrics counted

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._started = time.monotonic()

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Every logged test says which weights it scored: the optimizer step of the tested checkpoint (or of
        the weights in memory) beside its metrics, in the same row of ``metrics.csv``, W&B and TensorBoard."""
        step = weights_step(trainer.ckpt_path) if trainer.ckpt_path else trainer.global_step
        pl_module.log(WEIGHTS_STEP, float(step if step is not None else -1), sync_dist=True, reduce_fx="max")

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_repeats(trainer, "val", trainer.val_dataloaders)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check_repeats(trainer, "test", trainer.test_dataloaders)

    def _check_repeats(self, trainer: Trainer, split: str, loaders: Any) -> None:
        """Under DDP, Lightning pads an evaluation set that brought no distributed sampler to a multiple of the
        ranks, repeating samples in the metrics: said once per split, and kept in ``metrics.json``."""
        if split in self._repeats:
            return
        for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
            if (found := repeated_samples(loader)) is None:
                continue
            samples, counted = found
            self._repeats[split] = {"samples": samples, "counted": counted}
            say(f"{split} under DDP: Lightning repeats {counted - samples} of the {samples} {split} samples so that "
                f"{trainer.world_size} ranks get equal shares, and {split}/ metrics count {counted}; for each sample "
                f"once, give {split}_dataloader's DataLoader sampler=kiln.data.EvaluationShard(dataset, "
                "trainer.world_size, trainer.global_rank)")  # fmt: skip
            if trainer.is_global_zero:
                update_metrics(trainer.default_root_dir, repeated_samples=self._repeats)
            return

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        values = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
        if values:
            self.history = [h for h in self.history if h["epoch"] != trainer.current_epoch]  # re-validated on resume
            self.history.append({"epoch": trainer.current_epoch, **values})

    def _elapsed(self) -> float:
        return self.seconds + (time.monotonic() - self._started if self._started is not None else 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "seconds": self._elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history, self.seconds = list(state_dict["history"]), float(state_dict["seconds"])

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if trainer.is_global_zero:  # the `kiln` command, when there is one, records its own line after this
            stopped = isinstance(exception, Stopped | Preempted | KeyboardInterrupt | SystemExit)
            line = str(exception).splitlines()[0] if str(exception) else type(exception).__name__
            record_status("interrupted" if stopped else "failed", line, trainer.default_root_dir)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        record_status("finished", "", trainer.default_root_dir)
        checkpoint = trainer.checkpoint_callback
        monitor = getattr(checkpoint, "monitor", None) or "val/loss"
        mode = getattr(checkpoint, "mode", "min")
        scored = [h for h in self.history if monitor in h]
        best = (min if mode == "min" else max)(scored, key=lambda h: h[monitor]) if scored else None
        update_metrics(
            trainer.default_root_dir,
            epochs=trainer.current_epoch,
            global_step=trainer.global_step,
            wall_seconds=round(self._elapsed(), 3),
            val={"monitor": monitor, "best": best, "last": self.history[-1] if self.history else None},
        )
