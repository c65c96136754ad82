"""Files written whole or not at all: a full disk or a kill mid-write leaves the old file, or none, never half a one;
and YAML read and written by libyaml, PyYAML's C code, where it is installed (pure Python otherwise)."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kiln.process import running

MOST_COLUMNS = 64  # values a sample a predictions CSV holds as columns; more go to .npy files beside it

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the same safe tags and resolvers, in C
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; it replaces ``path`` when the block ends without an error,
    and is removed when it raises (``OSError`` of a full disk included). Each writer has its own temporary (its
    process and thread in the name): sweep drivers ending together all write the sweep's pictures, and with one
    shared name a driver's rename found its temporary already moved away (an internal error)."""
    path = Path(path)
    writer = f"{os.getpid()}-{threading.get_ident()}"
    temporary = path.with_name(f".{path.name}.{writer}.partial{path.suffix}")  # the suffix: Pillow picks the format
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextmanager
def folder_written_whole(path: Path) -> Iterator[Path]:
    """A staging folder beside ``path`` to fill; it becomes ``path`` (readable as the umask allows, not 0700) when
    the block ends without an error, and is removed when it raises. One a killed process left is removed first."""
    for left in path.parent.glob(f".{path.name}.*.partial"):
        pid = left.name.rsplit(".", 2)[-2]
        if left.is_dir() and pid.isdigit() and not running(int(pid)):
            shutil.rmtree(left, ignore_errors=True)
            print(f"removed {left}: a partial {path.name} a killed process left", file=sys.stderr)
    staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
    staging.mkdir(parents=True)  # mode 0o777 less the umask (tempfile's folders were 0700)
    try:
        yield staging
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_yaml(text: str | bytes) -> Any:
    """``yaml.safe_load``, in C: the CLI reads its config files several times a command."""
    return yaml.load(text, Loader=_LOADER)


def dump_yaml(data: Any) -> str:
    """``yaml.safe_dump(data, sort_keys=False)``, in C."""
    return yaml.dump(data, Dumper=_DUMPER, sort_keys=False)


def broken_archives(folder: Path, pattern: str = "*.ckpt") -> list[str]:
    """The files under ``folder`` matching ``pattern`` that no longer open as the zip archives ``torch.save``
    writes (truncated, overwritten): named, without reading their tensors."""
    import zipfile

    broken = []
    for path in sorted(folder.glob(pattern)) if folder.is_dir() else []:
        try:
            zipfile.ZipFile(path).close()
        except (OSError, zipfile.BadZipFile):
            broken.append(path.name)
    return broken
