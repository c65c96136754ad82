"""The classes a config names by ``class_path``: imported without raising, and the arguments they take."""

from __future__ import annotations

import importlib
import inspect
from typing import Any


def import_class(dotted: str) -> Any:
    """The object a ``module.Name`` path names, or ``None`` when it cannot be imported."""
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def is_a(entry: Any, base: type) -> bool:
    """Whether a configured class (a ``class_path`` node, a dotted path, or an object already built) is, or derives
    from, ``base`` (a user's subclass counts)."""
    if isinstance(entry, base):
        return True
    path = entry.get("class_path") if hasattr(entry, "get") else entry
    cls = import_class(path) if isinstance(path, str) else None
    return isinstance(cls, type) and issubclass(cls, base)


def parameters(cls: Any) -> list[str]:
    """The arguments a class accepts, through ``**kwargs`` to its bases as jsonargparse reads them."""
    return list(defaults(cls))


REQUIRED = inspect.Parameter.empty  # an argument without a default


def defaults(cls: Any) -> dict[str, Any]:
    """Each argument a class accepts (as :func:`parameters` reads them) with its default, or ``REQUIRED``."""
    found: dict[str, Any] = {}
    for klass in getattr(cls, "__mro__", [cls]):
        try:
            parameters = inspect.signature(klass.__init__).parameters.values()
        except (TypeError, ValueError):
            break
        for p in parameters:
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self":
                found.setdefault(p.name, p.default)
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return found
