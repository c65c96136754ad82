"""A cookiecutter extension (template only): a hook that refuses a name prints its one line, not a traceback.

Cookiecutter logs a failed hook with ``logger.exception``; this drops the traceback from that one
record through a standard ``logging.Filter`` on cookiecutter's hooks logger. Loaded by
``cookiecutter.json``'s ``_extensions`` (the template folder is on ``sys.path`` while it generates).
"""

from __future__ import annotations

import logging

from jinja2 import Environment
from jinja2.ext import Extension


class _NoTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return not str(record.msg).startswith("Stopping generation")  # the hook's own line said why


class QuietHookFailure(Extension):
    """Installs the filter when cookiecutter builds its Jinja environment."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        hooks_log = logging.getLogger("cookiecutter.hooks")
        if not any(isinstance(f, _NoTraceback) for f in hooks_log.filters):
            hooks_log.addFilter(_NoTraceback())
