"""A multi-layer perceptron on flattened inputs: no BatchNorm or dropout, so per-sample gradients add up exactly."""

import math
from collections.abc import Sequence

from torch import Tensor, nn


class MLP(nn.Module):
    """``depth`` hidden layers of ``hidden`` units with ReLU, on samples of any fixed shape (flattened).

    Useful as a baseline, for feature vectors, and wherever batch-independent gradients matter
    (accumulation and DDP equivalence checks), since nothing in it mixes samples of a batch.

    Args:
        input_shape: One sample's shape (the CLI links it from the data): ``(C, H, W)``, ``(L,)``, ``(F,)``.
        num_outputs: Outputs per sample: one logit per class, or one value per regression target.
        hidden: Units per hidden layer.
        depth: Hidden layers.
    """

    def __init__(
        self,
        input_shape: Sequence[int] = (1, 8, 8),
        num_outputs: int = 10,
        hidden: int = 128,
        depth: int = 2,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(input_shape)
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True)]
            width = hidden
        layers.append(nn.Linear(width, num_outputs))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
