"""The run folder in the config: what the CLI fills in for a run, and the config.yaml that leaves it out again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

from kiln.cli.classes import import_class, is_a, parameters
from kiln.errors import ConfigError
from kiln.runs.folders import layout, wandb_run_id
from kiln.wandb import mode as wandb_mode
from kiln.wandb.mode import ensure_wandb_mode

Key = tuple[str | int, ...]  # a place in the dumped config: dict keys and list positions


def class_nodes(value: Any, at: Key) -> Iterator[tuple[Key, Namespace]]:
    """The ``class_path``/``init_args`` entries in a logger or callbacks config value, with their places."""
    items = value if isinstance(value, list) else [value]
    for i, item in enumerate(items):
        if isinstance(item, Namespace) and "class_path" in item:
            yield ((*at, i) if isinstance(value, list) else at), item


def _run_folder_of(path: Path) -> Path | None:
    """The run folder ``path`` lies in (a folder with a ``config.yaml``, or ``checkpoints/``), if any."""
    for folder in (path, *path.parents):
        if layout(folder).config.is_file() or layout(folder).checkpoints.is_dir():
            return folder
    return None


class RunPaths:
    """Fills this run's folder into every setting that writes files, where the user left it unset.

    A value the user set is kept and said, unless it lies in another run's folder (a reused
    ``config.yaml`` of an older kiln, a copied flag): writing there would change that run's
    checkpoints and logs, so it stops in one line. What was filled is recorded, and
    :meth:`portable` drops it from the saved ``config.yaml``, so ``-c config.yaml`` starts a run
    of its own instead of writing into this one.
    """

    def __init__(self, run_dir: Path, resume_dir: Path | None, root: str | Path) -> None:
        self.run_dir, self.resume_dir, self.root = run_dir, resume_dir, Path(root).resolve()
        self.filled: list[Key] = [("trainer", "default_root_dir"), ("ckpt_path",)]

    def fill(self, config: Namespace, run_name: str) -> None:
        """Point the Trainer, loggers, profilers and checkpoint callbacks at the run folder."""
        given_root = config.trainer.default_root_dir
        if given_root not in (None, str(self.run_dir)):
            print(f"trainer.default_root_dir: {given_root} replaced by the run folder {self.run_dir} (set run.root "
                  "to choose where run folders go)", file=sys.stderr)  # fmt: skip
        config.trainer.default_root_dir = str(self.run_dir)
        for at, logger in class_nodes(config.trainer.logger, ("trainer", "logger")):
            self._logger(at, logger, run_name)
        for at, profiler in class_nodes(config.trainer.profiler, ("trainer", "profiler")):
            self._fill("trainer.profiler", at, profiler, "dirpath", str(self.run_dir))
        for at, callback in class_nodes(config.trainer.callbacks, ("trainer", "callbacks")):
            if is_a(callback, ModelCheckpoint):  # a user's subclass too
                owner = f"trainer.callbacks ({callback.class_path.rsplit('.', 1)[-1]})"
                self._fill(owner, at, callback, "dirpath", str(layout(self.run_dir).checkpoints))

    def _logger(self, at: Key, logger: Namespace, run_name: str) -> None:
        if is_a(logger, MLFlowLogger):  # one store for every run under the root: its UI lists them side by side
            self._fill("trainer.logger", at, logger, "tracking_uri", f"sqlite:///{self.root / 'mlflow.db'}")
            self._fill("trainer.logger", at, logger, "artifact_location", str(self.root / "mlflow-artifacts"))
            self._fill("trainer.logger", at, logger, "experiment_name", run_name, unset=(None, "", "lightning_logs"))
            self._fill("trainer.logger", at, logger, "run_name", self.run_dir.name)
            return
        self._fill("trainer.logger", at, logger, "save_dir", str(self.run_dir), unset=(None, "", "."))
        if is_a(logger, WandbLogger):  # kiln's, Lightning's or a user's subclass
            if notice := ensure_wandb_mode():
                print(notice, file=sys.stderr)
            if logger.init_args.get("mode") is None:  # per run: W&B reads the variable once per process
                self._set(at, logger, "mode", wandb_mode.current())
            self._fill("trainer.logger", at, logger, "name", f"{run_name}/{self.run_dir.name}")
            if self.resume_dir is not None and logger.init_args.get("id") is None:
                self._set(at, logger, "id", wandb_run_id(self.run_dir))  # the resumed run continues its W&B run
                self._set(at, logger, "resume", "allow")
            return
        # CSV / TensorBoard: straight into the run folder, no name/version_N nesting (where the logger has them)
        self._fill("trainer.logger", at, logger, "name", "", unset=(None, "", "lightning_logs"))
        self._fill("trainer.logger", at, logger, "version", "", unset=(None, ""))

    def _set(self, at: Key, node: Namespace, name: str, value: Any) -> None:
        node.init_args[name] = value
        self.filled.append((*at, "init_args", name))

    def _fill(
        self, owner: str, at: Key, node: Namespace, name: str, value: Any, unset: tuple[Any, ...] = (None,)
    ) -> None:
        """Give ``name`` the run's ``value`` where the user left it unset (and the class takes it); a value the
        user set is kept, and said, unless it points into another run's folder."""
        if name not in parameters(import_class(node.class_path)):
            return  # e.g. MLFlowLogger has no `version`
        given = node.init_args.get(name)
        if given in unset or given == value:
            self._set(at, node, name, value)
            return
        other = _run_folder_of(Path(str(given)).resolve()) if isinstance(given, str) and given else None
        if other is not None and other != self.run_dir.resolve():
            raise ConfigError(
                f"{owner}.init_args.{name}: {given} is inside another run's folder ({other}); this run writes "
                f"into its own ({self.run_dir}): drop the setting (a config.yaml reused with -c: its run's paths)"
            )
        print(f"{owner}.init_args.{name}: keeping your {given!r} (the run folder's is {value!r})", file=sys.stderr)

    def portable(self, dumped: dict[str, Any]) -> dict[str, Any]:
        """``dumped`` (a run's resolved config) without what was filled in for this run folder."""
        for key in self.filled:
            node: Any = dumped
            for part in key[:-1]:
                fits = isinstance(node, list) and isinstance(part, int) and part < len(node)
                node = node[part] if fits or (isinstance(node, dict) and part in node) else None
            if isinstance(node, dict):
                node.pop(key[-1], None)
        return dumped
