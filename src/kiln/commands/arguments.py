"""argparse for kiln's own commands (sweep, multirun, export, infer): a bad option is one line, not usage plus error."""

from __future__ import annotations

import argparse
from typing import NoReturn

from kiln.errors import UsageError


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` (exit 2, one line) instead of printing the usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")
