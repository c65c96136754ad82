"""A monitored key the module never logs, said after the sanity validation, not after an epoch of training."""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn

from kiln.errors import ConfigError

REPLACE = ("a config with run: {without: [ModelCheckpoint]} and trainer: {callbacks+: [{class_path: ModelCheckpoint, "
           "init_args: {monitor: <key>, mode: max}}]}")  # fmt: skip


class MonitoredKeys(Callback):
    """Stops in one line when a callback monitors a key (``ModelCheckpoint``'s ``val/loss``, an ``EarlyStopping``'s)
    that validation did not log; Lightning's own check came at the first epoch's end, as an error in Lightning.

    A ``val…`` key is checked once the sanity validation ran; any other (a training metric), after the first
    validation of training, before the callbacks that would save or stop on it."""

    def __init__(self) -> None:
        self.checked = False

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, only_validation=True)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking and not self.checked and trainer.state.fn == TrainerFn.FITTING:
            self.checked = True
            self._check(trainer, only_validation=False)

    def _check(self, trainer: Trainer, only_validation: bool) -> None:
        logged = sorted(trainer.callback_metrics)
        if not logged:  # no batch ran (an empty shard), or the module logs nothing: Lightning's own check decides
            return
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            key = getattr(callback, "monitor", None)
            if not isinstance(key, str) or key in logged or (only_validation and not key.startswith("val")):
                continue
            name = type(callback).__name__
            how = REPLACE if name == "ModelCheckpoint" else f"give the {name} another monitor"
            raise ConfigError(
                f"{name} monitors {key}, which the module does not log (it logged "
                f"{', '.join(logged)}): log it with self.log('{key}', …), or monitor another key ({how})"
            )
