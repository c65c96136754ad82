"""Every kiln command's one boundary: it routes the subcommands, and turns whatever ends one into one line.

Known failures (a user's error, a stop signal, a full disk, an unreadable file) become one line naming
the file or key and the fix, with their exit code; anything else becomes one line saying an internal
error happened and where its full traceback was saved (in the run folder when there is one). Nothing
here imports torch: ``kiln infer`` runs without it.
"""

from __future__ import annotations

import difflib
import errno
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from kiln import console
from kiln.commands.blame import causes, internal_error, said
from kiln.errors import AlreadyFinished, Interrupted, KilnError, Preempted, Stopped, UsageError
from kiln.process import stop_signals
from kiln.process.secrets import load_env_file
from kiln.runs.record import RunRecord

# subcommand -> the module and function that runs it (fit, validate, test and predict: kiln.cli)
COMMANDS = {
    "sweep": ("kiln.commands.sweep.command", "sweep_command"),  # many `fit` runs, driven by Optuna
    "multirun": ("kiln.commands.sweep.multirun", "multirun_command"),  # seeds, folds and grids of `fit`, aggregated
    "export": ("kiln.commands.export", "export_command"),  # ONNX and torch.export files, checked against eager
    "convert": ("kiln.commands.convert", "main"),  # any datamodule's splits to LitData chunks
    "infer": ("kiln.commands.infer", "infer_command"),  # predictions from an exported model, without torch
    "serve": ("kiln.commands.serve", "serve_command"),  # an exported model over HTTP, batched (LitServe)
    "diff": ("kiln.commands.diff", "diff_command"),  # what differs between two runs: config, environment, code
    "tune": ("kiln.commands.tune", "tune_command"),  # a learning-rate range test on the configured optimizer
}
FULL = (errno.ENOSPC, errno.EDQUOT)
WITHOUT_TORCH = ("infer", "serve", "diff")  # commands that run where torch is not installed, or need not load it


LIGHTNING = {  # LightningCLI's own subcommands, which kiln.cli runs
    "fit": "train a model, then test it (run folder, checkpoints, summary)",
    "validate": "score a checkpoint on the validation split",
    "test": "score a checkpoint on the test split",
    "predict": "write a checkpoint's predictions to predictions.csv",
}
ABOUT = {
    "sweep": "a hyper-parameter search over fit runs (Optuna)",
    "multirun": "seeds, folds and grids of fit runs, aggregated",
    "export": "ONNX and torch.export files of a checkpoint, checked against it",
    "infer": "predictions from an exported model, without torch",
    "serve": "an exported model over HTTP, batched, as infer answers",
    "convert": "a datamodule's splits to LitData chunks for streaming",
    "diff": "what differs between two runs: config, environment, code",
    "tune": "a learning-rate range test on the configured optimizer",
}
FIRST = ("-c", "--config", "--print_config")  # what LightningCLI takes before its subcommand


def usage() -> str:
    """Every subcommand, each in a line (LightningCLI's own help names only its four)."""
    rows = "\n".join(f"  {name:<9} {about}" for name, about in {**LIGHTNING, **ABOUT}.items())
    return f"usage: kiln [-v] <subcommand> [options]   (kiln <subcommand> --help for its options)\n\n{rows}"


def _command(argv: list[str], given: bool, process: bool, record: RunRecord) -> Callable[[], object]:
    """What runs ``argv``'s subcommand (``given``: passed in, not this process's command line, which
    LightningCLI reads itself; ``process``: this is the ``kiln`` process, not a call from a Python session;
    ``record``: where a Lightning command's run folder is recorded)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)  # `kiln` alone did nothing
    if argv[0].startswith("-") and argv[0].split("=", 1)[0] not in FIRST:
        raise UsageError(f"kiln {argv[0]}: unknown option before the subcommand; `kiln --help` lists the subcommands")
    if argv[0] not in (*COMMANDS, *LIGHTNING) and not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], [*LIGHTNING, *COMMANDS], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UsageError(f"kiln {argv[0]}: no such subcommand{hint} (`kiln --help` lists them)")
    own = argv[1 : argv.index("--") if "--" in argv else None]
    if process and argv[0] not in WITHOUT_TORCH and not (argv[0] in COMMANDS and {"-h", "--help"} & set(own)):
        _import_torch_frozen()  # not for kiln's own commands' --help: their parsers import no torch
    if argv[:1] and argv[0] in COMMANDS:
        module, name = COMMANDS[argv[0]]
        run = getattr(importlib.import_module(module), name)
        return lambda: run(argv[1:])
    from kiln.cli import build_cli

    return lambda: build_cli(argv if given else None, record=record)


def _import_torch_frozen() -> None:
    """torch's import without the cyclic garbage collector, its objects then kept out of the collector's sight
    (``gc.freeze``): they live as long as the process, and Python would walk them at every full collection and again
    as it exits (about 0.8 s of each command's start and end, benchmarks/README.md). torch alone: frozen, Triton's
    bindings (which torch._dynamo loads) would report themselves leaked at exit."""
    gc.disable()
    try:
        import torch  # noqa: F401
    finally:
        gc.freeze()
        gc.enable()


def os_error(err: OSError) -> str | None:
    """One line for a file-system failure a user can act on (full disk, no permission, read-only), else None."""
    where = f" ({err.filename})" if getattr(err, "filename", None) else ""
    if err.errno in FULL:
        return f"no space left on the device{where}: free some, or write elsewhere (--run.root, --output)"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{err.strerror or 'not permitted'}{where}: write where you may, or change the permissions"
    return None


def _full_disk(err: BaseException) -> str | None:
    """One line for a full disk behind a library's own error (a sweep's SQLite study, a journal file)."""
    for cause in causes(err):
        if isinstance(cause, OSError) and cause.errno in FULL:
            return os_error(cause)
        if "database or disk is full" in str(cause):
            return "no space left on the disk of the sweep's study database: free some, then run the same command"
    return None


def _unexpected(err: Exception, run_dir: Path | None) -> str:
    if wrapped := next((c for c in causes(err) if isinstance(c, KilnError)), None):  # jsonargparse wraps one a
        return f"error: {said(wrapped)}"  # class's __init__ raised in its own ValueError
    said_here = (os_error(err) if isinstance(err, OSError) else None) or _full_disk(err)
    return f"error: {said_here or internal_error(err, run_dir)}"


@dataclass(frozen=True)
class _Ending:
    """How this command ends, said in one line and, for a Lightning command, recorded in its run folder."""

    records: bool  # false for sweep and multirun: they run `kiln fit` themselves and record each run's end
    run: RunRecord  # a Lightning command's run folder, once it has one

    def record(self, state: str, detail: str = "") -> None:
        """The command's end in its run folder."""
        if self.records:
            self.run.record(state, detail)

    def leave(self, message: str | Callable[[], str], code: int, remove_run: bool = True) -> None:
        """Remove a run folder that holds no checkpoint, then say ``message`` (made after: it may name a file);
        a run folder that stays records how its command ended."""
        if remove_run and (removed := self.run.remove_if_unsaved()):
            print(f"removed {removed}: the command failed before it saved anything there", file=sys.stderr)
        line = message() if callable(message) else message
        self.record("failed" if remove_run else "interrupted", line)
        print(line, file=sys.stderr)
        sys.exit(code)


def _exiting(process: bool) -> None:
    """A ``kiln`` process a stop ended: later stop signals cannot change its exit code (``main`` called with
    arguments, in a Python session that goes on, keeps its handlers)."""
    if process:
        stop_signals.leaving()


def main(args: list[str] | None = None) -> None:
    """The ``kiln`` command."""
    process = args is None  # the `kiln` command itself, not a call from Python
    argv = sys.argv[1:] if args is None else [str(a) for a in args]
    if verbose := [a for a in argv[: argv.index("--") if "--" in argv else None] if a in ("-v", "--verbose")]:
        argv = [a for a in argv if a not in verbose]  # everything on the console: Lightning's and W&B's lines too
        args = argv
    with console.verbosity(bool(verbose)), _session_kept(process):
        _main(argv, args, process)


@contextmanager
def _session_kept(process: bool) -> Iterator[None]:
    """A command called from a Python session (a notebook, a test) leaves it as it found it: the environment
    (``.env``'s keys, Lightning's seed variables, the run folder's)."""
    if process:  # the `kiln` process ends with its command
        yield
        return
    kept = dict(os.environ)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in kept]:
            del os.environ[key]
        os.environ.update(kept)


def _main(argv: list[str], args: list[str] | None, process: bool) -> None:
    """The command ``argv``, its end recorded and said in one line, whatever way it ends."""
    load_env_file()  # the project's .env (WANDB_API_KEY, …): under variables already set
    stop_signals.install()
    logging.raiseExceptions = False  # a log handler that cannot write (a full disk) is quiet, not 46,000 lines
    end = _Ending(records=not (argv[:1] and argv[0] in COMMANDS), run=RunRecord())
    try:
        _command(argv, given=args is not None, process=process, record=end.run)()
        end.record("finished")
    except AlreadyFinished as done:
        print(done, file=sys.stderr)
    except KilnError as err:
        end.leave(f"error: {said(err)}", err.exit_code)
    except Stopped as stop:
        _exiting(process)
        end.leave(str(stop), stop_signals.exit_code(stop.signal_name), remove_run=False)
    except Interrupted as stop:  # a `kiln fit` process of sweep/multirun was: exit as it did
        _exiting(process)
        sys.exit(stop.code)
    except Preempted as stop:
        _exiting(process)  # rank 0 has requeued the job: SLURM's SIGTERM to the tasks may come any moment
        end.record("interrupted", f"SIGUSR1: {stop}")
        sys.exit(stop_signals.exit_code("SIGUSR1"))  # PreemptionCheckpoint said where it saved
    except KeyboardInterrupt:
        end.leave("stopped (Ctrl-C)", 130, remove_run=False)
    except SystemExit as stop:
        if type(stop).__name__ == "SIGTERMException":  # Lightning's: PreemptionCheckpoint said where it saved
            _exiting(process)
            end.record("interrupted", "SIGTERM")
            sys.exit(stop_signals.exit_code("SIGTERM"))
        raise
    except Exception as err:  # an OSError a user can act on, or an internal error
        end.leave(partial(_unexpected, err, end.run.folder), 1)
