"""A small character-level language model (a GPT): self-contained, no injected network."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from kiln.training.hparams import save_config
from kiln.training.schedules import optimization


def _adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)


class Block(nn.Module):
    """Causal self-attention, then an MLP, each around a residual with its layer norm first."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, h: Tensor) -> Tensor:
        b, t, c = h.shape
        q, k, v = self.qkv(self.norm1(h)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                                  is_causal=True)  # fmt: skip
        h = h + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return h + self.mlp(self.norm2(h))


class LanguageModel(LightningModule):
    """Next-token cross-entropy on ``(batch, block_size)`` ids; ``generate`` continues a text.

    Args:
        vocab_size: Distinct tokens (linked from the data).
        block_size: Longest context (linked from the data).
        width: Embedding width.
        depth: Transformer blocks.
        heads: Attention heads per block.
        dropout: Dropout in attention and MLPs.
        optimizer: Builds the optimizer from the parameters (``class_path`` in YAML).
        scheduler: Builds an LR scheduler from the optimizer; ``None`` keeps the LR constant.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 64,
        width: int = 96,
        depth: int = 2,
        heads: int = 4,
        dropout: float = 0.1,
        optimizer: OptimizerCallable = _adamw,
        scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        save_config(self)  # the optimizer's and scheduler's configs too: load_from_checkpoint rebuilds them
        self.optimizer, self.scheduler = optimizer, scheduler
        self.embed, self.position = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size)
        self.val_loss = MeanMetric(nan_strategy="disable")  # per character, over every rank; NaN kept, not dropped
        self.test_loss = MeanMetric(nan_strategy="disable")
        self.val_acc = MulticlassAccuracy(vocab_size, average="micro")
        self.test_acc = MulticlassAccuracy(vocab_size, average="micro")
        self.example_input_array = torch.zeros(1, block_size, dtype=torch.long)  # the summary's FLOPs and sizes

    def forward(self, ids: Tensor) -> Tensor:
        """Logits ``(batch, time, vocab_size)``: each position's guess of the next token."""
        h = self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.norm(self.blocks(h)))

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def training_step(self, batch: Sequence[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return self._loss(self(x), y)  # kiln's TrainLoss logs it (train/loss)

    def _evaluate(self, batch: Sequence[Tensor], loss: MeanMetric, accuracy: MulticlassAccuracy) -> Tensor:
        x, y = batch
        logits = self(x)
        loss.update(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none"))  # each character's
        accuracy.update(logits.flatten(0, 1), y.flatten())
        return logits

    def validation_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_loss, self.val_acc)

    def on_validation_epoch_end(self) -> None:
        self.log("val/loss", self.val_loss)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: Sequence[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_loss, self.test_acc)

    def on_test_epoch_end(self) -> None:
        self.log("test/loss", self.test_loss)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        """Each position's likeliest next token, ``(batch, time)``."""
        return self(batch[0] if isinstance(batch, list | tuple) else batch).argmax(-1)

    def prediction_columns(self, prediction: Tensor, batch: Any) -> dict[str, list[str]]:
        """predictions.csv (kiln's contract): the window, its next characters, and the model's guess of them."""
        data = getattr(self.trainer, "datamodule", None)
        decode = getattr(data, "decode", lambda ids: " ".join(map(str, ids.tolist())))
        x, y = batch if isinstance(batch, list | tuple) else (batch, None)
        columns = {"input": [decode(row) for row in x], "predicted": [decode(row) for row in prediction]}
        return columns if y is None else {**columns, "target": [decode(row) for row in y]}

    @torch.inference_mode()
    def generate(self, ids: Tensor, tokens: int, temperature: float = 0.8, seed: int = 0) -> Tensor:
        """``ids`` continued by ``tokens`` sampled ones (seeded: the same text every time)."""
        generator = torch.Generator(device=ids.device).manual_seed(seed)
        block = self.hparams["block_size"]
        for _ in range(tokens):
            logits = self(ids[:, -block:])[:, -1] / temperature
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
        return ids

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer(self.parameters())
        return optimization(self.trainer, optimizer, self.scheduler(optimizer) if self.scheduler else None)
