"""Every docstring example in the packages runs and holds (river's habit: statistics with
examples).

Only the modules listed in ``WITH_EXAMPLES`` are run, and each of them must still hold at
least one example: a module that loses its examples fails here instead of passing with
nothing run. A module outside the list that gains examples fails too (add it to the list),
so no example is silently skipped."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("estimators", "schemas", "producers", "stream_app")

# Every module with docstring examples, and the fewest examples each must keep.
WITH_EXAMPLES = {
    "estimators.aggregate": 5,
    "estimators.aggregate_multi": 4,
    "estimators.budget": 2,
    "estimators.compare": 3,
    "estimators.consistency": 4,
    "estimators.figures": 7,
    "estimators.fit": 2,
    "estimators.fleet": 2,
    "estimators.ledger": 3,
    "estimators.linear": 3,
    "estimators.mechanisms": 5,
    "estimators.per_station": 2,
    "estimators.planning": 2,
    "estimators.privacy": 9,
    "estimators.registry": 4,
    "estimators.reports": 11,
    "estimators.shuffle": 6,
    "producers.corridors": 9,
    "producers.counters": 3,
    "producers.devices": 4,
    "producers.http_client": 1,
    "producers.pems.decimals": 4,
    "producers.pems.grid": 5,
    "producers.pems.model": 1,
    "producers.pems.stamps": 3,
    "producers.progress": 6,
    "producers.replay.epoch": 9,
    "producers.settings": 2,
    "producers.spans": 17,
    "producers.trip_stats": 11,
    "producers.trip_spans": 4,
    "producers.trips": 11,
    "schemas.cap_drops": 5,
    "schemas.connection": 19,
    "schemas.device_binary": 15,
    "schemas.device_http": 3,
    "schemas.enrollment": 21,
    "schemas.epochs": 2,
    "schemas.kafka_io": 11,
    "schemas.settings": 3,
    "schemas.wire": 6,
    "stream_app.cli.cpu": 2,
    "stream_app.cli.demo": 8,
    "stream_app.day_figure": 3,
    "stream_app.worker.day_metric": 5,
    "stream_app.cli.errors": 2,
    "stream_app.cli.shuffler": 3,
    "stream_app.cli.helper_process": 10,
    "stream_app.cli.working": 3,
    "stream_app.worker.decode": 5,
    "stream_app.worker.frames": 10,
    "stream_app.worker.gaps": 9,
    "stream_app.guard": 2,
    "stream_app.worker.introspect": 5,
    "stream_app.ports": 3,
    "stream_app.worker.records": 9,
    "stream_app.report.cap_drops": 2,
    "stream_app.report.loading": 4,
    "stream_app.report.summary": 5,
    "stream_app.worker.rollups": 9,
    "stream_app.shuffler.columns": 5,
    "stream_app.shuffler.door_policy": 11,
    "stream_app.shuffler.front_door": 1,
    "stream_app.shuffler.intake": 3,
    "stream_app.shuffler.enrolled": 9,
    "stream_app.shuffler.kept": 7,
    "stream_app.shuffler.metrics": 6,
    "stream_app.shuffler.notes": 5,
    "stream_app.shuffler.payload": 5,
    "stream_app.shuffler.policy": 21,
    "stream_app.shuffler.release": 8,
    "stream_app.shuffler.state": 4,
    "stream_app.worker.stage2": 1,
    "stream_app.subscribe": 8,
    "stream_app.worker.windows": 9,
}


def _all_modules() -> list[str]:
    """Every module of the packages, subpackages' included (``__main__`` is not imported: it runs)."""
    out = []
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        out.append(pkg)
        out += [m.name for m in pkgutil.walk_packages(mod.__path__, prefix=f"{pkg}.")
                if m.name.rpartition(".")[2] != "__main__"]
    return out


def _examples(name: str) -> int:
    """How many examples doctest finds in module ``name`` (what testmod would run)."""
    module = importlib.import_module(name)
    return sum(len(t.examples) for t in doctest.DocTestFinder().find(module))


@pytest.mark.parametrize("name", sorted(WITH_EXAMPLES))
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted >= WITH_EXAMPLES[name], (
        f"{name} has {result.attempted} examples, {WITH_EXAMPLES[name]} expected: examples were removed")
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_every_module_with_examples_is_listed() -> None:
    """The list is complete: a module outside it holds no example (else it would never run)."""
    modules = _all_modules()
    assert set(WITH_EXAMPLES) <= set(modules), set(WITH_EXAMPLES) - set(modules)
    unlisted = {name: n for name in modules if name not in WITH_EXAMPLES and (n := _examples(name))}
    assert not unlisted, f"modules with examples missing from WITH_EXAMPLES: {unlisted}"
