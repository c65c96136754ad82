"""Which configured callbacks a run gets: those the Trainer's flags turn off and those ``run.without`` names
are left out, each said in one line; of two that Lightning takes one of, the later replaces the earlier."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch.callbacks import Checkpoint, LearningRateMonitor, ModelSummary, ProgressBar

from kiln import console
from kiln.cli.classes import import_class, is_a
from kiln.cli.run_paths import class_nodes
from kiln.errors import UsageError, nearest


def chosen_callbacks(config: Namespace, as_trained: Sequence[str] = ()) -> tuple[list[Namespace], list[str]]:
    """``config.trainer.callbacks`` less what is left out, and the class paths ``run.without`` left out (what a
    checkpoint of the run records); ``run.without`` is then emptied, so the saved config (``config.yaml``, a
    sweep's ``best.yaml``) lists what ran and a rerun of it leaves nothing out twice. ``as_trained``: the class
    paths the run a checkpoint comes from left out, left out of its evaluation too where they are listed."""
    callbacks = [node for _, node in class_nodes(config.trainer.callbacks, ())]
    trainer = config.trainer
    flags: dict[type, tuple[bool, str]] = {  # Lightning would refuse to start with them listed
        LearningRateMonitor: (not trainer.logger, "trainer.logger is false"),
        ProgressBar: (trainer.enable_progress_bar is False, "trainer.enable_progress_bar is false"),
        ModelSummary: (trainer.enable_model_summary is False, "trainer.enable_model_summary is false"),
        Checkpoint: (trainer.enable_checkpointing is False, "trainer.enable_checkpointing is false"),
    }
    named, replacing = _named(config.run.without, callbacks)
    left_out = sorted({c.class_path for c in callbacks if id(c) in named and id(c) not in replacing})
    named |= {id(c): "the run of the checkpoint left it out" for c in callbacks if c.class_path in as_trained}
    moved = {id(r) for r in replacing.values()}  # a replacement goes where what it replaces was: hooks run in order
    ordered = [
        c for first in callbacks if id(first) not in moved for c in (first, replacing.get(id(first))) if c is not None
    ]
    kept = []
    for callback in ordered:
        why = next((why for base, (off, why) in flags.items() if off and is_a(callback, base)), None)
        why = why or named.get(id(callback))
        if why is None:
            kept.append(callback)
        else:
            console.LOG.info(f"{_name(callback)}: left out, as {why}")
    config.run.without = []
    return _later_replaces(kept), left_out


def _name(callback: Namespace) -> str:
    return str(callback.class_path).rsplit(".", 1)[-1]


def _named(names: list[str], callbacks: list[Namespace]) -> tuple[dict[int, str], dict[int, Namespace]]:
    """Why each callback ``run.without`` names is left out (by class name, path, or a base class's path), and which
    replaces which: of several of one class, the last stays (a ``callbacks+`` added it, after the defaults, to replace
    them) in the first one's place. A name that matches none stops in one line listing the names there are."""
    found: dict[int, str] = {}
    replacing: dict[int, Namespace] = {}
    for name in names:
        base = import_class(name) if "." in name else None
        matches = [
            c for c in callbacks
            if name in (c.class_path, _name(c)) or (isinstance(base, type) and is_a(c, base))
        ]  # fmt: skip
        if not matches:
            there = sorted({_name(c) for c in callbacks})
            hint = nearest(name.rsplit(".", 1)[-1], there)
            raise UsageError(f"run.without: no callback {name} in trainer.callbacks ({', '.join(there)}){hint}")
        same: dict[str, list[Namespace]] = defaultdict(list)
        for callback in matches:
            same[callback.class_path].append(callback)
        for group in same.values():
            why = "run.without names it" + (f"; the {_name(group[-1])} added after it replaces it" if group[1:] else "")
            found |= {id(c): why for c in group[:-1] or group}
            replacing |= {id(group[0]): group[-1]} if group[1:] else {}
    return found, replacing


def _later_replaces(callbacks: list[Any]) -> list[Any]:
    """Of the callbacks a run takes one of (a progress bar, a model summary, kiln's predictions.csv), the last
    listed (``callbacks+`` adds after the defaults) replaces those before it: Lightning refused two bars and
    printed two summaries, and a second writer found predictions.csv taken."""
    from kiln.callbacks.predictions import PredictionWriter

    kept = list(callbacks)
    for base in (ProgressBar, ModelSummary, PredictionWriter):
        same = [c for c in kept if is_a(c, base)]
        for replaced in same[:-1]:
            kept.remove(replaced)
            console.LOG.info(f"{_name(replaced)}: left out, as {_name(same[-1])} comes after it (a run takes one "
                             f"{base.__name__})")  # fmt: skip
    return kept


def add_kiln_callbacks(callbacks: list[Any], extra: Sequence[Any], inside: str | None, run_dir: Path | None) -> None:
    """What kiln adds to the Trainer's callbacks: the caller's own (a sweep's reporter), the check of monitored
    keys before anything saves or stops, and the ranks ``ddp_spawn`` starts writing to ``console.log``; inside a
    sweep or multirun, the preemption checkpoint leaves the how-to-go-on line to it."""
    from kiln.callbacks.monitored import MonitoredKeys
    from kiln.callbacks.preemption import PreemptionCheckpoint
    from kiln.callbacks.spawned_ranks import SpawnedRanks

    callbacks.extend(extra)
    callbacks.insert(0, MonitoredKeys())
    for callback in callbacks if inside else ():
        if isinstance(callback, PreemptionCheckpoint):
            callback.hint = ""
    if run_dir is not None:
        callbacks.append(SpawnedRanks(run_dir))
