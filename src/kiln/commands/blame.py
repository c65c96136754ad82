"""Whose mistake an error is: the user's code (their module, network or data: one line naming their line) or kiln's
(an internal error, its traceback saved, "please report it")."""

from __future__ import annotations

import functools
import importlib.util
import re
import tempfile
import traceback
from datetime import datetime
from pathlib import Path

from kiln.errors import CallError, KilnError

WORKER_TRACEBACK = "Original Traceback (most recent call last):"  # in torch's re-raised worker error


def internal_error(err: BaseException, folder: Path | None = None) -> str:
    """Save the traceback (in the command's run folder ``folder`` when it has one), and say where, in one line."""
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    if folder is not None and folder.is_dir():
        saved = folder / f"error-{stamp}.log"
    else:
        saved = Path(tempfile.gettempdir()) / f"kiln-error-{stamp}.log"
    try:
        saved.write_text("".join(traceback.format_exception(err)))
        where = f"the traceback is in {saved}"
    except OSError:
        where = "the traceback could not be saved"
    first = str(err).splitlines()[0] if str(err) else ""
    for cause in causes(err):  # jsonargparse wraps an error a user class's __init__ raised in its own ValueError
        if (yours := _raised_in_user_code(cause)) is not None:
            return f"{yours}; {where}"
        if _lightnings_refusal(cause):  # raised in Lightning's frames, about what the user gave it
            return f"Lightning refused your module, data or config: {(str(cause) or '?').splitlines()[0]}; {where}"
    return f"internal error ({type(err).__name__}: {first}); {where}; please report it"


def _lightnings_refusal(err: BaseException) -> bool:
    """Lightning's ``MisconfigurationException``: its checks of the module, datamodule, loaders and Trainer settings
    it was given (a DataLoader it cannot rebuild, a monitored key never logged), not a fault of kiln's."""
    kind = type(err)
    return kind.__name__ == "MisconfigurationException" and kind.__module__.startswith("lightning")


def _raised_in_user_code(err: BaseException) -> str | None:
    """``err`` and the line of the user's module, network or data that raised it (theirs to fix, not kiln's)."""
    first = str(err).splitlines()[0] if str(err) else ""
    said, process = f"{type(err).__name__}: {first}", ""
    frames: list[traceback.FrameSummary] = list(traceback.extract_tb(err.__traceback__))
    if (worker := _worker_traceback(str(err))) is not None:  # torch re-raises a worker's error from its own frames
        said, frames, process = worker[0], worker[1], ", in a DataLoader worker process"
    if (frame := _user_frame(frames)) is None:
        return None
    return f"{said} (raised in your code: {frame.filename}:{frame.lineno}, in {frame.name}{process})"


def _worker_traceback(message: str) -> tuple[str, list[traceback.FrameSummary]] | None:
    """A DataLoader worker's error, as torch re-raises it: its last line and its frames, read from the message."""
    if WORKER_TRACEBACK not in message:
        return None
    original = message.split(WORKER_TRACEBACK, 1)[1]
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', original)
    frames = [traceback.FrameSummary(file, int(line), name, lookup_line=False) for file, line, name in found]
    lines = [line for line in original.strip().splitlines() if line.strip()]
    return (lines[-1].strip(), frames) if lines else None


def _user_frame(frames: list[traceback.FrameSummary], past_engine: bool = False) -> traceback.FrameSummary | None:
    """Where the error was raised, when that is the user's own code: the innermost frame that is neither an installed
    package's nor Python's, unless it is kiln's (``past_engine``: the innermost outside kiln, its caller's)."""
    import sysconfig

    engine = Path(__file__).resolve().parents[1]  # installed or not
    libraries = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    yours = _installed_with_kiln()
    for frame in reversed(frames):
        path = Path(frame.filename).resolve()
        if engine in path.parents:
            if past_engine:
                continue
            return None
        compiled = not Path(frame.filename).is_absolute()  # "<frozen …>", a Cython module's "yaml/_yaml.pyx"
        library = any(folder in path.parents for folder in libraries) and not any(f in path.parents for f in yours)
        if not compiled and not library:
            return frame  # torch, Lightning and Python frames above it: called by the code that matters
    return None


@functools.cache
def _installed_with_kiln() -> tuple[Path, ...]:
    """The folders of the packages installed with kiln, the research package: a non-editable install (the
    Dockerfile's) puts them among the libraries, where every error the user's code raised was called kiln's."""
    from importlib.metadata import packages_distributions

    found = packages_distributions()
    project = set(found.get("kiln", ()))  # kiln's distribution: the template's, or a generated project's
    folders: list[Path] = []
    for name in (n for n, dists in found.items() if n != "kiln" and project & set(dists)):
        spec = importlib.util.find_spec(name)
        folders += [Path(p).resolve() for p in (spec.submodule_search_locations or [])] if spec else []
    return tuple(folders)


def causes(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def said(err: KilnError) -> str:
    """A user error's line; for a kiln function the user's code called with a value it cannot take, with where."""
    frames = traceback.extract_tb(err.__traceback__)
    if isinstance(err, CallError) and (frame := _user_frame(frames, past_engine=True)) is not None:
        return f"{err} (called from your code: {frame.filename}:{frame.lineno}, in {frame.name})"
    return str(err)
