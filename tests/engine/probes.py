"""Instruments for effect tests, importable by ``class_path``: fixed data order, recording optimizers, rank dumps."""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from torch.utils.data import DataLoader, DistributedSampler

from research.data import DigitsDataModule
from research.models import Classifier


class FixedOrderDigits(DigitsDataModule):
    """Digits whose training batches come in dataset order, so runs can be compared batch by batch.

    Under DDP, Lightning would swap in a *shuffling* DistributedSampler for any training loader; an
    explicit non-shuffling one is kept, giving rank r the samples r, r + world_size, ...
    """

    def train_dataloader(self) -> DataLoader:
        dataset = super().train_dataloader().dataset
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if world_size == 1:
            return DataLoader(dataset, batch_size=self.batch_size, shuffle=False)
        assert self.trainer is not None
        sampler: DistributedSampler = DistributedSampler(dataset, world_size, self.trainer.global_rank, shuffle=False)
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler)


class RecordingSGD(torch.optim.SGD):
    """SGD that records the total gradient norm it is handed at each step (after any clipping)."""

    def __init__(self, params: Any, lr: float = 0.1) -> None:
        super().__init__(params, lr=lr)
        self.seen_norms: list[float] = []

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None  # Lightning passes the forward/backward as a closure
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.seen_norms.append(float(torch.nn.utils.get_total_norm(grads)))
        super().step()
        return loss


class SaveRankWeights(Callback):
    """Writes each rank's final parameters and logged metrics to ``<dirpath>/rank<N>.pt``."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        Path(self.dirpath).mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        torch.save({"state": state, "metrics": metrics}, Path(self.dirpath) / f"rank{trainer.global_rank}.pt")


class SignalAtStep(Callback):
    """Sends a real signal after optimizer step ``step``, once (a marker file remembers): to this process,
    with ``group`` to its whole process group, DataLoader workers included, as SLURM and systemd do, or
    with ``parent`` to the process that started this one (a sweep's driver) only."""

    def __init__(
        self, step: int, marker: str, name: str = "SIGTERM", group: bool = False, only_in: str | None = None,
        parent: bool = False,
    ) -> None:  # fmt: skip
        self.step, self.marker, self.signal, self.group = step, Path(marker), signal.Signals[name], group
        self.only_in = only_in  # fire only in a run whose folder path holds this (one trial of a sweep)
        self.parent = parent

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Step 0: before the first batch (a signal in the run's start-up, as SLURM's may come)."""
        self._maybe_send(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        self._maybe_send(trainer)

    def _maybe_send(self, trainer: Trainer) -> None:
        if self.only_in is not None and self.only_in not in str(trainer.default_root_dir):
            return
        if trainer.global_step == self.step and not self.marker.exists():
            self.marker.touch()
            if self.group:  # from another process, as SLURM's: workers die at once if not their parent's
                subprocess.run(["kill", f"-{self.signal.name}", "--", f"-{os.getpgrp()}"], check=False)
            else:
                os.kill(os.getppid() if self.parent else os.getpid(), self.signal)


class NativeSignalTakeover(Callback):
    """Built with the Trainer, it sets ``name``'s C-level disposition to ignore behind Python's back, as OpenMPI does
    when Lightning's MPI environment check imports mpi4py: Python's handler table still names its own handler."""

    def __init__(self, name: str = "SIGUSR1") -> None:
        libc = ctypes.CDLL(None)
        libc.signal.restype, libc.signal.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signal.Signals[name].value, 1)  # SIG_IGN


class SignalAtFitEnd(Callback):
    """Sends a real signal to this process's whole group when ``fit`` has trained its last step (the moment a
    sweep's subprocess trial ends), once, in a run whose folder path holds ``only_in``."""

    def __init__(self, marker: str, only_in: str, name: str = "SIGTERM") -> None:
        self.marker, self.only_in, self.signal = Path(marker), only_in, name

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.only_in in str(trainer.default_root_dir) and not self.marker.exists():
            self.marker.touch()
            subprocess.run(["kill", f"-{self.signal}", "--", f"-{os.getpgrp()}"], check=False)


class SignalAsItExits(Callback):
    """At the exit of a run whose folder path holds ``only_in``, once, after it recorded ``finished``: SIGTERM to
    its parent (a sweep's driver, which forwards it here) with Python's default handler back, as it is while
    Python shuts down; the forwarded signal kills this process (the race a process-group SIGTERM can meet)."""

    def __init__(self, marker: str, only_in: str) -> None:
        self.marker, self.only_in = Path(marker), only_in

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.only_in in str(trainer.default_root_dir) and not self.marker.exists():
            self.marker.touch()
            atexit.register(self._stop_parent)

    @staticmethod
    def _stop_parent() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(60)  # the forwarded SIGTERM ends it


class SigtermAsPythonFinalizes(Callback):
    """A SIGTERM to this process as its interpreter ends, as SLURM sends one to every task of a job rank 0 has just
    requeued: at exit, Python's own rule first (a Python handler goes back to the default, an ignored signal stays
    ignored: CPython's signal finalization, which runs after atexit and would leave no Python to send it)."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        atexit.register(self._sigterm_as_python_ends)

    @staticmethod
    def _sigterm_as_python_ends() -> None:
        if callable(signal.getsignal(signal.SIGTERM)):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # time for the default handler, if in place, to end the process


class SignalInEvaluation(Callback):
    """Sends a real signal to this process after batch ``batch`` of an evaluation ``stage`` (``validate``,
    ``test``, ``predict``; in ``fit``, of epoch ``epoch``), once (a marker file remembers)."""

    def __init__(self, stage: str, batch: int, marker: str, name: str = "SIGTERM", epoch: int | None = None) -> None:
        self.stage, self.batch, self.marker, self.signal, self.epoch = stage, batch, Path(marker), name, epoch

    def _maybe_send(self, trainer: Trainer, batch_idx: int) -> None:
        if trainer.sanity_checking or trainer.state.stage != self.stage or batch_idx != self.batch:
            return
        if (self.epoch is None or trainer.current_epoch == self.epoch) and not self.marker.exists():
            self.marker.touch()
            os.kill(os.getpid(), signal.Signals[self.signal])

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._maybe_send(trainer, args[2])

    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._maybe_send(trainer, args[2])

    def on_predict_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._maybe_send(trainer, args[2])


class SignalInTraining(SignalInEvaluation):
    """Sends a real signal to this process after training batch ``batch`` (of epoch ``epoch``), once: inside a
    gradient accumulation when ``batch + 1`` is not a multiple of ``accumulate_grad_batches``."""

    def __init__(self, batch: int, marker: str, name: str = "SIGTERM", epoch: int | None = None) -> None:
        super().__init__("train", batch, marker, name, epoch)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self._maybe_send(trainer, args[2])


class RecordLabels(Callback):
    """Appends each training batch's labels to ``path`` (one JSON list per line): which samples came when."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        with self.path.open("a") as file:
            file.write(json.dumps(batch[1].tolist()) + "\n")


class TeamWandb(WandbLogger):
    """A user's subclass of Lightning's W&B logger (a team's defaults): kiln must treat it as W&B."""


class RecordInputs(Callback):
    """Writes a fingerprint of every training sample this rank saw to ``<folder>/inputs-rank<N>.json``."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: list[float] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.seen += batch[0].flatten(1).sum(1).double().round(decimals=4).tolist()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        (self.folder / f"inputs-rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class GRUNet(torch.nn.Module):
    """A recurrent net over (C, L) signals, whose export makes torch's exporters warn at length."""

    def __init__(self, num_classes: int, in_channels: int = 1, hidden: int = 16) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.gru = torch.nn.GRU(in_channels, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.transpose(1, 2))
        return self.head(out[:, -1])


class RecordRestoredBest(Callback):
    """Writes, as training starts (after a resume restored the callbacks), the best checkpoint it knows."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        best = trainer.checkpoint_callback
        score = getattr(best, "best_model_score", None)
        recorded = {"path": getattr(best, "best_model_path", ""), "score": float(score) if score is not None else None}
        Path(self.path).write_text(json.dumps(recorded))


class SignalAtHook(Callback):
    """Sends a real signal to this process in ``hook``: ``setup`` (before Lightning's own handler is
    installed with the stage) or ``on_fit_end`` (after it is gone, before the test after fit)."""

    def __init__(self, hook: str, name: str = "SIGTERM") -> None:
        self.hook, self.signal = hook, signal.Signals[name]

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.hook == "setup":
            os.kill(os.getpid(), self.signal)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.hook == "on_fit_end":
            os.kill(os.getpid(), self.signal)


class PlainDigits(LightningDataModule):
    """The digits as a plain LightningDataModule: tensors and a shuffling DataLoader, no kiln base class."""

    split: tuple[float, ...] = (0.8, 0.1, 0.1)  # 1438, 180 and 179 digits

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        from research.data.digits import load_digits

        images, labels = load_digits()
        self.sets = torch.utils.data.random_split(
            torch.utils.data.TensorDataset(images.float().div(16).unsqueeze(1), labels),
            list(self.split),
            generator=torch.Generator().manual_seed(0),
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[1], batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[2], batch_size=self.batch_size)


class StreamedDigits(PlainDigits):
    """PlainDigits read through an IterableDataset of the user's own: a position no sampler holds."""

    def train_dataloader(self) -> DataLoader:
        samples = self.sets[0]

        class Stream(torch.utils.data.IterableDataset):
            def __iter__(self) -> Any:
                return iter(samples)

        return DataLoader(Stream(), batch_size=self.batch_size)


class WorkerDigits(PlainDigits):
    """PlainDigits shuffled by a worker that is not persistent: Lightning starts it before kiln orders it, and kiln
    starts Lightning's iterator again."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=True, num_workers=1)


class WeightedDigits(PlainDigits):
    """PlainDigits drawn through a sampler of the user's own (weighted, with replacement): no order kiln can resume."""

    def train_dataloader(self) -> DataLoader:
        weights = [1.0] * len(self.sets[0])
        return DataLoader(self.sets[0], self.batch_size, sampler=torch.utils.data.WeightedRandomSampler(weights, 1000))


class ManyCores(Callback):
    """Lightning sees a 16-core machine (its worker hint needs more than 2 cores; CI has 2)."""

    def __init__(self, cores: int = 16) -> None:
        import lightning.fabric.utilities.data as data

        data._num_cpus_available = lambda: cores


class ShardedValDigits(PlainDigits):
    """PlainDigits with an odd validation set (181) drawn through kiln.data.EvaluationShard, and an odd test set
    (179) through a plain DataLoader, as most LightningDataModules write it."""

    split = (1437, 181, 179)

    def val_dataloader(self) -> DataLoader:
        from kiln.data import EvaluationShard

        assert self.trainer is not None
        shard = EvaluationShard(self.sets[1], self.trainer.world_size, self.trainer.global_rank)
        return DataLoader(self.sets[1], batch_size=self.batch_size, sampler=shard)


class SlurmSignalAtStep(Callback):
    """Asks SLURM to send ``name`` to this job's steps after optimizer step ``step``, once (a marker file
    remembers): ``scancel --signal``, the signal an ``sbatch --signal`` warning or an operator sends."""

    def __init__(self, step: int, marker: str, name: str = "USR1") -> None:
        self.step, self.marker, self.name = step, Path(marker), name

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        if trainer.global_step == self.step and not self.marker.exists():
            self.marker.touch()
            signum = getattr(signal, f"SIG{self.name}")
            held = signal.pthread_sigmask(signal.SIG_BLOCK, {signum})  # scancel, a process of this job step, inherits
            try:  # the block: slurmd's signal reached it too and once ended it before it exited (died with SIGUSR1)
                subprocess.run(["scancel", f"--signal={self.name}", os.environ["SLURM_JOB_ID"]], check=True)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)  # this process's own signal arrives now
            time.sleep(5)  # the signal comes from slurmd meanwhile; the next step boundary acts on it


class GroupAtExit(Callback):
    """Writes, as each rank's interpreter exits, whether torch.distributed's group is still up there (a gloo group
    left for the interpreter's teardown can abort the process: ``terminate called without an active exception``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        path = Path(f"{self.marker}.{trainer.global_rank}.{os.getpid()}")
        atexit.register(lambda: path.write_text(str(torch.distributed.is_initialized())))


class Untested(Classifier):
    """A module without test_step (Lightning's own check: the attribute is None or not overridden)."""

    test_step = None  # type: ignore[assignment]


class FirstSteps(Callback):
    """Appends the step each process starts training at to ``first_steps.txt`` in the run folder: a resume starts
    where the run stopped, a retrain at 0."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        with (Path(trainer.default_root_dir) / "first_steps.txt").open("a") as f:
            f.write(f"{trainer.global_step}\n")


class Masks(LightningDataModule):
    """Inputs (1 x 10 x 10) and their per-pixel class masks (10 x 10): a segmentation's dense targets."""

    def __init__(self, batch_size: int = 8) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        x = torch.randn(40, 1, 10, 10, generator=torch.Generator().manual_seed(0))
        self.sets = [torch.utils.data.TensorDataset(x[i::2], (x[i::2, 0] > 0).long()) for i in range(2)]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[0], batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[1], batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.sets[1], batch_size=self.batch_size)


class PixelNet(LightningModule):
    """Per-pixel class scores (B x 2 x 10 x 10): a dense prediction, in plain Lightning."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TwoHeads(LightningModule):
    """A forward with two named outputs, class scores and a 2-value box: a multi-head model, in plain Lightning."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64 * in_channels, 16), torch.nn.ReLU())
        self.scores, self.box = torch.nn.Linear(16, num_classes), torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        features = self.body(x)
        return {"scores": self.scores(features), "box": self.box(features)}

    def _loss(self, batch: Any) -> torch.Tensor:
        out = self(batch[0])
        return torch.nn.functional.cross_entropy(out["scores"], batch[1]) + out["box"].pow(2).mean()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", self._loss(batch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test/loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TwoMaps(LightningModule):
    """Two maps a pixel (B x 2 x 8 x 8: 128 values a sample): a dense output, too many values for CSV columns."""

    def __init__(self, in_channels: int = 1) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self(batch[0]) - batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", (self(batch[0]) - batch[0]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
