"""Where a training step's time goes: `bench.py --profile DIR` runs these windows over a run's steps.

An epoch each, so that the windows do not disturb each other (a run needs 6 epochs or more):
epoch 1 lists every host-device synchronisation with the code that asked for it (torch's sync
debug mode, validation and checkpoints included); epoch 2 records 20 steps with `torch.profiler`
(kernels, runtime calls, a Perfetto trace); epoch 3 runs under `cProfile` (host time by function);
epoch 4 is timed clean. Each kind writes `<kind>-*.txt`, `<kind>-trace.json.gz` and a line of
`summary.md` in DIR.
"""

from __future__ import annotations

import collections
import cProfile
import gzip
import io
import pstats
import shutil
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")
OWN_CODE = ("kiln", "lightning", "torchmetrics", "benchmarks", "torch/optim", "torch/nn/utils")


def _frames(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frames of our own and Lightning's code that led to a synchronisation."""
    kept = [f for f in stack if any(part in f.filename for part in OWN_CODE) and "profiling.py" not in f.filename]
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(kept[-4:])) or "(no own frame)"


class StepWindows:
    """The windows, by training step number; ``before_step(n)`` opens and closes them."""

    def __init__(self, out: Path, kind: str, steps_per_epoch: int) -> None:
        self.out, self.kind, self.spe = out, kind, steps_per_epoch
        out.mkdir(parents=True, exist_ok=True)
        traced = min(20, steps_per_epoch)
        start = 2 * steps_per_epoch + min(10, steps_per_epoch - traced)
        self.windows = {"sync": (steps_per_epoch, 2 * steps_per_epoch), "trace": (start, start + traced),
                        "cprofile": (3 * steps_per_epoch, 4 * steps_per_epoch),
                        "clean": (4 * steps_per_epoch, 5 * steps_per_epoch)}  # fmt: skip
        self.open: dict[str, Any] = {}
        self.summary: dict[str, Any] = {"kind": kind}
        self.syncs: collections.Counter[str] = collections.Counter()
        self._showwarning = warnings.showwarning

    def before_step(self, step: int) -> None:
        for name, (first, end) in self.windows.items():
            if step == end and name in self.open:
                getattr(self, f"_close_{name}")()
            if step == first and name not in self.open:
                getattr(self, f"_open_{name}")()

    def finish(self) -> None:
        for name in list(self.open):
            getattr(self, f"_close_{name}")()
        line = " | ".join(f"{k}: {v}" for k, v in self.summary.items())
        with (self.out / "summary.md").open("a") as f:
            f.write(f"- {line}\n")

    def _steps(self, name: str) -> int:
        first, end = self.windows[name]
        return end - first

    def _sync_cuda(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    # epoch 1: every synchronisation, with who asked for it
    def _open_sync(self) -> None:
        self.open["sync"] = True
        if not torch.cuda.is_available():
            return

        def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if "synchronizing" in str(message):
                self.syncs[_frames(traceback.extract_stack()[:-1])] += 1
            else:
                self._showwarning(message, category, filename, lineno, file, line)

        warnings.showwarning = record
        warnings.filterwarnings("always", message=".*synchroniz")
        torch.cuda.set_sync_debug_mode("warn")

    def _close_sync(self) -> None:
        del self.open["sync"]
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._showwarning
        total = sum(self.syncs.values())
        lines = [f"{self.kind}: {total} synchronisations in {self._steps('sync')} steps (with validation)"]
        lines += [f"{n:6d}  {where}" for where, n in self.syncs.most_common()]
        (self.out / f"{self.kind}-syncs.txt").write_text("\n".join(lines) + "\n")
        self.summary["syncs/epoch"] = total

    # epoch 2: kernels and runtime calls of 20 steps
    def _open_trace(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._sync_cuda()
        self.open["trace"] = profile(activities=activities)
        self.open["trace"].__enter__()
        self._trace_from = time.perf_counter()

    def _close_trace(self) -> None:
        profiler = self.open.pop("trace")
        self._sync_cuda()
        wall = (time.perf_counter() - self._trace_from) * 1000
        profiler.__exit__(None, None, None)
        steps = self._steps("trace")
        averages = profiler.key_averages()
        tables = [averages.table(sort_by=k, row_limit=40) for k in ("self_cpu_time_total", "self_device_time_total")]
        (self.out / f"{self.kind}-ops.txt").write_text(f"{steps} steps\n\n" + "\n\n".join(tables))
        raw = self.out / f"{self.kind}-trace.json"
        profiler.export_chrome_trace(str(raw))
        with raw.open("rb") as src, gzip.open(f"{raw}.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        raw.unlink()
        kernels = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1000  # kernel time (ms) over the window
        calls = {name: sum(a.count for a in averages if a.key == name) for name in SYNC_CALLS}
        self.summary.update({
            "profiled ms/step": round(wall / steps, 2), "kernel ms/step": round(busy / steps, 2),
            "kernels/step": round(len(kernels) / steps, 1),
            "runtime syncs/step": {k: round(v / steps, 2) for k, v in calls.items() if v},
        })  # fmt: skip

    # epoch 3: host time by function
    def _open_cprofile(self) -> None:
        self.open["cprofile"] = cProfile.Profile()
        self.open["cprofile"].enable()

    def _close_cprofile(self) -> None:
        profiler = self.open.pop("cprofile")
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        text.write(f"{self._steps('cprofile')} steps, validation and checkpoints included\n")
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(r"\((training|validation)_step\)")  # the step hooks, wherever ranked
        (self.out / f"{self.kind}-cprofile.txt").write_text(text.getvalue())

    # epoch 4: clean
    def _open_clean(self) -> None:
        self._sync_cuda()
        self.open["clean"] = time.perf_counter()

    def _close_clean(self) -> None:
        started = self.open.pop("clean")
        self._sync_cuda()
        self.summary["clean ms/step"] = round((time.perf_counter() - started) * 1000 / self._steps("clean"), 3)


def lightning_windows(out: Path, kind: str) -> Any:
    """The windows as a Lightning callback: a window's steps include the validation and checkpoints between them."""
    from lightning.pytorch import Callback

    class LightningWindows(Callback):
        windows: StepWindows | None = None

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self.windows is None:
                self.windows = StepWindows(out, kind, trainer.num_training_batches)
            self.windows.before_step(trainer.current_epoch * trainer.num_training_batches + batch_idx)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self.windows is not None:
                self.windows.finish()

    return LightningWindows()
