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

_UMASK = os.umask(0o022)  # read once (setting is the only way to read it) and put back
os.umask(_UMASK)


def _fsync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _training_state(checkpoint: dict[str, Any]) -> tuple[Any, ...]:
    """What tells two saves of the same training state apart: the step, the keys, and whether any
    weight or optimizer tensor was modified in place in between (its version counter)."""
    tensors = [t for t in checkpoint.get("state_dict", {}).values() if isinstance(t, torch.Tensor)]
    for optimizer in checkpoint.get("optimizer_states", []):
        for state in optimizer.get("state", {}).values():
            tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
    versions = tuple((t.data_ptr(), t._version) for t in tensors)
    return checkpoint.get("global_step"), checkpoint.get("epoch"), tuple(checkpoint), versions


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a temporary file beside the target, fsyncs it, then renames it over the target.

    The rename is atomic within one filesystem, so a crash or a full disk mid-write leaves the
    previous checkpoint intact, never a truncated ``last.ckpt`` (Lightning stages in ``$TMPDIR``
    and moves without fsync). Loading always uses the safe loader.

    A second save of the same training state (``last.ckpt`` right after the epoch's ``best``) is a
    hard link to the first file, renamed into place the same way: half the writes and the disk
    space, which matters for big models. Lightning's ``save_last: link`` instead symlinks to the
    last top-k file even when that is an older epoch, and removes the old link before making the
    new one.
    """

    def __init__(self) -> None:
        super().__init__()
        self._last_saved: tuple[tuple[Any, ...], Path] | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        state = _training_state(checkpoint)
        if self._last_saved is not None and self._last_saved[0] == state and self._link(self._last_saved[1], target):
            return
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp makes it private; a checkpoint is read like any file
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        _fsync_directory(target.parent)
        self._last_saved = (state, target)

    @staticmethod
    def _link(source: Path, target: Path) -> bool:
        """Hard-link ``source`` to ``target`` atomically; False where the filesystem cannot."""
        if source == target:
            return source.is_file()  # already there, unless removed since
        temporary = target.parent / f".{target.name}.{os.getpid()}.link.tmp"
        try:
            temporary.unlink(missing_ok=True)
            os.link(source, temporary)
            os.replace(temporary, target)
        except OSError:  # no hard links here, another filesystem, or the source is gone: write it out
            temporary.unlink(missing_ok=True)
            return False
        _fsync_directory(target.parent)
        return True

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint_file(path, map_location=map_location)
