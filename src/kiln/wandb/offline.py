"""The metric history of an offline W&B run, read from its ``run-<id>.wandb`` file without a server.

That file is W&B's private format (docs/development.md, private APIs; tests/engine/test_results.py reads a real
one): a 7-byte header (``:W&B``, magic, version), then LevelDB-log records (32 KiB blocks; each chunk has a CRC, a
length and a type: full, first, middle, last) holding ``wandb_internal_pb2.Record`` protobufs; ``history`` records
carry one logged step each as ``key -> JSON value``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE_HEADER = 7  # ":W&B", a 2-byte magic, a version byte
CHUNK_HEADER = 7  # a CRC (4 bytes), a length (2) and a type (1)
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(data: bytes) -> Iterator[bytes]:
    """The record payloads of a LevelDB log (chunks joined; block tails too short for a chunk skipped)."""
    position, pieces = FILE_HEADER, []
    while position + CHUNK_HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < CHUNK_HEADER:
            position += left
            continue
        _, length, kind = struct.unpack_from("<IHB", data, position)
        if kind == 0:  # zero padding up to the next block
            position += left
            continue
        body = data[position + CHUNK_HEADER : position + CHUNK_HEADER + length]
        position += CHUNK_HEADER + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pieces = [body]
        elif kind == MIDDLE:
            pieces.append(body)
        elif kind == LAST:
            yield b"".join([*pieces, body])
            pieces = []


def records(path: Path) -> Iterator[Any]:
    """Every record of the offline run file ``path``, parsed (a record cut short by a killed run ends them)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if not data.startswith(b":W&B"):
        raise ValueError(f"{path}: not a W&B run file")
    for payload in _records(data):
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        try:
            record.ParseFromString(payload)
        except Exception:
            return
        yield record


def artifacts(path: Path) -> list[dict[str, Any]]:
    """The artifacts the offline run logged, in order: name, type, aliases, metadata, the run's project and
    entity, and the files of each version (``files``: their names; ``entries``: name, MD5 and where it was)."""
    found, run = [], {"project": "", "entity": ""}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = {"project": record.run.project, "entity": record.run.entity}
        elif kind == "artifact":
            artifact = record.artifact
            entries = [{"path": e.path, "digest": e.digest, "local_path": e.local_path}
                       for e in artifact.manifest.contents]  # fmt: skip
            found.append({"name": artifact.name, "type": artifact.type, "aliases": list(artifact.aliases),
                          "metadata": json.loads(artifact.metadata or "{}"), "digest": artifact.digest, **run,
                          "files": [e["path"] for e in entries], "entries": entries})  # fmt: skip
    return found


def history(path: Path) -> list[dict[str, Any]]:
    """Every logged step of the offline run file ``path``: one dict per ``log`` call (``_step`` included,
    pictures and tables left out)."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            media = {key.removesuffix("/_type") for key in items if key.endswith("/_type")}  # a picture's fields
            rows.append({key: value for key, value in items.items() if key.rsplit("/", 1)[0] not in media})
    return rows


def run_file(run_dir: Path) -> Path | None:
    """The newest offline W&B run file of a kiln run folder, if it logged to W&B."""
    found = sorted(run_dir.glob("wandb/*run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None
