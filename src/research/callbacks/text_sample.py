"""What a language model writes: a text it generates after each test, in the run folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class TextSample(Callback):
    """After a test: ``sample-<checkpoint>.txt``, the test text's first ``prompt`` characters continued by
    ``length`` generated ones (seeded). Needs a module with ``generate`` and data with ``encode``/``decode``.

    Args:
        prompt: Characters of the test text the sample starts from.
        length: Characters generated.
        temperature: Sampling temperature (lower: surer, more repetitive).
    """

    def __init__(self, prompt: int = 24, length: int = 240, temperature: float = 0.8) -> None:
        self.prompt, self.length, self.temperature = prompt, length, temperature
        self.path: Path | None = None

    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        data: Any = getattr(trainer, "datamodule", None)
        generate = getattr(pl_module, "generate", None)
        if not trainer.is_global_zero or not callable(generate) or not hasattr(data, "decode"):
            return
        start = data.test_set.inputs[0][: self.prompt].unsqueeze(0).to(pl_module.device)
        ids = generate(start, self.length, temperature=self.temperature)
        weights = Path(trainer.ckpt_path).stem if trainer.ckpt_path else "in-memory"
        self.path = Path(trainer.default_root_dir) / f"sample-{weights}.txt"
        self.path.write_text(f"weights: {trainer.ckpt_path or 'in memory'}\n\n{data.decode(ids[0])}\n")
