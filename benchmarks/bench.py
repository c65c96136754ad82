"""A hand-written PyTorch loop against the template's `fit` path: same network, data, optimizer, batch size.

`make bench` runs every workload as fresh processes, raw and template interleaved, and reports
medians: steps/s (from the second epoch on), the template's extra milliseconds per step, time
from process start to the first optimizer step, and peak memory. Results go to
benchmarks/results/ (JSON and Markdown); `--update-readme` (what `make bench` passes) also writes the
table into benchmarks/README.md, so no other measurement changes a tracked file.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import math
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# workload -> (template CLI arguments, epochs); the raw loop mirrors the same settings
# (the ResNet's width is set: a class_path switch keeps init_args the new class accepts, like SmallCNN's 32)
RESNET = [
    "--model.init_args.net",
    "research.nets.ResNet",
    "--model.init_args.net.init_args.width",
    "16",
    "--data",
    "kiln.data.SyntheticDataModule",
    "--data.num_workers",
    "0",
]  # fmt: skip (channels: from the data)
CIFAR_GPU = [*RESNET, "--data.num_samples", "50000", "--data.batch_size", "512", "--trainer.accelerator", "gpu",
             "--data.num_workers", "4"]  # fmt: skip
GPU_BATCH = 512  # cifar_gpu's batch size (`--batch-size` changes it for every kind)
SMOKE_SAMPLES = SMOKE_BATCH = 32  # `--smoke`: cifar_gpu's training set and batch, one batch an epoch
SMOKE_SIZE = 8  # `--smoke`: image height and width (bf16 kinds on a CPU without bf16 instructions: benchmarks/README)
DEFAULT_COMPILE_MODE = "default"  # cifar_gpu's optimised kinds (`--compile-mode`; benchmarks/README.md)
WORKLOADS: dict[str, tuple[list[str], int]] = {
    "default": ([], 10),  # digits, SmallCNN, batch 64, AdamW + warm-up/cosine, augmentation
    "resnet": ([*RESNET, "--data.num_samples", "2560", "--data.batch_size", "128"], 5),  # ResNet-20, CIFAR-shaped
    "cifar_gpu": (CIFAR_GPU, 3),  # GPU: 50k CIFAR-shaped images, batch 512
}
COMPILE_MODES = ["none", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]
# kinds measured per workload: raw loop, template; on GPU also the optimised raw loop, the on-device data path,
# and the ceiling: the optimised net and optimizer on batches already on the GPU, nothing else
KINDS = {"default": ["raw", "raw_batched", "lightning", "lightning_wandb", "template"], "resnet": ["raw", "template"],
         "cifar_gpu": ["raw", "raw_fast", "template_fast", "template_on_device", "ceiling"]}  # fmt: skip


def fast_args(compile_mode: str, small: bool) -> list[str]:
    """The template's optimised GPU settings: bf16 autocast, channels_last, ``torch.compile`` in ``compile_mode``."""
    args = ["--trainer.precision", "bf16-mixed", "--trainer.callbacks+", "kiln.callbacks.ChannelsLast"]
    if compile_mode != "none" and not small:  # the smoke run skips compiling (minutes on 2 cores)
        args += ["--trainer.callbacks+", "kiln.callbacks.Compile", "--trainer.callbacks.mode", compile_mode]
    return args


def smoke(args: list[str]) -> list[str]:
    """`--smoke`: the same code paths, tiny and on the CPU, to check the benchmark itself runs."""
    swap = {"50000": str(SMOKE_SAMPLES), str(GPU_BATCH): str(SMOKE_BATCH), "gpu": "cpu", "4": "0"}
    synthetic = "kiln.data.SyntheticDataModule" in args  # the raw loops' images are as small
    return [*(swap.get(a, a) for a in args), *(["--data.size", str(SMOKE_SIZE)] if synthetic else [])]


def with_batch_size(args: list[str], batch_size: int) -> list[str]:
    """``args`` with ``--data.batch_size`` set to ``batch_size``."""
    at = args.index("--data.batch_size") + 1
    return [*args[:at], str(batch_size), *args[at + 1 :]]


def gpu_net(small: bool) -> tuple[torch.nn.Module, int, int, int]:
    """cifar_gpu's network, training-set size, batch size and image size (tiny and on the CPU for ``--smoke``)."""
    from research.nets import ResNet

    sizes = (SMOKE_SAMPLES, SMOKE_BATCH, SMOKE_SIZE) if small else (50000, GPU_BATCH, 32)
    return ResNet(in_channels=3, num_classes=10), *sizes


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_raw(
    workload: str, epochs: int, started: float, kind: str = "raw", small: bool = False, compile_mode: str = "default"
) -> dict[str, float]:
    """zero_grad, forward, loss, backward, step; a DataLoader; evaluation under inference_mode."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(42)
    device = torch.device("cuda" if workload == "cifar_gpu" and not small else "cpu")
    fast = kind == "raw_fast"  # bf16 autocast + channels_last + torch.compile (in compile_mode)
    if workload == "default":
        from torchvision.transforms import v2

        from research.data.digits import load_digits
        from research.nets import SmallCNN

        images, labels = load_digits()
        images = (images.float().div(16).unsqueeze(1) - 0.3053) / 0.3760
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
        train, val = order[:1258], order[1258:1438]
        augment = v2.RandomAffine(degrees=10, translate=(0.125, 0.125))
        net: torch.nn.Module = SmallCNN(in_channels=1, num_classes=10, width=32)
        batch_size = 64

        class Augmented(TensorDataset):
            def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
                x, y = super().__getitem__(i)
                return augment(x), y

        train_set: TensorDataset = Augmented(images[train], labels[train])
        val_set = TensorDataset(images[val], labels[val])
        if kind == "raw_batched":  # the template's batches: whole-batch fetch, seeded augmentation, its split
            from research.data import DigitsDataModule

            data = DigitsDataModule(batch_size=batch_size, num_workers=0)
            data.setup("fit")
            train_set, val_set = data.train_set, data.val_set  # type: ignore[assignment]
    else:
        net, n, batch_size, size = gpu_net(small)
        if workload == "resnet":
            n, batch_size = 2560, 128
        g = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (n + n // 10, 3, size, size), generator=g, dtype=torch.uint8).float().div(255)
        labels = torch.randint(0, 10, (n + n // 10,), generator=g)
        train_set, val_set = TensorDataset(images[:n], labels[:n]), TensorDataset(images[n:], labels[n:])
    workers = 4 if device.type == "cuda" else 0
    options = {"num_workers": workers, "pin_memory": device.type == "cuda", "persistent_workers": workers > 0}
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, **options)  # type: ignore[arg-type]
    val_loader = DataLoader(val_set, batch_size=batch_size, **options)  # type: ignore[arg-type]
    if kind == "raw_batched":
        loader, val_loader = data.train_dataloader(), data.val_dataloader()
    net = net.to(device)
    if fast:
        net = net.to(memory_format=torch.channels_last)
    compiled = fast and not small and compile_mode != "none"
    model: torch.nn.Module = torch.compile(net, mode=compile_mode) if compiled else net  # type: ignore[assignment]
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01, fused=True)  # as the template
    total = epochs * len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, int(0.05 * total))) * 0.5 * (1 + math.cos(math.pi * s / total))
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast)

    def inputs(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last) if fast else x

    first_step = timed_from = None
    for epoch in range(epochs):
        if epoch == 1:
            sync(device)
            timed_from, steps_before = time.perf_counter(), epoch * len(loader)
        model.train()
        if hasattr(loader.sampler, "set_epoch"):  # the template's sampler: the order follows (seed, epoch)
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                loss = F.cross_entropy(model(inputs(x)), y.to(device, non_blocking=True))
            loss.backward()
            optimizer.step()
            schedule.step()
            if first_step is None:
                first_step = time.time() - started
        model.eval()
        with torch.inference_mode(), autocast:
            correct = sum(int((model(inputs(x)).argmax(1).cpu() == y).sum()) for x, y in val_loader)
        print(f"epoch {epoch}: loss {float(loss):.3f} val acc {correct / len(val_set):.3f}", file=sys.stderr)
    sync(device)
    assert timed_from is not None and first_step is not None
    rate = (total - steps_before) / (time.perf_counter() - timed_from)
    return {"steps_per_s": rate, "first_step_s": first_step, **peak_memory(device)}


def sync(device: object) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize()


def peak_memory(device: object) -> dict[str, float]:
    import torch

    memory = {"peak_rss_mb": peak_rss_mb()}
    if getattr(device, "type", "cpu") == "cuda":
        memory["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return memory


def run_ceiling(
    workload: str,
    epochs: int,
    started: float,
    kind: str = "ceiling",
    small: bool = False,
    compile_mode: str = "default",
    profile: Path | None = None,
) -> dict[str, float]:
    """What the GPU does with this model: the optimised net and fused AdamW on batches already on the GPU
    (zero_grad, forward, loss, backward, step), nothing else: no loader, no schedule, no validation."""  # fmt: skip
    import torch
    import torch.nn.functional as F

    torch.manual_seed(42)
    device = torch.device("cpu" if small else "cuda")
    net, n, batch_size, size = gpu_net(small)
    net = net.to(device).to(memory_format=torch.channels_last)
    compiled = not small and compile_mode != "none"
    model = torch.compile(net, mode=compile_mode) if compiled else net
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(0)  # a few distinct batches, normalised as the template's
    batches = [
        (((torch.randint(0, 256, (batch_size, 3, size, size), generator=g).float() / 255 - 0.5) / 0.29).to(device)
         .contiguous(memory_format=torch.channels_last), torch.randint(0, 10, (batch_size,), generator=g).to(device))
        for _ in range(8)
    ]  # fmt: skip
    steps_per_epoch = math.ceil(n / batch_size)
    first_step = timed_from = None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    from profiling import StepWindows  # benchmarks/profiling.py

    windows = StepWindows(profile, kind, steps_per_epoch) if profile is not None else None
    for number in range(epochs * steps_per_epoch):
        if number == steps_per_epoch:
            sync(device)
            timed_from = time.perf_counter()
        if windows is not None:
            windows.before_step(number)
        step(*batches[number % len(batches)])
        if first_step is None:
            first_step = time.time() - started
    if windows is not None:
        windows.finish()
    sync(device)
    assert timed_from is not None and first_step is not None
    rate = (epochs - 1) * steps_per_epoch / (time.perf_counter() - timed_from)
    return {"steps_per_s": rate, "first_step_s": first_step, **peak_memory(device)}


def run_template(
    workload: str,
    epochs: int,
    started: float,
    kind: str = "template",
    small: bool = False,
    compile_mode: str = "default",
    profile: Path | None = None,
    extra: list[str] | None = None,
) -> dict:
    """The template's own `fit`: default callbacks, W&B (offline) and the progress bar all on (``extra``: more
    CLI arguments, to measure what a setting costs)."""  # fmt: skip
    from bare_lightning import StepTimer  # benchmarks/bare_lightning.py

    from kiln.cli import build_cli

    runs = tempfile.mkdtemp(prefix="kiln-bench-")
    atexit.register(shutil.rmtree, runs, ignore_errors=True)  # last, after W&B's own exit handlers
    args = smoke(WORKLOADS[workload][0]) if small else WORKLOADS[workload][0]
    if workload == "cifar_gpu" and not small:
        args = with_batch_size(args, GPU_BATCH)
    if kind != "template":  # template_fast, template_on_device
        args = [*args, *fast_args(compile_mode, small)]
    if kind == "template_on_device":
        args = [*args, "--data.on_device", "true", "--data.num_workers", "0"]
    cli = build_cli([*args, *(extra or []), "--trainer.max_epochs", str(epochs), "--run.root", runs], run=False)
    timer = StepTimer(started)
    cli.trainer.callbacks.append(timer)  # type: ignore[attr-defined]
    if profile is not None:
        from profiling import lightning_windows  # benchmarks/profiling.py

        cli.trainer.callbacks.append(lightning_windows(profile, kind))  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert timer.first_step is not None
    return {"steps_per_s": timer.rate, "first_step_s": timer.first_step, **peak_memory(timer.device)}


def sweep_overhead(trials: int) -> dict[str, float]:
    """Per-trial cost of `kiln sweep`: identical `configs/debug/limit.yaml` trials in one sweep against the same
    run built alone in the same process (ask, tell, storage and reporting are the difference)."""
    import optuna
    import yaml

    from kiln.commands.sweep.driver import run_sweep
    from kiln.commands.sweep.inprocess import fit
    from kiln.commands.sweep.space import read_sweep

    quiet = ["-c", str(ROOT / "configs" / "debug" / "limit.yaml"), "--trainer.logger=false",
             "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"name": "bench", "n_trials": trials, "pruner": "none", "args": quiet,
                "space": {"model.init_args.net.init_args.width": {"choices": [32]}}}  # fmt: skip
        (Path(tmp) / "bench.yaml").write_text(yaml.safe_dump(spec))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        started = time.perf_counter()
        study = run_sweep(read_sweep(Path(tmp) / "bench.yaml"), Path(tmp) / "sweeps")
        in_sweep = [t.user_attrs["seconds"] for t in study.get_trials()][1:]  # the first pays lazy imports
        per_trial_wall = (time.perf_counter() - started) / trials
        alone = []
        for n in range(len(in_sweep)):
            began = time.perf_counter()
            fit(
                [*quiet, f"--run.root={tmp}/alone", f"--run.name=run{n}", "--run.test_after_fit=false"],
                inside="bench.py",
            )
            alone.append(time.perf_counter() - began)
    trial, single = statistics.median(in_sweep), statistics.median(alone)
    return {"trial_s": trial, "alone_s": single, "overhead_s": trial - single, "per_trial_wall_s": per_trial_wall}


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "WANDB_MODE": "offline"})
    return time.perf_counter() - started


def measure(command: list[str]) -> dict[str, float]:
    """Run one measuring process of this script; its last stdout line is the JSON result. With ``--smoke`` the
    process is forked from this one (see ``forked``)."""
    if "--smoke" in command:
        return forked(command[2:])
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# what a smoke run's measuring processes import: `kiln.cli` alone loads its engine (and Lightning) on first use, and
# a run's W&B start imports W&B's launch inputs
SMOKE_PRELOADED = ("torch._dynamo", "kiln.cli.engine", "kiln.commands.sweep.command", "wandb.sdk.launch")


def forked(argv: list[str]) -> dict[str, float]:
    """A smoke run's measuring process, forked from this one, which imported torch and kiln once: a fresh
    interpreter per kind paid those imports again, and a smoke run's figures are checked, never compared."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # leaves by SystemExit through Python's own exit, which runs W&B's and the run folder's handlers
        os.close(read)
        from kiln.wandb.forked import leave_temporary_folders_to_parent

        leave_temporary_folders_to_parent()  # this driver's W&B folders: it removes them as it ends
        with os.fdopen(write, "w") as out:
            out.write(json.dumps(measure_once(parser().parse_args(argv))))
        raise SystemExit(0)
    os.close(write)
    with os.fdopen(read) as out:
        printed = out.read()
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed (its error is above)")
    return json.loads(printed)


def one(kind: str, workload: str, small: bool, settings: list[str]) -> dict[str, float]:
    command = [sys.executable, str(Path(__file__)), "--one", kind, "--workload", workload, *settings]
    return measure(command + ["--started", repr(time.time())] + (["--smoke"] if small else []))


# (workload, baseline kind, measured kind, what the ratio is)
COMPARISONS = [
    ("default", "raw", "template", "template / raw loop"),
    ("default", "raw_batched", "template", "template / raw loop with the template's batches (loop cost only)"),
    ("default", "lightning", "template", "template / bare Lightning, same net and batches, Lightning's default logger"),
    (
        "default",
        "lightning_wandb",
        "template",
        "template / bare Lightning logging to W&B offline as the template does (kiln's own cost)",
    ),
    ("resnet", "raw", "template", "template / raw loop"),
    ("cifar_gpu", "raw", "raw_fast", "optimised / fp32 eager (raw loops, DataLoader)"),
    ("cifar_gpu", "raw", "ceiling", "ceiling / fp32 eager raw loop: the most the optimised settings can give"),
    ("cifar_gpu", "raw_fast", "template_fast", "template / raw loop, same DataLoader, both optimised"),
    ("cifar_gpu", "ceiling", "template_on_device", "template, on-device data / ceiling"),
    ("cifar_gpu", "template_fast", "template_on_device", "on-device data / DataLoader (template)"),
]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), help="default: all this machine can run")
    parser.add_argument("--smoke", action="store_true", help="every workload tiny, on the CPU, once: checks the script")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="folder for the JSON and Markdown results")
    parser.add_argument("--update-readme", action="store_true", help="also rewrite the table in benchmarks/README.md")
    all_kinds = sorted({k for ks in KINDS.values() for k in ks})
    parser.add_argument("--kinds", nargs="+", choices=all_kinds, help="only these kinds (default: each workload's)")
    parser.add_argument("--compile-mode", choices=COMPILE_MODES, default=DEFAULT_COMPILE_MODE,
                        help="cifar_gpu's optimised kinds: torch.compile mode, or none for eager")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=GPU_BATCH, help="cifar_gpu's batch size")
    parser.add_argument("--epochs", type=int, help="epochs per run (default: the workload's)")
    parser.add_argument("--profile", type=Path, help="also profile each run into this folder (benchmarks/profiling.py)")
    parser.add_argument("--no-sweep", action="store_true", help="leave out the sweep and start-up measurements")
    parser.add_argument("--no-serve", action="store_true", help="leave out `kiln serve` under load (serving.py)")
    parser.add_argument("--template-args", default="", help="more `kiln fit` arguments for the template kinds")
    parser.add_argument("--one", choices=all_kinds, help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--sweep-trials", type=int, help=argparse.SUPPRESS)
    return parser


def measure_once(options: argparse.Namespace) -> dict[str, float]:
    """What one measuring process (``--one`` or ``--sweep-trials``) measures."""
    global GPU_BATCH
    GPU_BATCH = options.batch_size
    if options.sweep_trials:
        return sweep_overhead(options.sweep_trials)
    epochs = options.epochs or (WORKLOADS[options.workload][1] if not options.smoke else 2)
    run = (options.workload, epochs, options.started, options.one, options.smoke)
    if options.one.startswith("raw"):
        return run_raw(*run, compile_mode=options.compile_mode)
    if options.one.startswith("lightning"):  # benchmarks/bare_lightning.py
        from bare_lightning import run_lightning

        wandb = options.one == "lightning_wandb"
        return {**run_lightning(epochs, options.started, options.smoke, wandb), **peak_memory("cpu")}
    if options.one == "ceiling":
        return run_ceiling(*run, compile_mode=options.compile_mode, profile=options.profile)
    extra = shlex.split(options.template_args)
    return run_template(*run, compile_mode=options.compile_mode, profile=options.profile, extra=extra)


def main() -> None:
    options = parser().parse_args()
    if options.sweep_trials or options.one:  # a single measuring process
        print(json.dumps(measure_once(options)))
        return
    settings = ["--compile-mode", options.compile_mode, "--batch-size", str(options.batch_size)]
    settings += ["--epochs", str(options.epochs)] if options.epochs else []
    settings += ["--profile", str(options.profile)] if options.profile else []
    settings += ["--template-args", options.template_args] if options.template_args else []

    import torch

    if options.smoke:  # its measuring processes are forked from this one: they import nothing again
        for name in SMOKE_PRELOADED:
            importlib.import_module(name)

    runnable = [w for w in WORKLOADS if w != "cifar_gpu" or torch.cuda.is_available() or options.smoke]
    workloads = options.workloads or runnable
    if "cifar_gpu" not in workloads and not options.smoke:
        print("no CUDA GPU here: the cifar_gpu workload is left out", file=sys.stderr)
    repeats = 1 if options.smoke else options.repeats
    medians: dict[str, dict[str, dict[str, float]]] = {}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for workload in workloads:
        kinds = [k for k in KINDS[workload] if options.kinds is None or k in options.kinds]
        samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
        for repeat in range(repeats):
            for kind in samples:  # interleaved, so drifts hit every kind alike
                samples[kind].append(one(kind, workload, options.smoke, settings))
                print(f"{workload} {kind} #{repeat + 1}: {samples[kind][-1]}", file=sys.stderr)
        medians[workload] = {k: {m: statistics.median(s[m] for s in v) for m in v[0]} for k, v in samples.items()}
        runs[workload] = samples
    gpu = {"compile_mode": options.compile_mode, "batch_size": options.batch_size}
    if options.smoke:  # on the CPU, tiny and never compiled
        gpu = {"compile_mode": "none", "batch_size": 32}
    results: dict[str, object] = {"medians": medians, "runs": runs, "comparisons": [], "cifar_gpu_settings": gpu}
    for workload, base, measured, meaning in COMPARISONS:
        if workload in runs and {base, measured} <= set(runs[workload]):  # paired: drift cancels
            pairs = list(zip(runs[workload][base], runs[workload][measured], strict=True))
            results["comparisons"].append({  # type: ignore[attr-defined]
                "workload": workload, "baseline": base, "measured": measured, "meaning": meaning,
                "ratio": statistics.median(b["steps_per_s"] / a["steps_per_s"] for a, b in pairs),
                "extra_ms_per_step": statistics.median(1000 / b["steps_per_s"] - 1000 / a["steps_per_s"]
                                                       for a, b in pairs),
            })  # fmt: skip
    if not options.no_sweep:
        trials = ["--sweep-trials", "2", "--smoke"] if options.smoke else ["--sweep-trials", "8"]  # smoke: forked
        sweep = measure([sys.executable, str(Path(__file__)), *trials])
        results["sweep"] = sweep
        with tempfile.TemporaryDirectory() as root:
            sweep["process_s"] = seconds(
                [sys.executable, "-m", "kiln", "fit", "-c", "configs/debug/limit.yaml", "--trainer.logger=false",
                 "--run.root", root, "--run.test_after_fit=false"]
            )  # fmt: skip
    if not options.smoke and not options.no_sweep:
        imports, helps = [], []
        for _ in range(repeats):  # interleaved as well
            imports.append(seconds([sys.executable, "-c", "import lightning"]))
            helps.append(seconds([sys.executable, "-m", "kiln", "fit", "--help"]))
        results["startup"] = {
            "import_lightning_s": statistics.median(imports),
            "help_s": statistics.median(helps),
            "help_extra_s": statistics.median(h - i for h, i in zip(helps, imports, strict=True)),
        }
    if not options.no_serve:
        import serving  # benchmarks/serving.py

        results["serving"] = serving.measure(options.smoke, RESNET)
    write(results, repeats, options.out, readme=options.update_readme and not options.smoke)


def machine_name() -> str:
    import torch

    name = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    name += f", {torch.get_num_threads()} threads"
    if torch.cuda.is_available():
        name += f", {torch.cuda.get_device_name()}"
    return name


def gpu_settings(results: dict) -> list[str]:
    """The line that says how cifar_gpu's kinds ran (none when it did not run)."""
    if "cifar_gpu" not in results["medians"]:
        return []
    s = results["cifar_gpu_settings"]
    compiled = "eager" if s["compile_mode"] == "none" else f"torch.compile mode {s['compile_mode']}"
    return [f"cifar_gpu: batch {s['batch_size']}; optimised kinds: bf16 autocast, channels_last, {compiled}."]


def write(results: dict, repeats: int, out: Path, readme: bool) -> None:
    machine = machine_name()
    lines = [
        f"Machine: {machine}. Medians of {repeats} interleaved runs each (ratio and extra ms/step: medians "
        f"of the back-to-back pairs), {datetime.now():%Y-%m-%d %H:%M}.",
        *gpu_settings(results),
        "",
        "| workload | measured / baseline | baseline steps/s | measured steps/s | ratio | extra ms/step "
        "| first step baseline / measured (s) | peak RSS baseline / measured (MB) | peak GPU (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in results["comparisons"]:
        a, b = results["medians"][c["workload"]][c["baseline"]], results["medians"][c["workload"]][c["measured"]]
        gpu = f"{a['peak_gpu_mb']:.0f} / {b['peak_gpu_mb']:.0f}" if "peak_gpu_mb" in a and "peak_gpu_mb" in b else "-"
        lines.append(
            f"| {c['workload']} | {c['meaning']} | {a['steps_per_s']:.1f} | {b['steps_per_s']:.1f} | "
            f"{c['ratio']:.3f} | {c['extra_ms_per_step']:.2f} | {a['first_step_s']:.1f} / {b['first_step_s']:.1f} | "
            f"{a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} | {gpu} |"
        )
    if "startup" in results:
        s = results["startup"]
        lines += [
            "",
            f"`kiln fit --help`: {s['help_s']:.2f} s; `python -c 'import lightning'`: {s['import_lightning_s']:.2f} s.",
        ]
    if "sweep" in results:
        w = results["sweep"]
        lines += [
            "",
            f"Sweep trials (`configs/debug/limit.yaml`, in-process): {w['trial_s']:.2f} s a trial in the sweep, "
            f"{w['alone_s']:.2f} s the same run alone: overhead {w['overhead_s']:.2f} s per trial (target <= 1 s); "
            f"as its own `kiln fit` process (`--subprocess`) {w['process_s']:.1f} s.",
        ]
    if "serving" in results:
        import serving

        lines += ["", "`kiln serve` (onnxruntime, CPU, `--max_batch_size 32`), one sample a request, clients on the "
                  "same machine, against onnxruntime in-process at the same batch size:", "",
                  *serving.table(results["serving"])]  # fmt: skip
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    (out / f"{stamp}.json").write_text(json.dumps({"machine": machine, **results}, indent=2))
    (out / f"{stamp}.md").write_text(table + "\n")
    if readme:
        path = HERE / "README.md"
        text = path.read_text()
        start, end = "<!-- results -->", "<!-- /results -->"
        path.write_text(text[: text.index(start) + len(start)] + "\n" + table + "\n" + text[text.index(end) :])
    print(table)


if __name__ == "__main__":
    main()
