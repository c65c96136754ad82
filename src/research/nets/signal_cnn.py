"""A small 1-D convolutional classifier for signals and sequences of any length."""

from torch import Tensor, nn


class SignalCNN(nn.Module):
    """Three 1-D conv blocks, global average pooling, a linear head, on ``(batch, channels, length)``.

    Args:
        in_channels: Channels of each sample (the CLI links it from the data).
        num_classes: Output logits.
        width: Channels of the first block (the others have twice as many).
        kernel_size: Odd convolution width.
        dropout: Dropout before the head.
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 4, width: int = 32, kernel_size: int = 5, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        layers: list[nn.Module] = []
        channels = in_channels
        for out in (width, 2 * width, 2 * width):
            layers += [
                nn.Conv1d(channels, out, kernel_size, padding=kernel_size // 2, bias=False),
                nn.BatchNorm1d(out),
                nn.ReLU(inplace=True),
                nn.MaxPool1d(2, ceil_mode=True),
            ]
            channels = out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(channels, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
