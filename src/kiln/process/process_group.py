"""Put back what an in-process DDP run leaves behind, so a later DDP run from the same process can start."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kiln.errors import NeedsOwnProcess
from kiln.runs.folders import RUN_DIR_ENV

# what Lightning's DDP set-up exports (and kiln's run folder for DDP's child processes)
DDP_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "OMP_NUM_THREADS", RUN_DIR_ENV)


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def destroy() -> None:
    """End this process's group, if any: Lightning destroys only NCCL's at exit, and a gloo group left to the
    interpreter's teardown can abort the process (SIGABRT, `terminate called without an active exception`)."""
    if _initialized():
        torch.distributed.destroy_process_group()


@contextmanager
def released_after() -> Iterator[None]:
    """A DDP run inside this process (one device: no child processes) keeps torch.distributed's group, whose
    store listens on ``MASTER_PORT``, and leaves ``MASTER_PORT`` exported: a later DDP run started from here,
    as a child process (which inherits the port), fails with EADDRINUSE. On the way out, destroy the group
    this block created (a rank's too: see :func:`destroy`) and restore the variables as they were (with the CPU
    thread count that Lightning's DDP set through ``OMP_NUM_THREADS``)."""
    saved = {key: os.environ.get(key) for key in DDP_ENV}
    had_group, threads = _initialized(), torch.get_num_threads()
    try:
        yield
    finally:
        if not had_group:
            destroy()
        if os.environ.get("OMP_NUM_THREADS") != saved["OMP_NUM_THREADS"]:
            torch.set_num_threads(threads)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def check_one_process(
    devices: int, inside: str | None, fix: str = "add --subprocess to run each `kiln fit` as its own process"
) -> None:
    """Refuse, before training, a multi-process run inside another command (``inside``, e.g. ``kiln sweep``): DDP
    starts its other ranks by running the command line again, which would be the sweep, not the trial (a rank
    that cannot parse it exits, and rank 0 waits for it until the process group's timeout)."""
    if inside is not None and devices > 1:
        raise NeedsOwnProcess(
            f"this run trains on {devices} processes (DDP), which cannot start inside `{inside}`: {fix}"
        )
