"""A device's day in shuffled terms (estimators/ledger.py). Deterministic (no Monte Carlo)."""

from __future__ import annotations

import math

import pytest

import estimators as E
from estimators.ledger import ShuffledDayLedger
from estimators.registry import get_spec

V = 4


def _q(name: str, **params: float) -> tuple[E.MechanismSpec, E.Mechanism, int]:
    spec = get_spec(name)
    return spec, spec.build(params, V), V


def test_every_decision_is_the_composed_days() -> None:
    """Each spend is accepted exactly when the day with it, composed afresh (no cached
    vectors), stays within the budget; a query joins mid-day and another stops answering.
    (Checked by hand to fail when the cache takes a vector above a fitting one as fitting.)"""
    budget = 7.0  # reached after ~22 of the 40 epochs (40 answered would cost 10.1)
    ledger = ShuffledDayLedger(budget, min_crowd=20)
    fresh = ShuffledDayLedger(budget, min_crowd=20)
    queries = {"alp": _q("alp"), "unary": _q("unary", q=0.3)}
    counts: dict[str, int] = {}
    decisions = []
    for epoch in range(40):
        active = ["alp"] + (["unary"] if epoch >= 3 else [])
        for key in active:
            spec, mech, v = queries[key]
            fresh._account(key, spec, mech, v)  # noqa: SLF001 (the PLDs only, no cached decisions)
            want = fresh.day_epsilon({**counts, key: counts.get(key, 0) + 1}) <= budget
            got = ledger.spend("d", key, spec, mech, v)
            assert got == want, (epoch, key, counts)
            if got:
                counts[key] = counts.get(key, 0) + 1
            decisions.append(got)
    assert True in decisions and False in decisions
    assert ledger.counts["d"] == counts
    assert ledger.total("d") <= budget


def test_shuffled_terms_answer_more_than_local_terms_and_never_charge_more() -> None:
    """Through the aggregate release at min_crowd 20, ALP and unary RR answer more epochs of a
    budget of 10 than the local ledger allows, and the shuffled day is never above the local
    composition of the same answers."""
    queries = [("alp", _q("alp")), ("unary", _q("unary"))]
    shuffled, local = ShuffledDayLedger(10.0, min_crowd=20), E.DayLedger(10.0)
    n_shuffled = n_local = 0
    for _ in range(30):
        for key, (spec, mech, v) in queries:
            n_shuffled += shuffled.spend("d", key, spec, mech, v)
            n_local += local.spend("d", spec.report_epsilon(mech, v))
    assert n_shuffled > n_local > 0
    answered = [spec.report_epsilon(mech, v) for key, (spec, mech, v) in queries
                for _ in range(shuffled.counts["d"].get(key, 0))]
    assert shuffled.total("d") <= E.day_epsilon(answered) + 1e-9


def test_a_larger_crowd_charges_less() -> None:
    spec, mech, v = _q("unary")
    small, large = ShuffledDayLedger(5.0, min_crowd=20), ShuffledDayLedger(5.0, min_crowd=200)
    for led in (small, large):
        led.spend("d", "u", spec, mech, v)
    assert large.total("d") < small.total("d")


def test_sampling_privacy_is_charged_locally() -> None:
    """No shuffled bound exists for its linked rounds: the ledger falls back to the local figure."""
    spec, mech, v = _q("sp")
    ledger = ShuffledDayLedger(100.0, min_crowd=1000)
    assert ledger.spend("d", "sp", spec, mech, v) and ledger.spend("d", "sp", spec, mech, v)
    eps = spec.report_epsilon(mech, v)
    assert ledger.total("d") == pytest.approx(E.day_epsilon([eps, eps]))
    assert math.isfinite(ledger.total("d"))


def test_days_are_separate() -> None:
    spec, mech, v = _q("unary")
    ledger = ShuffledDayLedger(10.0, min_crowd=20)
    while ledger.spend("d1", "u", spec, mech, v):
        pass
    assert ledger.counts["d1"]["u"] > 1 and ledger.spend("d2", "u", spec, mech, v)
    assert ledger.total("d2") < ledger.total("d1") <= 10.0
