"""`kiln serve` under load: requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, against onnxruntime
called in-process on the same samples at the same batch sizes (the ceiling no server can pass).

A short default-experiment run is exported as `kiln export` does, then served as `kiln serve --model` serves it;
each client keeps one HTTP connection and sends one sample a request, as a service calling it would.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KILN = [sys.executable, "-m", "kiln"]
CLIENTS = (1, 8, 32)


def exported(folder: Path, args: list[str]) -> Path:
    """A short run (configs/debug/limit.yaml) of the default experiment with ``args``, exported to ONNX."""
    quiet = ["--trainer.logger=false", "--run.test_after_fit=false", "--run.root", str(folder / "runs")]
    subprocess.run([*KILN, "fit", "-c", str(ROOT / "configs/debug/limit.yaml"), *quiet, *args], check=True,
                   capture_output=True)  # fmt: skip
    (best,) = (folder / "runs").glob("*/*/checkpoints/best-*.ckpt")
    out = folder / "export"
    subprocess.run([*KILN, "export", "--ckpt_path", str(best), "--format", "onnx", "--output", str(out)], check=True,
                   capture_output=True)  # fmt: skip
    return out / "model.onnx"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load(port: int, clients: int, seconds: float, body: bytes) -> dict[str, float]:
    """``clients`` threads sending ``body`` back to back for ``seconds``: requests/s, p50 and p99 (ms)."""
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine = []
        while (start := time.perf_counter()) < end:
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            assert answer.status == 200, answer.read()
            answer.read()
            mine.append(time.perf_counter() - start)
        latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cuts = statistics.quantiles(latencies, n=100)
    return {"requests_per_s": len(latencies) / (time.perf_counter() - began), "p50_ms": 1000 * cuts[49],
            "p99_ms": 1000 * cuts[98]}  # fmt: skip


def ceiling(model: Path, pixels: np.ndarray, batch: int, seconds: float) -> float:
    """Samples/s of onnxruntime in this process on batches of ``batch`` copies of ``pixels``, preprocessed once."""
    from kiln.commands.exported import load as load_model

    served = load_model(model, "bench")
    x = np.repeat(served.samples(pixels[None]), batch, axis=0)
    served.run(x)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        served.run(x)
        done += batch
    return done / (time.perf_counter() - start)


def measure(smoke: bool, resnet: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """The default experiment's SmallCNN on 8x8, and (not in a smoke run) bench.py's ResNet-20 on 3x32x32 (``resnet``:
    its `kiln fit` arguments): each one's requests/s and p50/p99 at each client count, and the ceiling."""
    models = {"digits": [], **({"resnet": resnet} if resnet and not smoke else {})}
    return {name: measure_one(args, smoke) for name, args in models.items()}


def measure_one(args: list[str], smoke: bool) -> dict[str, dict[str, float]]:
    seconds = 0.5 if smoke else 8.0
    with tempfile.TemporaryDirectory() as folder:
        model = exported(Path(folder), args)
        spec = json.loads((model.parent / "preprocess.json").read_text())
        pixels = np.random.default_rng(0).integers(0, 256, spec["input_shape"]).astype(np.uint8)  # JSON: as integers
        port = _port()
        server = subprocess.Popen([*KILN, "serve", "--model", str(model), "--port", str(port)],
                                  stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        try:
            _healthy(port, server)
            body = json.dumps({"input": pixels.tolist()}).encode()
            results = {str(c): load(port, c, seconds, body) for c in CLIENTS}
        finally:
            server.send_signal(signal.SIGTERM)  # as `docker stop` does: the server stops its own processes
            server.wait(60)
        for c in CLIENTS:
            results[str(c)]["ceiling_per_s"] = ceiling(model, pixels, min(c, 32), seconds)
    return results


def _healthy(port: int, server: subprocess.Popen) -> None:
    for _ in range(1200):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError("kiln serve exited before it was healthy")
        time.sleep(0.1)
    raise RuntimeError("kiln serve was not healthy within 120 s")


def table(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    lines = ["| model | clients | requests/s | p50 (ms) | p99 (ms) | in-process onnxruntime, samples/s | served / "
             "in-process |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, rows in results.items():
        for c, r in rows.items():
            lines.append(f"| {name} | {c} | {r['requests_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                         f"{r['ceiling_per_s']:.0f} | {r['requests_per_s'] / r['ceiling_per_s']:.3f} |")  # fmt: skip
    return lines


if __name__ == "__main__":  # the default experiment's model alone; `make bench` adds bench.py's ResNet
    print("\n".join(table(measure("--smoke" in sys.argv, []))))
