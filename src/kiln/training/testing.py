"""The test after ``fit``: which weights are scored, ``metrics.json``, and the run summary."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from kiln.files import written_whole
from kiln.runs.folders import layout, read_metrics
from kiln.runs.summary import TestResult, print_summary, print_untested, wandb_sync_command
from kiln.training.checkpointing import load_checkpoint_file
from kiln.wandb.mode import finish_wandb

TestChoice = Literal["best", "last", "both"]


WEIGHTS_STEP = "test/weights_step"  # logged with each test (RunMetrics): the step of the weights it scored


def weights_step(path: str | Path) -> int | None:
    """The optimizer step a checkpoint was saved at."""
    return load_checkpoint_file(path, mmap=True).get("global_step")


def checkpoints_to_test(trainer: Trainer, choice: TestChoice) -> list[tuple[str, str | None, int | None]]:
    """``(label, file, step)``: the best and/or the last checkpoint; one entry when both hold the same step."""
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
    last_file = layout(trainer.default_root_dir).last
    last = str(last_file) if last_file.is_file() else None
    if best is None and last is None:
        return [("final weights", None, trainer.global_step)]
    if choice == "best" or last is None:
        path = best or last
        return [("best" if best else "last", path, weights_step(path))]  # type: ignore[arg-type]
    if choice == "last" or best is None:
        return [("last", last, weights_step(last))]
    best_step, last_step = weights_step(best), weights_step(last)
    if best_step == last_step:
        return [("best = last", best, best_step)]
    return [("best", best, best_step), ("last", last, last_step)]


def test_after_fit(
    trainer: Trainer, model: LightningModule, datamodule: LightningDataModule | None, choice: TestChoice,
    summary: bool = True,
) -> dict[str, float]:  # fmt: skip
    """Test the chosen checkpoints, write ``metrics.json``, print the summary (``summary``); the first one's
    metrics."""
    progress_from_spawned_ranks(trainer)
    results = []
    for label, path, step in checkpoints_to_test(trainer, choice):
        out = trainer.test(model, datamodule=datamodule, ckpt_path=path, verbose=False)
        metrics = {k: v for k, v in (out[0] if out else {}).items() if k != WEIGHTS_STEP}  # `step` says it there
        results.append(TestResult(label, path, step, metrics))
    run_dir = Path(trainer.default_root_dir)
    if trainer.is_global_zero:
        write_metrics(run_dir, trainer, results)
        sync = wandb_sync_command(trainer)  # read from the run before it closes
        finish_wandb()  # W&B prints its history as it closes: before the summary, so the console ends on it
        if summary:
            print_summary(results, run_dir, sync)
    return results[0].metrics


def progress_from_spawned_ranks(trainer: Trainer) -> None:
    """Under ``ddp_spawn`` the ranks trained in processes of their own and this one's loops never moved: its test
    logged at step 0 (metrics.csv then dropped every training row) and metrics.json said 0 epochs and steps. Its
    loops take rank 0's progress from the ``last.ckpt`` rank 0 wrote as training ended."""
    last = layout(trainer.default_root_dir).last
    if trainer.global_step or not last.is_file():
        return
    loops = load_checkpoint_file(last, mmap=True).get("loops") or {}
    if "fit_loop" in loops:
        trainer.fit_loop.load_state_dict(loops["fit_loop"])


EVALUATION_HOOKS = {"validate": ("validation_step", "val_dataloader"), "test": ("test_step", "test_dataloader")}


def missing_for(stage: str, model: LightningModule, datamodule: LightningDataModule | None) -> str | None:
    """What ``stage`` (validate, test) needs that the module or the data lacks; Lightning would stop on it."""
    from lightning.pytorch.utilities.model_helpers import is_overridden

    step, loader = EVALUATION_HOOKS[stage]
    if not is_overridden(step, model):
        return f"{type(model).__name__} has no {step}"
    if datamodule is not None and not is_overridden(loader, datamodule):
        return f"{type(datamodule).__name__} has no {loader}"
    return None


def summarize_untested(trainer: Trainer, summary: bool = True, why: str | None = None) -> None:
    """A fit without its test ends on a summary too: its last validation, the weights to test, its run folder;
    ``why``: what the test lacks, where it was not turned off."""
    if not trainer.is_global_zero:
        return
    run_dir = Path(trainer.default_root_dir)
    sync = wandb_sync_command(trainer)
    finish_wandb()
    if not summary:
        return
    best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
    last = layout(run_dir).last
    weights = Path(best) if best else (last if last.is_file() else None)
    validation = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/") and v.numel() == 1}
    print_untested(validation, weights, run_dir, sync, why)


def update_metrics(run_dir: str | Path, **sections: Any) -> None:
    """Set top-level entries of ``metrics.json``, keeping the others; written whole or not at all."""
    data = {**read_metrics(run_dir), **sections}
    metrics = layout(run_dir).metrics
    metrics.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(metrics) as partial:
        partial.write_text(json.dumps(data, indent=2) + "\n")


def write_metrics(run_dir: Path, trainer: Trainer, results: list[TestResult]) -> None:
    """The test section of ``metrics.json`` (with epochs and steps trained); it marks a tested run."""
    update_metrics(run_dir, epochs=trainer.current_epoch, global_step=trainer.global_step,
                   test=[asdict(result) for result in results])  # fmt: skip


def after_fit(trainer: Trainer, model: LightningModule, datamodule: Any, run: Any) -> dict[str, float] | None:
    """What follows a fit that ended: the test after fit (``run.test_after_fit``) and the summary, or the summary
    alone, saying why nothing was tested. A stop that came between fit and test begins no test."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from kiln import console
    from kiln.errors import Preempted
    from kiln.process import stop_signals

    summary = run.summary or console.verbose()
    missing = missing_for("test", model, datamodule)
    if not run.test_after_fit or missing:
        summarize_untested(trainer, summary, missing)
        return None
    try:
        if (name := stop_signals.received()) is not None:  # came between fit and its test: no test begins
            raise SIGTERMException if name == "SIGTERM" else Preempted(f"{name} before the test after fit")
        return test_after_fit(trainer, model, datamodule, run.test_ckpt, summary)
    except (SIGTERMException, Preempted):
        print(
            "the test after fit was stopped; training is complete: the same command with "
            "`--ckpt_path last` tests it without training",
            file=sys.stderr,
        )
        raise
