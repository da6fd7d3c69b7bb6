"""Rollups (``stream_app.worker.rollups``), pure: sums of the epochs' estimates, variances that add,
score bounds of the sum, withheld propagation with the reason, out-of-order closing, a
restart from the stored state, withdrawals; and the Monte Carlo coverage of the sum's bounds."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from functools import partial

import numpy as np
import pytest

from schemas import Query
from schemas.wire import FRAME_LENGTH
from stream_app.worker.estimate import EpochResult, QueryEstimators, StationEstimates
from stream_app.worker.records import EpochSummary, decode_partial, decode_partials, encode_bundle, encode_partial
from stream_app.worker.rollups import (
    RollupId,
    RollupPolicy,
    RollupState,
    rollup_result,
    route_key,
    summary_of,
    version_window,
)
from tests.unit import _mc

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # on the hour
E0 = int(T0.timestamp()) // 30
V = 5
Q = Query(query_id="q-rr", analyst_id="a", version=1, sensors=tuple(400_001 + i for i in range(V)), mechanism="rr",
          population=500, t_start=T0, t_end=T0 + timedelta(hours=2))
QE = QueryEstimators.build(Q)
CONF = (0.95, 0.99)


def epoch(e: int, rng: np.random.Generator, withheld: str | None = None, gaps: frozenset[int] = frozenset(),
          closed_by: str = "markers") -> EpochResult:
    n = int(rng.integers(300, 500))
    res = EpochResult(query=Q, epoch=e, closed_by=closed_by, confidences=CONF,  # type: ignore[arg-type]
                      participants=n, reports=n, round_reports=[n], late=1, refused=2, missing_batches=0,
                      withheld=None if withheld is None else f"because {withheld}", withheld_code=withheld,
                      no_source_data=gaps, epsilon_shuffled=float(rng.uniform(0.1, 0.2)))
    if withheld is None:
        for name in Q.spec.estimator_names:
            est = rng.normal(20, 15, V)
            sd = rng.uniform(5, 9, V)
            res.values[name] = StationEstimates(est, sd, np.stack([est - 1] * 2), np.stack([est + 1] * 2))
    return res


def hour(seed: int = 1, **special: str) -> list[EpochResult]:
    """Two hours of epochs from E0; ``special`` maps "e<offset>" to a withheld code."""
    rng = np.random.default_rng(seed)
    return [epoch(E0 + i, rng, special.get(f"e{i}")) for i in range(240)]


def run(results: list[EpochResult], batches: int = 1, order: np.ndarray | None = None,
        store: dict[bytes, bytes] | None = None) -> tuple[list[RollupState], dict[bytes, bytes]]:
    """Feed the summaries (encoded and decoded, as on the topic) in ``batches``, storing every
    touched state as bytes between batches (as the changelog does); the decided rollups."""
    store = {} if store is None else store
    items = [decode_partial(encode_partial(summary_of(r))) for r in results]
    if order is not None:
        items = [items[i] for i in order]
    decided: list[RollupState] = []
    policy = RollupPolicy()
    for chunk in np.array_split(np.arange(len(items)), batches):
        batch = [items[i] for i in chunk]
        assert all(isinstance(s, EpochSummary) for s in batch)
        out = policy.apply(lambda rid: RollupState.decode(store[rid.key]) if rid.key in store else None,
                           batch)  # type: ignore[arg-type]
        decided += out.decided
        store.update({rid.key: st.encode() for rid, st in out.touched.items()})
    return decided, store


def by_id(states: list[RollupState]) -> dict[RollupId, RollupState]:
    ids = [s.rid for s in states]
    assert len(ids) == len(set(ids)), "a rollup was decided twice"
    return {s.rid: s for s in states}


def test_sums_equal_numpy_sums_and_variances_add() -> None:
    results = hour()
    decided = by_id(run(results)[0])
    assert sorted({(r.span, len([s for s in decided if s.span == r.span])) for r in decided}) == [(10, 24), (120, 2)]
    for rid, st in decided.items():
        part = results[rid.start - E0: rid.start - E0 + rid.span]
        res = rollup_result(QE, st, CONF)
        assert res.withheld is None and res.span_s == rid.span * 30 and res.epoch == rid.start
        n = sum(r.participants for r in part)
        assert res.participants == n and res.late == rid.span and res.refused == 2 * rid.span
        for name, v in res.values.items():
            est = np.sum([r.values[name].estimate for r in part], axis=0)
            var = np.sum([r.values[name].sd ** 2 for r in part], axis=0)
            np.testing.assert_allclose(v.estimate, est, rtol=1e-12)
            np.testing.assert_allclose(v.sd, np.sqrt(var), rtol=1e-12)
            for j, c in enumerate(CONF):  # the score interval of the sum at the summed participants
                lo, hi = QE.estimators[name].score_interval(est, float(n), c)
                np.testing.assert_allclose(v.lower[j], lo, rtol=1e-9, atol=1e-9)
                np.testing.assert_allclose(v.upper[j], hi, rtol=1e-9, atol=1e-9)
        assert res.epsilon_shuffled == max(r.epsilon_shuffled or 0.0 for r in part)


def test_a_rollup_is_decided_only_when_all_its_epochs_are_and_out_of_order_closing_gives_the_same_sums() -> None:
    results = hour(seed=2)
    decided, _ = run(results[:9])
    assert decided == []  # one epoch short
    in_order = by_id(run(results)[0])
    order = np.random.default_rng(3).permutation(len(results))
    shuffled = by_id(run(results, batches=17, order=order)[0])
    assert in_order.keys() == shuffled.keys()
    for rid, st in in_order.items():
        other = shuffled[rid]
        assert st.estimate is not None and other.estimate is not None
        np.testing.assert_allclose(other.estimate, st.estimate, rtol=1e-12)  # float sums: up to the order
        assert other.participants == st.participants


def test_withheld_epochs_withhold_their_rollups_with_the_epoch_and_its_code() -> None:
    results = hour(seed=4, e13="missing_batches", e17="late")
    decided = by_id(run(results)[0])
    bad5 = decided[RollupId("q-rr", 1, 10, E0 + 10)]
    res = rollup_result(QE, bad5, CONF)
    assert res.withheld_code == "missing_batches" and res.values == {}
    assert res.withheld is not None and f"epoch {E0 + 13}" in res.withheld and "and 1 more" in res.withheld
    hour0 = rollup_result(QE, decided[RollupId("q-rr", 1, 120, E0)], CONF)
    assert hour0.withheld_code == "missing_batches" and f"epoch {E0 + 13}" in str(hour0.withheld)
    assert rollup_result(QE, decided[RollupId("q-rr", 1, 10, E0)], CONF).withheld is None
    assert rollup_result(QE, decided[RollupId("q-rr", 1, 120, E0 + 120)], CONF).withheld is None
    rows = res.render()  # a withheld rollup renders as a withheld epoch does
    assert len(rows) == V * len(Q.spec.estimator_names) and b'"span_s":300' in rows[0][1]


def test_no_source_data_in_any_epoch_marks_the_rollup_station() -> None:
    rng = np.random.default_rng(5)
    gaps = {4: frozenset({2, 5}), 7: frozenset({2})}
    results = [epoch(E0 + i, rng, gaps=gaps.get(i, frozenset())) for i in range(10)]
    (st,) = run(results)[0]
    res = rollup_result(QE, st, CONF)
    assert res.no_source_data == frozenset({2, 5}) == res.blank
    row = json.loads(res.render()[1][1])  # station index 2: flagged, and no number (not a flow)
    assert row["data_quality"] == "no_source_data" and row["estimate"] is None and row["bounds"] == []


def test_a_restart_neither_loses_nor_duplicates_a_rollup() -> None:
    results = hour(seed=6)
    whole = by_id(run(results)[0])
    first, store = run(results[:100], batches=3)
    # a crash after the summaries were sent but before their windows were stored: sent again
    again, store = run(results[90:], batches=4, store=store)
    restarted = by_id(first + again)
    assert restarted.keys() == whole.keys()
    for rid, st in whole.items():
        assert restarted[rid].estimate is not None and st.estimate is not None
        np.testing.assert_allclose(restarted[rid].estimate, st.estimate, rtol=1e-12)
        assert restarted[rid].participants == st.participants and restarted[rid].late == st.late
    stored = RollupState.decode(store[RollupId("q-rr", 1, 10, E0).key])
    assert stored.decided and stored.published and stored.estimate is None  # a decided rollup keeps no arrays


def test_an_epoch_withdrawn_after_publication_withdraws_its_rollups() -> None:
    results = hour(seed=7)[:120]
    _, store = run(results)
    policy = RollupPolicy()
    withdrawn = summary_of(EpochResult(query=Q, epoch=E0 + 3, closed_by="markers", confidences=CONF, participants=0,
                                       reports=0, round_reports=[0], late=0, refused=0, missing_batches=0,
                                       withheld="withdrawn: a later marker", withheld_code="conflicting_markers",
                                       retracted=True))
    out = policy.apply(lambda rid: RollupState.decode(store[rid.key]) if rid.key in store else None, [withdrawn])
    assert sorted(s.rid.span for s in out.retracted) == [10, 120] and out.decided == []
    res = rollup_result(QE, out.retracted[0], CONF)
    assert res.retracted and res.withheld_code == "conflicting_markers" and f"epoch {E0 + 3}" in str(res.withheld)
    store.update({rid.key: st.encode() for rid, st in out.touched.items()})
    again = policy.apply(lambda rid: RollupState.decode(store[rid.key]), [withdrawn])
    assert again.retracted == [] and again.touched == {}  # the same withdrawal twice: once


def test_summaries_travel_as_stage_records_keyed_by_their_hour() -> None:
    s = summary_of(hour(seed=8)[121])
    assert decode_partials(encode_bundle([encode_partial(s)] * 2)) == [s, s]
    assert route_key(s) == route_key(summary_of(hour(seed=8)[239]))  # one hour, one key
    assert route_key(s) != route_key(summary_of(hour(seed=8)[119]))
    withheld = summary_of(epoch(E0, np.random.default_rng(0), withheld="late"))
    assert decode_partial(encode_partial(withheld)) == withheld and withheld.estimate.shape == (0, 0)
    with pytest.raises(ValueError):
        decode_partial(encode_partial(s)[:-8])  # an array cut short


def _rollup_of(releases: list[str | None], batches: int = 3) -> EpochResult:
    """The 5-minute rollup of ten epochs with these releases (fed in ``batches``, the state stored between)."""
    rng = np.random.default_rng(3)
    results = [dataclasses.replace(epoch(E0 + i, rng), release=r) for i, r in enumerate(releases)]
    (st,) = run(results, batches=batches)[0]
    return rollup_result(QE, st, CONF)


def test_a_rollup_says_which_release_its_epochs_came_from() -> None:
    """All aggregate: aggregate. One permuted among them, wherever: permuted (the more revealing:
    the aggregate counts are a function of the permuted reports). One epoch not attested (the
    direct path): null, as its epsilon_shuffled would be. Through the summaries' and the states'
    encodings, into the rows' and frames' header."""
    agg = _rollup_of(["aggregate"] * 10)
    assert agg.release == "aggregate" and agg.header()["release"] == "aggregate"
    assert _rollup_of(["aggregate"] * 9 + ["permuted"]).release == "permuted"
    assert _rollup_of(["permuted"] + ["aggregate"] * 9, batches=1).release == "permuted"
    assert _rollup_of([None] * 10).release is None
    assert _rollup_of(["aggregate"] * 5 + [None] + ["aggregate"] * 4).release is None
    s = summary_of(dataclasses.replace(hour(seed=8)[3], release="aggregate"))
    assert decode_partial(encode_partial(s)).release == "aggregate"  # type: ignore[union-attr]
    bad = encode_partial(s).replace(b'"release":"aggregate"', b'"release":"aggregatx"')
    with pytest.raises(ValueError, match="bad release"):
        decode_partial(bad)
    cut = b',"release":"aggregate"'
    old = encode_partial(s).replace(cut, b"")  # a summary written before the field
    assert decode_partial(old[:5] + FRAME_LENGTH.pack(FRAME_LENGTH.unpack_from(old, 5)[0] - len(cut)) + old[9:]) \
        == dataclasses.replace(s, release=None)
    st = RollupState.new(RollupId(Q.query_id, 1, 10, E0))
    st.add(s)  # a state written before the release fields: its epochs' release is unknown
    head_len = FRAME_LENGTH.unpack_from(data := st.encode(), 4)[0]
    head = json.loads(data[8:8 + head_len])
    del head["release"], head["unreleased"]
    h = json.dumps(head, separators=(",", ":")).encode()
    older = RollupState.decode(data[:4] + FRAME_LENGTH.pack(len(h)) + h + data[8 + head_len:])
    assert older.unreleased and RollupState.decode(data).release == "aggregate"


def test_rollups_reaching_outside_a_version_are_withheld_and_a_newer_version_cuts_the_older_short() -> None:
    """Version 1 runs from E0 + 3; version 2 takes over at E0 + 14 (7 minutes in). Rollups that
    reach outside a version's epochs are withheld once the epochs inside are decided, with the
    reason -- for version 1's, when version 2's first summary says it was cut short -- and never
    left waiting for epochs that will not come."""
    v1 = Q.model_copy(update={"t_start": T0 + timedelta(seconds=90)})
    v2 = Q.model_copy(update={"version": 2, "t_start": T0 + timedelta(minutes=7)})
    versions = {1: v1}
    window = partial(version_window, lambda q, v: versions.get(v))
    rng = np.random.default_rng(9)
    first = [summary_of(epoch(E0 + i, rng)) for i in range(3, 14)]  # version 1's epochs
    policy = RollupPolicy()
    store: dict[RollupId, RollupState] = {}
    out = policy.apply(store.get, first, window)
    store.update(out.touched)
    assert [(st.rid.start, st.withheld and st.withheld[1]) for st in out.decided] == \
        [(E0, "outside_query_window")]  # epochs 0-2 were never version 1's
    assert "3 of its epochs" in str(rollup_result(QE, out.decided[0], CONF).withheld)
    versions[2] = v2
    later = [dataclasses.replace(summary_of(epoch(E0 + i, rng)), query_version=2) for i in range(14, 30)]
    out = policy.apply(store.get, later, window)
    decided = {(st.rid.query_version, st.rid.span, st.rid.start): st for st in out.decided}
    assert decided.keys() == {(1, 10, E0 + 10), (1, 120, E0), (2, 10, E0 + 10), (2, 10, E0 + 20)}
    first_withheld = {k: st.withheld and st.withheld[:2] for k, st in decided.items()}
    assert first_withheld == {(1, 10, E0 + 10): (E0 + 14, "outside_query_window"),  # cut short by version 2
                              (1, 120, E0): (E0, "outside_query_window"),
                              (2, 10, E0 + 10): (E0 + 10, "outside_query_window"),  # before version 2 began
                              (2, 10, E0 + 20): None}
    assert route_key(first[0]) == route_key(later[0])  # every version's rollups of an hour: one partition


# The Monte Carlo coverage of a rollup's bounds: 10 epochs with different true counts through
# the mechanisms' exact tallies, summed, and the score interval of the sum at 10 N. With 3,000
# rollups a coverage at its nominal level has a standard error of 0.40 points at 95 % (0.18 at
# 99 %); the test fails below nominal minus 4 standard errors, a false-failure rate under 1e-4
# per level and case if the true coverage is nominal (the two-coin RR estimate is continuous
# enough; Sampling Privacy's is a lattice with the half-step correction).
@pytest.mark.parametrize("key", ["rr_two_coin", "sp_binary"])
def test_the_bounds_of_a_sum_cover_its_true_total(key: str) -> None:
    trials, n = 3_000, 200
    yes = [0, 1, 3, 0, 8, 2, 15, 0, 5, 30]  # a quiet station's 5 minutes: most epochs near zero
    case = _mc.case(key)
    name, est = next(iter(case.estimators.items()))
    total = np.zeros(trials)
    for i, y in enumerate(yes):
        total += _mc.simulate(key, [y], n, trials, salt=f"rollup-{i}")[name][:, 0]
    for c in (0.95, 0.99):
        lo, hi = est.score_interval(total[:, None], float(n * len(yes)), c)
        covered = float(np.mean((lo[:, 0] <= sum(yes)) & (sum(yes) <= hi[:, 0])))
        se = np.sqrt(c * (1 - c) / trials)
        assert covered >= c - 4 * se, (key, c, covered)
