"""The one way kiln's modules and DataModules save their hyper-parameters: every argument's config, so that
``load_from_checkpoint`` rebuilds the object, and nothing built in Python."""

from __future__ import annotations

import sys
import warnings
from typing import Any


def _built(value: Any) -> bool:
    """An argument that is a built object (a network, a function, a list of transforms), not a config."""
    items = value if isinstance(value, list | tuple) else [value]
    return any(callable(v) for v in items)


def save_config(owner: Any, logger: bool = True) -> None:
    """Call in ``__init__`` for Lightning's ``save_hyperparameters`` of every argument: under the CLI each is its
    config (a network's ``class_path`` and ``init_args`` too); an object built in Python (pass it again when
    loading) is left out, as is the copy the loggers would record of it. The caller's frame is passed, never
    stored: Lightning's own lookup keeps it in a reference cycle that holds the object (and a DataModule's
    loader workers) until a garbage collection."""
    with warnings.catch_warnings():  # Lightning's advice on `nn.Module` arguments: they are dropped just below
        warnings.filterwarnings("ignore", message=".*is an instance of `nn.Module`")
        owner.save_hyperparameters(logger=logger, frame=sys._getframe(1))
        objects = [key for key, value in owner.hparams.items() if _built(value)]
        if objects:  # saved again without them: hparams_initial (what loggers record) kept a deep copy of each
            owner.save_hyperparameters(owner.hparams, ignore=objects, logger=logger, frame=sys._getframe(1))
