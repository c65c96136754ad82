"""argparse for kiln's own commands (sweep, multirun, export, infer): a bad option is one line, not usage plus error."""

from __future__ import annotations

import argparse
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
