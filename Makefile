# cgsvc developer commands. `make demo` and `make test` are the README quick start.
# Both set up .venv on first use (and again when pyproject.toml changes).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck protos protos-check bench gpu-check device-wheels clean

setup: $(STAMP)

# torch first, pinned to the CPU build that this machine keeps on disk: a later
# range resolution then finds it installed instead of pulling a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[worker,dev,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python -m cgsvc.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check cgsvc clients workers tests bench scripts
	$(VENV)/bin/buf lint protos

typecheck: $(STAMP)
	$(VENV)/bin/mypy

protos: $(STAMP)
	$(PY) scripts/genproto.py

protos-check: $(STAMP)
	$(PY) scripts/genproto.py --check

# The suite waits on servers, worker groups and subprocesses about as long as it computes: two
# pytest processes, each running a whole file at a time (module fixtures stay shared), fill the
# cores one leaves idle. PYTEST_ARGS= (empty) runs it in one process. The slowest tests are named
# at the end of every run (CI's log included): the suite must stay near 20 minutes here.
PYTEST_ARGS ?= -n 2 --dist loadfile

test: lint typecheck protos-check
	$(VENV)/bin/pytest --durations=15 --durations-min=20 $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/resolve_bench.py

# The worker's GPU paths in one prepared run (bench/gpu_check.py): on a machine without a GPU it
# runs what a CPU can and lists the rest. On the lent GPU machine (no virtualenv there) run
# `python3 bench/gpu_check.py --out DIR` directly.
gpu-check: $(STAMP)
	$(PY) bench/gpu_check.py --out var/gpu-check

# Wheels the lent GPU machine cannot fetch (it has no network): carry .whl and run
# `bash bench/device_run.sh OUT` there (scripts/device_wheels.sh says what each set is for).
device-wheels: $(STAMP)
	scripts/device_wheels.sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
