"""Keep secrets out of every file a run writes: config.yaml, checkpoint hyper-parameters, the W&B config."""

from __future__ import annotations

import re
from typing import Any

from jsonargparse import Namespace

# api_key, token, secret, password, credential, bearer, auth; not tokenizer, max_tokens or author
SECRET_NAME = re.compile(
    r"(api_?keys?|(^|_)token$|secret|passw(or)?d|credential|bearer|(^|_)auth(orization)?($|_)|private_?key)",
    re.IGNORECASE,
)
REDACTED = "<redacted: pass it through an environment variable>"


def is_secret_name(key: str) -> bool:
    """Whether a setting called ``key`` (the last part of a dotted path) holds a secret."""
    return bool(SECRET_NAME.search(key.rsplit(".", 1)[-1]))


def redact(value: Any, key: str = "") -> Any:
    """A copy of nested dicts/lists/Namespaces with every value under a secret-looking key replaced,
    whatever its type (a string, a number, a whole dict of keys)."""
    if key and is_secret_name(key) and value not in (None, "", {}, []):
        return REDACTED
    if isinstance(value, Namespace):
        return Namespace(**{k: redact(v, k) for k, v in vars(value).items()})
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    return value


def redact_text(text: str, secrets: list[str]) -> str:
    """``text`` with each of the given secret values replaced (for messages that echo values back)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def secret_values(value: Any, key: str = "") -> list[str]:
    """Every non-empty value under a secret-looking key, as text (to scrub them from messages)."""
    if key and is_secret_name(key) and value not in (None, "", {}, []):
        if isinstance(value, dict | Namespace):
            items = vars(value).items() if isinstance(value, Namespace) else value.items()
            return [str(v) for k, v in items for v in secret_values(v, "secret")]
        if isinstance(value, list | tuple):
            return [str(v) for v in value]
        return [str(value)]
    if isinstance(value, Namespace):
        return [s for k, v in vars(value).items() for s in secret_values(v, k)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in secret_values(v, str(k))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in secret_values(v, key)]
    return []
