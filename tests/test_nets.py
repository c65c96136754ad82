"""Both architectures take 1 or 3 channels and any image size, and return one logit per class."""

import pytest
import torch

from research.nets import ResNet, SmallCNN


@pytest.mark.parametrize("net_class", [SmallCNN, ResNet])
@pytest.mark.parametrize(("channels", "size"), [(1, 8), (1, 28), (3, 32), (3, 17)])
def test_output_shape(net_class: type[torch.nn.Module], channels: int, size: int) -> None:
    net = net_class(in_channels=channels, num_classes=7)
    out = net(torch.randn(4, channels, size, size))
    assert out.shape == (4, 7)
    assert torch.isfinite(out).all()


def test_resnet_depth_follows_blocks_per_stage() -> None:
    convs = lambda net: sum(isinstance(m, torch.nn.Conv2d) for m in net.stages.modules())  # noqa: E731
    # ResNet-20: 3 stages x 3 blocks x 2 convs + 2 projection shortcuts
    assert convs(ResNet(blocks_per_stage=3)) == 3 * 3 * 2 + 2
    assert convs(ResNet(blocks_per_stage=1)) == 3 * 1 * 2 + 2
