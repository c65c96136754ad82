"""A hand-written PyTorch loop against the template's `fit` path: same network, data, optimizer, batch size.

`make bench` runs every workload as fresh processes, raw and template interleaved, and reports
medians: steps/s (from the second epoch on), the template's extra milliseconds per step, time
from process start to the first optimizer step, and peak memory. Results go to
benchmarks/results/ (JSON and Markdown) and the table into benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# workload -> (template CLI arguments, epochs); the raw loop mirrors the same settings
# (the ResNet's width is set: a class_path switch keeps init_args the new class accepts, like SmallCNN's 32)
RESNET = ["--model.init_args.net", "kiln.nets.ResNet", "--model.init_args.net.init_args.in_channels", "3",
          "--model.init_args.net.init_args.width", "16", "--data", "kiln.data.SyntheticDataModule",
          "--data.num_samples", "1280", "--data.batch_size", "128", "--data.num_workers", "0"]  # fmt: skip
WORKLOADS: dict[str, tuple[list[str], int]] = {
    "default": ([], 6),  # digits, SmallCNN, batch 64, AdamW + warm-up/cosine, augmentation
    "resnet": (RESNET, 3),  # ResNet-20 on random CIFAR-shaped images, batch 128
}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_raw(workload: str, epochs: int, started: float) -> dict[str, float]:
    """zero_grad, forward, loss, backward, step; a DataLoader; evaluation under inference_mode."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(42)
    if workload == "default":
        from sklearn.datasets import load_digits
        from torchvision.transforms import v2

        from kiln.nets import SmallCNN

        digits = load_digits()
        images = (torch.from_numpy(digits.images).float().div(16).unsqueeze(1) - 0.3053) / 0.3760
        labels = torch.from_numpy(digits.target).long()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
        train, val = order[:1258], order[1258:1438]
        augment = v2.RandomAffine(degrees=10, translate=(0.125, 0.125))
        net, batch_size = SmallCNN(in_channels=1, num_classes=10, width=32), 64

        class Augmented(TensorDataset):
            def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
                x, y = super().__getitem__(i)
                return augment(x), y

        train_set = Augmented(images[train], labels[train])
        val_set = TensorDataset(images[val], labels[val])
    else:
        from kiln.nets import ResNet

        g = torch.Generator().manual_seed(0)
        images = torch.randint(0, 256, (1280 + 128, 3, 32, 32), generator=g, dtype=torch.uint8).float().div(255)
        labels = torch.randint(0, 10, (1280 + 128,), generator=g)
        train_set, val_set = TensorDataset(images[:1280], labels[:1280]), TensorDataset(images[1280:], labels[1280:])
        net, batch_size = ResNet(in_channels=3, num_classes=10), 128
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=batch_size)
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.01)
    total = epochs * len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(1, int(0.05 * total))) * 0.5 * (1 + math.cos(math.pi * s / total))
    )
    first_step = timed_from = None
    for epoch in range(epochs):
        if epoch == 1:
            timed_from, steps_before = time.perf_counter(), epoch * len(loader)
        net.train()
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            schedule.step()
            if first_step is None:
                first_step = time.time() - started
        net.eval()
        with torch.inference_mode():
            correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in val_loader)
        print(f"epoch {epoch}: loss {float(loss):.3f} val acc {correct / len(val_set):.3f}", file=sys.stderr)
    assert timed_from is not None and first_step is not None
    rate = (total - steps_before) / (time.perf_counter() - timed_from)
    return {"steps_per_s": rate, "first_step_s": first_step, "peak_rss_mb": peak_rss_mb()}


def run_template(workload: str, epochs: int, started: float) -> dict[str, float]:
    """The template's own `fit`: default callbacks, W&B (offline) and the progress bar all on."""
    from lightning.pytorch import Callback

    from kiln.cli import build_cli

    class Timer(Callback):
        first_step: float | None = None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
            if self.first_step is None:
                self.first_step = time.time() - started

        def on_train_epoch_start(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
            if trainer.current_epoch == 1:
                self.timed_from, self.steps_before = time.perf_counter(), trainer.global_step

        def on_train_end(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
            self.rate = (trainer.global_step - self.steps_before) / (time.perf_counter() - self.timed_from)

    runs = tempfile.mkdtemp(prefix="kiln-bench-")
    args, _ = WORKLOADS[workload]
    cli = build_cli([*args, "--trainer.max_epochs", str(epochs), "--run.root", runs], run=False)
    timer = Timer()
    cli.trainer.callbacks.append(timer)  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert timer.first_step is not None
    return {"steps_per_s": timer.rate, "first_step_s": timer.first_step, "peak_rss_mb": peak_rss_mb()}


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "WANDB_MODE": "offline"})
    return time.perf_counter() - started


def one(kind: str, workload: str) -> dict[str, float]:
    command = [sys.executable, str(Path(__file__)), "--one", kind, "--workload", workload]
    command += ["--started", repr(time.time())]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{kind}/{workload} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--one", choices=["raw", "template"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:  # a single measured process
        runner = run_raw if options.one == "raw" else run_template
        print(json.dumps(runner(options.workload, WORKLOADS[options.workload][1], options.started)))
        return

    results: dict[str, dict] = {}
    for workload in options.workloads:
        samples: dict[str, list[dict[str, float]]] = {"raw": [], "template": []}
        for repeat in range(options.repeats):
            for kind in ("raw", "template"):  # interleaved, so drifts hit both alike
                samples[kind].append(one(kind, workload))
                print(f"{workload} {kind} #{repeat + 1}: {samples[kind][-1]}", file=sys.stderr)
        medians = {k: {m: statistics.median(s[m] for s in v) for m in v[0]} for k, v in samples.items()}
        raw, template = medians["raw"], medians["template"]
        results[workload] = {
            **{f"{k}_{m}": v for k, ms in medians.items() for m, v in ms.items()},
            "ratio": template["steps_per_s"] / raw["steps_per_s"],
            "extra_ms_per_step": 1000 / template["steps_per_s"] - 1000 / raw["steps_per_s"],
        }
    imports = [seconds([sys.executable, "-c", "import lightning"]) for _ in range(3)]
    helps = [seconds([sys.executable, "-m", "kiln", "fit", "--help"]) for _ in range(3)]
    results["startup"] = {"import_lightning_s": statistics.median(imports), "help_s": statistics.median(helps)}
    write(results, options.repeats)


def write(results: dict[str, dict], repeats: int) -> None:
    import torch

    machine = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
    machine += f", {torch.get_num_threads()} threads"
    lines = [
        f"Machine: {machine}. Medians of {repeats} interleaved runs each, {datetime.now():%Y-%m-%d %H:%M}.",
        "",
        "| workload | raw steps/s | template steps/s | template/raw | extra ms/step "
        "| first step raw / template (s) | peak RSS raw / template (MB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if name == "startup":
            continue
        lines.append(
            f"| {name} | {r['raw_steps_per_s']:.1f} | {r['template_steps_per_s']:.1f} | {r['ratio']:.3f} | "
            f"{r['extra_ms_per_step']:.2f} | {r['raw_first_step_s']:.1f} / {r['template_first_step_s']:.1f} | "
            f"{r['raw_peak_rss_mb']:.0f} / {r['template_peak_rss_mb']:.0f} |"
        )
    s = results["startup"]
    lines += ["", f"`kiln fit --help`: {s['help_s']:.2f} s; `import lightning`: {s['import_lightning_s']:.2f} s."]
    table = "\n".join(lines)
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    (out / f"{stamp}.json").write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    (out / f"{stamp}.md").write_text(table + "\n")
    readme = HERE / "README.md"
    text = readme.read_text()
    start, end = "<!-- results -->", "<!-- /results -->"
    readme.write_text(text[: text.index(start) + len(start)] + "\n" + table + "\n" + text[text.index(end) :])
    print(table)


if __name__ == "__main__":
    main()
