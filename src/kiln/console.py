"""What a command prints: Lightning messages that say nothing dropped by their exact text, and the information
lines kept in the run folder's console.log rather than on the console."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# (logger, start of the message, why it goes)
UNHELPFUL = [
    ("lightning.pytorch.utilities.rank_zero", "💡 Tip: For seamless cloud logging",
     "an advertisement for another product, printed on every run without LitLogger"),
]  # fmt: skip


# (category, message regex, module regex, why it goes): warnings from dependencies that kiln cannot fix
DEPENDENCY_WARNINGS = [
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree",
     "Lightning 2.6 builds torch's deprecated LeafSpec in every batch transfer; Lightning must change, not kiln"),
    (UserWarning, r"The dirpath has changed from", r"lightning\.pytorch\.callbacks\.model_checkpoint",
     "validate/test/predict from a checkpoint run in their own folder (a resume keeps its folder): nothing is lost"),
    (UserWarning, r"Checkpoint directory .* exists and is not empty",
     r"lightning\.pytorch\.callbacks\.model_checkpoint",
     "a resume goes on in its own run folder, beside the checkpoints it goes on from: expected, on every resume"),
    (UserWarning, r"The `srun` command is available on your system but is not used", "",
     "printed twice on every run of a machine with SLURM installed; scripts/slurm.sbatch runs kiln under srun"),
    (UserWarning, r"Using `DistributedSampler` with the dataloaders", r"lightning\.pytorch\.trainer",
     "printed for every padded or unpadded evaluation set under DDP; kiln.callbacks.RunMetrics says in one line "
     "when samples are repeated, how many, and how to count each once (kiln.data.EvaluationShard)"),
    (UserWarning, r"Couldn't infer the batch indices fetched from your dataloader: `DeviceLoader`",
     r"lightning\.pytorch\.loops\.prediction_loop",
     "on every predict of on-device data: kiln.callbacks.PredictionWriter numbers its rows from the loader's order"),
    (UserWarning, r"Be aware that when using `ckpt_path`, .* callbacks: \[(('EMA'|\"EarlyStopping\{[^}]*\}\")(, )?)+\]",
     r"lightning\.pytorch\.trainer\.call",
     "EMA's and EarlyStopping's states, which only training reads: validate/test/predict score the weights the "
     "checkpoint holds (an EMA checkpoint's average, said in a line), and a resume that drops EMA is refused"),
    (UserWarning, r"You're resuming from a checkpoint that ended before the epoch ended",
     r"lightning\.pytorch\.loops\.training_epoch_loop",
     "on every mid-epoch resume: kiln's datamodules resume their loaders at the saved sample (ExactResume), and kiln "
     "says in its own line when a datamodule cannot"),
]  # fmt: skip


def quiet_worker_hint() -> None:
    """Drop Lightning's "does not have many workers" hint for loaders of tensors held in memory: on a machine with
    more than 2 cores it asks for `num_workers=<cores - 1>`, where worker processes would only add IPC."""
    warnings.filterwarnings("ignore", message=r"The '\w+_dataloader' does not have many workers", module=r"lightning")


class _DropUnhelpful(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.starts)


def quiet_lightning() -> None:
    """Drop the messages in ``UNHELPFUL`` and ``DEPENDENCY_WARNINGS``; every other message is kept."""
    for category, message, module, _ in DEPENDENCY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name in {logger for logger, _, _ in UNHELPFUL}:
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropUnhelpful) for f in log.filters):
            log.addFilter(_DropUnhelpful(tuple(start for logger, start, _ in UNHELPFUL if logger == name)))


# A command's console: its own lines, the model summary, the progress bar, warnings that matter and the
# summary. Lightning's information lines ("Seed set to 42", "GPU available", "Restoring states …") go to
# the run folder's console.log instead, and W&B's banner and history to its own log; `-v` keeps both here.
TO_FILE = ("lightning.pytorch", "lightning.fabric", "kiln")  # loggers whose information lines go to console.log
LOG = logging.getLogger("kiln")  # kiln's own information lines (the per-class table, callbacks left out)


_verbose = False  # `kiln -v`: set for its command by kiln.commands.boundary (a child `kiln fit` gets `-v`)


def verbose() -> bool:
    return _verbose


@contextmanager
def verbosity(on: bool) -> Iterator[None]:
    """Everything on the console (``kiln -v``) for one command; as it was after it (a notebook's next call)."""
    global _verbose
    before, _verbose = _verbose, on or _verbose
    try:
        yield
    finally:
        _verbose = before


class _Held(logging.Handler):
    """Keeps a command's information lines until its run folder exists."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_command: list[tuple[logging.Handler, list[tuple[logging.Handler, int]]]] = []  # (its handler, levels it changed)


def begin_command() -> None:
    """Information lines leave the console (kept for console.log), unless ``-v``."""
    while _command:  # one command at a time: a notebook's earlier build_cli(run=False) hands over here
        end_command()
    if not LOG.handlers:
        LOG.addHandler(logging.StreamHandler())
        LOG.setLevel(logging.INFO)
        LOG.propagate = False
    if verbose():
        return
    os.environ["WANDB_SILENT"] = "true"  # W&B's banner and history: in its own debug log
    held: logging.Handler = _Held()
    changed: list[tuple[logging.Handler, int]] = []
    for name in TO_FILE:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler:  # the console's; not a file's
                changed.append((handler, handler.level))
                handler.setLevel(logging.WARNING)
        logger.addHandler(held)
    _command.append((held, changed))


def to_run_folder(run_dir: Path) -> None:
    """From now on (and what came before) the information lines go to ``<run_dir>/console.log``."""
    if not _command:
        return
    held, changed = _command[-1]
    run_dir.mkdir(parents=True, exist_ok=True)
    written = logging.FileHandler(run_dir / "console.log", encoding="utf-8")
    written.setLevel(logging.INFO)
    written.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    for record in getattr(held, "records", []):
        written.emit(record)
    for name in TO_FILE:
        logging.getLogger(name).removeHandler(held)
        logging.getLogger(name).addHandler(written)
    _command[-1] = (written, changed)


def end_command() -> None:
    """Put the console back as it was (a notebook's next cell, a sweep's next trial)."""
    if not _command:
        return
    handler, changed = _command.pop()
    for name in TO_FILE:
        logging.getLogger(name).removeHandler(handler)
    handler.close()
    for stream, level in changed:
        stream.setLevel(level)


def say(message: str) -> None:
    """A line kiln's user should see, once per run (rank zero): on the console, and in console.log."""
    from lightning.pytorch.utilities import rank_zero_only

    if getattr(rank_zero_only, "rank", 0) == 0:
        if not LOG.handlers:  # outside a command (a notebook's own Trainer): the console alone
            LOG.addHandler(logging.StreamHandler())
            LOG.setLevel(logging.INFO)
            LOG.propagate = False
        LOG.warning(message)
