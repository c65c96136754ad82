"""Plain ``nn.Module`` architectures: no training logic, injected into LightningModules."""

from kiln.nets.cnn import SmallCNN
from kiln.nets.mlp import MLP
from kiln.nets.resnet import ResNet
from kiln.nets.signal_cnn import SignalCNN

__all__ = ["MLP", "ResNet", "SignalCNN", "SmallCNN"]
