"""Privacy of what a device really sends: the report vector's epsilon (brute force), the day's
composition (never a larger bound than a valid one), the device's daily ledger, and the
equal-epsilon planner. Deterministic: no statistics here."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import estimators as E
from estimators import StationCounts
from estimators.registry import get_spec
from producers.fleet import Device, privatize
from stream_app.cli import main

LN = math.log


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# -- the report vector's epsilon ------------------------------------------------------------
@pytest.mark.parametrize("name,params", [
    ("alp", {}), ("alp", {"pisNo": 0.2}), ("alp", {"pisNo": 0.000025}), ("rr", {}), ("rr", {"pi1": 0.5, "pi2": 0.7}),
    ("fresh", {}), ("fresh", {"pisYes1": 0.3, "pisNo1": 0.2}),
])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_per_sensor_report_epsilon_is_the_brute_force(name: str, params: dict[str, float], v: int) -> None:
    spec = get_spec(name)
    mech = spec.build(params, v)
    brute = max(E.local_epsilon(E.per_sensor_joint_table(m.output_table(0), v)) for m in spec.round_mechanisms(mech))
    assert spec.report_epsilon(mech, v) == pytest.approx(brute, rel=1e-12)


def _set_joint_table(table: np.ndarray, v: int, passages: int) -> np.ndarray:
    """P(report vector | set of stations passed) for every set of at most ``passages`` of ``v``
    stations: rows are the sets, columns every report vector (the brute force of a span report)."""
    import itertools
    sets = [frozenset(c) for k in range(passages + 1) for c in itertools.combinations(range(v), k)]
    outs = list(itertools.product(range(table.shape[1]), repeat=v))
    return np.array([[math.prod(table[int(s in truth), o[s]] for s in range(v)) for o in outs] for truth in sets])


@pytest.mark.parametrize("name,params", [("alp", {}), ("rr", {}), ("rr", {"pi1": 0.5, "pi2": 0.7}), ("unary", {}),
                                         ("fresh", {})])
@pytest.mark.parametrize("v,passages", [(1, 1), (2, 2), (3, 2), (4, 2), (4, 3), (5, 2)])
def test_span_report_epsilon_is_the_brute_force_over_sets(name: str, params: dict[str, float], v: int,
                                                          passages: int) -> None:
    """A span report's truth is a set of at most P stations: the closed form against every pair
    of sets (fails with ``P (up + down)`` used where ``V < 2P``, or with P ignored)."""
    spec = get_spec(name)
    mech = spec.build(params, v)
    brute = max(E.local_epsilon(_set_joint_table(m.output_table(0), v, passages)) for m in spec.round_mechanisms(mech))
    assert spec.report_epsilon(mech, v, passages) == pytest.approx(brute, rel=1e-12)


def test_a_symmetric_mechanism_doubles() -> None:
    """AlmostRandom-like (P(1|Yes) = P(0|No) = 3/4): per answer ln 3, whole report ln 9."""
    table = np.array([[0.75, 0.25], [0.25, 0.75]])
    assert E.local_epsilon(table) == pytest.approx(LN(3))
    assert E.local_epsilon(E.per_sensor_joint_table(table, 3)) == pytest.approx(LN(9))
    assert E.per_sensor_report_epsilon(table, 3) == pytest.approx(LN(9))


@pytest.mark.slow
def test_plan_bars(capsys: pytest.CaptureFixture[str]) -> None:
    alp = _plan(capsys, "alp", "--population", "47719", "--expected-yes", "100", "--stations", "3220")
    assert isinstance(alp, dict)
    assert alp["epsilon"] == pytest.approx(LN(3.5 * 0.95 / 0.9), abs=1e-6)  # 1.306830
    assert alp["epsilon_per_answer"] == pytest.approx(LN(3.5), abs=1e-9)
    rr = _plan(capsys, "rr", "--population", "1000", "--expected-yes", "10", "--stations", "3")
    assert isinstance(rr, dict) and rr["epsilon"] == pytest.approx(LN(126), abs=1e-6)  # 4.836282
    sp = _plan(capsys, "sp", "--population", "47719", "--expected-yes", "100", "--stations", "3220")
    assert isinstance(sp, dict) and sp["epsilon"] == pytest.approx(7.877156, abs=1e-6)


# -- the day ----------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [LN(3), 7.88, 1.3068, 0.1, 0.01])
def test_the_day_is_the_smallest_valid_bound(eps: float) -> None:
    basic = E.basic_composition(eps, 2880)
    advanced = E.advanced_composition(eps, 2880, 1e-6)
    optimal = E.optimal_composition(eps, 2880, 1e-6)
    assert optimal <= min(basic, advanced) + 1e-9
    assert E.day_epsilon([eps] * 2880, 1e-6) == pytest.approx(min(basic, advanced, optimal))


@pytest.mark.slow
@pytest.mark.parametrize("eps,k", [(LN(3), 2880), (0.1, 2880), (1.3068, 2880), (0.5, 50), (7.88, 2880)])
def test_optimal_composition_agrees_with_googles_pld_accountant(eps: float, k: int) -> None:
    """dp_accounting's privacy-loss-distribution accountant discretizes pessimistically: its
    epsilon is never below the exact one, and within 0.2% of it."""
    from dp_accounting.pld import common, privacy_loss_distribution

    pld = privacy_loss_distribution.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0.0))
    reference = pld.self_compose(k).get_epsilon_for_delta(1e-6)
    exact = E.optimal_composition(eps, k, 1e-6)
    assert exact <= reference + 1e-6
    assert reference <= exact * 1.002 + 1e-6


def test_optimal_composition_matches_its_theorem_at_small_k() -> None:
    """Kairouz-Oh-Viswanath at k = 2 by hand: the loss is 2 eps w.p. p^2, 0 w.p. 2pq, -2 eps
    w.p. q^2; at e' = 0 delta is p^2 (1 - e^-2eps) + 0 + q^2 (1 - e^2eps)_+ = p^2 (1 - e^-2eps)
    (the pair (0, that delta) is exactly attainable), and at e' = 2 eps delta is 0."""
    eps = 0.5
    p = math.exp(eps) / (1 + math.exp(eps))
    d0 = p * p * (1 - math.exp(-2 * eps))
    assert E.optimal_composition(eps, 2, d0 * 1.0001) == pytest.approx(0.0)
    assert 0 < E.optimal_composition(eps, 2, d0 * 0.9) < 2 * eps
    assert E.optimal_composition(eps, 2, 1e-12) == pytest.approx(2 * eps, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", E.mechanism_names())
def test_every_plan_takes_the_smallest_day(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    stations = str(get_spec(name).max_stations or 3)
    out = _plan(capsys, name, "--population", "10000", "--expected-yes", "100", "--stations", stations)
    assert isinstance(out, dict)
    assert out["epsilon_day"] <= min(out["epsilon_day_basic"], out["epsilon_day_advanced"]) + 1e-9


def test_the_planner_says_how_many_epochs_a_budget_allows(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "rr", "--population", "1000", "--expected-yes", "10", "--stations", "3",
                "--daily-budget", "20")
    assert isinstance(out, dict)
    n = out["epochs_within_budget"]
    assert n == E.epochs_within_budget(LN(126), 20.0) == 4  # 4 x 4.836 = 19.3; a fifth is 24.2
    assert E.day_epsilon([LN(126)] * n) <= 20 < E.day_epsilon([LN(126)] * (n + 1))


# -- the device's ledger ------------------------------------------------------------------------
def test_the_ledger_refuses_what_would_exceed_the_day_and_starts_afresh_the_next_day() -> None:
    ledger = E.DayLedger(budget=10.0)
    spent = [ledger.spend("2026-11-18", 3.0) for _ in range(4)]
    assert spent == [True, True, True, False] and ledger.total("2026-11-18") == pytest.approx(9.0)
    assert ledger.spend("2026-11-19", 3.0)  # a new day


def test_a_small_daily_budget_refuses_later_epochs_with_the_reason() -> None:
    from datetime import UTC, datetime

    from schemas import Query

    q = Query(query_id="q", analyst_id="a", version=1, sensors=(1, 2, 3), mechanism="rr", population=100,
              t_start=datetime(2026, 11, 18, tzinfo=UTC), t_end=datetime(2026, 11, 19, tzinfo=UTC))
    ledger = E.DayLedger(budget=3 * q.epsilon + 1e-9)
    truth = np.array([70, 10, 10, 10])
    out = [privatize(q, StationCounts(truth), np.random.default_rng(i), "tally", Device(), ledger, "2026-11-18")
           for i in range(5)]
    assert [er.refused for er in out] == [0, 0, 0, 100, 100]
    assert [er.participants for er in out] == [100, 100, 100, 0, 0]
    assert "daily privacy budget" in (out[3].refusal_reason or "")


# -- equal epsilon ----------------------------------------------------------------------------
@pytest.mark.slow
def test_compare_bars(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _plan(capsys, "compare", "--epsilon", "1.0986", "--population", "47719", "--expected-yes", "100",
                 "--stations", "3220")
    assert isinstance(rows, list)
    by = {r["mechanism"]: r for r in rows}
    assert set(by) == set(E.COMPARED)
    assert by["oue"]["sd"] == pytest.approx(378.5, abs=0.5)
    assert by["sp"]["sd"] == pytest.approx(401.3, abs=0.5)
    assert by["sp"]["lattice_step"] == pytest.approx(1611.5, abs=1)
    assert any("lattice" in w for w in by["sp"]["warnings"])  # step 1,611 > the expected 100
    assert by["alp"]["epsilon"] <= 1.0986 + 1e-9
    # the shuffled figures at n = the population: the clone bound depends on the epsilon alone
    clone = E.shuffled_day((E.VariationRatio(3.0, 0.5, 3.0),), 47719, 2880)
    assert by["oue"]["epsilon_shuffled"] == pytest.approx(clone.epsilon, rel=1e-3)
    assert by["oue"]["epsilon_day_shuffled"] == pytest.approx(clone.epsilon_day, rel=1e-3)
    assert by["alp"]["epsilon_shuffled"] <= by["oue"]["epsilon_shuffled"] + 1e-12
    assert all(r["shuffle_trust"] == E.TRUST_ASSUMPTION for r in rows)


@pytest.mark.parametrize("eps,n,yes,k", [(1.0986, 47719, 100, 3221), (2.0, 5000, 30, 8), (0.5, 200, 0, 2)])
def test_kary_formula_equals_the_core(eps: float, n: int, yes: float, k: int) -> None:
    formula, core = E.kary_variances(eps, n, yes, k)
    assert formula == pytest.approx(core, rel=1e-9)


@pytest.mark.slow
def test_sp_at_equal_epsilon_is_the_core_where_it_can_be_built() -> None:
    rows = {r["mechanism"]: r for r in E.compare(2.0, 5000, 40, 50)}
    pis = rows["sp"]["params"]["pis"]
    mech = E.sampling_privacy(50, pis)
    assert E.mechanism_epsilon(mech).epsilon == pytest.approx(2.0)
    assert rows["sp"]["sd"] ** 2 == pytest.approx(40 * (1 - pis) / pis)


def test_oue_variance_by_simulation() -> None:
    """OUE simulated directly (fixed seed): every vehicle sends V + 1 bits, its own bit kept with
    p = 1/2, every other bit set with q = 1/(e^eps + 1). 400 trials; the sample variance over
    the formula lies in [0.70, 1.33] but with probability 1.2e-5 (chi-square, 399 d.o.f.): the
    false-failure rate of this test, which a fixed seed makes a one-time draw."""
    eps, n, yes, k = LN(3), 2000, 50, 6
    p, q = E.support_probabilities("oue", eps, k)
    rng = np.random.default_rng(20261122)
    est = []
    for _ in range(400):
        c = rng.binomial(yes, p) + rng.binomial(n - yes, q)  # the count of bit 1 of the station
        est.append((c - n * q) / (p - q))
    var = float(np.var(est, ddof=1))
    assert 0.70 <= var / E.oracle_variance(p, q, n, yes) <= 1.33
