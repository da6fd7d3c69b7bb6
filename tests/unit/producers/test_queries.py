"""The replay's default queries (producers/queries.py): a day plan remembered across runs is used
only while its composed day still fits the budget; one that does not (a stale or tampered file)
is planned again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import producers.queries as queries
from estimators.fleet import parse_fleet_queries, planned_day

MECHANISMS, POPULATION, STATIONS, BUDGET = "unary@3600//40", 2_000, 4, 1.0


@pytest.fixture
def planner(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """The planner stubbed (a real plan takes many seconds): a private setting, calls recorded."""
    calls: list[tuple[object, ...]] = []

    def plan(*key: object) -> dict[str, dict[str, float]]:
        calls.append(key)
        return {"unary@3600//40": {"q": 0.45}}

    monkeypatch.setattr(queries, "_planned_day_params", plan)
    return calls


def test_a_plan_is_remembered_and_used_while_it_fits(tmp_path: Path, planner: list[tuple[object, ...]]) -> None:
    first = queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    again = queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    assert first == again and len(planner) == 1  # the second run read the file
    assert planned_day(parse_fleet_queries(MECHANISMS), again, POPULATION, STATIONS) <= BUDGET


def test_a_remembered_plan_over_the_budget_is_planned_again(tmp_path: Path, planner: list[tuple[object, ...]]) -> None:
    queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    (path,) = tmp_path.iterdir()
    kept = json.loads(path.read_text())
    kept["params"] = {"unary@3600//40": {"q": 0.001}}  # hardly any noise: far over a day of 1
    path.write_text(json.dumps(kept))
    assert planned_day(parse_fleet_queries(MECHANISMS), kept["params"], POPULATION, STATIONS) > BUDGET
    assert queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path) == {
        "unary@3600//40": {"q": 0.45}}
    assert len(planner) == 2
    path.write_text("not json")
    queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    assert len(planner) == 3


def test_a_shipped_plan_is_used_while_it_fits_and_replanned_when_not(tmp_path: Path, planner: list[tuple[object, ...]],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run (empty cache) uses the shipped plan of its setting, checked as a cache is: a
    shipped plan over the budget, or of another setting, is not used."""
    shipped = tmp_path / "plans.json"
    monkeypatch.setattr(queries, "SHIPPED_PLANS", shipped)
    fits = {"unary@3600//40": {"q": 0.46}}
    shipped.write_text(json.dumps([{"key": [MECHANISMS, POPULATION + 1, STATIONS, BUDGET], "params": {}},
                                   {"key": [MECHANISMS, POPULATION, STATIONS, BUDGET], "params": fits}]))
    assert queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path / "cache") == fits
    assert not planner and [p.name[:9] for p in (tmp_path / "cache").iterdir()] == ["day-fits-"]  # its check only
    shipped.write_text(json.dumps([{"key": [MECHANISMS, POPULATION, STATIONS, BUDGET],
                                    "params": {"unary@3600//40": {"q": 0.001}}}]))
    assert queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path / "cache") == {
        "unary@3600//40": {"q": 0.45}}
    assert len(planner) == 1


def test_a_passed_check_is_remembered_for_its_parameters_and_accounting_code(
        tmp_path: Path, planner: list[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A remembered plan whose check passed once is used again without composing its day; the
    stamp is for those parameters under this accounting code: other parameters (a tampered
    file) or other code are checked again."""
    queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)  # checked, stamped
    composed: list[object] = []
    real = planned_day

    def counted(*args: object) -> float:
        composed.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr("estimators.fleet.planned_day", counted)
    assert queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path) == {
        "unary@3600//40": {"q": 0.45}}
    assert not composed and len(planner) == 1
    code = queries._accounting
    monkeypatch.setattr(queries, "_accounting", lambda: "other code")
    queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path)
    assert len(composed) == 1 and len(planner) == 1  # checked again, still fits
    monkeypatch.setattr(queries, "_accounting", code)
    (path,) = tmp_path.glob("day-plan-*")
    path.write_text(json.dumps({"key": [MECHANISMS, POPULATION, STATIONS, BUDGET],
                                "params": {"unary@3600//40": {"q": 0.001}}}))
    assert queries.planned_day_params(MECHANISMS, POPULATION, STATIONS, BUDGET, tmp_path) == {
        "unary@3600//40": {"q": 0.45}}
    assert len(composed) == 2 and len(planner) == 2  # over the budget: planned again


@pytest.mark.slow
def test_the_shipped_plans_are_of_the_demos_default_setting() -> None:
    """What is shipped reads back and fits its budget (half a minute: the day at n = 120,000;
    each plan is checked against the planner's choice by tests/unit/project/test_quoted_figures.py)."""
    kept = queries._read_plans(queries.SHIPPED_PLANS)
    assert kept and all(queries._fitting([plan], tuple(plan["key"])) == plan["params"] for plan in kept)
