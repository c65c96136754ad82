"""Networks and data with injected faults, importable by ``class_path`` from test configs."""

from __future__ import annotations

import torch
from torch import Tensor

from kiln.data import DigitsDataModule
from kiln.models import ImageClassifier
from kiln.nets import SmallCNN


class NaNAtSteps(SmallCNN):
    """A SmallCNN whose training forward returns NaN at the given 0-based training steps."""

    def __init__(self, steps: list[int], **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.steps = set(steps)
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x)
        if self.training:
            if self.calls in self.steps:
                out = out * float("nan")
            self.calls += 1
        return out


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad * ctx.factor, None


class GradSpikeAtStep(SmallCNN):
    """A SmallCNN whose gradients are multiplied by ``factor`` at one training step (forward unchanged)."""

    def __init__(self, step: int, factor: float = 1e4, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.step, self.factor, self.calls = step, factor, 0

    def forward(self, x: Tensor) -> Tensor:
        out = super().forward(x)
        if self.training:
            if self.calls == self.step:
                out = _ScaleGrad.apply(out, self.factor)
            self.calls += 1
        return out


class LabelsOutOfRange(DigitsDataModule):
    """Digits where every tenth training label is ``num_classes`` (one past the last class)."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        assert self.train_set is not None
        self.train_set.labels[::10] = self.num_classes


class ConstantLabels(DigitsDataModule):
    """Digits whose training labels are all 3."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        assert self.train_set is not None
        self.train_set.labels[:] = 3


class WithApiKey(ImageClassifier):
    """A classifier that takes a secret, as a model calling an external service would."""

    def __init__(self, *args: object, api_key: str = "", **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.api_key = api_key
