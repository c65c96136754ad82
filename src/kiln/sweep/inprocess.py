"""What ``kiln sweep`` and ``kiln multirun`` share: own options before ``--``, ``kiln fit`` runs in this process."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kiln.errors import UsageError


def parse_command(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options, and the ``kiln fit`` arguments every run gets (what follows ``--``)."""
    fit_args = args[args.index("--") + 1 :] if "--" in args else []  # e.g. -- -c configs/trainer/gpu.yaml
    own = args[: args.index("--")] if "--" in args else args
    try:
        return parser.parse_args(own), fit_args
    except SystemExit as stop:  # argparse printed the usage and its error
        if stop.code:
            raise UsageError(f"{parser.prog}: see `{parser.prog} --help`") from None
        raise


def fit(args: list[str]) -> Any:
    """``kiln fit <args>`` here (``build_cli``), with the command's own ``sys.argv`` hidden for the call:
    LightningCLI warns about both, and W&B records ``sys.argv`` as the run's command."""
    from kiln.cli import build_cli

    command, sys.argv[1:] = sys.argv[1:], []
    try:
        return build_cli(["fit", *args])
    finally:
        sys.argv[1:] = command


def short_key(key: str) -> str:
    """A dotted CLI key by its last part (``…optimizer.init_args.lr`` -> ``lr``), for tables and names."""
    return key.rsplit(".", 1)[-1]


def describe(values: dict[str, Any]) -> str:
    """``lr=0.003, width=16``: a run's settings in one line."""
    return ", ".join(
        f"{short_key(k)}={v:.4g}" if isinstance(v, float) else f"{short_key(k)}={v}" for k, v in values.items()
    )
