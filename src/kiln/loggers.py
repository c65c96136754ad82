"""The W&B logger the default experiment uses: Lightning's, with its arguments declared here."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only


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
        log_model: Upload checkpoints as W&B artifacts: at the end (``True``) or as they are
            saved (``"all"``). Offline, every checkpoint is copied into W&B's folder.
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
            self.stopped = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
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
        self._guarded(super().finalize, status)
