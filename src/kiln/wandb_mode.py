"""Choose W&B's mode before a WandbLogger starts, so a run never prompts for a key or blocks."""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path


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


def ensure_wandb_mode() -> str | None:
    """Respect ``WANDB_MODE`` when set; without an API key switch to offline and return a notice."""
    if os.environ.get("WANDB_MODE"):
        return None
    if has_api_key():
        return None
    os.environ["WANDB_MODE"] = "offline"
    return "W&B: no API key (set WANDB_API_KEY or run `wandb login`), logging offline; `wandb sync` uploads it later"


def finish_wandb(exit_code: int = 0) -> None:
    """End this process's W&B run, so the next run in the same process (a notebook) starts its own."""
    wandb = sys.modules.get("wandb")  # never import W&B just to close it
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)
