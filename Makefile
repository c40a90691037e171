# Two entry points for a fresh machine: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench experiments dashboard deploy-check venv clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,plots,study]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/gpugov run --simulate --record out/demo.jsonl

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python bench/simulator.py
	$(BIN)/python bench/daemon.py
	$(BIN)/python bench/cli_speed.py

experiments: $(STAMP)
	$(BIN)/gpugov experiments --out results/bundled
	$(BIN)/gpugov experiments --trace azure-conv --out results/azure-conv

dashboard: $(STAMP)
	$(BIN)/python deploy/grafana/dashboard.py > deploy/grafana/gpugov-dashboard.json

deploy-check: $(STAMP)
	$(BIN)/pytest -q tests/deploy

clean:
	rm -rf out build *.egg-info .pytest_cache .ruff_cache
