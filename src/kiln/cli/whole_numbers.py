"""Whole numbers stay whole: ``limit_train_batches: 1`` is one batch, never ``1.0`` (all of them).

typing caches unions and takes ``Union[int, float]`` and ``Union[float, int]`` for the same one, so
which order an annotation such as Lightning's ``Optional[Union[int, float]]`` gets depends on which
module made that union first (on one GPU machine's Python, plain ``import lightning`` gave ``float``
first; a library imported before kiln can do the same). jsonargparse tries a
union's members in order and ``float`` accepts any integer, so with ``float`` first an integer came
out as a float: Lightning reads ``limit_train_batches: 1`` as one batch and ``1.0`` as every batch.
"""

from __future__ import annotations

import operator
from functools import reduce
from types import UnionType
from typing import Any, Union, get_args, get_origin


def int_before_float(hint: Any) -> Any:
    """The union with ``int`` tried before ``float`` (a new ``X | Y``, which typing does not cache)."""
    if get_origin(hint) not in (Union, UnionType):
        return hint
    members = list(get_args(hint))
    if int not in members or float not in members or members.index(int) < members.index(float):
        return hint
    members.remove(int)
    members.insert(members.index(float), int)
    try:
        return reduce(operator.or_, members)
    except TypeError:  # a member that cannot be written with `|`: left as it is
        return hint


def keep_whole_numbers(parser: Any) -> None:
    """Every int-or-float argument of the parser tries ``int`` first (docs/development.md: private APIs)."""
    for action in parser._actions:  # argparse's list of the parser's arguments
        hint = getattr(action, "_typehint", None)  # jsonargparse's ActionTypeHint keeps its type here
        if hint is not None and (fixed := int_before_float(hint)) is not hint:
            action._typehint = fixed
