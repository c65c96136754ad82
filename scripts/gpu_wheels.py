"""Download, on a machine with network, the wheels a GPU machine without one lacks, for scripts/gpu_check.sh.

    make gpu-wheels HAVE=have.txt   (or: uv run --no-sync python scripts/gpu_wheels.py HAVE [--python 3.12])

HAVE lists what the GPU machine's Python already has (`python3 -m pip list --format=freeze` run there,
or one name per line). Every locked package it lacks is fetched (main dependencies, every extra and
the test tools of the dev group), for that Python and Linux x86-64; the torch/CUDA stack is never
fetched (a GPU machine brings its own build), nor the editors' tools (jupyterlab, mypy, ruff, pre-commit).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
NEVER = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")  # the machine's own GPU build
NOT_FOR_TESTS = {"jupyterlab", "jupyter-server", "jupyterlab-server", "jupyter-lsp", "notebook-shim", "mypy", "ruff",
                 "pre-commit", "identify", "cfgv", "nodeenv", "virtualenv", "distlib", "babel", "debugpy", "jedi",
                 "parso", "nbconvert", "jupyter-events", "terminado", "send2trash", "argon2-cffi",
                 "argon2-cffi-bindings", "jupyter-builder", "widgetsnbextension",
                 "jupyterlab-widgets"}  # fmt: skip
# (the last three: notebook front-end assets, never imported)
CARRY_MIB = 60  # a lent GPU machine's call carries 64 MiB, the working tree (about 3) with the wheels
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
PLATFORMS += [f"manylinux_2_{n}_x86_64" for n in range(24, 40)]


def uv() -> list[str]:
    """The uv the Makefile uses (``$UV``: ``uv``, or ``python3 -m uv`` where it was installed with pip)."""
    return os.environ.get("UV", "uv").split()


def pip() -> list[str]:
    """pip of this Python, or one uv runs for the download (uv's environments have no pip)."""
    return [sys.executable, "-m", "pip"] if importlib.util.find_spec("pip") else [*uv(), "tool", "run", "pip"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing(have: set[str], python: str, skip: set[str]) -> list[str]:
    """The locked requirements (name==version) for Linux x86-64 and ``python`` that ``have`` lacks."""
    exported = subprocess.run(
        [*uv(), "export", "--locked", "--all-extras", "--group", "dev", "--no-hashes",
         "--no-emit-project", "--no-header"], cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    marker_env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython",
                  "extra": ""}  # fmt: skip
    wanted = []
    for line in exported.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "-")):
            continue
        requirement = Requirement(line.strip())
        name = canonical(requirement.name)
        if requirement.marker and not requirement.marker.evaluate(marker_env):
            continue
        if name in have or name in skip or name in NOT_FOR_TESTS or NEVER.match(name):
            continue
        wanted.append(f"{requirement.name}{requirement.specifier}")
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("have", type=Path, help="the GPU machine's `pip list --format=freeze` (or names, one a line)")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python version (major.minor)")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="where the wheels go (git-ignored)")
    parser.add_argument("--skip", nargs="*", default=[], help="packages to leave out (their tests skip)")
    options = parser.parse_args()
    lines = options.have.read_text().split()
    have = {canonical(re.split(r"[=<>@ ]", line.strip(), maxsplit=1)[0]) for line in lines if line.strip()}
    wanted = missing(have, options.python, {canonical(name) for name in options.skip})
    print(f"{len(wanted)} packages to fetch: {' '.join(wanted)}", file=sys.stderr)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [*pip(), "download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation",
         "cp", "--python-version", options.python, *platforms, "--dest", str(options.dest), *wanted], check=True,
    )  # fmt: skip
    print(f"wheels in {options.dest}; on the GPU machine: scripts/gpu_check.sh OUT", file=sys.stderr)
    wheels = sorted(options.dest.glob("*.whl"), key=lambda p: p.stat().st_size, reverse=True)
    total = sum(p.stat().st_size for p in wheels) / 2**20
    if total > CARRY_MIB:  # what a lent machine's call carries, the working tree included
        largest = ", ".join(f"{p.name.split('-')[0]} {p.stat().st_size / 2**20:.0f}" for p in wheels[:4])
        print(f"warning: the wheels take {total:.0f} MiB, over the {CARRY_MIB} MiB a call to a lent GPU machine "
              f"carries; the largest (MiB): {largest}. Leave some out with --skip (their tests fail there)",
              file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
