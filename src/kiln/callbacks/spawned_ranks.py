"""The ranks ``ddp_spawn`` starts print what a ``kiln`` command prints (information lines in the run folder's
console.log, none of the dependency warnings kiln drops) and end as a ``kiln`` command ends (no group left)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from kiln import console
from kiln.process import process_group


class SpawnedRanks(Callback):
    """Added by the CLI, never configured. A spawned rank unpickles the trainer but runs no ``kiln`` command (and
    inherits none of its warning filters), so this callback sets its console up as it is unpickled there, before
    the rank's first line ("Initializing distributed"), and ends its process group after its stage."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.made_in = os.getpid()

    def _in_spawned_rank(self) -> bool:
        return os.getpid() != self.made_in  # unpickled in another process: a rank ddp_spawn started

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._in_spawned_rank():
            console.quiet_lightning()
            console.begin_command()
            console.to_run_folder(self.run_dir)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._in_spawned_rank():  # the rank exits after its stage
            process_group.destroy()
