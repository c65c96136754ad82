"""Speed settings for any LightningModule: ``torch.compile`` and channels-last memory, kept out of the research code."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn

from kiln.console import say
from kiln.training.contracts import datamodule, sample_shape


class Compile(Callback):
    """``torch.compile`` the LightningModule's ``forward`` in place, before the first batch of every stage.

    Only what ``self(x)`` runs is compiled (not ``training_step``, so ``self.log`` works as ever); the parameter
    names stay, so checkpoints load into an uncompiled module. The model summary runs before, uncompiled.

    Args:
        mode: ``torch.compile``'s mode (``default``, ``reduce-overhead``, ``max-autotune``).
        dynamic: ``torch.compile``'s ``dynamic``. ``False``: one graph per batch shape, each specialised; with
            torch's automatic choice (``None``) an epoch's last, smaller batch turns the module into a shape-generic
            graph that every later batch then runs. ``None`` suits inputs whose length varies from batch to batch
            (more than torch's 8 recompilations).
        fullgraph: Fail on a graph break instead of running that part eagerly.
        backend: ``torch.compile``'s backend: ``inductor`` generates kernels; ``aot_eager`` captures the same
            graphs (forward and backward) and runs them with torch's own kernels, to tell a capture problem from a
            code-generation one, and in seconds where inductor's C++ build takes a minute on a CPU.
    """

    def __init__(
        self, mode: str | None = None, dynamic: bool | None = False, fullgraph: bool = False, backend: str = "inductor"
    ) -> None:
        self.mode, self.dynamic, self.fullgraph, self.backend = mode, dynamic, fullgraph, backend
        self._compiled: nn.Module | None = None

    def _compile(self, pl_module: LightningModule) -> None:
        if self._compiled is not pl_module:
            pl_module.compile(mode=self.mode, dynamic=self.dynamic, fullgraph=self.fullgraph, backend=self.backend)
            self._compiled = pl_module

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._compile(pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._compile(pl_module)

    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._compile(pl_module)

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._compile(pl_module)


@torch.compiler.disable
def _nhwc(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The forward's 4-D tensor arguments in channels-last layout (others as they are); left out of ``Compile``'s
    graphs, where it was a graph of its own that each step dispatched beside the forward's (benchmarks/README.md)."""
    return tuple(
        a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.ndim == 4 else a
        for a in args
    )


class ChannelsLast(Callback):
    """Weights and image inputs in NHWC layout: faster convolutions on GPUs with tensor cores (with ``bf16-mixed`` or
    ``16-mixed``). Images only: for data that declares another ``input_shape`` it steps aside, saying so in one line.
    """

    def __init__(self) -> None:
        self._hook: Any = None
        self._said = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        shape = sample_shape(datamodule(trainer))
        if shape is not None and len(shape) != 3:
            if not self._said:  # once a command, not once a stage
                say(f"ChannelsLast: off, as samples of shape {tuple(shape)} are not images (C, H, W)")
                self._said = True
            return
        pl_module.to(memory_format=torch.channels_last)
        if self._hook is None:
            self._hook = pl_module.register_forward_pre_hook(_nhwc)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
