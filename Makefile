# Run `make` (or `make help`) for the list of targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash

# uv on PATH; else the one `make install` put in the user's bin folder (not on PATH everywhere); else a module
# of python3 (no `python3 -m uv` first: under `uv run` or an activated .venv, python3 is the venv's, without uv)
UV := $(shell command -v uv 2>/dev/null || { u="$$(python3 -m site --user-base 2>/dev/null)/bin/uv"; [ -x "$$u" ] && echo "$$u"; } || echo python3 -m uv)
# the uv that writes uv.lock (pyproject.toml's required-version), so one `uv add` changes only its own lines
UV_VERSION := 0.13.9
EXP ?=
TRAINER ?=
LOGGER ?=
DEBUG ?=
ARGS ?=
SWEEP ?= digits
# .pyc files written at install where Python writes none itself (PYTHONDONTWRITEBYTECODE: every start compiled every
# module again, the project's own src/ too); elsewhere Python caches the ~3.4k modules a command imports on first
# use, not all 19k (30 s). An edited module is compiled again on each start until the next `make install`
BYTECODE := $(if $(PYTHONDONTWRITEBYTECODE),--compile-bytecode)
# tests in TEST_WORKERS processes of one thread each (torch's own threads would only contend for the cores);
# every run of a test, and the runs it starts, see the same thread count: CPU results stay bitwise comparable.
# The engine suite's tests wait on their subprocesses, servers and SLURM: a third worker takes the core a waiting
# one leaves (benchmarks/README.md); test-fast's and a generated project's tests keep theirs busy: two
TEST_WORKERS ?= $(if $(SUITE),3,2)
FAST_WORKERS ?= 2
PYTEST = OMP_NUM_THREADS=1 $(UV) run --no-sync pytest --dist worksteal
# without the notebook plugin (1.3 s to import in each worker) where no notebook is collected
NO_NOTEBOOKS = -p no:nbmake -o addopts="-ra --strict-markers --durations=$(1)"
# the template runs its engine suite, which generates a project and runs that project's own `make test` (the
# research package's tests and notebooks, renamed); a generated project has no tests/engine: its tests run here
SUITE = $(if $(wildcard tests/engine),tests/engine,)
PRESETS = $(if $(EXP),-c configs/experiment/$(EXP).yaml) $(if $(TRAINER),-c configs/trainer/$(TRAINER).yaml) \
          $(if $(LOGGER),-c configs/logger/$(LOGGER).yaml) $(if $(DEBUG),-c configs/debug/$(DEBUG).yaml)

.PHONY: help install add train sweep test test-fast test-gpu gpu-check gpu-wheels lint format typecheck notebook bench mutants clean

help: ## Show this list of targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  train variables: EXP=<configs/experiment/*> TRAINER=<configs/trainer/*> LOGGER=<configs/logger/*> DEBUG=<configs/debug/*> ARGS='--key value ...'"

install: ## Install uv if missing, then the locked environment (.venv) and, in a git repo, the pre-commit hooks
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet --user uv==$(UV_VERSION) 2>/dev/null || python3 -m pip install --quiet uv==$(UV_VERSION)
	$(UV) sync --locked --all-extras $(BYTECODE)  # every extra (HF datasets, LitData)
	$(if $(BYTECODE),$(UV) run --no-sync python -m compileall -q src || echo "src/: a module above does not compile; Python reports it when it is imported")
	@if [ -d .git ]; then $(UV) run --no-sync pre-commit install >/dev/null && echo "pre-commit hooks installed"; fi
	@echo "ready: make train, make test-fast; the CLI is .venv/bin/kiln (or \`source .venv/bin/activate\`, then kiln)"

add: ## Add a dependency to pyproject.toml and uv.lock and install it (PKG='name>=1.2'; GROUP=dev for a tool)
	@test -n "$(PKG)" || { echo "PKG='name>=version': the package to add (GROUP=dev for a development tool)"; exit 2; }
	$(UV) add $(if $(GROUP),--group $(GROUP)) "$(PKG)"

train: ## Train the default experiment (override with EXP=, TRAINER=, LOGGER=, DEBUG=, ARGS=)
	$(UV) run --no-sync kiln fit $(PRESETS) $(ARGS)

sweep: ## Hyper-parameter sweep of configs/sweep/$(SWEEP).yaml (rerun to continue it; ARGS='--report' for the table only)
	$(UV) run --no-sync kiln sweep -c configs/sweep/$(SWEEP).yaml $(ARGS)

test: ## Run the whole test suite on the CPU, as CI does (GPU tests: make test-gpu); in the template, the engine's suite
	$(PYTEST) -n $(TEST_WORKERS) $(if $(SUITE),$(call NO_NOTEBOOKS,30)) $(SUITE)

test-fast: ## The inner loop while working: no slow, no GPU tests, no notebook (nor its plugin: 1.3 s to import)
	$(PYTEST) -n $(FAST_WORKERS) -m "not slow and not gpu" $(call NO_NOTEBOOKS,15) tests

test-gpu: ## Run only the GPU tests (needs CUDA)
	$(UV) run --no-sync pytest -m gpu

gpu-check: ## On a GPU machine: the whole suite, the GPU tests and the GPU benchmark, logs in OUT (default gpu-check/)
	scripts/gpu_check.sh $(or $(OUT),gpu-check)

gpu-wheels: ## Wheels a GPU machine without network lacks, into .whl/ (HAVE=<its pip list --format=freeze>)
	@test -n "$(HAVE)" || { echo "HAVE=<file>: the GPU machine's python3 -m pip list --format=freeze"; exit 2; }
	UV="$(UV)" $(UV) run --no-sync python scripts/gpu_wheels.py $(HAVE)

lint: ## Check style with ruff
	$(UV) run --no-sync ruff check .
	$(UV) run --no-sync ruff format --check .

format: ## Fix style with ruff
	$(UV) run --no-sync ruff format .
	$(UV) run --no-sync ruff check --fix .

typecheck: ## Check types with mypy
	$(UV) run --no-sync mypy

bench: ## Benchmark the template against a raw PyTorch loop (benchmarks/README.md)
	$(UV) run --no-sync python benchmarks/bench.py --update-readme

mutants: ## Break the engine on purpose, one promise at a time, and check a test fails for each (tests/engine/mutants.py)
	@test -d tests/engine || { echo "make mutants: the engine's suite is the template's (tests/engine)"; exit 2; }
	$(UV) run --no-sync python tests/engine/mutants.py

notebook: ## Start JupyterLab in notebooks/ with the project's environment as the kernel
	$(UV) run --no-sync jupyter lab notebooks/

clean: ## Remove run folders and caches (keeps data/ and .venv)
	rm -rf runs .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +
