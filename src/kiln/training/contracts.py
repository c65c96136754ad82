"""What kiln's engine may use of a LightningModule and its LightningDataModule: small named contracts, each optional.

None is a base class: a plain module or datamodule declares what it has under these names, and the
engine reads them here only, never by guessing. Without one, the part that needs it steps aside (at
most one line); a command that cannot do without it stops in one line naming what to add.

Data (a LightningDataModule):
    ``input_shape``: one sample's shape without the batch dimension (``(C, H, W)`` images, ``(C, L)`` or
        ``(L,)`` signals, ``(F,)`` features, ``(T,)`` token ids). Linked into the network; checked in
        the first batches; an export's input.
    ``num_classes`` (and ``class_names``): classification. Linked into the model and the network; then
        label checks, the class histogram, the confusion matrix, confident mistakes, class columns in
        predictions and top-1 agreement in an export's parity.
    ``mean`` and ``std``: the statistics it normalises float inputs with. Pictures undo them; an
        export's ``preprocess.json`` records them.
    ``resume_at(epoch, samples)``: where the training order resumes, for an exact mid-epoch resume of a loader whose
        sampler is its own (a plain DataLoader's order needs none: ``callbacks.resume.resumable_order``).
    ``test_set`` with ``raw(i)``: a test sample as stored (an export's ``preprocess.json`` tells uint8 from float).
    ``num_outputs``, ``vocab_size``, ``block_size``, and any name the project lists in its ``pyproject.toml``
        (``[tool.kiln] declares = ["num_joints"]``): linked into the model's and the network's argument of the
        same name.
A LightningModule:
    ``prediction_columns(prediction, batch)``: ``predictions.csv``'s columns for a batch (else kiln
        writes class columns for classifiers, values for anything else).
    ``example_input_array`` (Lightning's own): an input for the model summary and an export, where the
        data's test batches give none.
    ``net`` with ``in_channels``: the channels its network takes, checked against the first batches.
A network class (``model.net``'s):
    ``init_only``: the arguments that only initialise its weights (``Timm``'s ``weights``), which a checkpoint's
        resume or rebuild ignores.
    ``input_stats(init_args, in_channels)``: the statistics its pretrained weights expect, which become the
        data's ``mean``/``std``.

``CONTRACTS`` names them all: ``tests/engine/test_surface.py`` holds that no other engine module reads them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kiln.errors import ConfigError

CONTRACTS = ("input_shape", "num_classes", "class_names", "mean", "std", "resume_at", "test_set", "raw",
             "prediction_columns", "example_input_array", "in_channels", "init_only", "input_stats")  # fmt: skip


@runtime_checkable
class ResumesMidEpoch(Protocol):
    """Data whose training order can start at any sample of any epoch (``kiln.data.ResumableSampler`` does)."""

    def resume_at(self, epoch: int, samples: int) -> None: ...


@runtime_checkable
class WritesPredictions(Protocol):
    """A module that says how its predictions read in ``predictions.csv``: columns of one value per sample."""

    def prediction_columns(self, prediction: Any, batch: Any) -> Mapping[str, Sequence[Any]]: ...


def datamodule(trainer: Any) -> Any:
    """The trainer's datamodule, or None (loaders given directly, or no trainer)."""
    return getattr(trainer, "datamodule", None) if trainer is not None else None


def classes(data: Any) -> int | None:
    """``num_classes`` where the data declares a positive integer number of classes; else None."""
    value = getattr(data, "num_classes", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def declared_classes(trainer: Any) -> int | None:
    return classes(datamodule(trainer))


def declared_names(trainer: Any) -> list[str] | None:
    """The class names the data declares, one per class; else None."""
    data = datamodule(trainer)
    names, count = getattr(data, "class_names", None), classes(data)
    if count is None or not isinstance(names, Sequence) or isinstance(names, str) or len(names) != count:
        return None
    return [str(name) for name in names]


def sample_shape(data: Any) -> tuple[int, ...] | None:
    """``input_shape`` where the data declares one (a sequence of positive integers); else None."""
    shape = getattr(data, "input_shape", None)
    if not isinstance(shape, Sequence) or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(shape)


def statistics(data: Any) -> tuple[list[float], list[float]] | None:
    """``(mean, std)`` where the data declares the statistics it normalises float inputs with; else None."""
    mean, std = getattr(data, "mean", None), getattr(data, "std", None)
    if not (isinstance(mean, Sequence) and isinstance(std, Sequence)) or not mean or not std:
        return None
    return [float(m) for m in mean], [float(s) for s in std]


def declared(data: Any, name: str) -> Any:
    """A declaration of the data as it stands, unchecked (the links compare it with what the user wrote)."""
    return getattr(data, name, None)


def network_channels(module: Any) -> int | None:
    """The input channels ``module.net`` declares, if it declares them as an integer."""
    channels = getattr(getattr(module, "net", None), "in_channels", None)
    return channels if isinstance(channels, int) and not isinstance(channels, bool) else None


def stored_dtype(data: Any) -> Any:
    """The dtype of a test sample as the data stores it (``test_set.raw(0)``), else None."""
    test_set: Any = getattr(data, "test_set", None)
    return test_set.raw(0)[0].dtype if hasattr(test_set, "raw") and len(test_set) else None


def init_only(network_class: Any) -> tuple[str, ...]:
    """The network class's arguments that only initialise its weights (none declared: none)."""
    return tuple(getattr(network_class, "init_only", ()))


def has_input_stats(network_class: Any) -> bool:
    return hasattr(network_class, "input_stats")


def input_stats(network_class: Any, init_args: Any, in_channels: int | None) -> Any:
    """The statistics the network's pretrained weights expect, ``(mean, std)``, or None."""
    return network_class.input_stats(init_args, in_channels) if has_input_stats(network_class) else None


PROJECT = "pyproject.toml"


def project_declarations(kilns: tuple[str, ...]) -> tuple[str, ...]:
    """``kilns`` (kiln's own names), then the names a project's data declares beyond them, linked and streamed as
    kiln's are: ``[tool.kiln] declares`` in the ``pyproject.toml`` of the folder kiln runs in (a pose task's
    ``num_joints``: no engine edit)."""
    path = Path(PROJECT).resolve()
    project = _declared_in(path, path.stat().st_mtime_ns) if path.is_file() else ()
    return kilns + tuple(name for name in project if name not in kilns)


@functools.lru_cache(maxsize=4)
def _declared_in(path: Path, modified: int) -> tuple[str, ...]:
    """The file read once a command, however many links, checks and streams ask (again when it changes)."""
    import tomllib

    try:
        names = tomllib.loads(path.read_text()).get("tool", {}).get("kiln", {}).get("declares", [])
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{PROJECT}: not valid TOML ({err}); fix it, as kiln reads [tool.kiln] there") from None
    if not isinstance(names, list) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ConfigError(f'{PROJECT}: [tool.kiln] declares = {names!r}: give a list of argument names, e.g. '
                          '["num_joints"]')  # fmt: skip
    return tuple(names)
