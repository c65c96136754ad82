"""The engine suite's fixtures: small files in the real formats of MNIST and CIFAR-10; real database servers."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import forkserver
import pytest
from dataset_files import write_cifar10, write_mnist


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's: the server's environment is what the workers get
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "long: a minute or so of one worker; its module runs first (see below)")
    config.addinivalue_line("markers", "real_process: every kiln command the test runs is a real process, not a fork")
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        forkserver.share()  # pytest-xdist's controller, before it starts the workers: one server for them all


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each worker starts with a long test: pytest-xdist's worksteal hands worker k the next
    ``len(pending) // workers left`` items and others steal from a queue's tail, so a long test late in a
    queue kept one worker busy while the others had nothing left (the generated project's test, started at
    485 s of 598). The modules of the long tests go round-robin to the heads of the workers' first queues,
    their long tests first; whole modules move, so module-scoped fixtures are still made once."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    long = [path for path, tests in modules.items() if any(t.get_closest_marker("long") for t in tests)]
    heads: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for n, path in enumerate(long):
        heads[n % workers] += sorted(modules[path], key=lambda t: t.get_closest_marker("long") is None)  # stable
    rest = [t for path, tests in modules.items() if path not in long for t in tests]
    ordered: list[pytest.Item] = []
    for k, head in enumerate(heads):
        fill = max(0, (len(items) - len(ordered)) // (workers - k) - len(head))
        ordered += head + rest[:fill]
        rest = rest[fill:]
    items[:] = ordered + rest


def pytest_unconfigure() -> None:
    """No server left waiting, nor its socket's folder in the temporary folder (xdist's workers skip atexit): the
    controller's shared one as the last worker has ended, a process's own as its session ends."""
    forkserver.stop()


@pytest.fixture(autouse=True)
def _real_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test about signals, exit codes or resumes that no fork proof covers (test_forkserver.py) launches real
    processes: a fork skips Python's own finalization."""
    if request.node.get_closest_marker("real_process"):
        monkeypatch.setenv(forkserver.REAL, "1")


@pytest.fixture
def mnist_root(tmp_path: Path) -> Path:
    """A data folder holding small MNIST and FashionMNIST files in the real idx format."""
    root = tmp_path / "data"
    write_mnist(root / "MNIST" / "raw", n_train=96, n_test=48, seed=0)
    write_mnist(root / "FashionMNIST" / "raw", n_train=96, n_test=48, seed=1)
    return root


@pytest.fixture
def cifar_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data folder holding small CIFAR-10 batches in the real pickle format.

    torchvision checks each file's md5 against the official release; synthetic files cannot
    match, so only that check is bypassed.
    """
    from torchvision.datasets import cifar

    root = tmp_path / "data"
    write_cifar10(root / "cifar-10-batches-py", n_per_batch=20, seed=2)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    return root


@contextlib.contextmanager
def _engine(name: str, timeout: int) -> Iterator[list[str]]:
    """``scripts/engines/<name> start`` (skipped, with the script's reason, where it cannot start), stopped after;
    what it printed, its folder first."""
    script = str(Path(__file__).resolve().parents[2] / "scripts" / "engines" / name)
    started = subprocess.run([script, "start"], capture_output=True, text=True, timeout=timeout)
    if started.returncode == 3:
        pytest.skip(started.stderr.strip())
    assert started.returncode == 0, started.stderr[-2000:]
    printed = started.stdout.split()
    try:
        yield printed
    finally:
        subprocess.run([script, "stop", printed[0]], check=False, timeout=60)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server of its own on 127.0.0.1, as scripts/engines/postgres.sh starts it for users and CI
    (skipped where no server is installed); its URL, password included."""
    with _engine("postgres.sh", timeout=120) as (_, url):
        yield url


@pytest.fixture
def slurm_conf() -> Iterator[str]:
    """A one-node SLURM cluster of its own, as scripts/engines/slurm.sh starts it (skipped where it cannot: not
    root, no SLURM); its slurm.conf, for SLURM_CONF. One at a time on a machine (an flock across pytest-xdist
    workers): two clusters on one host both named their node after it, and a job of one never started."""
    with open(Path(tempfile.gettempdir()) / "kiln-slurm-tests.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        with _engine("slurm.sh", timeout=300) as (folder,):
            yield f"{folder}/slurm.conf"
