# Two entry points for a fresh machine: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two installs, one stamp each: the node's (what `make demo` runs: `pip install -e .`, no
# extras) and the development one on top of it (tests, lint, mypy, figures, study, Ray).
NODE_STAMP := $(VENV)/.installed-node
TEST_STAMP := $(VENV)/.installed-test
# mypy reads the installed layout (folder daemon/ is module gpugov.daemon) from a link tree.
MYPY_TREE := build/mypy/gpugov
LAYERS := plant controllers daemon profiles study
# pytest-xdist: one worker per core and one more (at most 4), each test file on one worker
# so module fixtures are built once; `make test PYTEST_PARALLEL=` runs the suite in one
# process. The one more: many tests wait on the processes and servers they start (the
# fault campaign's daemons), and on 2 cores 3 workers ran the suite in 411 s against 555 s.
# --no-loadscope-reorder: the files go in tests/conftest.py's order (the long ones marked
# RUN_EARLY first), not xdist's by number of tests, which left a long file with few tests
# (the device check's) to start last while the other workers sat idle.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min((os.cpu_count() or 1) + 1, 4))")
PYTEST_PARALLEL ?= -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: demo test lint typecheck bench experiments dashboard deploy-check venv clean

$(NODE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): $(NODE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,plots,study]'
	touch $@

venv: $(TEST_STAMP)

demo: $(NODE_STAMP)
	mkdir -p out
	$(BIN)/gpugov run --simulate --record out/demo.jsonl

# The sources are byte-compiled once before the suite: it starts a few hundred gpugov
# processes, and where PYTHONDONTWRITEBYTECODE is set (as in many CI images) each compiled
# every module again. The MPCs' numba kernels are compiled once too, while lint and mypy
# run: on a fresh checkout every worker and process that reached them before the disk
# cache was written compiled them again (about 20 s of CPU each).
test: $(TEST_STAMP)
	$(BIN)/python -m gpugov simulate --controller mpc-online --duration 5 > /dev/null 2>&1 & \
		warm=$$!; \
		$(BIN)/ruff check . && $(BIN)/ruff format --check . && \
		$(MAKE) --no-print-directory typecheck; status=$$?; \
		wait $$warm || echo "numba warm-up failed: the suite compiles the kernels itself"; \
		exit $$status
	$(BIN)/python -m compileall -q -j 0 gpugov $(LAYERS) tests > /dev/null
	$(BIN)/pytest -q $(PYTEST_PARALLEL)

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_STAMP)
	rm -rf $(MYPY_TREE)
	mkdir -p $(MYPY_TREE)
	cd $(MYPY_TREE) && ln -s ../../../gpugov/*.py ../../../gpugov/py.typed . && \
		for layer in $(LAYERS); do ln -s ../../../$$layer $$layer; done
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python bench/simulator.py
	$(BIN)/python bench/daemon.py
	$(BIN)/python bench/cli_speed.py

experiments: $(TEST_STAMP)
	$(BIN)/gpugov experiments --out results/bundled
	$(BIN)/gpugov experiments --trace azure-conv --out results/azure-conv

dashboard: $(TEST_STAMP)
	$(BIN)/python deploy/grafana/dashboard.py > deploy/grafana/gpugov-dashboard.json

deploy-check: $(TEST_STAMP)
	$(BIN)/pytest -q tests/deploy

clean:
	rm -rf out build *.egg-info .pytest_cache .ruff_cache .mypy_cache
