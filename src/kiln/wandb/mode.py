"""Choose W&B's mode before a WandbLogger starts, so a run never prompts for a key or blocks."""

from __future__ import annotations

import base64
import json
import netrc
import os
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kiln.errors import ConfigError, first_line


def _base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")


def api_key() -> str | None:
    """The key W&B would use: ``WANDB_API_KEY``, or the ``wandb login`` entry for the server in netrc."""
    if key := os.environ.get("WANDB_API_KEY"):
        return key
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        entry = netrc.netrc(str(path)).authenticators(urlsplit(_base_url()).hostname or "")
    except (OSError, netrc.NetrcParseError):
        return None
    return entry[2] if entry and entry[2] else None


def server_problem(key: str, timeout: float = 10.0) -> str | None:
    """Why W&B could not start an online run with ``key`` (no connection, no answer, an HTTP error, a
    refused key), or ``None``: one authenticated GraphQL query, as ``wandb.init`` makes, bounded in time."""
    url = f"{_base_url()}/graphql"
    auth = base64.b64encode(f"api:{key}".encode()).decode()
    headers = {"Content-Type": "application/json", "Authorization": f"Basic {auth}"}
    request = urllib.request.Request(url, json.dumps({"query": "{ viewer { id } }"}).encode(), headers)
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                viewer = (json.loads(response.read()).get("data") or {}).get("viewer")
            outcome.append(None if viewer else f"{url} does not know this API key")
        except urllib.error.HTTPError as err:
            refused = " (the API key was refused)" if err.code in (401, 403) else ""
            outcome.append(f"{url} answered HTTP {err.code} {err.reason}{refused}")
        except (OSError, ValueError, AttributeError) as err:  # no connection, a timeout, not W&B's JSON
            reason = getattr(err, "reason", None) or err
            reason = silent if isinstance(reason, TimeoutError) else getattr(reason, "strerror", None) or reason
            outcome.append(f"{url}: {reason}")

    silent = f"no answer in {timeout:.0f} s"
    probe = threading.Thread(target=ask, daemon=True)  # getaddrinfo itself has no timeout
    probe.start()
    probe.join(timeout + 5)  # a server that answers a byte at a time is bounded here too
    return outcome[0] if outcome else f"{url}: {silent}"


QUIET_MODES = ("offline", "disabled", "dryrun")  # W&B's modes that start no online run


def current() -> str | None:
    """This process's W&B mode, ``WANDB_MODE`` (W&B reads it once per process; ``ensure_wandb_mode`` sets it where
    it falls back to offline): read here only."""
    return os.environ.get("WANDB_MODE") or None


def why_not_online() -> str | None:
    """Why an online W&B run cannot start now (its mode, no key, the server's answer), or None."""
    if (mode := current()) in QUIET_MODES:
        return f"WANDB_MODE is {mode}"
    key = api_key()
    return "no API key (set WANDB_API_KEY or run `wandb login`)" if key is None else server_problem(key)


def ensure_wandb_mode() -> str | None:
    """Respect ``WANDB_MODE`` when set; else log offline, with a one-line notice, unless an online run can start.

    W&B would prompt for a missing key on a terminal; with a key but a server (or a proxy) that
    does not answer, or answers with an error, it blocks for minutes and then fails the run.
    """
    if sweep := os.environ.get("WANDB_SWEEP_ID"):
        _refuse_offline_agent(sweep)
        return None
    if current():
        return None
    key = api_key()
    if key is None:
        os.environ["WANDB_MODE"] = "offline"
        return "W&B: no API key (set WANDB_API_KEY or run `wandb login`), logging offline; `wandb sync` uploads later"
    if reason := server_problem(key):
        os.environ["WANDB_MODE"] = "offline"
        return f"W&B: cannot start an online run ({reason}), logging offline; `wandb sync` uploads it later"
    return None


def _refuse_offline_agent(sweep: str) -> None:
    """Under ``wandb agent`` a run must log online: offline, the sweep controller never gets its metric."""
    why = why_not_online()
    if why:
        raise ConfigError(
            f"W&B sweep agent (WANDB_SWEEP_ID={sweep}): {why}; logging offline would leave the sweep without this "
            "run's metric, so nothing was trained. Fix the key or the connection and start the agent again"
        )


INIT_TIMEOUT = "30"  # seconds W&B waits for its run to start (its own default, 90, blocked a run for minutes)


def start_or_fall_back(logger: Any) -> str | None:
    """Start a ``WandbLogger``'s run now, before training; if W&B cannot start it (an HTTP 500 to run creation,
    a full disk), log offline instead, or with that failing too, not at all: one line says which, and
    training goes on either way. Uses Lightning's ``_wandb_init`` and ``_experiment`` (docs/development.md:
    private APIs)."""
    os.environ.setdefault("WANDB_INIT_TIMEOUT", INIT_TIMEOUT)
    try:
        logger.experiment  # noqa: B018  # Lightning's lazy start: wandb.init
        return None
    except Exception as err:  # W&B's CommError, UsageError, OSError of a full disk: each ends the same way
        reason = first_line(err)
    for mode in ("offline", "disabled"):
        if logger._wandb_init.get("mode") == mode:
            continue
        finish_wandb(exit_code=1)
        logger._experiment, logger._wandb_init["mode"] = None, mode
        try:
            logger.experiment  # noqa: B018
        except Exception as err:
            reason = f"{reason}; {mode}: {first_line(err)}"
            continue
        more = "`wandb sync` uploads it later" if mode == "offline" else "the run goes on without W&B"
        return f"W&B: the run could not start ({reason}); logging {mode}, {more}"
    raise RuntimeError(f"W&B could not start even disabled ({reason})")


def finish_wandb(exit_code: int = 0) -> None:
    """End this process's W&B run, so the next run in the same process (a notebook) starts its own, and wait
    until W&B's service has written and closed its files: ``wandb.finish`` returns before that, and a notebook
    reading the run's history at once (``kiln.results``) read a part of it."""
    wandb = sys.modules.get("wandb")  # never import W&B just to close it
    if wandb is not None and wandb.run is not None:
        try:
            wandb.finish(exit_code=exit_code)
            wandb.teardown(exit_code)  # the service ends once every file is whole; the next run starts its own
        except Exception as err:  # a full disk, a server gone: what it logged is what there is
            print(f"W&B: the run could not be closed cleanly ({first_line(err)})", file=sys.stderr)


def start_runs(loggers: list[Any]) -> None:
    """Start each ``WandbLogger``'s run (``start_or_fall_back``); one line for each that fell back."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in loggers:
        if isinstance(logger, WandbLogger) and (notice := start_or_fall_back(logger)):
            print(notice, file=sys.stderr)
