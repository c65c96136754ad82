"""``config.yaml``, ``env.json`` and ``code.diff`` in the run folder, and the same config in the W&B run."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.loggers import WandbLogger

from kiln.cli.from_checkpoint import BUILT_FROM, BUILT_FROM_KEY
from kiln.cli.parser import plain_config
from kiln.cli.run_paths import RunPaths
from kiln.files import dump_yaml, written_whole
from kiln.process.secrets import redact
from kiln.runs.provenance import write_environment


class WandbConfigSaver(SaveConfigCallback):
    """Saves ``config.yaml`` into the run folder and the same resolved config into the W&B run, secrets redacted;
    beside it ``env.json`` and ``code.diff`` (``kiln.runs.provenance``), also in the W&B config.

    Built with ``save_to_log_dir=False`` and writing the file itself: a redacted value (a marker in
    place of a number or a dict) would fail the type check Lightning's own save makes.
    """

    def __init__(
        self,
        parser: LightningArgumentParser,
        config: Namespace,
        run_paths: RunPaths | None = None,
        command: list[str] | None = None,
        left_out: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """``left_out``: the callbacks ``run.without`` left out, by class path (an evaluation of a checkpoint leaves
        them out too)."""
        super().__init__(parser, redact(config), **kwargs)
        self.run_paths, self.command, self.left_out = run_paths, command, list(left_out or [])
        self.built_from: dict[str, Any] = {}  # the model's and the data's config, what it left out: in checkpoints

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:

        path = Path(trainer.default_root_dir) / self.config_filename  # the run folder, as every logger's
        path.parent.mkdir(parents=True, exist_ok=True)
        whole = plain_config(self.parser, self.config, skip_unset=False)
        dumped = copy.deepcopy(whole)  # config.yaml's, made portable in place; W&B gets `whole` (one dump: 0.03 s)
        self.built_from = {key: dumped[key] for key in BUILT_FROM if isinstance(dumped.get(key), dict)}
        self.built_from["left_out"] = self.left_out
        if self.run_paths is not None:  # without this run's folder: `-c config.yaml` starts a run of its own
            dumped = self.run_paths.portable(dumped)
        with written_whole(path) as partial:
            partial.write_text(dump_yaml(dumped))
        environment = write_environment(path.parent, trainer.datamodule, self.command)  # env.json, code.diff
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.config.update({"cli": whole, "env": environment}, allow_val_change=True)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """What the model and the data were built from, whatever the module saves of itself: ``from_checkpoint``
        rebuilds them from it (a module that ignores its injected ``net`` in ``save_hyperparameters`` too)."""
        if self.built_from:
            checkpoint[BUILT_FROM_KEY] = self.built_from
