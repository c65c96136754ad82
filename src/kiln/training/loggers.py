"""The loggers kiln's presets use: Lightning's W&B logger with its arguments declared here, and its CSV logger
continuing a resumed run's history."""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from kiln.errors import first_line
from kiln.files import written_whole
from kiln.runs import folders


class Wandb(WandbLogger):
    """Lightning's ``WandbLogger`` with the common ``wandb.init`` arguments spelled out.

    Why not Lightning's class directly: to read its signature, jsonargparse imports ``wandb`` (the
    module's ``TYPE_CHECKING`` block) on every ``kiln --help`` (benchmarks/README.md); here ``wandb`` loads
    only when the run starts. Lightning also always passes W&B's deprecated ``anonymous`` setting,
    which makes W&B print a warning on every run; this class does not. For a ``wandb.init``
    argument not listed here, use ``lightning.pytorch.loggers.WandbLogger`` (the CLI treats both
    alike).

    Args:
        name: Display name of the run (default: ``<run.name>/<run folder>``).
        save_dir: Folder W&B writes its files into (default: the run folder).
        project: W&B project.
        entity: W&B user or team the project belongs to.
        group: Groups related runs (e.g. the seeds of one experiment).
        job_type: Kind of run, to filter by (e.g. ``train``, ``sweep``).
        tags: Labels shown and searchable in the W&B project.
        notes: A longer description of the run.
        id: Run id; with ``resume`` it continues that run.
        resume: How to treat an existing run with ``id``: ``allow`` (the default), ``must``,
            ``never``, ``auto``.
        mode: ``online``, ``offline`` or ``disabled`` (default: ``WANDB_MODE``; kiln picks
            ``offline`` when there is no API key or no server).
        log_model: Log checkpoints as versions of the W&B model artifact: ``True``, at the end of fit, the
            best (alias ``best``) and ``last.ckpt`` (alias ``latest``), each with its epoch, step, monitored
            value, config hash and git commit, each file once; ``"all"``: every checkpoint as it is saved
            (Lightning's). Offline, W&B keeps them in its folder until ``wandb sync``.
        prefix: Prefix for every logged metric key.
        checkpoint_name: Name of the model artifact (default ``model-<run id>``).
        save_code: Save the main script and the git diff with the run.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str = ".",
        project: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        job_type: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        id: str | None = None,
        resume: Literal["allow", "must", "never", "auto"] | None = None,
        mode: str | None = None,
        log_model: Literal["all"] | bool = False,
        prefix: str = "",
        checkpoint_name: str | None = None,
        save_code: bool | None = None,
    ) -> None:
        init: dict[str, Any] = {"entity": entity, "group": group, "job_type": job_type, "tags": tags}
        init |= {"notes": notes, "mode": mode, "save_code": save_code}
        super().__init__(
            name=name,
            save_dir=save_dir,
            id=id,
            project=project,
            log_model=log_model,
            prefix=prefix,
            checkpoint_name=checkpoint_name,
            **{key: value for key, value in init.items() if value is not None},
        )
        if resume is not None:
            self._wandb_init["resume"] = resume
        self._wandb_init.pop("anonymous", None)  # deprecated in W&B; passing it at all prints a warning
        self.stopped: str | None = None  # why W&B logging stopped mid-run, if it did

    def _guarded(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """W&B failing mid-run (a full disk, a server gone) stops W&B, with one line, never the run."""
        if self.stopped is not None:
            return None
        try:
            return call(*args, **kwargs)
        except Exception as err:
            self.stopped = first_line(err)
            print(f"W&B: logging stopped ({self.stopped}); the run goes on without it: checkpoints, the test and "
                  "metrics.json are kept in the run folder", file=sys.stderr)  # fmt: skip
            return None

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        self._guarded(super().log_metrics, metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self._guarded(super().log_hyperparams, params)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        self._guarded(super().log_image, key, images, step, **kwargs)

    @rank_zero_only
    def log_table(self, *args: Any, **kwargs: Any) -> None:
        self._guarded(super().log_table, *args, **kwargs)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._guarded(super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._log_model is True:  # kiln's policy: the best checkpoint and the newest state, each file once
            self._guarded(self._log_best_and_latest, status)
        else:
            self._guarded(super().finalize, status)

    def _log_best_and_latest(self, status: str) -> None:
        """The best checkpoint (alias ``best``) and ``last.ckpt`` (alias ``latest``) as versions of the model
        artifact, each with where it came from: monitor, score, epoch, step, config and code; a file already
        logged unchanged (the test after fit finalizes again) is not logged twice. Offline, W&B keeps them in
        the run's folder until ``wandb sync``."""
        if status != "success" or self._experiment is None:
            return
        import wandb

        callbacks = [c for c in self._checkpoint_callbacks.values() if getattr(c, "best_model_path", "")]
        best = Path(callbacks[0].best_model_path) if callbacks else None
        run_dir = folders.run_of(best) if best is not None else Path(self.save_dir) if self.save_dir else None
        if run_dir is None:
            return
        last = folders.layout(run_dir).last
        chosen = [
            (path, aliases) for path, aliases in ((best, ["best"]), (last, ["latest"])) if path and path.is_file()
        ]
        for path, aliases in chosen:
            stamp = path.stat().st_mtime
            if self._logged_model_time.get(str(path)) == stamp:
                continue
            metadata = checkpoint_metadata(path, run_dir, callbacks[0] if callbacks else None)
            artifact = wandb.Artifact(self._checkpoint_name or f"model-{self.experiment.id}", type="model",
                                      metadata=metadata)  # fmt: skip
            artifact.add_file(str(path), name="model.ckpt", policy="immutable")
            self.experiment.log_artifact(artifact, aliases=aliases)
            self._logged_model_time[str(path)] = stamp


def checkpoint_metadata(path: Path, run_dir: Path, checkpoint_callback: Any | None) -> dict[str, Any]:
    """Where a checkpoint came from: its file, epoch and step, the monitored value (for the best), the sha256 of
    the run's config.yaml and the git commit of its env.json."""
    import hashlib
    import json

    from kiln.training.checkpointing import load_checkpoint_file

    state = load_checkpoint_file(path, mmap=True)
    config, env = folders.layout(run_dir).config, folders.layout(run_dir).environment
    environment = json.loads(env.read_text()) if env.is_file() else {}
    metadata: dict[str, Any] = {
        "file": path.name, "run": str(run_dir), "epoch": state.get("epoch"), "global_step": state.get("global_step"),
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
        "git_commit": (environment.get("code") or {}).get("commit"),
    }  # fmt: skip
    if checkpoint_callback is not None and Path(checkpoint_callback.best_model_path) == path:
        score = checkpoint_callback.best_model_score
        metadata |= {"monitor": checkpoint_callback.monitor, "score": float(score) if score is not None else None}
    return metadata


class _ContinuedHistory(ExperimentWriter):
    """Lightning's CSV writer, except that a resumed run continues its ``metrics.csv`` (Lightning's deletes it,
    with the epochs before the resume): the first save rewrites it whole, the earlier rows before the first step
    logged now (rows a killed run logged past its checkpoint are logged again) and those of that step whose metrics
    are not logged again (a stop in an epoch's validation: its last training step's rows stay, its validation runs
    again), then the new ones."""

    def _check_log_dir_exists(self) -> None:
        self._earlier: list[dict[str, Any]] | None = None
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as f:
                self._earlier = [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]

    def save(self) -> None:
        if self._earlier is None or not self.metrics:
            return super().save()
        first = min(int(m["step"]) for m in self.metrics)
        again = set().union(*(m for m in self.metrics if int(m["step"]) == first)) - {"step", "epoch"}

        def kept(row: dict[str, Any]) -> bool:
            step = int(float(row.get("step", first)))
            return step < first or (step == first and not again.intersection(row))

        rows = [r for r in self._earlier if kept(r)] + self.metrics
        self.metrics_keys = sorted(set().union(*rows))
        with written_whole(self.metrics_file_path) as partial, partial.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)
        self._earlier, self.metrics = None, []


class Csv(CSVLogger):
    """Lightning's ``CSVLogger`` (``metrics.csv`` and ``hparams.yaml`` in the run folder); a resume continues the
    run's ``metrics.csv`` instead of deleting what the epochs before it logged.

    Args:
        save_dir: Folder of ``metrics.csv`` (default: the run folder).
        name: A subfolder of ``save_dir`` (default: none).
        flush_logs_every_n_steps: Write the rows kept in memory every this many steps.
    """

    def __init__(self, save_dir: str = ".", name: str | None = None, flush_logs_every_n_steps: int = 100) -> None:
        # no version_N subfolder: the run folder is the version
        super().__init__(save_dir, name=name, version="", flush_logs_every_n_steps=flush_logs_every_n_steps)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if not isinstance(self._experiment, ExperimentWriter):
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuedHistory(log_dir=self.log_dir)
        return self._experiment
