"""Keep secrets out of every file a run writes: config.yaml, checkpoint hyper-parameters, the W&B config."""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"(api_?key|token|secret|passw(or)?d|credential)", re.IGNORECASE)
REDACTED = "<redacted: pass it through an environment variable>"


def redact(value: Any, key: str = "") -> Any:
    """A copy of nested dicts/lists with every non-empty value under a secret-looking key replaced."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if SECRET_NAME.search(key) and isinstance(value, str) and value:
        return REDACTED
    return value
