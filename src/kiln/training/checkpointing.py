"""Checkpoint files that are never half-written and only ever loaded safely."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from kiln.errors import KilnError

_UMASK = os.umask(0o022)  # read once (setting is the only way to read it) and put back
os.umask(_UMASK)


def _fsync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


EMPTY = "an empty checkpoint path: name a .ckpt file (or best, last, wandb:…)"


class CheckpointError(KilnError):
    """A checkpoint file that is missing, truncated, corrupted, or not a safe checkpoint."""


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu", mmap: bool = False) -> dict[str, Any]:
    """``torch.load(weights_only=True)``, with an error that names the file instead of an unpickling traceback.

    Never falls back to unsafe (pickle) loading: a file that needs it is refused. ``mmap`` checks a
    file without reading all of it.
    """
    if not str(path).strip():  # Path("") would be the current folder
        raise CheckpointError(EMPTY)
    path = Path(path)
    if path.is_dir():
        inside = " (a run folder: its newest state is checkpoints/last.ckpt)" if (path / "checkpoints").is_dir() else ""
        raise CheckpointError(f"checkpoint {path} is a folder, not a file{inside}: name a .ckpt file")
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


TEMPORARY_GLOB = ".*.ckpt.*.tmp"  # what AtomicCheckpointIO writes before the rename


def _disk_full(err: BaseException, directory: Path) -> bool:
    """A write that failed for lack of space: torch reports it as its own writer error, so ask the filesystem."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(directory).free < 1 << 20
    except OSError:
        return False


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files a killed write left in ``directory``; the caller says so."""
    stale = sorted(directory.glob(TEMPORARY_GLOB)) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a temporary file beside the target, fsyncs it, then renames it over the target.

    The rename is atomic within one filesystem, so a crash or a full disk mid-write leaves the
    previous checkpoint intact, never a truncated ``last.ckpt`` (Lightning stages in ``$TMPDIR``
    and moves without fsync). A full disk is one line naming the file. Loading always uses the
    safe loader.
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
            os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp makes it private; a checkpoint is read like any file
            os.replace(temporary, target)
        except BaseException as err:
            Path(temporary).unlink(missing_ok=True)
            if _disk_full(err, target.parent):
                previous = [target] if target.is_file() else sorted(target.parent.glob("*.ckpt"), key=os.path.getmtime)
                kept = (
                    f"the previous checkpoint {previous[-1]} is intact" if previous else "nothing was saved before it"
                )
                raise CheckpointError(f"no space left on device while writing {target}; {kept}") from None
            raise
        _fsync_directory(target.parent)

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint_file(path, map_location=map_location)
