"""The ``run`` section of every command's config: where its folder goes and what happens after ``fit``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jsonargparse.typing import PositiveInt

from kiln.cli.links import DataLinks
from kiln.cli.whole_numbers import keep_whole_numbers
from kiln.runs.folders import DEFAULT_ROOT
from kiln.training.testing import TestChoice


@dataclass
class RunOptions:
    """Where a run's folder goes and what happens after ``fit``.

    Args:
        name: Experiment name; runs land in ``<root>/<name>/<timestamp>``.
        root: Folder holding all runs.
        test_after_fit: Test once ``fit`` ends, write ``metrics.json`` and print a summary.
        test_ckpt: What the test after fit scores: the ``best`` checkpoint (lowest ``val/loss`` by
            default), the ``last`` one (the final weights), or ``both`` (each once, when they differ).
        cpu_threads: torch's intra-op CPU threads (``None``: torch's default, one per core). Fewer
            are often faster for small models on a shared machine; the count changes the order of
            floating-point sums, so bitwise-repeatable CPU runs need the same count.
        without: Callbacks of ``trainer.callbacks`` to leave out, by class name (``[BatchGrid]``)
            or path; a subclass of a named class goes too. A preset drops (or, adding its own,
            replaces) one default callback this way without restating the whole list.
        summary: End on the run summary (``kiln sweep`` and ``kiln multirun`` turn it off for their runs: they print
            a line per run and their own table; ``-v`` prints it anyway).
    """

    name: str = "default"
    root: str = DEFAULT_ROOT
    test_after_fit: bool = True
    test_ckpt: TestChoice = "both"
    cpu_threads: PositiveInt | None = None
    without: list[str] = field(default_factory=list)
    summary: bool = True


def add_run_arguments(parser: Any, links: DataLinks) -> None:
    """kiln's own arguments beside Lightning's: ``run``, ``non_finite`` (always on, and set on its own:
    ``--non_finite.action skip``, not by list position), ``init_from``, and the links from the data (num_classes,
    in_channels, input_shape: never restated)."""
    from kiln.callbacks.non_finite import NonFiniteGuard

    keep_whole_numbers(parser)  # the trainer's limit_*_batches, val_check_interval, overfit_batches
    parser.add_class_arguments(RunOptions, "run")
    parser.add_lightning_class_args(NonFiniteGuard, "non_finite")
    links.add_to(parser)
    parser.add_argument(
        "--init_from", type=str | None, default=None,
        help="fit: start a new run from this checkpoint's weights (fine-tuning): new optimizer, schedule, folder",
    )  # fmt: skip
    parser.add_argument(
        "--init_partial", type=bool, default=False,
        help="with --init_from: load what fits by name and shape even from another network class",
    )  # fmt: skip
