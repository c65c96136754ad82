"""A multi-layer perceptron on flattened images: no BatchNorm or dropout, so per-sample gradients add up exactly."""

from torch import Tensor, nn


class MLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` units with ReLU, on images of a fixed size.

    Useful as a baseline and wherever batch-independent gradients matter (accumulation and DDP
    equivalence checks), since nothing in it mixes samples of a batch.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        image_size: tuple[int, int] = (8, 8),
        hidden: int = 128,
        depth: int = 2,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_channels * image_size[0] * image_size[1]
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
