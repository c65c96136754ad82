"""`kiln serve` on the loopback: each shipped example's checkpoint served, its answers what `kiln infer` writes for
the same samples, batched under concurrency; a bad request one 4xx line with the server answering after; a
SIGTERM that finishes the requests in flight."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataset_files import write_image_folder
from helpers import CONFIGS, LIMIT, needs

needs("onnx", "onnxruntime", "litserve", "multipart", reason="needs the serve and onnx extras (make install)")

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
KILN = [sys.executable, "-m", "kiln"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request(url: str, body: bytes | None = None, kind: str = "application/json") -> tuple[int, Any]:
    """The status and the parsed answer of a GET (no body) or a POST."""
    sent = urllib.request.Request(url, data=body, headers={"Content-Type": kind})
    try:
        with urllib.request.urlopen(sent, timeout=60) as answer:
            body = answer.read()
            return answer.status, json.loads(body) if "json" in (answer.headers.get("content-type") or "") else None
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def predict(url: str, payload: dict[str, Any]) -> tuple[int, Any]:
    return request(f"{url}/predict", json.dumps(payload).encode())


@contextmanager
def serving(args: list[str], cwd: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``kiln serve`` in a process of its own, once ``/health`` says ok (never before: it polls from the start)."""
    port = free_port()
    server = subprocess.Popen([*KILN, "serve", *args, "--port", str(port)], cwd=cwd, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                status, _ = request(f"{url}/health")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert server.poll() is None, server.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "kiln serve never became healthy"
            time.sleep(0.1)
        yield url, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)


def fit(experiment: str, root: Path) -> Path:
    """A short run of ``experiment``; its best checkpoint."""
    from kiln.cli import build_cli

    files = [] if experiment == "digits" else ["-c", str(CONFIGS / "experiment" / f"{experiment}.yaml")]
    cli = build_cli(["fit", *files, *LIMIT, *QUIET, "--run.root", str(root), "--run.test_after_fit=false"])
    return Path(cli.trainer.checkpoint_callback.best_model_path)  # type: ignore[union-attr]


def samples(spec: dict[str, Any], n: int) -> np.ndarray:
    """``n`` samples of the model's input: pixels for an image model, ids below the vocabulary, else floats."""
    rng, shape = np.random.default_rng(0), spec["input_shape"]
    if spec["source"] == "image":
        return rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    if spec["dtype"] != "float32":
        return rng.integers(0, 8, (n, *shape)).astype(spec["dtype"])
    return rng.normal(size=(n, *shape)).astype(np.float32)


def same(answer: dict[str, Any], row: dict[str, str], arrays: dict[str, np.ndarray], index: int) -> bool:
    """A served answer against `kiln infer`'s CSV row (six significant digits) and its arrays."""
    if "probabilities" in answer:
        values = {"class": answer["class"], **{f"p_{k}": v for k, v in answer["probabilities"].items()}}
    else:
        values = {k: v for k, v in answer.items() if k not in ("batch", "resized", *arrays)}
    for name, array in arrays.items():
        if not np.allclose(np.asarray(answer[name]), array[int(row["array_row"])], rtol=1e-5, atol=1e-6):
            return False
    return (
        all(
            row[k] == v if isinstance(v, str) else float(row[k]) == pytest.approx(v, rel=1e-5, abs=1e-6)
            for k, v in values.items()
        )
        and int(row["sample"]) == index
    )


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["digits", "friedman", "sentences"])
def test_answers_are_kiln_infer_s_and_come_in_batches(experiment: str, tmp_path: Path) -> None:
    best = fit(experiment, tmp_path / "runs")
    run = best.parents[1]
    subprocess.run([*KILN, "export", "--ckpt_path", str(best), "--format", "onnx"], check=True, capture_output=True)
    spec = json.loads((run / "export" / "preprocess.json").read_text())
    inputs = samples(spec, 48)
    np.save(tmp_path / "samples.npy", inputs)
    infer = ["infer", "--model", str(run / "export" / "model.onnx"), "--output", str(tmp_path / "p.csv")]
    done = subprocess.run([*KILN, *infer, str(tmp_path / "samples.npy")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    arrays = {p.stem.removeprefix("p-"): np.load(p) for p in tmp_path.glob("p-*.npy")}
    assert (experiment == "sentences") == bool(arrays)  # the language model's logits are an array a sample
    with serving(["--ckpt_path", str(best), "--max_batch_size", "16", "--batch_timeout", "0.05"], tmp_path) as (url, _):
        info = request(f"{url}/info")[1]["model"]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda x: predict(url, {"input": x.tolist()}), inputs))
    assert info["checkpoint"] == str(best) and info["run"] == str(run)
    assert info["config_sha256"] == hashlib.sha256((run / "config.yaml").read_bytes()).hexdigest()
    assert info["input"]["input_shape"] == spec["input_shape"] and info["kiln"]
    assert all(status == 200 for status, _ in answers), answers[:3]
    assert all(same(a, row, arrays, i) for i, ((_, a), row) in enumerate(zip(answers, rows, strict=True)))
    assert max(a["batch"] for _, a in answers) > 1  # under 16 clients, requests ran together


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short digits run's export (model.onnx, preprocess.json)."""
    root = tmp_path_factory.mktemp("served")
    best = fit("digits", root / "runs")
    subprocess.run([*KILN, "export", "--ckpt_path", str(best), "--format", "onnx", "--output", str(root / "export")],
                   check=True, capture_output=True)  # fmt: skip
    return root / "export" / "model.onnx"


@pytest.mark.slow
def test_images_by_json_and_upload_are_answered_as_infer_reads_the_files(digits: Path, tmp_path: Path) -> None:
    images = sorted(write_image_folder(tmp_path / "images", classes=2, per_class=2, size=12))  # resized to 8x8
    done = subprocess.run([*KILN, "infer", "--model", str(digits), "--output", str(tmp_path / "p.csv"),
                           str(tmp_path / "images")], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "resized 4 of 4 images to 8x8" in done.stderr, done.stderr
    with (tmp_path / "p.csv").open() as f:
        rows = list(csv.DictReader(f))
    with serving(["--model", str(digits.parent)], tmp_path) as (url, _):  # the export folder
        encoded = [predict(url, {"image": base64.b64encode(p.read_bytes()).decode()}) for p in images]
        boundary = "kilnboundary"
        uploads = [request(f"{url}/predict", (f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
                                              f'filename="{p.name}"\r\n\r\n').encode() + p.read_bytes()
                           + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}")
                   for p in images]  # fmt: skip
    for (status, answer), (status2, upload), row in zip(encoded, uploads, rows, strict=True):
        assert status == status2 == 200 and answer == upload
        assert answer["resized"] == "resized from 12x12 to 8x8 (bilinear)"
        assert same({**answer}, {**row, "sample": "0"}, {}, 0)


BAD: dict[str, tuple[dict[str, Any], int, str]] = {
    "neither key": ({"x": 1}, 400, "a request gives either input or image"),
    "both keys": ({"input": [], "image": ""}, 400, "a request gives either input or image"),
    "wrong shape": ({"input": [[1, 2]]}, 422, "int64 values of shape [1, 2], where the model takes one sample"),
    "not numbers": ({"input": [["a"] * 8] * 8}, 422, "values that are not all numbers"),
    "not finite": ({"input": [[[float("nan")] * 8] * 8]}, 422, "input: 64 values are NaN or infinite"),
    "pixels over 255": ({"input": [[[300] * 8] * 8]}, 422, "integers are pixels from 0 to 255"),
    "not base64": ({"image": "#!"}, 422, "image: not base64"),
    "not an image": ({"image": base64.b64encode(b"text").decode()}, 422, "image: not an image file"),
}


@pytest.mark.slow
def test_a_bad_request_is_one_4xx_line_and_the_server_answers_after(digits: Path, tmp_path: Path) -> None:
    good = {"input": np.zeros((1, 8, 8)).tolist()}
    with serving(["--model", str(digits), "--max_payload_mb", "0.5", "--batch_timeout", "0.2"], tmp_path) as (
        url,
        server,
    ):
        with ThreadPoolExecutor(8) as pool:  # in one batch: a refusal is its request's alone (LitServe failed them all)
            mixed = list(pool.map(lambda p: predict(url, p), [good, BAD["wrong shape"][0]] * 4))
        assert [status for status, _ in mixed] == [200, 422] * 4
        assert max(answer["batch"] for _, answer in mixed[::2]) > 1
        for name, (payload, status, says) in BAD.items():
            got, answer = predict(url, payload)
            assert (got, says in answer["detail"], "\n" in answer["detail"]) == (status, True, False), (name, answer)
            assert predict(url, good)[0] == 200, name
        assert request(f"{url}/predict", b"{not json") == (400, {"detail": "the body is not JSON: send "
                       '{"input": [...]} or {"image": "<base64>"}, or a multipart form'})  # fmt: skip
        assert request(f"{url}/predict", b" " * 2**20)[0] == 413
        curl = request(f"{url}/predict", json.dumps(good).encode(), "application/x-www-form-urlencoded")  # curl -d
        assert curl[0] == 200 and "probabilities" in curl[1]
        assert predict(url, good)[0] == 200 and server.poll() is None


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_then_exits_0(digits: Path, tmp_path: Path) -> None:
    answers: list[tuple[int, Any]] = []
    with serving(["--model", str(digits), "--batch_timeout", "1", "--max_batch_size", "64"], tmp_path) as (url, server):
        sent = [threading.Thread(target=lambda: answers.append(predict(url, {"input": np.ones((1, 8, 8)).tolist()})))
                for _ in range(4)]  # fmt: skip
        for thread in sent:
            thread.start()
        time.sleep(0.3)  # the four wait for their batch to fill
        server.send_signal(signal.SIGTERM)
        for thread in sent:
            thread.join(60)
        assert server.wait(60) == 0, server.communicate()[1][-2000:]
        said = server.communicate()[1]
    assert "WARNING" not in said and "Traceback" not in said, said  # LitServe warned "Already not alive"
    assert [status for status, _ in answers] == [200] * 4 and {a["batch"] for _, a in answers} == {4}
    with pytest.raises(urllib.error.URLError):
        request(f"{url}/health")


@pytest.mark.slow
def test_ctrl_c_to_the_terminal_group_exits_0_without_a_traceback(digits: Path, tmp_path: Path) -> None:
    """Ctrl-C signals every process of the group: the model's process printed LitServe's KeyboardInterrupt."""
    with serving(["--model", str(digits)], tmp_path) as (url, server):
        assert predict(url, {"input": np.ones((1, 8, 8)).tolist()})[0] == 200
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(60) == 0
        said = server.communicate()[1]
    assert "Traceback" not in said and "KeyboardInterrupt" not in said and "WARNING" not in said, said


def test_a_model_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([*KILN, "serve", "--model", str(tmp_path / "model.onnx")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "model.onnx and its preprocess.json are needed (what `kiln export` writes)" in done.stderr


@pytest.mark.slow
def test_a_model_that_does_not_run_on_its_own_input_stops_before_it_listens(digits: Path, tmp_path: Path) -> None:
    """The warm-up batch runs before the server listens: it stopped with an internal error and a traceback."""
    bad = tmp_path / "export"
    shutil.copytree(digits.parent, bad)
    spec = json.loads((bad / "preprocess.json").read_text())
    (bad / "preprocess.json").write_text(json.dumps({**spec, "input_shape": [1, 9, 9]}))
    done = subprocess.run([*KILN, "serve", "--model", str(bad / "model.onnx"), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "does not run on a sample of shape [1, 9, 9], what its preprocess.json says it takes" in done.stderr
