"""Networks and data with injected faults, importable by ``class_path`` from test configs."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kiln.data.datasets import InMemoryDataset
from research.data import DigitsDataModule
from research.models import Classifier
from research.nets import SmallCNN


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
        assert isinstance(self.train_set, InMemoryDataset)
        self.train_set.targets[::10] = self.num_classes


class ConstantLabels(DigitsDataModule):
    """Digits whose training labels are all 3."""

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        assert isinstance(self.train_set, InMemoryDataset)
        self.train_set.targets[:] = 3


class WithApiKey(Classifier):
    """A classifier that takes a secret, as a model calling an external service would."""

    def __init__(
        self,
        *args: object,
        api_key: str = "",
        api_keys: dict[str, str] | None = None,
        password: int | None = None,
        auth: dict[str, str] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.api_key, self.api_keys, self.password, self.auth = api_key, api_keys, password, auth


class NaNInputAtStep(SmallCNN):
    """A SmallCNN whose first input sample is NaN at one training step, as one corrupt image would be:
    BatchNorm's running statistics take the NaN in the forward pass, before any loss is seen."""

    def __init__(self, step: int, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.step, self.calls = step, 0

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            if self.calls == self.step:
                x = x.clone()
                x[0] = float("nan")
            self.calls += 1
        return super().forward(x)


class EmptySplit(DigitsDataModule):
    """Digits with an empty ``train`` or ``val`` split, as a wrong folder or fraction gives."""

    def __init__(self, empty: str = "train", **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.empty = empty

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        split = getattr(self, f"{self.empty}_set")
        emptied = self.make_dataset(split.inputs[:0], split.targets[:0], self.empty == "train")
        setattr(self, f"{self.empty}_set", emptied)


class MissingChannel(DigitsDataModule):
    """Digits declared as 1x8x8 samples but yielded as 8x8 ones, as a forgotten ``unsqueeze(1)`` gives."""

    def make_dataset(self, inputs: Tensor, labels: Tensor, train: bool) -> InMemoryDataset:
        transform = self.train_transform() if train else None
        return InMemoryDataset(inputs.squeeze(1), labels, self.mean, self.std, transform, seed=self.seed)


class CrashAtStep(SmallCNN):
    """A network with a bug: its forward pass raises at training step ``step`` (a crash, not a user error)."""

    def __init__(self, step: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step, self.calls = step, 0

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            self.calls += 1
            if self.calls > self.step:
                raise TypeError("unsupported operand type(s) for +: 'Tensor' and 'NoneType'")
        return super().forward(x)
