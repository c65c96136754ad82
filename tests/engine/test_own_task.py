"""A user's own task in plain Lightning (a collate_fn of its own, another monitor, `run.without` in its experiment):
rerun, replace and resume as the README promises, and Lightning's refusals of their code said as theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forkserver
import pytest
import torch
import yaml
from helpers import PROBES

# images of different sizes, batched as a list of tensors, and a module that pools each one
TASK = '''
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule
from torch.utils.data import DataLoader, Dataset

from kiln.data import ResumableSampler


class Shapes(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = [torch.randn(3, 6 + i % 5, 6 + i % 3, generator=g) + self.labels[i] for i in range(n)]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, key):
        i = key[1] if isinstance(key, tuple) else key  # ResumableSampler yields (epoch, index)
        return self.images[i], self.labels[i]


class Alternating:
    """Batches of 2 and 4 samples in turn: a batch sampler with no one batch size."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        keys, start, size = list(self.sampler), 0, 2
        while start < len(keys):
            yield keys[start : start + size]
            start, size = start + size, 6 - size

    def __len__(self):
        return -(-len(self.sampler) // 3)


def as_list(items):
    return [x for x, _ in items], torch.stack([y for _, y in items])


class ListImages(LightningDataModule):
    def __init__(self, batch_size: int = 6, positional: bool = False, alternating: bool = False):
        super().__init__()
        self.batch_size, self.positional, self.alternating, self.at = batch_size, positional, alternating, None

    def setup(self, stage):
        self.train_set, self.val_set, self.test_set = Shapes(96, 0), Shapes(24, 1), Shapes(24, 2)

    def resume_at(self, epoch, samples):
        self.at = (epoch, samples)

    def train_dataloader(self):
        sampler = ResumableSampler(self.train_set, 0, self.trainer.world_size, self.trainer.global_rank)
        if self.at is not None:
            sampler.set_epoch(self.at[0])
            sampler.skip, self.at = self.at[1], None
        if self.alternating:
            return DataLoader(self.train_set, batch_sampler=Alternating(sampler), collate_fn=as_list)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, collate_fn=as_list)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=as_list)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size, collate_fn=as_list)

    def predict_dataloader(self):
        if self.positional:
            return DataLoader(self.test_set, self.batch_size, collate_fn=as_list)
        return DataLoader(self.test_set, batch_size=self.batch_size, collate_fn=as_list)


class PlainImages(ListImages):
    """Plain Lightning: the loader shuffles itself (a RandomSampler), and nothing says how to resume its order."""

    resume_at = None  # no contract: kiln makes the plain order resumable itself

    def __init__(self, batch_size: int = 6, num_workers: int = 0, persistent: bool = True):
        super().__init__(batch_size)
        self.num_workers, self.persistent = num_workers, persistent

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, collate_fn=as_list,
                          num_workers=self.num_workers, persistent_workers=self.persistent and self.num_workers > 0)


class ListNet(LightningModule):
    def __init__(self, lr: float = 0.05, log_val_loss: bool = True):
        super().__init__()
        self.save_hyperparameters()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(8, 4))

    def forward(self, images):
        return self.head(torch.cat([self.conv(x[None]).mean((2, 3)) for x in images]))

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch[0]), batch[1])

    def _score(self, batch, stage):
        logits, labels = self(batch[0]), batch[1]
        if self.hparams.log_val_loss or stage != "val":
            self.log(f"{stage}/loss", F.cross_entropy(logits, labels), batch_size=len(labels))
        self.log(f"{stage}/acc", (logits.argmax(1) == labels).float().mean(), batch_size=len(labels))

    def validation_step(self, batch, batch_idx):
        self._score(batch, "val")

    def test_step(self, batch, batch_idx):
        self._score(batch, "test")

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
'''

# the README's way to leave a check out and to replace the default ModelCheckpoint
EXPERIMENT = """
run: {name: shapes, without: [BatchGrid, ModelCheckpoint]}
trainer:
  max_epochs: 2
  logger: false
  enable_progress_bar: false
  callbacks+:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {monitor: val/acc, mode: max, filename: "best-{epoch}"}
model: {class_path: task.ListNet}
data: {class_path: task.ListImages, init_args: {batch_size: 6}}
"""


def kiln(folder: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """``kiln`` in a process of its own, in ``folder``, with the task importable as a project's code is (forked from
    the suite's preloaded server: a stop, its line, code and resume as a real process's, test_forkserver.py)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join([str(folder), PROBES])}
    command = [sys.executable, "-m", "kiln", *map(str, args)]
    return forkserver.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "experiment.yaml").write_text(EXPERIMENT)
    return tmp_path


def val_metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())["val"]


@pytest.mark.slow
def test_a_replaced_model_checkpoint_keeps_its_best_which_is_tested_and_config_yaml_reruns_to_the_same_value(
    project: Path,
) -> None:
    first = kiln(project, "fit", "-c", "experiment.yaml")
    assert first.returncode == 0, first.stderr[-3000:]
    (run,) = (project / "runs" / "shapes").iterdir()
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert saved == ["best-epoch=0.ckpt", "last.ckpt"] or saved == ["best-epoch=1.ckpt", "last.ckpt"], saved
    val = val_metrics(run)  # was: monitor val/loss, best null, and the summary tested last
    assert val["monitor"] == "val/acc" and val["best"]["val/acc"] == max(val["best"]["val/acc"], val["last"]["val/acc"])
    tested = json.loads((run / "metrics.json").read_text())["test"][0]
    assert tested["label"] == "best" and Path(tested["checkpoint"]).name == saved[0]
    log = (run / "console.log").read_text()
    assert "ModelCheckpoint: left out, as run.without names it; the ModelCheckpoint added after it replaces it" in log
    assert log.count("ModelCheckpoint: left out") == 1
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["without"] == []  # the list is what ran
    again = kiln(project, "fit", "-c", run / "config.yaml")  # was: run.without: no callback BatchGrid in …
    assert again.returncode == 0, again.stderr[-3000:]
    (rerun,) = (p for p in (project / "runs" / "shapes").iterdir() if p != run)
    assert val_metrics(rerun) == val_metrics(run)


@pytest.mark.slow
def test_a_sweep_over_an_experiment_with_run_without_reruns_its_best_yaml_to_the_best_trials_value(
    project: Path,
) -> None:
    spec = {"name": "shapes", "n_trials": 2, "pruner": "none", "metric": "val/acc", "direction": "maximize",
            "args": ["-c", "experiment.yaml"], "space": {"model.init_args.lr": {"low": 0.01, "high": 0.1}}}  # fmt: skip
    (project / "sweep.yaml").write_text(yaml.safe_dump(spec))
    swept = kiln(project, "sweep", "-c", "sweep.yaml")
    assert swept.returncode == 0, swept.stderr[-3000:]
    best = project / "runs" / "sweeps" / "shapes" / "best.yaml"
    value = float(best.read_text().split("val/acc ", 1)[1].split()[0])
    again = kiln(project, "fit", "-c", best)  # was: exit 2, run.without: no callback BatchGrid in …
    assert again.returncode == 0, again.stderr[-3000:]
    (rerun,) = (project / "runs" / "shapes-best").iterdir()
    assert val_metrics(rerun)["best"]["val/acc"] == pytest.approx(value, abs=5e-7)  # best.yaml's header: 6 digits


def final_weights(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")["state_dict"]


@pytest.mark.slow
def test_a_list_of_tensors_batch_stopped_mid_epoch_resumes_bitwise_to_the_uninterrupted_run(project: Path) -> None:
    args = ["fit", "-c", "experiment.yaml", "--run.test_after_fit", "false"]
    whole = kiln(project, *args, "--run.root", "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    stop = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=23",  # 7 batches into epoch 1
            "--trainer.callbacks.name=SIGUSR1", f"--trainer.callbacks.marker={project / 'sent'}"]  # fmt: skip
    cut = kiln(project, *args, *stop, "--run.root", "cut")
    assert cut.returncode == 138, cut.stderr[-3000:]
    resumed = kiln(project, *args, *stop, "--run.root", "cut", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (ran,), (cut_run,) = (project / "whole" / "shapes").iterdir(), (project / "cut" / "shapes").iterdir()
    weights, expected = final_weights(cut_run), final_weights(ran)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)  # was: 21 samples skipped for 42
    said = (cut_run / "console.log").read_text() + resumed.stderr
    assert "ambiguous collection" not in said  # Lightning's warning on kiln's own guess of the batch size
    assert "not an exact resume" not in said and "cannot resume" not in said
    alternating = [*args, *stop, "--run.root", "alternating", "--data.init_args.alternating", "true"]
    (project / "sent").unlink()
    assert kiln(project, *alternating).returncode == 138
    resumed = kiln(project, *alternating, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (  # never silence: was resumed 69 samples (23 batches counted as 3 each) into epoch 0, without a word
        "the training loader has no batch_size (a batch_sampler of its own), so where in epoch 0 the run stopped is "
        "unknown: the epoch starts over from its first sample, not an exact resume"
    ) in resumed.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, True), (2, False)],
                         ids=["in_process", "persistent_workers", "workers"])  # fmt: skip
def test_a_plain_shuffling_dataloader_stopped_mid_epoch_resumes_bitwise_with_no_code_of_its_own(
    project: Path, workers: int, persistent: bool
) -> None:
    args = ["fit", "-c", "experiment.yaml", "--run.test_after_fit", "false", "--data.class_path", "task.PlainImages",
            "--data.init_args.num_workers", str(workers), "--data.init_args.persistent", str(persistent)]  # fmt: skip
    whole = kiln(project, *args, "--run.root", "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    stop = ["--trainer.callbacks+=probes.SignalAtStep", "--trainer.callbacks.step=23",  # 7 batches into epoch 1
            "--trainer.callbacks.name=SIGTERM", f"--trainer.callbacks.marker={project / 'sent'}"]  # fmt: skip
    assert kiln(project, *args, *stop, "--run.root", "cut").returncode == 143
    resumed = kiln(project, *args, *stop, "--run.root", "cut", "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (ran,), (cut_run,) = (project / "whole" / "shapes").iterdir(), (project / "cut" / "shapes").iterdir()
    weights, expected = final_weights(cut_run), final_weights(ran)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)  # was: other weights, and the line below
    assert "cannot resume" not in (cut_run / "console.log").read_text() + resumed.stderr


@pytest.mark.slow
def test_lightnings_refusals_of_the_users_code_are_one_line_naming_theirs_not_an_internal_error(
    project: Path,
) -> None:
    unlogged = kiln(project, "fit", "-c", "experiment.yaml", "--run.without", "[BatchGrid]",
                    "--model.init_args.log_val_loss", "false")  # fmt: skip
    assert unlogged.returncode == 1, unlogged.stderr[-3000:]
    assert unlogged.stderr.strip().splitlines()[-1] == (
        "error: ModelCheckpoint monitors val/loss, which the module does not log (it logged "
        "val/acc): log it with self.log('val/loss', …), or monitor another key (a config with run: {without: "
        "[ModelCheckpoint]} and trainer: {callbacks+: [{class_path: ModelCheckpoint, init_args: {monitor: <key>, "
        "mode: max}}]})"
    )
    assert "Epoch 0" not in unlogged.stderr and not (project / "runs" / "shapes").exists()  # before any training
    trained = kiln(project, "fit", "-c", "experiment.yaml", "--trainer.max_epochs", "1")
    assert trained.returncode == 0, trained.stderr[-3000:]
    positional = kiln(project, "predict", "-c", "experiment.yaml", "--ckpt_path", "last", "--data.positional", "true")
    assert positional.returncode == 1, positional.stderr[-3000:]
    (line,) = [x for x in positional.stderr.splitlines() if x.startswith("error:")]
    assert "internal error" not in line and "please report it" not in line
    assert line.startswith("error: Lightning refused your module, data or config: The DataLoader implementation has")


def test_the_readmes_resume_at_example_starts_its_order_where_the_run_stopped() -> None:
    """README: a sampler of your own resumes exactly through resume_at and ResumableSampler (pairs=False)."""
    import re
    from types import SimpleNamespace

    from lightning.pytorch import LightningDataModule
    from torch.utils.data import DataLoader, TensorDataset

    readme = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()  # a README page
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "def resume_at" in block]
    scope = {"LightningDataModule": LightningDataModule, "DataLoader": DataLoader}
    exec(code, scope)  # the README's own text
    data = scope["MyData"]()
    data.train_set = TensorDataset(torch.arange(100))
    data.trainer = SimpleNamespace(world_size=1, global_rank=0)
    data.resume_at(1, 64)  # stopped two batches into epoch 1
    resumed = [batch[0] for batch in data.train_dataloader()]
    data.resume_at(1, 0)
    whole = [batch[0] for batch in data.train_dataloader()]
    assert torch.equal(torch.cat(resumed), torch.cat(whole)[64:]) and len(resumed) == 2
