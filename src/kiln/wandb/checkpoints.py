"""``--ckpt_path wandb:<entity>/<project>/<artifact>:<alias>``: a checkpoint logged as a W&B model artifact, as a file.

Online, W&B's API downloads the version through its artifact cache. Offline (``WANDB_MODE=offline``, no key, no
server), the version is the newest one with that alias that an offline run under the run root logged; its file is
taken from W&B's artifact cache, or from where the run logged it, and only when its MD5 is the one logged (a
``last.ckpt`` trained on since is refused, never read as the version).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import UsageError
from kiln.files import written_whole
from kiln.wandb import offline as wandb_offline

PREFIX = "wandb:"


@dataclass(frozen=True)
class Reference:
    """``[<entity>/]<project>/<artifact>:<alias or version>``, as W&B names a version."""

    entity: str
    project: str
    name: str
    alias: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.entity + '/' if self.entity else ''}{self.project}/{self.name}:{self.alias}"


def names_a_version(value: object) -> bool:
    """Whether a ``--ckpt_path`` value names a W&B version (``wandb:…``) rather than a file."""
    return isinstance(value, str) and value.startswith(PREFIX)


def parse(value: str) -> Reference:
    """The parts of a ``wandb:`` reference, or one line showing its form."""
    path, colon, alias = value.removeprefix(PREFIX).rpartition(":")
    parts = path.split("/")
    if not colon or not alias or len(parts) not in (2, 3) or not all(parts):
        raise UsageError(f"--ckpt_path {value}: write wandb:<entity>/<project>/<artifact>:<alias>, "
                         "as in wandb:me/kiln/model-1a2b3c4d:best")  # fmt: skip
    entity = parts[0] if len(parts) == 3 else ""
    return Reference(entity, parts[-2], parts[-1], alias)


def resolve(value: str, root: str | Path) -> Path:
    """The local checkpoint file of the W&B version ``value`` names, with one line saying which it is."""
    from kiln.wandb.mode import why_not_online

    reference = parse(value)
    why = why_not_online()
    path, source = _downloaded(reference) if why is None else _logged_offline(reference, Path(root), why)
    print(f"--ckpt_path {reference}: {path} ({source})", file=sys.stderr)
    return path


def _downloaded(reference: Reference) -> tuple[Path, str]:
    """Through W&B's API: the version's files in W&B's download folder (from its cache when already there)."""
    import wandb

    name = f"{reference.entity + '/' if reference.entity else ''}{reference.project}/{reference.name}:{reference.alias}"
    try:
        artifact = wandb.Api().artifact(name, type="model")
        folder = Path(artifact.download())
    except Exception as err:  # W&B raises CommError, ValueError and HTTP errors for a missing name or alias
        reason = (str(err).splitlines() or [type(err).__name__])[0][:300]
        raise UsageError(f"--ckpt_path {reference}: W&B could not give this version ({reason})") from None
    return _checkpoint_in(folder, reference), f"W&B version {artifact.version}, run {_logged_by(artifact)}"


def _logged_by(artifact: Any) -> str:
    try:
        run = artifact.logged_by()
    except Exception:  # a version uploaded outside a run
        return "unknown"
    return run.id if run is not None else "unknown"


def _checkpoint_in(folder: Path, reference: Reference) -> Path:
    files = sorted(folder.rglob("*.ckpt"))
    if len(files) != 1:
        raise UsageError(f"--ckpt_path {reference}: the version holds {len(files)} .ckpt files in {folder}; "
                         "name one of them as --ckpt_path")  # fmt: skip
    return files[0]


def _logged_offline(reference: Reference, root: Path, why: str) -> tuple[Path, str]:
    """The newest version with the alias among the offline runs under ``root``, its file checked by MD5."""
    found: list[tuple[float, int, Path, dict[str, Any]]] = []  # (run file time, order in it, run file, artifact)
    names: set[str] = set()
    for run_file in sorted(root.glob("**/wandb/*run-*/run-*.wandb")):
        for order, artifact in enumerate(wandb_offline.artifacts(run_file)):
            entity = artifact["entity"]
            if artifact["type"] != "model" or artifact["project"] != reference.project:
                continue
            if reference.entity and entity and entity != reference.entity:
                continue
            names.add(f"{artifact['name']}:{','.join(artifact['aliases'])}")
            if artifact["name"] == reference.name and reference.alias in artifact["aliases"]:
                found.append((run_file.stat().st_mtime, order, run_file, artifact))
    if not found:
        logged = "; ".join(sorted(names)) or "none"
        raise UsageError(f"--ckpt_path {reference}: not asked of W&B ({why}), and no run under {root.resolve()} "
                         f"logged it offline (model versions there: {logged})")  # fmt: skip
    _, _, run_file, artifact = max(found, key=lambda f: f[:2])
    entry = next((e for e in artifact["entries"] if e["path"].endswith(".ckpt")), None)
    if entry is None:
        raise UsageError(f"--ckpt_path {reference}: the version {run_file.parent.name} logged holds no .ckpt file")
    source = f"logged offline by {run_file.parent.name}, file MD5 {_hex(entry['digest'])}"
    if _md5(Path(entry["local_path"])) == entry["digest"]:  # where the run logged it, unchanged: beside its run's files
        return Path(entry["local_path"]), source
    cached = _cache_path(entry["digest"])
    if _md5(cached) == entry["digest"]:
        return _copied(cached, reference, entry["digest"]), f"{source}, from W&B's artifact cache"
    raise UsageError(f"--ckpt_path {reference}: the file {run_file.parent.name} logged ({entry['local_path']}) has "
                     f"changed since, and W&B's artifact cache ({cached}) does not hold it; `wandb sync` the run "
                     "and resolve it online, or name a checkpoint file")  # fmt: skip


def _cache_path(digest: str) -> Path:
    """Where W&B's artifact cache keeps a file of this MD5 (its layout: docs/development.md, private APIs)."""
    from wandb import env

    hex_digest = _hex(digest)
    return env.get_cache_dir() / "artifacts" / "obj" / "md5" / hex_digest[:2] / hex_digest[2:]


def _copied(cached: Path, reference: Reference, digest: str) -> Path:
    """The cached file in W&B's download folder, as ``artifact.download()`` would place it (by content, so a
    later version never overwrites it)."""
    from wandb import env

    target = Path(env.get_artifact_dir()) / f"{reference.name}-{_hex(digest)[:12]}" / "model.ckpt"
    if _md5(target) != digest:
        target.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(target) as partial:
            shutil.copyfile(cached, partial)
    return target


def _hex(digest: str) -> str:
    return base64.standard_b64decode(digest).hex()


def _md5(path: Path) -> str | None:
    """W&B's digest of a file: its MD5, base64; ``None`` for no file."""
    if not path.is_file():
        return None
    digest = hashlib.md5()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return base64.standard_b64encode(digest.digest()).decode()
