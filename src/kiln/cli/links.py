"""The data declares its shapes once; the CLI links them into the model and its network.

``num_classes``, ``in_channels`` and ``input_shape`` are read from the instantiated datamodule
(``link_arguments(..., apply_on="instantiate")``), so experiment files never restate them. A
value the user writes for one of them anyway is kept only when it agrees with the data.

One value goes the other way: a pretrained network (the examples' ``Timm`` with weights) declares the
normalisation its weights expect (``input_stats``), which becomes the data's ``mean``/``std``
unless the user wrote them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, MutableMapping
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.cli import LightningArgumentParser

from kiln.cli.classes import REQUIRED, defaults, import_class, parameters
from kiln.cli.config_errors import Source, skeleton, where_written
from kiln.errors import ConfigError, KilnError, UsageError
from kiln.training import contracts

# what a datamodule may declare (kiln.training.contracts); each goes to the model's and the network's argument of
# the same name, where the chosen class takes one (num_outputs: a logit per class, or a value per target)
DECLARED = ("num_classes", "num_outputs", "in_channels", "input_shape", "vocab_size", "block_size")


def declarations() -> tuple[str, ...]:
    """Everything the data may declare: kiln's names, then the project's."""
    return contracts.project_declarations(DECLARED)


def links(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``(declaration, target)``: each name into the model's argument and the network's of the same name."""
    return tuple((name, f"model.init_args.{owner}{name}") for name in names for owner in ("", "net.init_args."))


def link_targets() -> frozenset[str]:
    """Every key the data sets in the model and the network (never restated, never compared on a resume)."""
    return frozenset(target for _, target in links(declarations()))


def _is_key(key: str) -> Callable[[str, Any], bool]:
    """Matches a written setting that is ``key``, however it was spelt (with or without ``init_args``)."""
    return lambda path, _: skeleton(path) == skeleton(key)


def owner_name(config: Namespace | None, target: str) -> str:
    """The class a link target belongs to, by name (``MLP``), for a line about it."""
    owner = target.rsplit(".init_args.", 1)[0]
    return str((config.get(f"{owner}.class_path") if config is not None else None) or owner).rsplit(".", 1)[-1]


def _same(a: Any, b: Any) -> bool:
    as_list = lambda v: list(v) if isinstance(v, list | tuple) else v  # noqa: E731
    return bool(as_list(a) == as_list(b))


class DataLinks:
    """Links the datamodule's declarations into the model; refuses user values that contradict them."""

    def __init__(self) -> None:
        self.written: dict[str, tuple[str, Any]] = {}  # target -> (where the user wrote it, the value)
        self.accepted: dict[str, Any] = {}  # targets the chosen model and network classes take: their defaults
        self.config: Namespace | None = None  # the subcommand's config: it records the statistics set from the net
        self.stats_written: str | None = None  # where the user wrote data.mean or data.std, if they did
        self.stats_pending = False  # the net declares statistics, to apply once the data exists
        self.links: tuple[tuple[str, str], ...] = ()  # (declaration, target), as add_to linked them

    def add_to(self, parser: LightningArgumentParser) -> None:
        self.links = links(declarations())
        for attr, target in self.links:
            parser.link_arguments("data", target, compute_fn=_Link(self, attr, target), apply_on="instantiate")

    def note(self, config: Namespace, settings: list[Source]) -> None:
        """Before instantiation: which targets the chosen classes take, and which the user wrote."""
        self.written.clear()
        self.accepted.clear()
        by_user = {skeleton(path) for source in settings for path, _ in source.entries}
        self.config = config
        net = import_class(config.get("model.init_args.net.class_path") or "")
        self.stats_pending = contracts.has_input_stats(net)
        written = [key for key in ("data.mean", "data.std") if skeleton(key) in by_user]
        self.stats_written = where_written(settings, _is_key(written[-1]), written[-1]) if written else None
        for _, target in self.links:
            owner, name = target.rsplit(".init_args.", 1)
            class_path = config.get(f"{owner}.class_path")
            taken = defaults(import_class(class_path)) if class_path else {}  # as jsonargparse reads them
            if name not in taken:
                continue
            self.accepted[target] = taken[name]
            if skeleton(target) in by_user and config.get(target) is not None:
                where = where_written(settings, _is_key(target), target)
                self.written[target] = (where, config.get(target))

    def value(self, data: Any, attr: str, target: str) -> Any:
        """What ``target`` gets from the instantiated datamodule (its declaration, or the class's default)."""
        self._use_net_stats(data)
        declared = contracts.declared(data, attr)
        names = contracts.declared(data, "class_names") if attr == "num_classes" else None
        if names and declared is not None and len(names) != declared:  # pictures and predictions dropped them
            raise ConfigError(
                f"{type(data).__name__} declares {declared} classes and {len(names)} class_names "
                f"({', '.join(map(str, list(names)[:4]))}{', …' if len(names) > 4 else ''}): give one name a class"
            )
        if target not in self.accepted:
            return declared
        name = type(data).__name__
        where, given = self.written.get(target, (None, None))
        if declared is None:
            if given is not None:
                return given  # a datamodule that declares nothing: the user's value stands
            if attr == "in_channels" and (shape := contracts.declared(data, "input_shape")) is not None:
                raise ConfigError(
                    f"{target}: {name}'s samples have shape {tuple(shape)}, with no channel dimension, "
                    f"but the network takes in_channels: give the samples one (input_shape (1, "
                    f"{', '.join(map(str, shape))}), inputs.unsqueeze(1)) or use a network for "
                    "1-D samples (an MLP)"
                )
            if self.accepted[target] is not REQUIRED:
                return self.accepted[target]  # the class's own default: linked only where both sides have it
            raise ConfigError(
                f"{target}: the {owner_name(self.config, target)} needs {attr}, and {name} declares none: declare "
                f"it in the datamodule ({attr} = …), or give --{target}"
            )
        if given is not None and not _same(given, declared):
            raise UsageError(
                f"{where}: {given!r} contradicts the data: {name} has {attr} {declared!r}. "
                f"Drop the setting: the data sets it"
            )
        return declared

    def _use_net_stats(self, data: Any) -> None:
        """The data normalises as the pretrained net expects: its statistics become ``data.mean``/``std``
        (the module, its saved hyper-parameters and the run's config.yaml), unless the user wrote them."""
        if not self.stats_pending or self.config is None:
            return
        self.stats_pending = False
        net = self.config.model.init_args.net
        stats = contracts.input_stats(
            import_class(net.class_path), net.init_args, contracts.declared(data, "in_channels")
        )
        if stats is None:
            return
        mean, std = (list(values) for values in stats)
        origin = f"{net.init_args.get('name') or net.class_path}'s pretrained weights"
        name = type(data).__name__
        if self.stats_written is not None:  # the user's statistics stand; a difference is said
            yours = [(contracts.declared(data, "mean"), mean), (contracts.declared(data, "std"), std)]
            if not all(_same(value, wanted) for value, wanted in yours if value is not None):
                print(f"{self.stats_written}: keeping yours; {origin} expect mean {mean}, std {std}", file=sys.stderr)
            return
        if not {"mean", "std"} <= set(parameters(type(data))):
            print(f"{name} takes no mean/std: {origin} expect mean {mean}, std {std}; normalise so", file=sys.stderr)
            return
        data.mean, data.std = tuple(mean), tuple(std)
        data.hparams.update(mean=mean, std=std)  # what a checkpoint rebuilds the data with
        self.config.data.init_args.mean, self.config.data.init_args.std = mean, std  # what config.yaml shows
        print(f"data.mean {mean}, data.std {std}: the statistics {origin} expect", file=sys.stderr)

    def prune(self, hparams: MutableMapping[str, Any]) -> None:
        """Drop linked values that the chosen class does not take from the model's hyper-parameters.

        Lightning records every applied link there; one the class does not take (``input_shape``
        for a convolutional net) would stop ``--ckpt_path`` from rebuilding the model.
        """
        drop_link_targets(hparams, keep=self.accepted)


class _Link:
    """A link's ``compute_fn``: an object, not a closure, so that ``ddp_spawn`` can pickle the CLI it belongs to."""

    def __init__(self, links: DataLinks, attr: str, target: str) -> None:
        self.links, self.attr, self.target = links, attr, target

    def __call__(self, data: Any) -> Any:
        return self.links.value(data, self.attr, self.target)


def drop_link_targets(hparams: MutableMapping[str, Any], keep: Collection[str] = ()) -> None:
    """Remove the linked values (all but ``keep``) from a model's hyper-parameters (its ``init_args``)."""
    for target in link_targets() - set(keep):
        *parents, name = target.removeprefix("model.init_args.").split(".")
        node: Any = hparams
        for key in parents:
            node = node.get(key) if isinstance(node, MutableMapping) else None
        if isinstance(node, MutableMapping):
            node.pop(name, None)


def unwrap(err: BaseException) -> KilnError | None:
    """The kiln error raised inside a link's ``compute_fn`` (jsonargparse wraps it in a ValueError)."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, KilnError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None
