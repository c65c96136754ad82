"""Plain ``nn.Module`` architectures: no training logic, injected into LightningModules."""

from typing import TYPE_CHECKING, Any

from research.nets.cnn import SmallCNN
from research.nets.mlp import MLP
from research.nets.resnet import ResNet
from research.nets.signal_cnn import SignalCNN

if TYPE_CHECKING:
    from research.nets.pretrained import Timm

__all__ = ["MLP", "ResNet", "SignalCNN", "SmallCNN", "Timm"]


def __getattr__(name: str) -> Any:
    """``Timm`` on first use: importing timm takes a second and a half that runs without it need not pay."""
    if name == "Timm":
        from research.nets.pretrained import Timm

        return Timm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
