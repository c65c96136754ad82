"""What produced a run, beside its results: ``env.json`` (code, lockfile, versions, machine, command line, data)
and ``code.diff`` (the uncommitted changes), written when a command starts; ``kiln diff`` compares two runs."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from kiln.files import load_yaml, written_whole
from kiln.process.secrets import REDACTED, is_secret_name, redact, redact_text, redact_url
from kiln.runs.folders import layout

SAMPLED_FILES = 64  # files of a file-backed split whose bytes are hashed (all of them up to this many)


def _git(*args: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def code_state(where: Path) -> tuple[dict[str, Any], str]:
    """The git commit, branch and dirty flag of the code run from ``where``, and its uncommitted diff."""
    commit = _git("rev-parse", "HEAD", cwd=where)
    if commit is None:
        return {"commit": None, "note": "not a git repository (or no commit yet)"}, ""
    changed = _git("status", "--porcelain", "--untracked-files=no", cwd=where) or ""
    untracked = _git("ls-files", "--others", "--exclude-standard", cwd=where) or ""
    diff = _git("diff", "HEAD", cwd=where) or ""
    state = {
        "commit": commit.strip(),
        "branch": (_git("rev-parse", "--abbrev-ref", "HEAD", cwd=where) or "").strip() or None,
        "dirty": bool(changed.strip()),  # tracked files changed (code.diff holds how); new files are listed apart
        "untracked": untracked.splitlines()[:50],
    }
    return state, diff


def lockfile(where: Path) -> dict[str, Any]:
    """The sha256 of the nearest ``uv.lock`` at or above ``where`` (what `make install` installed from)."""
    for folder in (where, *where.parents):
        if (lock := folder / "uv.lock").is_file():
            return {"path": str(lock), "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}
    return {"path": None, "sha256": None}


def versions() -> dict[str, Any]:
    """Python and the libraries a result depends on, and the accelerator's software."""
    from importlib.metadata import PackageNotFoundError, version

    import lightning
    import torch
    import torchvision

    try:
        kiln = version("kiln")
    except PackageNotFoundError:  # run from src/ without an install
        kiln = None
    found: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
        "lightning": lightning.__version__, "kiln": kiln, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }  # fmt: skip
    found["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if found["gpus"] and shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        smi = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False)
        found["driver"] = smi.stdout.split("\n")[0].strip() if smi.returncode == 0 else None
    return found


def command_line(argv: list[str]) -> list[str]:
    """``argv`` with every value given to a secret-looking key replaced (``--x.api_key v``, ``--x.token=v``,
    secrets inside a JSON or YAML value, and a URL's password), as the config is."""
    shown, hide_next = [], False
    for arg in argv:
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
            continue
        flag = arg.startswith("--")
        key, equals, value = arg.partition("=") if flag else (arg, "", "")  # a bare value keeps its own '='
        if flag and is_secret_name(key.lstrip("-")):
            shown.append(f"{key}={REDACTED}" if equals else arg)
            hide_next = not equals
            continue
        text = value if equals else arg
        if text[:1] in "{[":  # a dict or list value: its own secret-looking keys
            try:
                parsed = load_yaml(text)
            except yaml.YAMLError:
                parsed = None
            hidden = redact(parsed) if isinstance(parsed, dict | list) else parsed
            if hidden != parsed:
                text = json.dumps(hidden)
        text = redact_url(text)  # a database URL's password (`--storage postgresql://user:…@host`)
        shown.append(f"{key}={text}" if equals else text)
    return shown


@contextmanager
def argv_shown(secrets: list[str] | None = None) -> Iterator[None]:
    """``sys.argv`` as ``command_line`` shows it, and without the config's ``secrets`` (values of secret-named keys,
    however the command gave them), for as long as W&B starts a run: W&B reads the command from ``sys.argv`` into
    the run's file, which ``wandb sync`` uploads (a sweep's report run held its ``--storage`` password)."""
    given = sys.argv[:]
    sys.argv[:] = [redact_text(arg, secrets or []) for arg in command_line(given)]
    try:
        yield
    finally:
        sys.argv[:] = given


def data_fingerprint(datamodule: Any) -> dict[str, Any]:
    """Per split the datamodule set up: its size and a sha256 of what it read: tensors held in memory whole,
    files by name and size and the bytes of up to 64 of them (spread evenly); another dataset by its size."""
    from kiln.data.datasets import InMemoryDataset

    found = {}
    for split in ("train", "val", "test"):
        dataset = getattr(datamodule, f"{split}_set", None)
        if dataset is None:
            continue
        digest, how = hashlib.sha256(), "size only"
        if isinstance(dataset, InMemoryDataset):
            for tensor in (dataset.inputs, dataset.targets):
                if tensor is not None:
                    digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
                    digest.update(tensor.detach().cpu().contiguous().numpy().data)  # its buffer: no copy of the bytes
            how = "tensors, whole"
        elif paths := getattr(dataset, "paths", None):
            step = max(1, len(paths) // SAMPLED_FILES)
            for i, path in enumerate(paths):
                digest.update(f"{Path(path).name}:{Path(path).stat().st_size}\n".encode())
                if i % step == 0:
                    digest.update(Path(path).read_bytes())
            how = (
                "file names and sizes; bytes of every file"
                if step == 1
                else f"file names and sizes; bytes of 1 in {step}"
            )
        size = len(dataset) if hasattr(dataset, "__len__") else None
        found[split] = {"samples": size, "sha256": digest.hexdigest() if how != "size only" else None, "how": how}
    return {"class": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}", "splits": found}


def write_environment(run_dir: Path, datamodule: Any, argv: list[str] | None = None) -> dict[str, Any]:
    """``env.json`` (and ``code.diff`` when the code has uncommitted changes) in ``run_dir``; returns the record.
    A resumed run's command writes them again: they describe the latest command in that folder."""
    where = Path.cwd()
    code, diff = code_state(where)
    record = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(list(sys.argv if argv is None else argv)),
        "cwd": str(where),
        "code": code,
        "lockfile": lockfile(where),
        "versions": versions(),
        "machine": {"host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "data": data_fingerprint(datamodule) if datamodule is not None else None,
    }
    with written_whole(layout(run_dir).environment) as partial:
        partial.write_text(json.dumps(record, indent=2) + "\n")
    diff_file = run_dir / "code.diff"
    if diff:
        with written_whole(diff_file) as partial:
            partial.write_text(diff)
    else:
        diff_file.unlink(missing_ok=True)
    return record
