"""Fine-tuning: the backbone trains at a fraction of the head's learning rate, or not at all at first.

The split is the network's ``head`` attribute (the layers that map features to classes); the
backbone is every other parameter.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from kiln.errors import ConfigError


def split(net: nn.Module, why: str) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The backbone's parameters and the head's; a network without a ``head`` stops in one line naming ``why``."""
    head = getattr(net, "head", None)
    if not isinstance(head, nn.Module):
        raise ConfigError(
            f"{why}: {type(net).__name__} has no `head` attribute (the layers that map features to classes), "
            "which tells its backbone from its head: give it one, or use a network that has one (research.nets.Timm)"
        )
    own = {id(p) for p in head.parameters()}
    return [p for p in net.parameters() if id(p) not in own], list(head.parameters())


def param_groups(net: nn.Module, why: str) -> list[dict[str, Any]]:
    """Two optimizer groups, named: Lightning's LearningRateMonitor logs ``lr-<Optimizer>/backbone`` and ``/head``."""
    backbone, head = split(net, why)
    return [{"params": backbone, "name": "backbone"}, {"params": head, "name": "head"}]


def hold_statistics(net: nn.Module, frozen: bool) -> None:
    """Batch-norm running statistics of the backbone stay as pretrained while it is frozen."""
    head = {id(m) for m in net.head.modules()}  # type: ignore[union-attr]
    for module in net.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and id(module) not in head:
            module.train(not frozen)


def drop_gradients(params: list[nn.Parameter]) -> None:
    """No gradient reaches the optimizer, so a frozen parameter neither moves nor decays.

    The backbone keeps ``requires_grad`` and runs its backward: DDP syncs only the parameters that
    required gradients when it wrapped the model, so one switched off there and on again later
    would train on each rank's own gradients, silently apart.
    """
    for p in params:
        p.grad = None
