# Two commands (see README): `make run` and `make test`. Both bootstrap .venv from nothing.
# `ptt` itself is .venv/bin/ptt (or `. .venv/bin/activate`, then `ptt`).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup sysdeps run plan test test-fast lint bench clean

setup: $(STAMP) sysdeps

# Prometheus (server + promtool) and nginx from the system's package manager: the tests run a
# real Prometheus and check the metrics with promtool (the demo scrapes with it), and run
# deploy/nginx/nginx.conf with a real nginx in front of the shuffler's front door. Installed
# only when missing. Under CI (CI set, as .ci/run does) all three must be there: the tests fail
# instead of skipping without them (tests/system_tools.py), and this guard says so first.
sysdeps:
	@missing=""; \
	if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then missing="prometheus"; fi; \
	if ! command -v nginx >/dev/null 2>&1 && ! [ -x /usr/sbin/nginx ]; then missing="$$missing nginx"; fi; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (apt)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "warning: not installed:$$missing (apt-get install$$missing); tests needing them skip (fail under CI)"; \
	  fi; \
	fi
	@if [ -n "$$CI" ]; then for tool in prometheus promtool nginx; do \
	  if ! command -v $$tool >/dev/null 2>&1 && ! [ -x /usr/sbin/$$tool ]; then \
	    echo "CI: $$tool could not be installed; the tests that need it must not be skipped"; exit 1; \
	  fi; \
	done; fi

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: embedded broker + shuffler + worker + replay of the synthetic day (DEMO_ARGS to change, e.g.
# DEMO_ARGS="--speed 0 --max-epochs 120"). `make plan` prints the planner at the papers' settings.
# Ctrl-C is the demo's normal end: it saves, stops and exits 130 (a clean stop). The recipe's
# shell waits for it (the trap keeps the shell alive; the demo still gets the default SIGINT)
# and says so on stderr (a `| tee` may be gone) instead of make's "Error 130"; other codes fail.
DEMO_ARGS ?=
run: setup
	@echo "$(BIN)/ptt demo $(DEMO_ARGS)"
	@trap : INT; $(BIN)/ptt demo $(DEMO_ARGS) || { code=$$?; if [ $$code -eq 130 ]; then \
	  echo "make run: stopped by Ctrl-C (a clean stop: what the demo saved is listed above)" >&2; \
	  else exit $$code; fi; }

plan: $(STAMP)  # the papers' settings: about 40 s on a busy 2-core machine
	$(BIN)/ptt plan sp --population 47719 --expected-yes 100 --stations 3220
	@echo
	$(BIN)/ptt plan alp --population 47719 --expected-yes 100 --stations 3220
	@echo
	$(BIN)/ptt plan alp --population 10047719 --expected-yes 100 --param pisNo=0.000025

lint: setup
	@echo "== ruff: lint every Python file"
	$(BIN)/ruff check .
	@echo "== mypy --strict: type-check estimators, producers, stream_app, schemas (20-30 s cold, ~1 s from .mypy_cache)"
	$(BIN)/mypy

# The whole test suite: lint, types, then every test, on TEST_WORKERS parallel pytest-xdist
# workers (each with its own broker, ports, topics and temporary directory; tests/conftest.py
# keeps a module's shared fixture on one worker). One line per finished test: worker, share of
# the suite done, result, file::test; at the end the 25 slowest (where the gate's time goes).
# TEST_WORKERS=0 runs the tests in this process, one by one;
# PYTEST_ARGS picks tests (e.g. PYTEST_ARGS=tests/unit/project). Ctrl-C stops it (pytest's
# exit code 2, "interrupted"): the shell's trap keeps the recipe alive to say so instead of
# make's "Error 2"; every other failure fails make.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
test: lint
	@echo "== pytest: every test on $(TEST_WORKERS) workers (the first lines come after ~1 min of collection)"
	@echo "$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -v --durations=25 $(PYTEST_ARGS)"
	@trap : INT; $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -v --durations=25 $(PYTEST_ARGS) || { code=$$?; \
	  if [ $$code -eq 2 ]; then echo "make test: stopped by Ctrl-C (the results so far are above)" >&2; \
	  else exit $$code; fi; }

# The fast inner loop while working: the unit tests but those marked slow (a second or more each:
# the planner at the papers' scale, subprocesses, Monte Carlo batteries; see pyproject.toml), with
# no lint and no integration tests -- under two minutes here. `make test` runs everything.
test-fast: setup
	@echo "$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -q -m 'not slow' tests/unit $(PYTEST_ARGS)"
	@trap : INT; $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -q -m 'not slow' tests/unit $(PYTEST_ARGS) || { \
	  code=$$?; if [ $$code -eq 2 ]; then echo "make test-fast: stopped by Ctrl-C" >&2; else exit $$code; fi; }

# Every benchmark script in tests/benchmarks/ (bench_*.py), one after the other, each run
# appended to the benchmark record (tests/benchmarks/record.jsonl: command, machine, date, figures).
bench: $(STAMP)
	@set -e; for b in tests/benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python tests/benchmarks/record.py $$b; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
