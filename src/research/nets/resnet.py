"""A CIFAR-style ResNet (He et al. 2016, section 4.2) for any channel count and image size."""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


@contextmanager
def _batchnorm_stats_frozen(module: nn.Module) -> Iterator[None]:
    """Keep BatchNorm running statistics as they are while a checkpointed block is recomputed.

    Recomputation runs the block's forward a second time, which would otherwise update the
    running mean/var twice per step and drift from an unchecked run.
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None) for m in norms]
    for m in norms:
        m.momentum = 0.0  # running = (1 - 0) * running + 0 * batch
    try:
        yield
    finally:
        for m, (momentum, tracked) in zip(norms, saved, strict=True):
            m.momentum = momentum
            if tracked is not None and m.num_batches_tracked is not None:
                m.num_batches_tracked.copy_(tracked)


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet-(6n+2): three stages of ``blocks_per_stage`` blocks, widths ``width``, 2x, 4x.

    The default (n=3, width 16) is ResNet-20. Global pooling frees it from a fixed image size.
    ``activation_checkpointing`` recomputes each block's activations in the backward pass instead
    of storing them: less memory for more compute, same losses and gradients.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        width: int = 16,
        blocks_per_stage: int = 3,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.activation_checkpointing = activation_checkpointing
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        in_planes = width
        for i, planes in enumerate((width, 2 * width, 4 * width)):
            for j in range(blocks_per_stage):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_planes, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        if not (self.activation_checkpointing and self.training and x.requires_grad):
            return self.head(self.stages(x))
        for block in self.stages:
            contexts = (nullcontext(), _batchnorm_stats_frozen(block))  # (first forward, recomputation)
            x = checkpoint(block, x, use_reentrant=False, context_fn=lambda c=contexts: c)  # type: ignore[misc]
        return self.head(x)
