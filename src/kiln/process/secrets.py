"""Keep secrets out of every file a run writes: config.yaml, checkpoint hyper-parameters, the W&B config."""

from __future__ import annotations

import os
import re
from pathlib import Path
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


def _holds_secret(key: str, value: Any) -> bool:
    return bool(key) and is_secret_name(key) and value not in (None, "", {}, [])


def _children(value: Any) -> list[tuple[str, Any]]:
    """The named entries of a Namespace or dict, or the items of a list (unnamed)."""
    if isinstance(value, Namespace):
        return list(vars(value).items())
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [("", v) for v in value]
    return []


def redact(value: Any, key: str = "") -> Any:
    """A copy of nested dicts/lists/Namespaces with every value under a secret-looking key replaced,
    whatever its type (a string, a number, a whole dict of keys)."""
    if _holds_secret(key, value):
        return REDACTED
    if isinstance(value, Namespace):
        return Namespace(**{k: redact(v, k) for k, v in _children(value)})
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    return value


def secret_values(value: Any, key: str = "") -> list[str]:
    """Every value under a secret-looking key (each leaf of a dict or list), as text: to scrub from messages."""
    if _holds_secret(key, value):
        children = _children(value)
        return [s for _, v in children for s in secret_values(v, "secret")] if children else [str(value)]
    return [s for k, v in _children(value) for s in secret_values(v, k)]


def redact_text(text: str, secrets: list[str]) -> str:
    """``text`` with each of the given secret values replaced (for messages that echo values back)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


URL_PASSWORD = re.compile(r"(?P<head>://[^/@:?#\s]*:)[^/@?#\s]*(?=@)")  # scheme://user:PASSWORD@host
URL_QUERY_ENTRY = re.compile(r"(?P<head>[?&](?P<key>[^=&#\s]+)=)(?P<value>[^&#\s]*)")  # ?key=value&...


def redact_url(text: str) -> str:
    """``text`` with each URL's password hidden: after ``user:`` and in query keys such as ``password=`` (a
    database URL takes either, as do the storages of a sweep)."""
    if "://" not in text:
        return text
    text = URL_PASSWORD.sub(lambda m: f"{m['head']}***", text)
    return URL_QUERY_ENTRY.sub(lambda m: f"{m['head']}***" if is_secret_name(m["key"]) else m[0], text)


def load_env_file(path: str | Path = ".env") -> list[str]:
    """Put the ``KEY=VALUE`` lines of ``path`` (the project's git-ignored ``.env``: ``# comments``, ``export``,
    quotes) into the environment, never over a variable already set; returns the names it set. The values are
    recorded nowhere: a run's files name a variable at most (``.env.example`` lists them)."""
    path = Path(path)
    if not path.is_file():
        return []
    names = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        if key.isidentifier() and key not in os.environ:
            os.environ[key] = value
            names.append(key)
    return names
