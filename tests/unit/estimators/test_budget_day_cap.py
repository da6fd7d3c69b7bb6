"""A device's day cap (``day_cap`` = M: at most M passages named a day) through the aggregate
release (estimators/budget.py ``EpochAccount.parts``) against brute force.

A day is R releases (30-s epochs or spans) of V stations; in each release a device names a set
of at most P stations, and at most M over the whole day. Every device answers every (release,
station) with its own coins, and the release is each (release, station) count of each report
value.
(a) At small n, V, P, R and M every released output (the joint counts of every release and
    station) and every day of the other device (any day within the same caps) is enumerated;
    the exact hockey-stick delta(eps), worst over every ordered pair of distinct days of the
    target -- days that move passages between releases included -- must lie below the
    account's day (its parts over R releases, composed).
(b) The same check fails for a deliberately wrong account that charges a capped day as one
    release (M, at most P, each way: "2P per span"): where M > P, two days that move two
    passages in two different releases exceed it.
(c) The cap only helps: the capped day is below the uncapped one, and the curator's sd with the
    same bound is sqrt(2M) / mu.
Deterministic (no Monte Carlo).
"""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np
import pytest

from estimators import budget, shuffle
from estimators.registry import get_spec
from tests.unit.estimators.test_budget_span import EPS, _hockey, _station_pmf

Day = tuple[frozenset[int], ...]


def _days(r: int, v: int, p: int, m: int) -> list[Day]:
    """Every day of R releases: a set of at most P of V stations each, at most M in all."""
    sets = [frozenset(c) for k in range(p + 1) for c in itertools.combinations(range(v), k)]
    return [d for d in itertools.product(sets, repeat=r) if sum(len(s) for s in d) <= m]


def _release(table: np.ndarray, day: Day, other: Day, v: int) -> np.ndarray:
    """P(the whole day's release): every (release, station) count, jointly (independent cells)."""
    cells = [_station_pmf(table, int(s in o), 1, int(s in t)) for t, o in zip(day, other, strict=True)
             for s in range(v)]
    out: np.ndarray = reduce(lambda a, b: np.multiply.outer(a, b).ravel(), cells)
    return out


def _brute(table: np.ndarray, r: int, v: int, p: int, m: int) -> np.ndarray:
    """Worst delta(eps) over every ordered pair of the target's days and every day of one other device."""
    days = _days(r, v, p, m)
    worst = np.zeros(EPS.size)
    for other in days:
        dists = {d: _release(table, d, other, v) for d in days}
        for a, b in itertools.permutations(days, 2):
            worst = np.maximum(worst, _hockey(dists[a], dists[b]))
    return worst


def _delta(parts: list[tuple[shuffle.Pld, int]]) -> np.ndarray:
    pld = shuffle.compose_counts(parts)
    return np.array([pld.delta(float(e)) for e in EPS])


CASES = [("unary", {"q": 0.2}, 3, 2, 1, 2), ("unary", {"q": 0.3}, 2, 3, 1, 1),
         ("alp", {"pisYes1": 0.3, "pisYes2": 0.3, "pisNo": 0.3}, 2, 2, 1, 1)]  # (name, params, R, V, P, M)


@pytest.mark.parametrize(("name", "params", "r", "v", "p", "m"), CASES)
def test_a_capped_day_dominates_brute_force_and_one_span_does_not(name: str, params: dict[str, float], r: int,
                                                                  v: int, p: int, m: int) -> None:
    spec = get_spec(name)
    mech = spec.build(params, v)
    (table,) = [t.output_table(0) for t in spec.round_mechanisms(mech)]
    acc = budget.epoch_account(spec, mech, v, 2, "aggregate", span_s=30 * p, passages=p, day_cap=m)
    assert 2 * m < acc.changed * r, "the case must be one where the cap binds"
    exact = _brute(table, r, v, p, m)
    ours = _delta(acc.parts(r))
    assert np.all(ours >= exact - 1e-9), float(np.max(exact - ours))
    if m > p:  # (b) a day charged as one release of min(M, P) passages each way is too small
        one_span = [(pld, min(m, p)) for pld in acc.stations]
        assert np.any(_delta(one_span) < exact - 1e-3), "the brute force must catch a day charged as one span"
    # (c) the cap helps
    uncapped = budget.epoch_account(spec, mech, v, 2, "aggregate", span_s=30 * p, passages=p)
    assert np.all(ours <= _delta(uncapped.parts(r)) + 1e-9)


def test_the_cap_is_charged_over_the_whole_day_at_the_papers_scale() -> None:
    """An hourly unary query at 3,220 stations capped at 40 passages a day: each station's two PLDs
    are composed 40 times over the day's 24 releases (not 24 x 120), the local day is 40 moved
    passages, and the curator's sd is sqrt(80) / mu (16.3 at a day of 2.5, 37.8 at 1)."""
    spec = get_spec("unary")
    mech = spec.build({"q": 0.01}, 3220)
    acc = budget.epoch_account(spec, mech, 3220, 5000, "aggregate", span_s=3600, passages=120, day_cap=40)
    assert [c for _, c in acc.parts(24)] == [40, 40]
    assert [c for _, c in acc.parts(1)] == [40, 40]  # one hour: at most 40 each way too
    big = budget.epoch_account(spec, mech, 3220, 5000, "aggregate", span_s=3600, passages=120, day_cap=10_000)
    assert [c for _, c in big.parts(24)] == [2880, 2880]  # a cap above the day's 24 x 120: the span bound
    assert acc.local_day(24, 1e-6) == pytest.approx(budget.local_day(acc.pair, 40, 1e-6))
    assert acc.pair == pytest.approx(2 * np.log(0.99 / 0.01))
    for b, want in ((2.5, 16.3), (1.0, 37.8)):
        sd = budget.central_limit_sd(b, 1e-6, span_s=3600, passages=120, n_stations=3220, day_cap=40)
        assert sd == pytest.approx(want, rel=3e-3)
    # the curator's L2 over the day: sqrt(2M) against the span bound's sqrt(24 x 240)
    ratio = budget.central_limit_sd(1.0, 1e-6, span_s=3600, passages=120, n_stations=3220) / \
        budget.central_limit_sd(1.0, 1e-6, span_s=3600, passages=120, n_stations=3220, day_cap=40)
    assert ratio == pytest.approx(np.sqrt(24 * 240 / 80))


def test_a_capped_permuted_release_composes_at_most_2m_reports() -> None:
    spec = get_spec("unary")
    mech = spec.build({"q": 0.2}, 4)
    acc = budget.epoch_account(spec, mech, 4, 1000, "permuted", day_cap=3)
    free = budget.epoch_account(spec, mech, 4, 1000, "permuted")
    assert {c for _, c in acc.parts(2880)} == {6}
    assert {c for _, c in free.parts(2880)} == {2880}
    assert acc.local_day(2880, 1e-6) <= budget.local_day(acc.local, 6, 1e-6)
