"""A vehicle's day across the queries it answers (estimators/fleet.py ``vehicle_day``); the
budget split is tested with the budget (test_budget.py). Deterministic."""

from __future__ import annotations

import math

import pytest

from estimators import Mechanism, MechanismSpec, fleet, privacy
from estimators.registry import get_spec

V = 5


def _queries(*names: str) -> list[tuple[MechanismSpec, Mechanism, int]]:
    return [(get_spec(n), get_spec(n).build({}, V), V) for n in names]


def test_vehicle_day_is_the_fleet_plans() -> None:
    r = fleet.fleet_plan(3_000, 50, V, epochs=40, mechanisms=("alp", "unary"))
    day = fleet.vehicle_day(_queries("alp", "unary"), 3_000, "aggregate", epochs=40)
    assert day["shuffled"] == pytest.approx(r["epsilon_day_vehicle"], rel=1e-12)
    assert day["shuffled"] > max(r["queries"][n]["epsilon_day_shuffled"] for n in ("alp", "unary")) - 1e-9


def test_local_day_composes_the_published_epsilons() -> None:
    qs = _queries("alp", "unary")
    day = fleet.vehicle_day(qs, 3_000, "local", epochs=40)
    eps = sum(s.report_epsilon(m, v) for s, m, v in qs)
    assert day["local"] == day["shuffled"] == pytest.approx(privacy.optimal_composition(eps, 40, 1e-6))


def test_more_queries_cost_more_and_sampling_privacy_has_no_shuffled_day() -> None:
    one = fleet.vehicle_day(_queries("unary"), 3_000, "aggregate", epochs=40)
    two = fleet.vehicle_day(_queries("unary", "alp"), 3_000, "aggregate", epochs=40)
    assert two["shuffled"] > one["shuffled"] and two["local"] > one["local"]
    sp = fleet.vehicle_day(_queries("sp", "unary"), 3_000, "aggregate", epochs=40)
    assert math.isinf(sp["shuffled"])
    assert math.isfinite(fleet.vehicle_day(_queries("sp"), 3_000, "local", epochs=40)["local"])
