"""Make a resumed run continue bitwise as if it had never stopped."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import BatchSampler, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from kiln.callbacks import metric_states
from kiln.console import say
from kiln.data.sampling import ResumableSampler
from kiln.training.contracts import ResumesMidEpoch, datamodule


def capture_rng() -> dict[str, Any]:
    """Every RNG state that training draws from, as types ``torch.load(weights_only=True)`` accepts."""
    _, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    keys = np.asarray(keys)
    version, python_state, python_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "state": list(python_state), "gauss": python_gauss},
    }


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))


def relocated(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """A ``ModelCheckpoint`` state with every path under ``old`` moved under ``new``."""

    def move(path: Any) -> Any:
        return new + path[len(old) :] if isinstance(path, str) and path.startswith(old) else path

    moved = {key: move(value) for key, value in state.items()}
    if isinstance(state.get("best_k_models"), dict):
        moved["best_k_models"] = {move(path): score for path, score in state["best_k_models"].items()}
    return moved


def samples_per_batch(loader: Any) -> int | None:
    """The samples of each batch of a training loader but its last: its ``batch_size``, or its batch sampler's;
    None for one whose batches vary (a guess from a batch's tensors miscounts a list of samples)."""
    size = getattr(loader, "batch_size", None)
    size = size if size is not None else getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and size > 0 else None


def resumable_order(loader: Any, seed: int) -> ResumableSampler | None:
    """A plain DataLoader's order (shuffled, in order, or Lightning's ``DistributedSampler`` under DDP) swapped for
    a ``ResumableSampler`` of the same kind: a function of (seed, epoch) that a resume can skip into, so any
    DataModule resumes exactly with no code of its own. None for any other order (a sampler of the user's own,
    batches of no one size, an iterable dataset), which is left as it is."""
    batches = getattr(loader, "batch_sampler", None)
    order = getattr(batches, "sampler", None)
    if isinstance(order, ResumableSampler):  # made so before (or by the user)
        return order
    if type(batches) is not BatchSampler:
        return None
    if type(order) is RandomSampler and not order.replacement and order.num_samples == len(order.data_source):
        shuffle, ranks, rank = True, 1, 0
    elif type(order) is SequentialSampler:
        shuffle, ranks, rank = False, 1, 0
    elif type(order) is DistributedSampler and not order.drop_last:
        shuffle, ranks, rank, seed = order.shuffle, order.num_replicas, order.rank, order.seed
    else:
        return None
    batches.sampler = ResumableSampler(loader.dataset, seed, ranks, rank, shuffle, pairs=False)
    return batches.sampler


class ExactResume(Callback):
    """Saves RNG states, the position in the epoch's data order and the module's metric states; restores them.

    Lightning restores weights, optimizer, scheduler and loop counters, but restarts the data
    iterator at the start of the epoch (replaying batches) and does not restore RNG states.
    With :class:`~kiln.data.sampling.ResumableSampler` the order is a function of (seed, epoch),
    so skipping the batches already trained on, and restoring the RNG right before the next
    batch, continues the run bitwise on CPU (with the ``deterministic`` preset on GPU). The
    module's torchmetrics (an epoch's training accuracy so far) are not in Lightning's checkpoints
    either: their states go in too, but those of a validation a resume runs again.
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None
        self._trainer: Trainer | None = None
        self._position: tuple[int, int | None] = (0, 0)  # (epoch, samples this rank trained on) a save resumes at
        self._before_validation: dict[str, int] = {}  # metric update counts as this validation began
        self._metrics_epoch: int | None = None  # the epoch of the metric states a resume put back
        self._batch_size: int | None = None  # the training loader's, read at each epoch's start
        self._order_seed = 0  # the seed of a plain loader's order made resumable (resumable_order), kept by a resume

    def state_dict(self) -> dict[str, Any]:
        # samples, not batches: a resume with another batch size neither replays nor skips data
        return {"rng": capture_rng(), "epoch": self._position[0], "samples": self._position[1],
                "order_seed": self._order_seed}  # fmt: skip

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # after the epoch's last batch, a checkpoint (e.g. at validation end) resumes with a new epoch
        epoch, (done_epoch, done) = trainer.current_epoch, self._position
        done = done if done_epoch == epoch else 0
        size = self._batch_size
        if trainer.is_last_batch:
            self._position = (epoch + 1, 0)
        else:  # a loader without a batch size of its own: where in the epoch is unknown (None), never guessed
            self._position = (epoch, done + size if size is not None and done is not None else None)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer  # load_state_dict gets no trainer, and must reach the datamodule
        self._order_seed = torch.initial_seed() & 0xFFFF_FFFF  # what seed_everything set; a resume's comes after

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._before_validation = metric_states.update_counts(pl_module)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._before_validation = {}

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._batch_size = samples_per_batch(trainer.train_dataloader)  # the epoch's loader (it may be reloaded)
        if order := self._plain_order(trainer):  # a reloaded loader: Lightning set the epoch of the order it had
            order.set_epoch(trainer.current_epoch)
        if self._metrics_epoch is not None and self._metrics_epoch != trainer.current_epoch:
            metric_states.reset(pl_module, list(metric_states.metrics_of(pl_module)))  # saved once the epoch ended
        self._metrics_epoch = None

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        metric_states.save(trainer, pl_module, checkpoint, self._before_validation)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """The metric states back (fit only). And a run folder moved or copied: its checkpoint callbacks' state names
        files under the old folder, and Lightning forgets the best checkpoint when the folder changed; point them at
        the files here instead."""
        if trainer.state.fn == TrainerFn.FITTING:
            self._metrics_epoch = metric_states.restore(trainer, pl_module, checkpoint)
        for callback in trainer.checkpoint_callbacks:
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            here = getattr(callback, "dirpath", None)
            if isinstance(state, dict) and here and state.get("dirpath") not in (None, here):
                checkpoint["callbacks"][callback.state_key] = relocated(state, str(state["dirpath"]), str(here))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning loads callback states before it builds (and, with workers, starts) the training
        # loader, so the data position goes to the datamodule now; the RNG waits for the first batch.
        self._pending = state_dict["rng"]
        self._position = (state_dict["epoch"], state_dict["samples"])  # _resume_order reads it too
        self._order_seed = state_dict.get("order_seed", self._order_seed)
        data, (epoch, samples) = datamodule(self._trainer), (state_dict["epoch"], state_dict["samples"])
        if samples is None:
            say(f"the training loader has no batch_size (a batch_sampler of its own), so where in epoch {epoch} the "
                "run stopped is unknown: the epoch starts over from its first sample, not an exact resume")  # fmt: skip
            samples = 0
        if isinstance(data, ResumesMidEpoch):
            data.resume_at(epoch, samples)

    def _plain_order(self, trainer: Trainer) -> ResumableSampler | None:
        """The training loader's order made resumable, unless the data resumes it itself (``resume_at``)."""
        if isinstance(datamodule(trainer), ResumesMidEpoch):
            return None
        return resumable_order(trainer.train_dataloader, self._order_seed)

    def _resume_order(self, trainer: Trainer) -> None:
        """A loader of the user's own: its plain order made resumable (resumable_order), and a resume skips into it.
        Lightning has started the loader's iterator by now: in-process workers take the new order as it is; other
        workers took the old one, so the iterator Lightning holds starts again (persistent workers in place)."""
        if isinstance(datamodule(trainer), ResumesMidEpoch):
            return
        loader: Any = trainer.train_dataloader
        order = resumable_order(loader, self._order_seed)
        # no batch has run yet: (0, 0) on a fresh run, what load_state_dict read on a resume
        epoch, samples = self._position[0], self._position[1] or 0
        if order is None:
            if samples:
                self._say_inexact(trainer, epoch)
            return
        order.set_epoch(epoch)
        order.skip = samples
        if getattr(loader, "num_workers", 0) > 0:
            iter(trainer.fit_loop._data_fetcher)  # type: ignore[arg-type]  # Lightning's iterator, from this order

    def _say_inexact(self, trainer: Trainer, epoch: int) -> None:
        data = datamodule(trainer)
        name = type(data).__name__ if data is not None else "the training loader"
        if isinstance(getattr(trainer.train_dataloader, "dataset", None), IterableDataset):
            why = "it reads an IterableDataset, whose position only the dataset could keep"
        else:
            why = ("its loader's sampler is its own: give the datamodule resume_at(epoch, samples) for an exact resume "
                   "(kiln.data.ResumableSampler does it)")  # fmt: skip
        say(
            f"{name} cannot resume its training order mid-epoch: the rest of epoch {epoch} is drawn from the start "
            f"of its data again (some samples twice, some not at all); {why}"
        )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._resume_order(trainer)
        # after the sanity check, right before the first batch: loaders draw from their own generators
        if self._pending is not None:
            restore_rng(self._pending)
            self._pending = None
