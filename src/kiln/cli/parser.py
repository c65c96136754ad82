"""The CLI's argument parser: Lightning's, reading its default config file once per parse instead of twice."""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch.cli import LightningArgumentParser

_parse: ContextVar[object | None] = ContextVar("kiln_parse", default=None)  # the outermost parse under way


class KilnArgumentParser(LightningArgumentParser):
    """Within one parse, a parser with default config files (``configs/train.yaml``) computes its defaults once.

    jsonargparse asks a subcommand's parser for its defaults as it parses the subcommand and again as it merges it
    into the whole config; each time it reads train.yaml and builds every class it names (about 0.04 s of every
    command). Both answers are the same: the parser and the file do not change while a command line is parsed.
    Each caller gets its own copy, as it would from jsonargparse.
    """

    _once: tuple[object, bool, Namespace] | None = None  # (the parse, skip_validation, the defaults)

    def parse_args(self, *args: Any, **kwargs: Any) -> Namespace:  # type: ignore[override]
        if _parse.get() is not None:  # a subcommand's parse, inside the command line's
            return super().parse_args(*args, **kwargs)
        token = _parse.set(object())
        try:
            return super().parse_args(*args, **kwargs)
        finally:
            _parse.reset(token)

    def get_defaults(self, skip_validation: bool = False, **kwargs: Any) -> Namespace:
        parse = _parse.get()
        if parse is None or kwargs or not self.default_config_files:
            return super().get_defaults(skip_validation, **kwargs)
        if self._once is None or self._once[:2] != (parse, skip_validation):
            self._once = (parse, skip_validation, super().get_defaults(skip_validation))
        return self._once[2].clone()


def plain_config(parser: ArgumentParser, config: Namespace, **kwargs: Any) -> dict[str, Any]:
    """The config as plain data, as ``parser.dump`` writes it: through JSON, which Python reads in C (YAML's text
    took pure-Python PyYAML to write and to read back, twice a command)."""
    return json.loads(parser.dump(config, format="json", skip_validation=True, **kwargs))
