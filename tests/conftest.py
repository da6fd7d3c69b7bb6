"""Fixtures shared by every tier: the system tools some tests need (see tests/system_tools.py:
skipped locally when missing, a failure under CI); and how the tests are shared out among
parallel workers (``make test`` runs pytest-xdist with ``--dist loadgroup``, see
``pytest_collection_modifyitems``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

from .devices import ENROLLMENT_SECRET
from .system_tools import require_tool

# the operator's enrollment secret of every shuffler and --via-shuffler replay a test starts
# (tests/devices.py signs the tests' own device reports with it); a test of a missing secret
# removes it
os.environ["PTT_ENROLLMENT_SECRET"] = ENROLLMENT_SECRET

# this test process's own directory (owner only), removed when the session ends, also by
# Ctrl-C (pytest_unconfigure): what the tests start -- in this process or as children, which
# inherit the environment -- keeps its caches there, never in the user's cache directory
# (schemas.settings.cache_dir: a replay's synthetic day and parse cache, a worker's files),
# and its secrets (XDG_RUNTIME_DIR: a demo's enrollment secret, stream_app/cli/private_dir.py),
# never in the system's temporary directory, even when a test kills a demo with SIGKILL
SESSION_DIR = Path(tempfile.mkdtemp(prefix="ptt-tests-"))
os.environ["XDG_CACHE_HOME"] = str(SESSION_DIR / "cache")
(SESSION_DIR / "run").mkdir(mode=0o700)
os.environ["XDG_RUNTIME_DIR"] = str(SESSION_DIR / "run")
# the bytecode cache of the processes the tests start (pytest_configure); pytest-xdist's workers
# inherit the main process's, so a run compiles a module once
PYCACHE = os.environ.setdefault("PTT_TESTS_PYCACHE", str(SESSION_DIR / "pycache"))
# the day plans and their passed checks (producers.queries.planned_day_params, in
# $XDG_CACHE_HOME/ptt/plans), shared by the run's workers in the same way: a setting is planned,
# and a kept plan's day composed, once a run instead of once a worker (each file is written under
# a temporary name and renamed)
PLANS = Path(os.environ.setdefault("PTT_TESTS_PLANS", str(SESSION_DIR / "plans")))
PLANS.mkdir(parents=True, exist_ok=True)
(SESSION_DIR / "cache" / "ptt").mkdir(parents=True)
(SESSION_DIR / "cache" / "ptt" / "plans").symlink_to(PLANS, target_is_directory=True)


@pytest.fixture
def promtool() -> str:
    """The path of ``promtool``."""
    return require_tool("promtool")


@pytest.fixture
def prometheus_bin() -> str:
    """The path of the ``prometheus`` server."""
    return require_tool("prometheus")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """Under pytest-xdist's ``--dist loadgroup`` each test goes to whichever worker is free,
    except that the tests of one group run on one worker. Every test that uses a fixture
    shared wider than one test but narrower than the session (module, package or class scope,
    e.g. test_adversarial's one pipeline for 16 tests) is put in the group of its file, so that
    fixture is built once, as in a serial run. Session fixtures (the broker) are built once per
    worker: each worker has its own broker, ports, topics and temporary directory.

    The long tests start first (:func:`_start_order`): xdist hands out the groups first (the
    largest first), then the other tests in this order, so the run ends on short unit tests that
    fill in around the last long ones, not on a long one that started last.

    This runs in each xdist worker (xdist's main process collects nothing): the groups' marks
    before the other hooks, among them the worker's, which tells the scheduler a test's groups
    by appending them to its node id (``...::test@group``); afterwards :func:`_group_suffix`."""
    worker = hasattr(config, "workerinput")
    if worker:
        for item in items:
            info = getattr(item, "_fixtureinfo", None)
            defs = info.name2fixturedefs.values() if info is not None else ()
            if any(d and d[-1].scope in ("module", "package", "class") for d in defs):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        items.sort(key=_start_order)  # stable: the same order on every worker, as xdist requires
    yield
    if worker and config.getvalue("loadgroup"):
        for item in items:
            _group_suffix(item)


def _group_suffix(item: pytest.Item) -> None:
    """The node id ``...@group`` pytest-xdist means to give a test in a group: since pytest 9.2
    keeps a structured node id, pytest-xdist 3.8 writes the old attribute, which nothing reads
    any more, and every test was scheduled on its own (pytest-dev/pytest-xdist#1386): module
    fixtures built once per worker, test_quoted_figures' fresh-process commands run on every
    worker. Set here when it is missing (with an older pytest, or a fixed xdist, xdist's is there)."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    suffix = "@" + "_".join(names)
    if not names or item.nodeid.endswith(suffix):
        return
    from _pytest.nodeid import NodeId

    item._id = NodeId.parse(item.nodeid + suffix)


def _start_order(item: pytest.Item) -> int:
    """0: the integration tests (seconds to minutes each: real brokers, workers, shufflers);
    1: the unit tests marked ``slow``; 2: the rest (most take milliseconds)."""
    if Path(__file__).parent / "integration" in item.path.parents:
        return 0
    return 1 if item.get_closest_marker("slow") is not None else 2


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Where the environment says not to write bytecode (PYTHONDONTWRITEBYTECODE), the Python
    processes the tests start -- hundreds a run: stream-app workers, shufflers, replays, ``ptt``
    commands, each importing the packages -- would each compile the packages again (~0.27 CPU-s
    a process): in a process that runs tests (an xdist worker, or pytest without workers) they
    share a bytecode cache instead (:data:`PYCACHE`, never next to the sources, removed with the
    session's directory). Not xdist's workers themselves: they start together, and each would
    compile every module it imports.

    ``make test`` (pytest-xdist, ``-v``): one line per finished test. pytest's verbose mode
    also writes each test's name as it starts; under xdist the workers' results come between,
    so that name stays a line of its own -- two lines per test. The terminal reporter is
    registered again without its start line (its instance attribute shadows the method)."""
    runs_tests = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    if runs_tests and os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ["PYTHONPYCACHEPREFIX"] = PYCACHE
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not getattr(config.option, "numprocesses", None) or config.option.verbose <= 0:
        return
    config.pluginmanager.unregister(reporter)
    reporter.pytest_runtest_logstart = lambda nodeid, location: None
    config.pluginmanager.register(reporter, "terminalreporter")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's own directory goes with the session (every worker's, under pytest-xdist)."""
    shutil.rmtree(SESSION_DIR, ignore_errors=True)
