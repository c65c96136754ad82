"""A W&B server on 127.0.0.1 holding one model artifact version: the GraphQL and HTTP answers W&B's own client
needs to find a version by name and alias, read its manifest and download its file."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar


def md5_b64(data: bytes) -> str:
    return base64.standard_b64encode(hashlib.md5(data).digest()).decode()


def _project(entity: str, project: str) -> dict[str, Any]:
    return {"id": "UHJvamVjdDox", "internalId": "1", "name": project, "entity": {"name": entity}}


def membership(entity: str, project: str, name: str, alias: str, version: int, digest: str) -> dict[str, Any]:
    """W&B's ``ArtifactMembershipFragment`` of one version: its collection, aliases and artifact."""
    collection = {"__typename": "ArtifactSequence", "name": name, "project": _project(entity, project)}
    alias_node = {"__typename": "ArtifactAlias", "id": "QWxpYXM6MQ==", "alias": alias}
    artifact = {
        "__typename": "Artifact", "id": "QXJ0aWZhY3Q6MQ==", "artifactSequence": collection, "versionIndex": version,
        "artifactType": {"name": "model"}, "description": None, "metadata": json.dumps({"file": "best.ckpt"}),
        "ttlDurationSeconds": -2, "ttlIsInherited": True, "tags": [], "historyStep": None, "state": "COMMITTED",
        "size": 1, "digest": digest, "commitHash": "abc", "fileCount": 1, "createdAt": "2026-11-25T00:00:00",
        "updatedAt": None, "aliases": [{**alias_node, "artifactCollection": collection}],
    }  # fmt: skip
    return {"__typename": "ArtifactCollectionMembership", "id": "TWVtYmVyc2hpcDox", "versionIndex": version,
            "createdAt": "2026-11-25T00:00:00", "aliases": [alias_node], "artifactCollection": collection,
            "artifact": artifact}  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    """Answers W&B's client for the one version in ``version`` (entity, project, name, alias, file bytes)."""

    version: ClassVar[dict[str, Any]] = {}
    asked: ClassVar[list[str]] = []

    def _base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"  # type: ignore[index]  # an IPv4 address

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        v = self.version
        self.asked.append(f"GET {self.path}")
        if self.path == "/files/model.ckpt":
            return self._send(v["data"])
        if self.path != "/manifest.json":
            return self._send(b"{}", 404)
        contents = {"model.ckpt": {"digest": md5_b64(v["data"]), "size": len(v["data"])}}
        manifest = {"version": 1, "storagePolicy": "wandb-storage-policy-v1", "storagePolicyConfig": {},
                    "contents": contents}  # fmt: skip
        self._send(json.dumps(manifest).encode())

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        query, variables, v = request.get("query", ""), request.get("variables") or {}, self.version
        operation = query.split("(")[0].split("{")[0].split()[-1] if query.strip().startswith("query") else "viewer"
        self.asked.append(operation)
        data: Any
        if operation == "ArtifactMembershipByName":
            found = (variables.get("entity"), variables.get("project"), variables.get("name")) == (
                v["entity"], v["project"], f"{v['name']}:{v['alias']}")  # fmt: skip
            held = membership(v["entity"], v["project"], v["name"], v["alias"], v["index"], md5_b64(v["data"]))
            data = {"project": {"artifactCollectionMembership": held if found else None}}
        elif operation == "FetchArtifactManifest":
            url = f"{self._base()}/manifest.json"
            data = {"artifact": {"currentManifest": {"file": {"directUrl": url}}}}
        elif operation == "GetArtifactMembershipFileUrls":
            node = {"__typename": "File", "name": "model.ckpt", "directUrl": f"{self._base()}/files/model.ckpt"}
            files = {"pageInfo": {"__typename": "PageInfo", "endCursor": None, "hasNextPage": False},
                     "edges": [{"node": node}]}  # fmt: skip
            data = {"project": {"artifactCollection": {"__typename": "ArtifactSequence",
                                                       "artifactMembership": {"files": files}}}}  # fmt: skip
        elif operation == "ServerFeaturesQuery":
            data = {"serverInfo": {"features": []}}
        else:  # the key's checks: kiln's, and W&B's Viewer and default-entity queries
            data = {"viewer": {"id": "VXNlcjox", "entity": v["entity"], "username": v["entity"], "email": None,
                               "flags": "{}", "teams": {"edges": []}}}  # fmt: skip
        self._send(json.dumps({"data": data}).encode())

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(entity: str, project: str, name: str, alias: str, index: int, data: bytes) -> Iterator[tuple[str, list]]:
    """The base URL of a server holding ``<entity>/<project>/<name>:<alias>`` (version ``v<index>``, one file
    ``model.ckpt`` of ``data``), and the GraphQL operations it was asked."""
    asked: list[str] = []
    version = {"entity": entity, "project": project, "name": name, "alias": alias, "index": index, "data": data}
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Served", (Handler,), {"version": version, "asked": asked}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()


def put_in_cache(cache_dir: Path, data: bytes) -> Path:
    """``data`` where W&B's artifact cache keeps a file of its MD5."""
    digest = hashlib.md5(data).hexdigest()
    path = cache_dir / "artifacts" / "obj" / "md5" / digest[:2] / digest[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
