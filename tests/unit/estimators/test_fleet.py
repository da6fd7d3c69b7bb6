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


def test_a_span_query_composes_over_its_own_releases() -> None:
    """An hourly unary query (P = 120, V >= 240) composes each station PLD 120 times per hour: over
    two hours what a 30-s query does over its 240 epochs, so a vehicle answering both is charged as
    answering two 30-s queries, and less with a cap of 20 passages; its local day composes 2 hourly
    reports of the span's epsilon (both fail if the span is ignored)."""
    v, n = 300, 2_000
    spec = get_spec("unary")
    mech = spec.build({"q": 0.3}, v)
    mixed = fleet.vehicle_day([(spec, mech, v), (spec, mech, v, 3600, 120)], n, "aggregate", epochs=240)
    twice = fleet.vehicle_day([(spec, mech, v), (spec, mech, v)], n, "aggregate", epochs=240)
    assert mixed["shuffled"] == twice["shuffled"]
    capped = fleet.vehicle_day([(spec, mech, v), (spec, mech, v, 3600, 20)], n, "aggregate", epochs=240)
    assert capped["shuffled"] < twice["shuffled"] - 0.1  # 20 passages an hour: a sixth of the hourly parts
    hourly = spec.report_epsilon(mech, v, 120)
    local = fleet.vehicle_day([(spec, mech, v, 3600, 120)], n, "local", epochs=240)
    assert local["local"] == pytest.approx(privacy.optimal_composition(hourly, 2, 1e-6))
