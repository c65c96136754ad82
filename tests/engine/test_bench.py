"""`make bench` itself: every workload's code path runs (tiny, on the CPU) and reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench.py"


@pytest.mark.slow
@pytest.mark.long
def test_bench_smoke_runs_the_gpu_workload_paths_and_writes_every_comparison(tmp_path: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "offline"}
    cmd = [sys.executable, str(BENCH), "--smoke", "--workloads", "cifar_gpu", "--out", str(tmp_path), "--epochs", "6",
           "--profile", str(tmp_path / "profile")]  # fmt: skip
    leftovers = set(Path(tempfile.gettempdir()).glob("kiln-bench-*"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "W&B: logging stopped" not in done.stderr  # each forked run logs to W&B as a run of its own would
    assert set(Path(tempfile.gettempdir()).glob("kiln-bench-*")) == leftovers  # each run's folder is removed
    (result,) = tmp_path.glob("*.json")
    report = json.loads(result.read_text())
    kinds = report["medians"]["cifar_gpu"]
    assert set(kinds) == {"raw", "raw_fast", "template_fast", "template_on_device", "ceiling"}
    for figures in kinds.values():
        assert figures["steps_per_s"] > 0 and figures["first_step_s"] > 0 and figures["peak_rss_mb"] > 0
    pairs = [(c["baseline"], c["measured"]) for c in report["comparisons"]]
    assert pairs == [("raw", "raw_fast"), ("raw", "ceiling"), ("raw_fast", "template_fast"),
                     ("ceiling", "template_on_device"), ("template_fast", "template_on_device")]  # fmt: skip
    table = next(tmp_path.glob("*.md")).read_text()
    assert table.count("| cifar_gpu |") == 5 and "template, on-device data / ceiling" in table
    sweep = report["sweep"]  # the per-trial overhead of `kiln sweep`
    assert sweep["trial_s"] > 0 and sweep["alone_s"] > 0 and sweep["process_s"] > 0  # speeds: make bench
    assert "overhead" in table
    for clients, served in report["serving"]["digits"].items():  # `kiln serve` under load, and the ceiling
        assert served["requests_per_s"] > 0 and served["p99_ms"] >= served["p50_ms"] > 0, clients
        assert served["ceiling_per_s"] > 0 and f"| digits | {clients} |" in table
    profile = tmp_path / "profile"  # --profile: where each run's steps go, an epoch per tool
    for kind in ("ceiling", "template_on_device", "template_fast"):
        assert "Self CPU" in (profile / f"{kind}-ops.txt").read_text()  # torch.profiler's tables
        assert "cumulative" in (profile / f"{kind}-cprofile.txt").read_text()
        assert (profile / f"{kind}-trace.json.gz").stat().st_size > 1000  # a Perfetto trace
    lines = (profile / "summary.md").read_text().splitlines()
    assert len(lines) == 3 and all("clean ms/step" in line and "kernels/step" in line for line in lines)
    assert "training_step" in (profile / "template_on_device-cprofile.txt").read_text()  # Lightning's hooks
