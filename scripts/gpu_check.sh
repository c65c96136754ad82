#!/usr/bin/env bash
# Check a GPU machine end to end: the whole test suite and the GPU benchmark, logs and results under OUT.
#
#   scripts/gpu_check.sh OUT [all|tests|gpu-tests|bench] [extra pytest or bench.py arguments]
#
# With the project's .venv (make install), that environment runs everything. Without one (a GPU
# machine with no network), the machine's own python3 runs it, with what it lacks installed from
# the wheels in .whl/ (make gpu-wheels HAVE=<that machine's pip list>, on a machine with network)
# into a folder of its own, and kiln taken from src/. Writes OUT/machine.txt, OUT/tests.log and
# OUT/junit.xml (tests), OUT/failures.txt (each failure as it happens, also when a time limit cuts
# the run short), OUT/gpu-tests.log, OUT/bench.log with the results JSON and table (bench).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT [all|tests|gpu-tests|bench] [arguments]}
what=${2:-all}
shift $(( $# < 2 ? $# : 2 ))
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export WANDB_MODE=offline PYTHONUNBUFFERED=1 KILN_FAILURES="$out/failures.txt"  # each failure as it happens

if [ -x .venv/bin/python ]; then
  py=.venv/bin/python
else
  py=python3
  site=${KILN_SITE:-/tmp/kiln-site}
  if [ -d .whl ] && [ ! -f "$site/.done" ]; then
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
      || { echo "error: installing .whl/ into $site failed" >&2; exit 1; }
    touch "$site/.done"
  fi
  export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # subprocesses (python -m kiln) inherit it
  export VENV=${VENV:-$("$py" -c 'import sys; print(sys.prefix)')}  # scripts/torchrun.sh runs its torchrun
fi

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c 'import sys, torch, lightning; print(sys.version.split()[0], "torch", torch.__version__, "lightning", lightning.__version__, "cuda", torch.cuda.is_available())'
  git log -1 --format='kiln %h' 2>/dev/null; git status --short | head -5; echo "$(nproc) CPU cores"; } > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
if [ "$what" != tests ] && ! "$py" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  echo "error: no CUDA GPU here ($py sees none): the GPU tests and benchmark need one; 'tests' runs the suite alone" >&2
  exit 1
fi

status=0
pytest_args=(-p no:cacheprovider -o "junit_family=xunit2")
if "$py" -c 'import xdist' 2>/dev/null; then  # one worker per 2 cores, each with 2 threads
  workers=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))
  pytest_args+=(-n "$workers")
  export OMP_NUM_THREADS=2
fi
if [ "$what" = all ] || [ "$what" = gpu-tests ]; then
  "$py" -m pytest -m gpu "${pytest_args[@]}" "$@" 2>&1 | tee "$out/gpu-tests.log" || status=1
fi
if [ "$what" = all ] || [ "$what" = tests ]; then
  "$py" -m pytest "${pytest_args[@]}" --junitxml "$out/junit.xml" "$@" 2>&1 | tee "$out/tests.log" || status=1
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  unset OMP_NUM_THREADS
  "$py" benchmarks/bench.py --workloads cifar_gpu --no-sweep --out "$out" "$@" 2>&1 | tee "$out/bench.log" || status=1
fi
exit $status
