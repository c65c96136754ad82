"""A segmentation in plain Lightning, a task kiln ships no example of, through every command: dense class masks
checked against the declared classes, a mid-epoch SIGTERM resumed bitwise with no sampler code, evaluations and
predictions from the checkpoint alone, an export of a two-output head with parity per output, inference on .npy
and PNG inputs, and a multirun read back with kiln.results."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import numpy as np
import pytest
import torch
from helpers import PROBES
from PIL import Image

TASK = '''
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from torch.utils.data import DataLoader, TensorDataset


def blobs(n, seed):
    """Images (1 x 16 x 16) of a bright square and a dim bar on noise; masks: 0 background, 1 square, 2 bar."""
    g = torch.Generator().manual_seed(seed)
    x, masks = 0.1 * torch.randn(n, 1, 16, 16, generator=g), torch.zeros(n, 16, 16, dtype=torch.long)
    for i, (r, c, b) in enumerate(torch.randint(0, 11, (n, 3), generator=g).tolist()):
        x[i, 0, r : r + 5, c : c + 5] += 1.0
        masks[i, r : r + 5, c : c + 5] = 1
        x[i, 0, b, :] += 0.5
        masks[i, b, :] = torch.where(masks[i, b, :] == 0, 2, masks[i, b, :])
    return TensorDataset(x, masks)


class Blobs(LightningDataModule):
    num_classes = 3
    class_names = ("background", "square", "bar")
    input_shape = (1, 16, 16)

    def __init__(self, batch_size: int = 8):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage):
        self.sets = [blobs(64, 0), blobs(16, 1), blobs(16, 2)]

    def train_dataloader(self):
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.sets[1], batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.sets[2], batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.sets[2], batch_size=self.batch_size)


class SegNet(LightningModule):
    """Per-pixel class scores and, as a second head, the share of the image that is not background."""

    def __init__(self, num_classes: int = 3, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Dropout(0.1))
        self.mask, self.area = torch.nn.Conv2d(8, num_classes, 1), torch.nn.Linear(8, 1)

    def forward(self, x):
        h = self.body(x)
        return {"mask": self.mask(h), "area": torch.sigmoid(self.area(h.mean((2, 3))))}

    def _loss(self, batch):
        out, masks = self(batch[0]), batch[1]
        area = (masks > 0).float().mean((1, 2)).unsqueeze(1)
        return F.cross_entropy(out["mask"], masks) + F.mse_loss(out["area"], area), out["mask"].argmax(1) == masks

    def training_step(self, batch, batch_idx):
        return self._loss(batch)[0]

    def validation_step(self, batch, batch_idx):
        loss, right = self._loss(batch)
        self.log_dict({"val/loss": loss, "val/pixel_acc": right.float().mean()})

    def test_step(self, batch, batch_idx):
        loss, right = self._loss(batch)
        self.log_dict({"test/loss": loss, "test/pixel_acc": right.float().mean()})

    def predict_step(self, batch, batch_idx):
        return self(batch[0])["mask"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
'''

EXPERIMENT = """
run: {name: blobs}
trainer: {max_epochs: 2, logger: false, enable_progress_bar: false}
model: {class_path: task.SegNet}
data: {class_path: task.Blobs, init_args: {batch_size: 8}}
"""


def kiln(folder: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """``kiln`` in a process of its own in ``folder``, the task importable as a project's code is."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join([str(folder), PROBES])}
    done = forkserver.run([sys.executable, "-m", "kiln", *map(str, args)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    return done


def weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["state_dict"]


@pytest.mark.slow
def test_a_segmentation_in_plain_lightning_goes_through_every_command(tmp_path: Path) -> None:
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    fit = ["fit", "-c", "experiment.yaml"]
    assert (whole := kiln(tmp_path, *fit, "--run.root", "whole")).returncode == 0, whole.stderr[-3000:]
    stop = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=11",  # 3 batches into epoch 1
            "--trainer.callbacks.name=SIGTERM", f"--trainer.callbacks.marker={tmp_path / 'sent'}"]  # fmt: skip
    assert kiln(tmp_path, *fit, *stop, "--run.root", "runs").returncode == 143
    resumed = kiln(tmp_path, *fit, *stop, "--run.root", "runs", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run,), (ran,) = (tmp_path / "runs" / "blobs").iterdir(), (tmp_path / "whole" / "blobs").iterdir()
    expected = weights(ran)
    assert all(torch.equal(weights(run)[k], expected[k]) for k in expected)  # no sampler code in the task
    assert "cannot resume" not in resumed.stderr and "labels" not in resumed.stderr  # dense labels pass the checks

    for command in ("validate", "test", "predict"):  # the checkpoint alone: its config and run folder
        done = kiln(tmp_path, command, "--ckpt_path", run / "checkpoints" / "last.ckpt")
        assert done.returncode == 0, done.stderr[-3000:]
    (predicted,) = run.parent.glob("predict-*")  # beside the run it read
    sys.path.insert(0, str(tmp_path))
    try:
        from kiln.cli.from_checkpoint import rebuild

        model, data = rebuild(run / "checkpoints" / "last.ckpt")
    finally:
        sys.path.remove(str(tmp_path))
    data.setup("predict")
    x, masks = data.sets[2].tensors
    with torch.inference_mode():
        eager = model.eval()(x)
    assert np.allclose(np.load(predicted / "predictions-prediction.npy"), eager["mask"].numpy(), atol=1e-6)
    assert np.array_equal(np.load(predicted / "predictions-target.npy"), masks.numpy())

    served = tmp_path / "served"
    exported = kiln(tmp_path, "export", "-c", "experiment.yaml", "--run.root", "runs", "--ckpt_path", "last",
                    "--output", served)  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    parity = json.loads((served / "parity.json").read_text())
    assert parity["output_names"] == ["mask", "area"] and {"onnx", "pt2"} <= set(parity)
    spec = json.loads((served / "preprocess.json").read_text())
    assert spec["class_names"] == ["background", "square", "bar"] and spec["output"] == "output"  # was null

    np.save(tmp_path / "sample.npy", x[0].numpy())
    Image.fromarray((x[1, 0].clamp(0, 1) * 255).round().byte().numpy()).save(tmp_path / "sample.png")
    inferred = kiln(tmp_path, "infer", "--model", served / "model.onnx", "--output", tmp_path / "p.csv",
                    tmp_path / "sample.npy", tmp_path / "sample.png")  # fmt: skip
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["path"]).name for r in rows] == ["sample.npy", "sample.png"] and "area" in rows[0]
    mask = np.load(tmp_path / "p-mask.npy")
    assert mask.shape == (2, 3, 16, 16) and np.allclose(mask[0], eager["mask"][0].numpy(), atol=1e-4)
    assert float(rows[0]["area"]) == pytest.approx(float(eager["area"][0, 0]), abs=1e-4)

    multirun = kiln(tmp_path, "multirun", "--seeds", "0-1", "--", *fit[1:], "--trainer.max_epochs", "1")
    assert multirun.returncode == 0, multirun.stderr[-3000:]
    from kiln import results

    table = results.multirun("multirun", root=tmp_path / "runs" / "multirun")
    assert "val/pixel_acc" in " ".join(map(str, table.columns)) + " ".join(map(str, table.index))
