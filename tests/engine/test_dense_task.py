"""Two tasks kiln ships no example of, in plain Lightning, through every command. A segmentation: dense class masks
checked against the declared classes, a mid-epoch SIGTERM resumed bitwise with no sampler code, evaluations and
predictions from the checkpoint alone, an export of a two-output head with parity per output, inference on .npy
and PNG inputs, and a multirun read back with kiln.results. A denoising autoencoder: its resume, its predicted
images and its export the same way."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import forkserver
import numpy as np
import pytest
import torch
from helpers import PROBES
from PIL import Image

from kiln import results

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


class Noisy(Blobs):
    """The same images with noise added: inputs noisy, targets clean (no classes)."""

    num_classes = class_names = None

    def setup(self, stage):
        g = torch.Generator().manual_seed(3)
        clean = [blobs(64, 0).tensors[0], blobs(16, 1).tensors[0], blobs(16, 2).tensors[0]]
        self.sets = [TensorDataset(x + 0.3 * torch.randn(x.shape, generator=g), x) for x in clean]


class Denoiser(LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                       torch.nn.Conv2d(8, 1, 3, padding=1))

    def forward(self, x):
        return x + self.net(x)

    def training_step(self, batch, batch_idx):
        return F.mse_loss(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", F.mse_loss(self(batch[0]), batch[1]))

    def test_step(self, batch, batch_idx):
        self.log("test/loss", F.mse_loss(self(batch[0]), batch[1]))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
'''

EXPERIMENT = """
run: {name: blobs}
trainer: {max_epochs: 2, logger: false, enable_progress_bar: false}
model: {class_path: task.SegNet}
data: {class_path: task.Blobs, init_args: {batch_size: 8}}
"""
DENOISE = ["--model", "task.Denoiser", "--data", "task.Noisy", "--data.init_args.batch_size", "8", "--run.name",
           "denoise"]  # fmt: skip


def kiln(folder: Path, *args: str | Path, wandb: str = "disabled") -> subprocess.CompletedProcess:
    """``kiln`` in a process of its own in ``folder``, the task importable as a project's code is."""
    env = {**os.environ, "WANDB_MODE": wandb, "PYTHONPATH": os.pathsep.join([str(folder), PROBES])}
    done = forkserver.run([sys.executable, "-m", "kiln", *map(str, args)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    return done


def weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["state_dict"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    return tmp_path


def fit_stopped_and_resumed(project: Path, fit: list[str], name: str) -> Path:
    """The run stopped by SIGTERM 3 batches into its second epoch and resumed, checked bitwise against one never
    stopped; its folder."""
    assert (whole := kiln(project, *fit, "--run.root", "whole")).returncode == 0, whole.stderr[-3000:]
    stop = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=11",
            "--trainer.callbacks.name=SIGTERM", f"--trainer.callbacks.marker={project / 'sent'}"]  # fmt: skip
    assert kiln(project, *fit, *stop, "--run.root", "runs").returncode == 143
    resumed = kiln(project, *fit, *stop, "--run.root", "runs", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (run,), (ran,) = (project / "runs" / name).iterdir(), (project / "whole" / name).iterdir()
    expected = weights(ran)
    assert all(torch.equal(weights(run)[k], expected[k]) for k in expected)  # no sampler code in the task
    assert "cannot resume" not in resumed.stderr and "labels" not in resumed.stderr  # dense labels pass the checks
    return run


def rebuilt_outputs(project: Path, run: Path) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """The test split's inputs and targets, and the module's output on them, from the run's last checkpoint."""
    sys.path.insert(0, str(project))
    try:
        from kiln.cli.from_checkpoint import rebuild

        model, data = rebuild(run / "checkpoints" / "last.ckpt")
    finally:
        sys.path.remove(str(project))
    data.setup("predict")
    x, targets = data.sets[2].tensors
    with torch.inference_mode():
        return x, targets, model.eval()(x)


@pytest.mark.slow
def test_a_segmentation_in_plain_lightning_goes_through_every_command(project: Path) -> None:
    tmp_path = project
    fit = ["fit", "-c", "experiment.yaml"]
    run = fit_stopped_and_resumed(tmp_path, fit, "blobs")

    maps = ["--trainer.callbacks+=kiln.callbacks.PredictionWriter", "--trainer.callbacks.class_maps=true"]
    for command in ("validate", "test", "predict"):  # the checkpoint alone: its config and run folder
        done = kiln(
            tmp_path, command, "--ckpt_path", run / "checkpoints" / "last.ckpt", *maps[: 2 * (command == "predict")]
        )
        assert done.returncode == 0, done.stderr[-3000:]
    (predicted,) = run.parent.glob("predict-*")  # beside the run it read
    assert (
        f"{len(list((predicted / 'predictions-prediction').iterdir()))} class maps in predictions-prediction/"
        in done.stderr
    )
    x, masks, eager = rebuilt_outputs(tmp_path, run)
    logged = kiln(tmp_path, "test", "--ckpt_path", run / "checkpoints" / "last.ckpt", "--trainer.logger",
                  "kiln.training.loggers.Wandb", wandb="offline")  # fmt: skip
    assert "ConfidentMistakes: no table of mistakes" in logged.stderr
    assert not list(run.parent.glob("test-*/wandb/offline-run-*/files/media/table/**/*.json"))  # was: an empty one
    assert np.allclose(np.load(predicted / "predictions-prediction.npy"), eager["mask"].numpy(), atol=1e-6)
    assert np.array_equal(np.load(predicted / "predictions-target.npy"), masks.numpy())
    for name, classes in (("prediction", eager["mask"].argmax(1)), ("target", masks)):  # class maps as images
        shown = [np.asarray(Image.open(predicted / f"predictions-{name}" / f"{i}.png")) for i in range(len(masks))]
        assert np.array_equal(np.stack(shown), classes.numpy()), name  # a pixel's value is its class

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
                    "--class_maps", tmp_path / "sample.npy", tmp_path / "sample.png")  # fmt: skip
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    assert "2 class maps in p-mask/" in inferred.stderr
    inferred_maps = np.stack([np.asarray(Image.open(tmp_path / "p-mask" / f"{i}.png")) for i in range(2)])
    assert np.array_equal(inferred_maps, np.load(tmp_path / "p-mask.npy").argmax(1))  # infer's maps as predict's
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["path"]).name for r in rows] == ["sample.npy", "sample.png"] and "area" in rows[0]
    mask = np.load(tmp_path / "p-mask.npy")
    assert mask.shape == (2, 3, 16, 16) and np.allclose(mask[0], eager["mask"][0].numpy(), atol=1e-4)
    assert float(rows[0]["area"]) == pytest.approx(float(eager["area"][0, 0]), abs=1e-4)

    multirun = kiln(tmp_path, "multirun", "--seeds", "0-1", "--", *fit[1:], "--trainer.max_epochs", "1")
    assert multirun.returncode == 0, multirun.stderr[-3000:]
    table = results.multirun("multirun", root=tmp_path / "runs" / "multirun")
    assert "val/pixel_acc" in " ".join(map(str, table.columns)) + " ".join(map(str, table.index))


@pytest.mark.slow
def test_a_denoising_autoencoder_in_plain_lightning_resumes_predicts_exports_and_infers(project: Path) -> None:
    run = fit_stopped_and_resumed(project, ["fit", "-c", "experiment.yaml", *DENOISE], "denoise")
    done = kiln(project, "predict", "--ckpt_path", run / "checkpoints" / "last.ckpt")
    assert done.returncode == 0, done.stderr[-3000:]
    (predicted,) = run.parent.glob("predict-*")
    x, clean, eager = rebuilt_outputs(project, run)
    assert np.allclose(np.load(predicted / "predictions-prediction.npy"), eager.numpy(), atol=1e-6)
    assert np.array_equal(np.load(predicted / "predictions-target.npy"), clean.numpy())
    served = project / "served"
    exported = kiln(project, "export", "--ckpt_path", run / "checkpoints" / "last.ckpt", "--output", served)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads((served / "parity.json").read_text())["output_names"] == ["output"]
    np.save(project / "noisy.npy", x[:3].numpy())
    inferred = kiln(project, "infer", "--model", served / "model.onnx", "--output", project / "p.csv",
                    project / "noisy.npy")  # fmt: skip
    assert inferred.returncode == 0, inferred.stderr[-3000:]
    assert np.allclose(np.load(project / "p-output.npy"), eager[:3].numpy(), atol=1e-4)
