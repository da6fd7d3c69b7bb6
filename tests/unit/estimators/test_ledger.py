"""A device's day in shuffled terms (estimators/ledger.py). Deterministic (no Monte Carlo)."""

from __future__ import annotations

import math
from collections.abc import Hashable
from datetime import UTC, datetime

import pytest

import estimators as E
from estimators.ledger import ShuffledDayLedger, report_charge
from estimators.registry import get_spec
from producers.fleet import charge
from schemas import Query

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
    counts: dict[Hashable, int] = {}
    decisions = []
    for epoch in range(40):
        active = ["alp"] + (["unary"] if epoch >= 3 else [])
        for key in active:
            spec, mech, v = queries[key]
            fresh.account(key, spec, mech, v, release="aggregate")  # the PLDs only, no cached decisions
            want = fresh.day_epsilon({**counts, key: counts.get(key, 0) + 1}) <= budget
            got = ledger.spend("d", key, spec, mech, v, release="aggregate")
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
            n_shuffled += shuffled.spend("d", key, spec, mech, v, release="aggregate")
            n_local += local.spend("d", spec.report_epsilon(mech, v))
    assert n_shuffled > n_local > 0
    answered = [spec.report_epsilon(mech, v) for key, (spec, mech, v) in queries
                for _ in range(shuffled.counts["d"].get(key, 0))]
    assert shuffled.total("d") <= E.day_epsilon(answered) + 1e-9


def test_a_larger_crowd_charges_less() -> None:
    spec, mech, v = _q("unary")
    small, large = ShuffledDayLedger(5.0, min_crowd=20), ShuffledDayLedger(5.0, min_crowd=200)
    for led in (small, large):
        led.spend("d", "u", spec, mech, v, release="aggregate")
    assert large.total("d") < small.total("d")


def test_sampling_privacy_is_charged_locally() -> None:
    """No shuffled bound exists for its linked rounds: the ledger falls back to the local figure."""
    spec, mech, v = _q("sp")
    ledger = ShuffledDayLedger(100.0, min_crowd=1000)
    assert ledger.spend("d", "sp", spec, mech, v) and ledger.spend("d", "sp", spec, mech, v)
    eps = report_charge(spec, mech, v)  # its rounds' epsilons summed (round 1 is truth-independent)
    assert eps == pytest.approx(spec.report_epsilon(mech, v))
    assert ledger.total("d") == pytest.approx(E.day_epsilon([eps, eps]))
    assert math.isfinite(ledger.total("d"))


def test_days_are_separate() -> None:
    spec, mech, v = _q("unary")
    ledger = ShuffledDayLedger(10.0, min_crowd=20)
    while ledger.spend("d1", "u", spec, mech, v, release="aggregate"):
        pass
    assert ledger.counts["d1"]["u"] > 1 and ledger.spend("d2", "u", spec, mech, v, release="aggregate")
    assert ledger.total("d2") < ledger.total("d1") <= 10.0


# -- charge in full: every round, the whole span report, the release a device can rely on ----------
def _query(mechanism: str, release: str | None = None, span_s: int = 30, **params: float) -> Query:
    return Query(query_id=f"q-{mechanism}", analyst_id="a", version=1, sensors=tuple(range(1, V + 1)),
                 mechanism=mechanism, params=params, population=100, span_s=span_s, release=release,
                 t_start=datetime(2026, 11, 18, tzinfo=UTC), t_end=datetime(2026, 11, 19, tzinfo=UTC))


def test_a_two_round_query_is_charged_both_rounds() -> None:
    """Locally: the fresh-sample variant's report costs its two rounds' joint epsilon, more than
    its largest round's (what the ledger charged before: fails with query.epsilon); through the
    shuffler: both rounds' PLDs (one round's alone would charge less)."""
    q = _query("fresh", pisYes2=0.2)
    rounds = [q.spec.report_epsilon(r, V) for r in q.spec.round_mechanisms(q.build())]
    local = E.DayLedger(100.0)
    assert charge(local, "d", q)
    assert local.total("d") == pytest.approx(sum(rounds)) and local.total("d") > max(rounds) + 1.0
    assert local.total("d") > q.epsilon
    shuffled = ShuffledDayLedger(100.0, min_crowd=50)
    for _ in range(10):
        assert charge(shuffled, "d", q)
    first = q.spec.round_mechanisms(q.build())[0]
    one_round = ShuffledDayLedger(100.0, min_crowd=50)
    for _ in range(10):
        one_round.spend("d", "r0", get_spec("rr"), first, V)
    assert shuffled.total("d") > one_round.total("d")


def test_a_query_without_a_release_is_charged_the_permuted_one() -> None:
    """A device cannot see which release the shuffler uses: a query that fixes none is charged the
    permuted release's figure (at least it), more than the aggregate one it may be served under."""
    free, pinned_agg, pinned_perm = _query("unary", q=0.3), _query("unary", "aggregate", q=0.3), \
        _query("unary", "permuted", q=0.3)
    totals = {}
    for name, q in (("none", free), ("aggregate", pinned_agg), ("permuted", pinned_perm)):
        led = ShuffledDayLedger(1000.0, min_crowd=50)
        for _ in range(20):
            assert charge(led, "d", q)
        totals[name] = led.total("d")
    assert totals["none"] >= totals["permuted"] - 1e-12
    assert totals["none"] > totals["aggregate"] * 1.5


def test_a_span_query_is_charged_its_whole_span_report() -> None:
    """One charge per span report: an hourly report of up to P = 4 stations (V = 4) costs its span
    report's epsilon locally and P station PLDs of each direction through the aggregate release."""
    q = _query("unary", "aggregate", span_s=3600, q=0.3)
    assert q.passages == V
    local = E.DayLedger(1000.0)
    assert charge(local, "d", q)
    assert local.total("d") == pytest.approx(q.spec.report_epsilon(q.build(), V, V))
    hourly, epochly = ShuffledDayLedger(1000.0, min_crowd=50), ShuffledDayLedger(1000.0, min_crowd=50)
    thirty = _query("unary", "aggregate", q=0.3)
    for _ in range(3):
        assert charge(hourly, "d", q)
    for _ in range(3 * V // 2):  # V changed stations per hourly report, 2 per 30-s report
        assert charge(epochly, "d", thirty)
    assert hourly.total("d") == pytest.approx(epochly.total("d"), rel=0.02)
