"""Lightning's instantiator of the model and the data, told only the links jsonargparse applied."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import _InstantiatorFn as _InstantiatorFn  # docs/development.md: private APIs


class Instantiator(_InstantiatorFn):
    """Lightning's instantiator, told only the links jsonargparse applied: a link into a network the chosen model
    does not take (a self-contained LightningModule) is ignored by jsonargparse, but Lightning would still write it
    into the hyper-parameters and fail there (``Expected key model.init_args.net… to be in data``)."""

    def __call__(self, class_type: Any, *args: Any, applied_instantiation_links: dict, **kwargs: Any) -> Any:
        self.cli._dump_config()
        built = self.cli.config_dump.get(self.key, {})
        applied = {key: value for key, value in applied_instantiation_links.items() if _has_parent(built, key)}
        return super().__call__(class_type, *args, applied_instantiation_links=applied, **kwargs)


def _has_parent(config: dict[str, Any], key: str) -> bool:
    """Whether ``config`` (one section of the CLI's config) holds the node a link target ``key`` sits in."""
    node: Any = config
    for part in key.split(".")[1:-1]:  # after the section's own name, up to the argument
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, dict)
