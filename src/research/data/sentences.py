"""Text the project generates: sentences of a small English grammar, read as characters by a language model."""

from __future__ import annotations

import random

import torch
from torch import Tensor

from kiln.data import TensorDataModule

SUBJECTS = ("the cat", "a dog", "my sister", "the old man", "a small bird", "the teacher", "our neighbour", "the king")
VERBS = ("sees", "likes", "finds", "follows", "watches", "helps", "paints", "calls", "remembers")
OBJECTS = ("the garden", "a red ball", "the river", "an apple", "the moon", "a letter", "the door", "her friend")
PLACES = ("in the morning", "at night", "by the sea", "after school", "under the bridge", "on sunday")


def sentences(n: int, seed: int) -> str:
    """``n`` sentences (subject, verb, object, sometimes a place and a second clause), a few per line."""
    rng = random.Random(seed)  # its own generator: the global RNGs stay as they are
    lines, line = [], []
    for _ in range(n):
        words = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)]
        if rng.random() < 0.4:
            words.append(rng.choice(PLACES))
        if rng.random() < 0.3:
            words += ["and", rng.choice(VERBS), rng.choice(OBJECTS)]
        text = " ".join(words)
        line.append(text[0].upper() + text[1:] + ".")
        if rng.random() < 0.25:
            lines.append(" ".join(line))
            line = []
    return "\n".join([*lines, " ".join(line)]) + "\n"


class SentencesDataModule(TensorDataModule):
    """Next-character prediction: windows of ``block_size`` character ids, each with the same window one
    character on as its target (int64 ``(block_size,)`` both, never normalised).

    The text is generated from ``seed`` and cut in order into train, validation and test parts, so no
    window of one part overlaps another. Declares ``vocab_size`` and ``block_size`` (linked into the
    model) and ``alphabet``; ``encode``/``decode`` turn text into ids and back.

    Args:
        num_sentences: Sentences generated.
        block_size: Characters per window (the model's context).
        stride: Characters between the starts of two training windows.
        val_fraction: Share of the text used for validation.
        test_fraction: Share held out for the final test.
        seed: Seed of the text.
        **kwargs: Loader options of :class:`TensorDataModule`.
    """

    def __init__(
        self,
        num_sentences: int = 4000,
        block_size: int = 64,
        stride: int = 32,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.text = sentences(num_sentences, seed)
        self.alphabet = "".join(sorted(set(self.text)))
        self.vocab_size, self.block_size, self.stride = len(self.alphabet), block_size, stride
        self.input_shape = (block_size,)
        self.fractions = (1 - val_fraction - test_fraction, val_fraction)

    def encode(self, text: str) -> Tensor:
        return torch.tensor([self.alphabet.index(c) for c in text], dtype=torch.long)

    def decode(self, ids: Tensor) -> str:
        return "".join(self.alphabet[i] for i in ids.tolist())

    def _windows(self, ids: Tensor, stride: int) -> tuple[Tensor, Tensor]:
        starts = range(0, len(ids) - self.block_size - 1, stride)
        x = torch.stack([ids[s : s + self.block_size] for s in starts])
        return x, torch.stack([ids[s + 1 : s + self.block_size + 1] for s in starts])

    def load(self) -> None:
        ids = self.encode(self.text)
        train_end = int(self.fractions[0] * len(ids))
        val_end = train_end + int(self.fractions[1] * len(ids))
        parts = {"train": ids[:train_end], "val": ids[train_end:val_end], "test": ids[val_end:]}
        for split, part in parts.items():  # evaluation windows do not overlap: each character scored once
            x, y = self._windows(part, self.stride if split == "train" else self.block_size)
            setattr(self, f"{split}_set", self.make_dataset(x, y, train=split == "train"))
