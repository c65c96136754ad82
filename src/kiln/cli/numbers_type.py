"""Values typed ``numbers.Number`` (torchvision's ``RandomAffine(degrees=…)``, ``RandomRotation``, ``Pad``, …) are
read and written as numbers. jsonargparse takes the abstract class for a class to instantiate: a config file's
``degrees: 10`` trained, but the run's config.yaml held ``degrees: Unable to serialize instance 10``, which
neither ``-c`` nor ``--ckpt_path`` (the checkpoint's config) could read back, and the command line refused ``10``."""

from __future__ import annotations

import numbers
from typing import Any

from jsonargparse.typing import register_type


def _is_number(value: Any, _: type) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _number(value: Any) -> Any:
    """A number, or the command line's text of one."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    if not _is_number(value, numbers.Number):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def register_numbers() -> None:
    """jsonargparse's public registry: ``numbers.Number`` parsed and dumped as the number it is."""
    register_type(numbers.Number, serializer=lambda value: value, deserializer=_number, type_check=_is_number)
