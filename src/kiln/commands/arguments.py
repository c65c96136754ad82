"""Arguments of kiln's own commands (sweep, multirun, export, infer, tune): a bad option is one line, not usage plus
error; the ``kiln fit`` arguments after ``--``, and the config they resolve to."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import NoReturn

from kiln.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` (exit 2, one line) instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def folder(text: str) -> str:
    """A folder option's value: an empty one trained into ``./<name>`` (not ignored by git), with no word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty folder: give one, or leave the option out for its default")
    return text


def parse_command(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The command's own options, and the ``kiln fit`` arguments every run gets (what follows ``--``)."""
    fit_args = args[args.index("--") + 1 :] if "--" in args else []  # e.g. -- -c configs/trainer/gpu.yaml
    own = args[: args.index("--")] if "--" in args else args
    return parser.parse_args(own), fit_args  # a OneLineParser: a bad option raises UsageError


def resolved_config(fit_args: list[str]) -> str:
    """The config ``kiln fit <fit_args>`` resolves to (what ``--print_config`` prints), before anything runs:
    a rerun reuses a run only if this text is the same (the files behind ``-c`` may have changed)."""
    from kiln.cli import argv_hidden, build_cli

    printed = io.StringIO()
    with argv_hidden(), contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        build_cli(["fit", *fit_args, "--print_config"])
    return printed.getvalue()
