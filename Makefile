# Two commands (see README): `make run` and `make test`. Both bootstrap .venv from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup run plan test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: embedded broker + replay of the synthetic day (DEMO_ARGS to change, e.g.
# DEMO_ARGS="--speed 0 --max-epochs 120"). `make plan` prints the planner at the papers' settings.
DEMO_ARGS ?=
run: $(STAMP)
	$(BIN)/ptt demo $(DEMO_ARGS)

plan: $(STAMP)
	$(BIN)/ptt plan sp --population 47719 --expected-yes 100 --stations 3220
	@echo
	$(BIN)/ptt plan alp --population 48719 --expected-yes 100
	@echo
	$(BIN)/ptt plan alp --population 10047719 --expected-yes 100 --param pisNo=0.000025

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The whole test suite: lint, types, then every test.
test: lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python tests/benchmarks/bench_sampling.py
	$(BIN)/python tests/benchmarks/bench_replay.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
