"""Checkpoint files that are never half-written and only ever loaded safely."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from kiln.errors import KilnError


class CheckpointError(KilnError):
    """A checkpoint file that is missing, truncated, corrupted, or not a safe checkpoint."""


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """``torch.load(weights_only=True)``, with an error that names the file instead of an unpickling traceback.

    Never falls back to unsafe (pickle) loading: a file that needs it is refused. ``mmap`` checks a
    file without reading all of it.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # zip, pickle and storage errors all mean: not a usable checkpoint
        message = str(err)
        if refused := re.search(r"Unsupported global: GLOBAL [\w.]+", message):
            raise CheckpointError(f"checkpoint {path} holds objects the safe loader refuses ({refused[0]})") from None
        # torch's own text for these suggests weights_only=False, which is never safe for an unknown file
        reason = type(err).__name__ if "weights_only" in message else (message.splitlines() or [""])[0][:200]
        raise CheckpointError(f"checkpoint {path} is truncated, corrupted or not a checkpoint ({reason})") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dictionary")
    return checkpoint


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a temporary file beside the target, fsyncs it, then renames it over the target.

    The rename is atomic within one filesystem, so a crash or a full disk mid-write leaves the
    previous checkpoint intact, never a truncated ``last.ckpt`` (Lightning stages in ``$TMPDIR``
    and moves without fsync). Loading always uses the safe loader.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # make the rename itself durable
        finally:
            os.close(directory)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint_file(path, map_location=map_location)
