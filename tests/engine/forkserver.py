"""``python -m kiln`` for tests, forked from a Python that has already imported torch, Lightning and kiln.

Each command runs kiln's real entry point in a process of its own (its argv, environment, folder, process group,
output and exit status), without paying again the ~3 s of imports that every launch of the suite would
(benchmarks/README.md). Tests about a process's own start or end (imports, signal masks, Python's finalization,
the installed script, the README's `make` commands and the scripts') launch real processes; so does a command whose
environment differs from the server's in a variable the preloaded modules may read as they import. Under
pytest-xdist one server, started by the controller, serves every worker; a process on its own starts its own.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kiln.wandb.forked import leave_temporary_folders_to_parent

# a W&B run's start imports W&B's launch inputs (1.7 CPU-s, pandas with them); a sweep on a database storage imports
# alembic and SQLAlchemy (0.6); a fit imports kiln's and the research package's modules and what they use (0.1-0.25
# s; they read no environment variable as they import): each forked command that needed them imported them again
PRELOADED = ("torch", "lightning.pytorch", "jsonargparse", "torchmetrics", "torchvision", "wandb.sdk.launch", "pandas",
             "optuna", "alembic", "sqlalchemy", "kiln.cli.engine", "kiln.callbacks", "research.models", "research.data",
             "research.nets", "torchvision.transforms.v2", "docstring_parser", "attr", "PIL.Image",
             "rich.console")  # fmt: skip
FORKABLE = {"env", "cwd", "timeout", "start_new_session"}  # subprocess.run's options a forked command takes
# variables a command may set unlike the server's: read when kiln runs, not when the preloaded modules import
# (CUBLAS_WORKSPACE_CONFIG and DATA_OPTIMIZER_*: what Lightning's deterministic mode and LitData set in a test's own
# process as it runs; in the worker's environment from then on, they made every later launch a real process)
RUNTIME = ("WANDB_", "PATH", "KILN_", "SLURM_", "MASTER_", "HF_", "PL_", "PYTEST_", "NETRC", "PYTHONPATH", "RANK",
           "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC",
           "CUBLAS_WORKSPACE_CONFIG", "DATA_OPTIMIZER_")  # fmt: skip


def _refused(env: dict[str, str], started: dict[str, str], imported: dict[str, str]) -> list[str]:
    """The variables in which a command's environment differs from the one the server started in and that the
    preloaded modules may have read as they imported (the command then runs as a real process); a variable those
    imports set themselves (torch's TORCHINDUCTOR_CACHE_DIR) may hold what they set it to."""
    differing = {k for k in {*env, *started} if env.get(k) != started.get(k)}
    return sorted(k for k in differing if not k.startswith(RUNTIME) and env.get(k) != imported.get(k))


def _serve(path: str) -> None:
    """The server: import, then fork one child per request until the process that started it goes away."""
    started = dict(os.environ)  # before the imports, some of which set variables of their own
    for name in PRELOADED:
        importlib.import_module(name)
    imported = dict(os.environ)
    assert threading.active_count() == 1, "a thread in the server would not survive its forks"
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own]  # each command's PYTHONPATH goes first
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.binding")
    listener.listen(16)
    os.rename(f"{path}.binding", path)  # the socket appears listening: a client that finds none waits for it
    print("ready", flush=True)
    running: dict[int, tuple[socket.socket, int]] = {}  # a child's pid -> its request's connection, its pidfd
    while True:  # blocks until a request, the worker's end or a child's end: a 20 ms poll cost 11 CPU-s a session
        ready, _, _ = select.select([listener, sys.stdin, *(fd for _, fd in running.values())], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return  # the worker is gone
        if listener in ready:
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 2)
            request = json.loads(message)
            refused = _refused(request["env"], started, imported)
            if refused or not fds:  # refused, or a question (``serves``): a command sends its output files
                for fd in fds:
                    os.close(fd)
                connection.sendall(json.dumps({"refused": refused}).encode() + b"\n")
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other, pidfd in running.values():
                    other.close()
                    os.close(pidfd)
                _child(request, fds, connection, base_path)
            for fd in fds:
                os.close(fd)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            running[pid] = (connection, os.pidfd_open(pid))
        for pid, (connection, pidfd) in list(running.items()):
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                del running[pid]
                connection.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                connection.close()


def _child(request: dict[str, Any], fds: list[int], connection: socket.socket, base_path: list[str]) -> None:
    """In the forked child: become the command's own process, run ``python -m kiln``, end as a process does."""
    connection.close()
    if request["new_session"]:
        os.setsid()
    else:
        os.setpgid(0, 0)
    for target, fd in ((1, fds[0]), (2, fds[1]), (0, os.open(os.devnull, os.O_RDONLY))):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    leave_temporary_folders_to_parent()  # the server removes W&B's as it ends
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *extra, *base_path]
    sys.argv = ["-m", *request["args"]]
    code: Any = 0
    try:
        runpy.run_module("kiln", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # as Python ends: its threads joined, then atexit's functions
    atexit._run_exitfuncs()  # its finalization (objects freed, modules torn down) is left out, as in a forked worker
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


class _Server:
    """A server this process started: for its own commands, or (``share``) for the xdist workers it starts."""

    def __init__(self, inherited: bool = False) -> None:
        """``inherited``: the environment a child process inherits (the C library's), as pytest-xdist's workers get
        it; else this process's ``os.environ``, which its commands send (code beneath Python may have changed the
        C library's: COLUMNS and LINES appeared there in pytest's process)."""
        self.folder = tempfile.mkdtemp(prefix="kiln-forkserver-")
        self.path = str(Path(self.folder) / "socket")
        env = None if inherited else dict(os.environ)
        self.process = subprocess.Popen([sys.executable, __file__, self.path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env)  # fmt: skip

    def wait_ready(self) -> None:
        """Wait until it has imported and listens (a server that failed to start fails the caller)."""
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == b"ready"

    def close(self) -> None:
        """Stop the server (its stdin closes) and remove its socket's folder."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


REAL = "KILN_TESTS_REAL_PROCESSES"  # set: every command runs as a real process
SHARED = "KILN_TESTS_FORK_SERVER"  # the socket of the server an xdist controller started for all its workers
_server: _Server | None = None
_starting = threading.Lock()  # the README test runs commands from several threads


def share() -> None:
    """Start one server for the workers this process (pytest-xdist's controller) is about to start, without
    waiting for it to import (the workers start meanwhile; they wait for its socket): each worker's own imported
    torch, Lightning and kiln again (8.5 CPU-s a worker). It inherits the environment the workers inherit (with
    what every conftest's pytest_configure set), so their commands fork from it."""
    global _server
    _server = _Server(inherited=True)
    os.environ[SHARED] = _server.path


def stop() -> None:
    """End the server this process started, if it did (as its pytest session ends)."""
    global _server
    if _server is not None:
        _server.close()
        _server = None
        os.environ.pop(SHARED, None)


def _socket() -> str:
    """The path of the server to ask: the controller's shared one, else this process's own (started at first use)."""
    global _server
    if shared := os.environ.get(SHARED):
        return shared
    with _starting:
        if _server is None:
            _server = _Server()
            _server.wait_ready()
    return _server.path


def _connect(path: str, patience: float = 120.0) -> socket.socket:
    """A connection to the server at ``path``; a shared server may still be importing: its socket comes once it
    listens. A socket nobody listens on is a server that ended: that fails at once."""
    deadline = time.monotonic() + patience
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except FileNotFoundError:
            connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no fork server listens at {path} after {patience:.0f} s") from None
            time.sleep(0.05)
        except ConnectionRefusedError:
            connection.close()
            raise RuntimeError(f"the fork server at {path} has ended (its output is above)") from None


def _ask(request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, Any, dict[str, Any]]:
    """Send a request to the server; the connection, its replies and the first reply."""
    connection = _connect(_socket())
    socket.send_fds(connection, [json.dumps(request).encode()], fds)
    replies = connection.makefile("rb")
    return connection, replies, json.loads(replies.readline())


def serves(env: dict[str, str]) -> bool:
    """Whether a command with this environment is forked (else it runs as a real process)."""
    connection, _, reply = _ask({"env": env}, [])
    connection.close()
    return not reply["refused"]


def run(command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(command, capture_output=True, text=True, ...)``, or with ``stdout=PIPE, stderr=STDOUT``
    (one stream, as a console shows both): forked when ``command`` is ``[sys.executable, "-m", "kiln", ...]`` and
    asks for no more than ``env``, ``cwd``, ``timeout`` and ``start_new_session``; a real process otherwise, or
    where the environment differs from the server's in a variable outside RUNTIME."""
    env = dict(os.environ if options.get("env") is None else options["env"])
    merged = options.get("stdout") == subprocess.PIPE and options.get("stderr") == subprocess.STDOUT
    asked = {k: options.pop(k) for k in ("capture_output", "text", "stdout", "stderr") if k in options}
    captured = (asked.get("capture_output", False) or merged) and asked.get("text")
    forkable = command[:3] == [sys.executable, "-m", "kiln"] and captured and set(options) <= FORKABLE
    forkable = forkable and not os.environ.get(REAL)  # a test marked real_process (tests/engine/conftest.py)
    if not forkable:
        return subprocess.run(command, **asked, **options)
    cwd, timeout = str(options.get("cwd") or os.getcwd()), options.get("timeout")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        request = {"args": command[3:], "env": env, "cwd": cwd, "new_session": options.get("start_new_session", False)}
        connection, replies, reply = _ask(request, [out.fileno(), (out if merged else err).fileno()])
        if "pid" not in reply:
            connection.close()
            return subprocess.run(command, **asked, **options)
        connection.settimeout(timeout)
        try:
            code = json.loads(replies.readline())["code"]
        except TimeoutError:
            os.killpg(reply["pid"], signal.SIGKILL)
            raise subprocess.TimeoutExpired(command, timeout or 0) from None
        finally:
            connection.close()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return subprocess.CompletedProcess(command, code, stdout, None if merged else stderr)


def run_together(commands: list[list[str]], **options: Any) -> list[subprocess.CompletedProcess[str]]:
    """``run`` for commands that must run at the same time (workers of one study, multiruns on one folder)."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda command: run(command, **options), commands))


if __name__ == "__main__":
    _serve(sys.argv[1])
