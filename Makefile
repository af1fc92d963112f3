# One entry point for newcomers and CI.
#   make demo   - set up (core install) and run the simulated seed comparison
#   make check  - set up (dev + runtime extras) and run lint, format check, layering, types, tests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
OUT ?= out

.PHONY: setup setup-dev demo check lint typecheck test bench clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# torch==2.13.0 first: it is a CPU build available locally; any other torch that pip resolves
# on its own is a multi-GB CUDA build.
$(VENV)/.dev: $(VENV)/.core
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,transformers,onnx]'
	touch $@

# MLServer pins its own dependencies: it gets a virtualenv of its own for the interop test.
.venv-mlserver/bin/mlserver:
	bash scripts/setup_mlserver_env.sh

# perf_analyzer 2.41 (bench/perf_analyzer.py) in a virtualenv of its own: see the script.
.venv-perf/bin/perf_analyzer:
	bash scripts/setup_perf_analyzer.sh

setup: $(VENV)/.core
setup-dev: $(VENV)/.dev .venv-mlserver/bin/mlserver

demo: setup
	$(VENV)/bin/evenserve compare scenarios/seed.yaml --plots $(OUT)/seed --json $(OUT)/seed/summary.json

lint: setup-dev
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/lint-imports

typecheck: setup-dev
	$(VENV)/bin/mypy --strict src

# The tests run in TEST_WORKERS processes (pytest-xdist), one test file per process at a time
# (--dist loadfile: a file's module-scoped servers start once); TEST_WORKERS=0 runs them in
# this process. A run that collects no tests still exits 5 and fails.
TEST_WORKERS ?= 2
test: setup-dev
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile

check: lint typecheck test

bench: setup
	$(PY) bench/sim_speed.py

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache
