"""Choose W&B's mode before a WandbLogger starts, so a run never prompts for a key or blocks."""

from __future__ import annotations

import netrc
import os
import socket
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit


def has_api_key() -> bool:
    """True when W&B would find a key: ``WANDB_API_KEY`` or a ``wandb login`` entry in netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        hosts = netrc.netrc(str(path)).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")
    return base in hosts


def server_unreachable(timeout: float = 5.0) -> str | None:
    """Why the W&B server cannot be reached within ``timeout`` seconds (DNS included), or ``None``."""
    url = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname or "api.wandb.ai", url.port or (80 if url.scheme == "http" else 443)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{host}:{port}: {err.strerror or err}")

    probe = threading.Thread(target=connect, daemon=True)  # getaddrinfo itself has no timeout
    probe.start()
    probe.join(timeout)
    return outcome[0] if outcome else f"{host}:{port}: no answer in {timeout:.0f} s"


def ensure_wandb_mode() -> str | None:
    """Respect ``WANDB_MODE`` when set; else log offline, with a one-line notice, without a key or a server.

    W&B would prompt for a missing key on a terminal, and with a key but no network it blocks
    for minutes before failing.
    """
    if os.environ.get("WANDB_MODE"):
        return None
    if not has_api_key():
        os.environ["WANDB_MODE"] = "offline"
        return "W&B: no API key (set WANDB_API_KEY or run `wandb login`), logging offline; `wandb sync` uploads later"
    if reason := server_unreachable():
        os.environ["WANDB_MODE"] = "offline"
        return f"W&B: server unreachable ({reason}), logging offline; `wandb sync` uploads it later"
    return None


def finish_wandb(exit_code: int = 0) -> None:
    """End this process's W&B run, so the next run in the same process (a notebook) starts its own."""
    wandb = sys.modules.get("wandb")  # never import W&B just to close it
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)
