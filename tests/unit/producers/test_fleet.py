"""The simulated fleet (``producers.fleet``): who is where, and what each device sends.

Checked: ``split_fleet`` margins (rows = each producer's share, columns = the data's flows),
its refusal when the fleet is too small, its determinism per (seed, epoch);
``query_truth_counts``; ``privatize`` in per-vehicle and tally modes for ``sp``, ``alp`` and
``rr``: report counts, allowed values, the device audit, reproducibility from
``epoch_rng``, equality of the tally path with the statistics core's exact tally; its three
truths (``StationCounts``, ``StationSets``, ``YesCounts``) answered alike, draw for draw, and a
truth a query cannot answer refused with an error; and the
privacy invariant of MECHANISMS.md §3: a vehicle's two Sampling Privacy rounds are never
linkable by position (each round is shuffled on its own), nor is a report's position
related to its vehicle.

Statistical assertions use fixed seeds (deterministic); the false-failure rate each would
have for a random seed under a correct implementation is stated at the assertion.
Family-wise (all of them together) false-failure < 5e-3 for a random seed.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from scipy import stats

import estimators as E
from estimators import Bitmaps, Counts, Pairs, StationCounts, Values, YesCounts
from estimators.reports import round_from_arrays
from producers.fleet import (
    Device,
    EpochReports,
    FleetTooSmall,
    epoch_rng,
    fleet_share,
    privatize,
    query_truth_counts,
    split_fleet,
)
from schemas import DecodedBatch, Query, decode_record, encode_batch, new_batch_id
from tests.station_counts import pair_counts

SEED = 20261118
T0 = datetime(2026, 11, 18, 8, 0, tzinfo=UTC)
P_MIN = 1e-3  # p-value floor of the chi-square checks: false-failure 1e-3 each


def make_query(mechanism: str, sensors: tuple[int, ...], params: dict[str, float] | None = None,
               query_id: str = "q-fleet", version: int = 1) -> Query:
    return Query(query_id=query_id, analyst_id="analyst-1", version=version, sensors=sensors,
                 mechanism=mechanism, params=params or {}, population=50_000,
                 t_start=T0, t_end=T0 + timedelta(days=1))


def sensors(v: int) -> tuple[int, ...]:
    return tuple(500_000 + 7 * i for i in range(1, v + 1))


def truth_for(v: int, n_none: int, per_station: int) -> np.ndarray:
    """Truth counts (V + 1,): ``n_none`` at none of the sensors, ``per_station`` at each
    sensor except the second (nobody there)."""
    tc = np.full(v + 1, per_station, dtype=np.int64)
    tc[0] = n_none
    if v >= 2:
        tc[2] = 0
    return tc


def ascent_fraction(x: np.ndarray) -> float:
    d = np.diff(x)
    up, down = int((d > 0).sum()), int((d < 0).sum())
    return up / (up + down)


# ---------------------------------------------------------------------------------------
# split_fleet, fleet_share
# ---------------------------------------------------------------------------------------
FLOWS = np.array([30, 0, 55, 12, 7, 1], dtype=np.int64)


def test_fleet_share_splits_the_fleet() -> None:
    for fleet, count in [(1000, 3), (10, 4), (2, 5), (47_719, 8), (7, 1)]:
        shares = [fleet_share(fleet, k, count) for k in range(count)]
        assert sum(shares) == fleet
        assert max(shares) - min(shares) <= 1
        assert shares == sorted(shares, reverse=True)  # the first ones take the remainder


@pytest.mark.parametrize(("fleet", "count"), [(1000, 3), (105, 4), (200, 1), (110, 7), (3, 5)])
def test_split_fleet_margins(fleet: int, count: int) -> None:
    flows = FLOWS if FLOWS.sum() <= fleet else np.array([1, 0, 1, 0, 1, 0])
    out = split_fleet(SEED, 4_000_123, flows, fleet, count)
    assert out.shape == (count, 1 + flows.size)
    assert out.dtype == np.int64 and out.min() >= 0
    assert out.sum(axis=1).tolist() == [fleet_share(fleet, k, count) for k in range(count)]
    assert out.sum(axis=0).tolist() == [fleet - int(flows.sum()), *flows.tolist()]


def test_split_fleet_exactly_full() -> None:
    out = split_fleet(SEED, 1, FLOWS, int(FLOWS.sum()), 3)
    assert out[:, 0].tolist() == [0, 0, 0]
    assert out.sum(axis=0)[1:].tolist() == FLOWS.tolist()


def test_split_fleet_too_small() -> None:
    with pytest.raises(FleetTooSmall) as info:
        split_fleet(SEED, 4_242, FLOWS, int(FLOWS.sum()) - 1, 2)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "epoch 4242" in msg and f"{int(FLOWS.sum())} vehicles" in msg and f"{int(FLOWS.sum()) - 1}" in msg
    assert "at least" in msg and "peak" in msg


def test_split_fleet_is_a_function_of_seed_and_epoch() -> None:
    a = split_fleet(SEED, 77, FLOWS, 1000, 4)
    assert np.array_equal(a, split_fleet(SEED, 77, FLOWS.copy(), 1000, 4))
    others = [split_fleet(SEED, e, FLOWS, 1000, 4) for e in range(78, 88)]
    assert all(not np.array_equal(a, o) for o in others)  # P(equal) is tiny for each
    assert not np.array_equal(a, split_fleet(SEED + 1, 77, FLOWS, 1000, 4))
    # a fresh array with the same values gives the same split
    assert np.array_equal(a, split_fleet(SEED, 77, np.asarray(FLOWS.tolist()), 1000, 4))


def test_split_fleet_is_unbiased_across_producers() -> None:
    """Over 300 epochs, producer k's count at station j sums to 300 * share_k * flow_j /
    fleet within 5 SE (SE from the hypergeometric variance). 3 x 7 cells, each two-sided
    normal tail 5.7e-7: false-failure < 2e-5."""
    fleet, count, epochs = 400, 3, 300
    colors = np.array([fleet - int(FLOWS.sum()), *FLOWS.tolist()], dtype=float)
    total = sum(split_fleet(SEED, e, FLOWS, fleet, count) for e in range(epochs))
    for k in range(count):
        n = fleet_share(fleet, k, count)
        p = colors / fleet
        expect = epochs * n * p
        var = epochs * n * p * (1 - p) * (fleet - n) / (fleet - 1)
        se = np.sqrt(np.maximum(var, 1e-12))
        assert np.all(np.abs(total[k] - expect) <= 5 * se + 1e-9)


# ---------------------------------------------------------------------------------------
# query_truth_counts
# ---------------------------------------------------------------------------------------
def test_query_truth_counts_maps_sensors_and_puts_the_rest_at_zero() -> None:
    data_stations = np.array([100, 200, 300, 400], dtype=np.int64)
    row = np.array([50, 5, 6, 7, 8], dtype=np.int64)  # 50 at none of the data's stations
    q = make_query("sp", (300, 999, 100))  # 999 is not in the data
    counts = query_truth_counts(row, data_stations, q)
    assert counts.tolist() == [50 + 6 + 8, 7, 0, 5]
    assert int(counts.sum()) == int(row.sum())
    # every sensor absent from the data: everyone is at index 0
    none = query_truth_counts(row, data_stations, make_query("sp", (1, 2)))
    assert none.tolist() == [76, 0, 0]


def test_split_then_truth_counts_add_up_over_producers() -> None:
    data_stations = np.array([11, 22, 33, 44, 55, 66], dtype=np.int64)
    split = split_fleet(SEED, 9, FLOWS, 500, 3)
    q = make_query("alp", (44, 11, 77))
    per = np.array([query_truth_counts(split[k], data_stations, q) for k in range(3)])
    assert per.sum(axis=0).tolist() == [500 - 12 - 30, 12, 30, 0]
    assert per.sum(axis=1).tolist() == [fleet_share(500, k, 3) for k in range(3)]


# ---------------------------------------------------------------------------------------
# privatize: counts and values
# ---------------------------------------------------------------------------------------
def test_sp_per_vehicle_reports() -> None:
    q = make_query("sp", sensors(3))
    tc = truth_for(3, 400, 150)
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device())
    assert isinstance(er, EpochReports)
    assert (er.participants, er.refused, er.refusal_reason) == (n, 0, None)
    assert len(er.rounds) == 2 and er.reports == [n, n]  # one report per vehicle per round
    for r in range(2):
        assert isinstance(er.rounds[r], Values)
        v = er.rounds[r].arrays()["value"]
        assert v.shape == (n,) and np.issubdtype(v.dtype, np.integer)
        assert v.min() >= 0 and v.max() <= 3
    # one die per vehicle for both rounds: only face S changes its report (0 -> truth), so
    # the round difference is exact per station -- 0 where nobody is, >= 0 elsewhere
    c1, c2 = (np.bincount(er.rounds[r].arrays()["value"], minlength=4) for r in range(2))
    assert c2[2] == c1[2]
    assert c2[1] >= c1[1] and c2[3] >= c1[3] and c2[0] <= c1[0]
    assert int(c2.sum()) == int(c1.sum()) == n


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_per_sensor_per_vehicle_reports_are_pairs(mechanism: str) -> None:
    """Only the non-default (station, report) pairs are sent: ALP the non-⊥ ones (0 or 1),
    RR the "1" answers. Their number is a sum of independent Bernoullis with mean
    ``Yes*P(non-default|Yes) + (N*V - Yes)*P(non-default|No)``; asserted within 6 sd
    (false-failure 2e-9)."""
    v = 20
    q = make_query(mechanism, sensors(v))
    tc = truth_for(v, 1500, 40)
    n, yes = int(tc.sum()), int(tc[1:].sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device())
    assert (er.participants, er.refused) == (n, 0)
    assert len(er.rounds) == 1
    assert set(er.rounds[0].arrays()) == {"station", "output"}  # no "vehicle" array ever leaves
    st, out = er.rounds[0].arrays()["station"], er.rounds[0].arrays()["output"]
    assert st.shape == out.shape and er.reports == [int(st.size)]
    assert st.min() >= 1 and st.max() <= v
    allowed = {E.ALP_NO, E.ALP_YES} if mechanism == "alp" else {1}
    assert set(np.unique(out).tolist()) <= allowed
    ps = q.per_station[0]  # type: ignore[index]
    assert ps is not None
    table = q.build().output_table(0)
    default = ps.default
    p_yes, p_no = 1 - table[1, default], 1 - table[0, default]
    mean = yes * p_yes + (n * v - yes) * p_no
    var = yes * p_yes * (1 - p_yes) + (n * v - yes) * p_no * (1 - p_no)
    assert abs(st.size - mean) < 6 * np.sqrt(var)
    # the consumer's view: per-station counts, the default column filled in from N
    counts = pair_counts(q.spec, q.build(), v, [E.SparseReports(np.zeros(0, np.int64), st, out)], n)[:, 0, :]
    assert counts.shape == (v, q.build().n_outputs) and np.all(counts.sum(axis=1) == n)


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_tally_mode_reports(mechanism: str) -> None:
    v = 5
    q = make_query(mechanism, sensors(v))
    tc = truth_for(v, 700, 60)
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "tally", Device())
    assert (er.participants, er.refused, er.refusal_reason) == (n, 0, None)
    assert len(er.rounds) == q.n_rounds and er.reports == [n] * q.n_rounds
    o = q.build().n_outputs
    for rnd in er.rounds:
        assert isinstance(rnd, Counts) and set(rnd.arrays()) == {"counts"}
        c = rnd.counts
        assert c.min() >= 0
        if mechanism == "sp":
            assert c.shape == (v + 1,) and int(c.sum()) == n
        else:
            assert c.shape == (v * o,)
            assert np.all(c.reshape(v, o).sum(axis=1) == n)


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_tally_mode_equals_the_core_exact_tally(mechanism: str) -> None:
    v = 4
    q = make_query(mechanism, sensors(v))
    tc = truth_for(v, 333, 77)
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(99), "tally", Device())
    # the mechanism as the statistics core builds it, independently of the Query object
    mech = E.build_mechanism(mechanism, {}, stations=v)
    if mechanism == "sp":
        expected = mech.tally(np.random.default_rng(99), tc)
        for r in range(2):
            assert np.array_equal(er.rounds[r].arrays()["counts"], expected[r])
    else:
        expected = E.PerStation(mech, v).tally(np.random.default_rng(99), tc[1:], n).ravel()
        assert np.array_equal(er.rounds[0].arrays()["counts"], expected)


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", E.mechanism_names(queryable_only=True))
def test_reports_are_in_the_layout_the_registry_names(mechanism: str, mode: str) -> None:
    """What the replay sends is labelled with the layout ``privatize`` states (the registry's
    per-vehicle layout, or ``counts`` for a tally), never guessed from the arrays: every round
    encodes and decodes under it (the wire checks the arrays a layout needs) and stage 1's
    ``accumulate`` takes it."""
    spec = E.get_spec(mechanism)
    v = spec.max_stations or 4
    q = make_query(mechanism, sensors(v))
    er = privatize(q, StationCounts(truth_for(v, 300, 30)), np.random.default_rng(SEED), mode, Device())
    layout = "counts" if mode == "tally" else spec.layout
    assert [rnd.layout for rnd in er.rounds] == [layout] * q.n_rounds
    for r, rnd in enumerate(er.rounds):
        value = encode_batch({"kind": rnd.kind, "query_id": q.query_id,
                              "query_version": q.version, "epoch": q.epoch_range()[0], "round": r,
                              "batch_id": new_batch_id(), "producer_id": "p0", "reports": er.reports[r],
                              "layout": rnd.layout, "n_stations": v, "n_outputs": q.n_outputs}, rnd.arrays())
        batch = decode_record(value)
        assert isinstance(batch, DecodedBatch) and batch.header.layout == layout
        counts = spec.accumulate(q.build(), v, round_from_arrays(layout, batch.arrays, er.reports[r]))
        assert counts.shape == (q.width,) and counts.sum() > 0


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_no_vehicles(mechanism: str, mode: str) -> None:
    q = make_query(mechanism, sensors(3))
    er = privatize(q, StationCounts(np.zeros(4, dtype=np.int64)), np.random.default_rng(1), mode, Device())
    assert er.participants == 0 and er.refused == 0
    assert er.reports == [0] * q.n_rounds
    for rnd in er.rounds:
        for arr in rnd.arrays().values():
            assert int(arr.sum()) == 0


def test_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        privatize(make_query("sp", sensors(2)), StationCounts(np.array([1, 1, 1])), np.random.default_rng(1), "batch",
                  Device())


# ---------------------------------------------------------------------------------------
# One privatize, three truths: StationCounts, StationSets, YesCounts
# ---------------------------------------------------------------------------------------
def _same_reports(a: EpochReports, b: EpochReports) -> bool:
    """The same refusals, rounds (their types and arrays) and vehicles behind them."""
    arrays_a, arrays_b = _arrays(a), _arrays(b)
    return ((a.participants, a.refused, a.refusal_reason) == (b.participants, b.refused, b.refusal_reason)
            and [type(r) for r in a.rounds] == [type(r) for r in b.rounds] and len(arrays_a) == len(arrays_b)
            and all(np.array_equal(x, y) for x, y in zip(arrays_a, arrays_b, strict=True))
            and len(a.vehicles) == len(b.vehicles)
            and all(np.array_equal(x, y) for x, y in zip(a.vehicles, b.vehicles, strict=True)))


@pytest.mark.parametrize("mix_pairs", [True, False])
@pytest.mark.parametrize("mechanism", ["alp", "rr", "unary", "fresh"])
def test_a_30s_truth_is_its_vehicles_one_station_sets(mechanism: str, mix_pairs: bool) -> None:
    """Per vehicle, a per-sensor query's 30-s truth (StationCounts) is privatized as the set
    truths of its vehicles, one station or none each, in the order the epoch re-draws: the same
    rounds, draw for draw, as StationSets.of_truths of those vehicles under the same rng."""
    q = make_query(mechanism, sensors(9))
    tc = truth_for(9, 400, 35)
    got = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device(1e3),
                    mix_pairs=mix_pairs)
    rng = np.random.default_rng(SEED)
    truths = np.repeat(np.arange(tc.size, dtype=np.int64), tc)
    rng.shuffle(truths)  # the epoch's virtual identities, drawn first
    want = privatize(q, E.StationSets.of_truths(truths), rng, "per-vehicle", Device(1e3), mix_pairs=mix_pairs)
    assert got.participants == int(tc.sum()) and _same_reports(got, want)


@pytest.mark.parametrize("mechanism", ["alp", "rr", "unary"])
def test_the_three_truths_tally_alike(mechanism: str) -> None:
    """Tally mode: a 30-s truth, its vehicles' one-station sets and their Yes counts give the
    same counts under the same rng (each station's two multinomials; no shuffle is drawn)."""
    q = make_query(mechanism, sensors(7))
    tc = truth_for(7, 250, 20)
    n = int(tc.sum())
    sets = E.StationSets.of_truths(np.repeat(np.arange(tc.size, dtype=np.int64), tc))
    got = [privatize(q, truth, np.random.default_rng(SEED), "tally", Device(1e3))
           for truth in (StationCounts(tc), sets, YesCounts(tc[1:], n))]
    assert got[0].participants == n and isinstance(got[0].rounds[0], Counts)
    assert _same_reports(got[0], got[1]) and _same_reports(got[1], got[2])


def test_a_tally_of_sets_charges_like_the_sets() -> None:
    """YesCounts: the audit and the day's ledger as its sets (one charge a report)."""
    q = make_query("unary", sensors(3))
    sets = E.StationSets(4, np.array([0, 0, 2, 3]), np.array([1, 3, 2, 2]))
    yes = YesCounts(sets.yes_counts(3), sets.n_vehicles)
    ledgers = [E.DayLedger(1.5 * q.epsilon), E.DayLedger(1.5 * q.epsilon)]
    for truth, ledger in zip((sets, yes), ledgers, strict=True):
        first = privatize(q, truth, np.random.default_rng(1), "tally", Device(), ledger, "2026-11-18")
        second = privatize(q, truth, np.random.default_rng(1), "tally", Device(), ledger, "2026-11-18")
        assert first.participants == 4 and second.refused == 4
        assert "daily privacy budget" in (second.refusal_reason or "")
    assert ledgers[0].total("2026-11-18") == ledgers[1].total("2026-11-18")


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", ["sp", "krr"])
def test_a_station_valued_query_has_no_set_truth(mechanism: str, mode: str) -> None:
    """A mechanism that reports one station cannot privatize a set of them, nor their tally;
    nothing is charged to the day."""
    q = make_query(mechanism, sensors(3))
    sets = E.StationSets(2, np.array([0, 0, 1]), np.array([1, 2, 3]))
    ledger = E.DayLedger(10 * q.epsilon)
    for truth in (sets, YesCounts(sets.yes_counts(3), 2)):
        with pytest.raises(ValueError, match="reports one station: it has no set truth"):
            privatize(q, truth, np.random.default_rng(0), mode, Device(), ledger, "2026-11-18")
    assert ledger.total("2026-11-18") == 0


def test_a_tally_of_sets_is_privatized_in_tally_mode_only() -> None:
    q = make_query("unary", sensors(3))
    with pytest.raises(ValueError, match="tally mode only"):
        privatize(q, YesCounts(np.array([1, 0, 2]), 3), np.random.default_rng(0), "per-vehicle", Device())


def test_a_bare_array_is_no_truth() -> None:
    with pytest.raises(TypeError, match="StationCounts, StationSets or YesCounts"):
        privatize(make_query("sp", sensors(2)), np.array([1, 1, 1]), np.random.default_rng(1), "tally", Device())


# ---------------------------------------------------------------------------------------
# The privacy invariant: rounds are never linkable, positions say nothing
# ---------------------------------------------------------------------------------------
def _inconsistent(r1: np.ndarray, r2: np.ndarray) -> int:
    """Positions i with r1[i] != 0 and r2[i] != r1[i]. If position i were one vehicle in
    both rounds this is impossible under Sampling Privacy (faces 1..V repeat themselves,
    face 0 and face S report 0 in round 1), so the count is 0 for aligned arrays."""
    return int(((r1 != 0) & (r2 != r1)).sum())


def _contingency_p(r1: np.ndarray, r2: np.ndarray, k: int) -> float:
    table = np.zeros((k, k), dtype=np.int64)
    np.add.at(table, (r1, r2), 1)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    return float(stats.chi2_contingency(table).pvalue)


def test_sp_rounds_are_not_linkable_by_position() -> None:
    """Had the two per-round arrays kept one vehicle per position, a (0 -> v) pair would
    reveal that vehicle's station (MECHANISMS.md §3). Compare with the aligned reports the
    mechanism produces in device memory (``Mechanism.sample``) for the same truths:

    * aligned: 0 impossible transitions, and round 2 is strongly dependent on round 1;
    * sent: many impossible transitions (about the count expected for two independent
      shuffles, within 20%), and a chi-square test of independence between the values at
      the same position in the two rounds has p > 1e-3 (false-failure 1e-3).
    """
    v = 3
    q = make_query("sp", sensors(v))
    tc = np.array([3000, 1000, 1000, 1000], dtype=np.int64)
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device())
    r1, r2 = er.rounds[0].arrays()["value"], er.rounds[1].arrays()["value"]

    truths = np.repeat(np.arange(v + 1), tc)
    aligned = q.build().sample(np.random.default_rng(SEED), truths)
    assert _inconsistent(aligned[0], aligned[1]) == 0
    assert _contingency_p(aligned[0], aligned[1], v + 1) < 1e-100
    # the aligned pairs really reveal the truth: every 0 -> u pair sits on a vehicle at u
    revealing = (aligned[0] == 0) & (aligned[1] != 0)
    assert revealing.sum() > 1000 and np.array_equal(aligned[1][revealing], truths[revealing])

    n1 = np.bincount(r1, minlength=v + 1)
    n2 = np.bincount(r2, minlength=v + 1)
    expected = sum(int(n1[u]) * (n - int(n2[u])) / n for u in range(1, v + 1))
    assert expected > 1000
    assert abs(_inconsistent(r1, r2) - expected) < 0.2 * expected  # sd ~ 30, margin > 10 sd
    assert _contingency_p(r1, r2, v + 1) > P_MIN
    # the per-round counts are those of the aligned reports' distribution: same sizes
    assert r1.size == r2.size == n


def test_sp_position_says_nothing_about_the_vehicle() -> None:
    """Truth counts are handed over grouped by station (index 0 first). A report's position
    must not carry that order: the first and second halves of each round have the same
    value distribution (chi-square homogeneity, p > 1e-3 each, false-failure 2e-3)."""
    q = make_query("sp", sensors(3))
    tc = np.array([2000, 2000, 0, 2000], dtype=np.int64)
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED + 5), "per-vehicle", Device())
    for r in range(2):
        x = er.rounds[r].arrays()["value"]
        half = x.size // 2
        table = np.array([np.bincount(x[:half], minlength=4), np.bincount(x[half:], minlength=4)])
        table = table[:, table.sum(axis=0) > 0]
        assert stats.chi2_contingency(table).pvalue > P_MIN


def test_sp_rounds_use_different_permutations() -> None:
    """Two independent uniform shuffles agree at a position with probability 1/n. Put one
    vehicle at each of V = 400 stations: then in the aligned reports round 2 equals round 1
    at every position of a non-S face, and the positions of matching values (over vehicles
    not at index 0) reveal the alignment; after independent shuffles matches are chance
    level: expected sum_u n1(u) n2(u) / n, asserted within 6 sd (Poisson approximation,
    false-failure 2e-9)."""
    v = 400
    q = make_query("sp", sensors(v))
    tc = np.ones(v + 1, dtype=np.int64)
    tc[0] = 600
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED + 9), "per-vehicle", Device())
    r1, r2 = er.rounds[0].arrays()["value"], er.rounds[1].arrays()["value"]
    n1, n2 = np.bincount(r1, minlength=v + 1), np.bincount(r2, minlength=v + 1)
    chance = float((n1.astype(float) * n2).sum() / n)
    matches = int((r1 == r2).sum())
    assert abs(matches - chance) < 6 * np.sqrt(chance)
    aligned = q.build().sample(np.random.default_rng(SEED + 9), np.repeat(np.arange(v + 1), tc))
    assert int((aligned[0] == aligned[1]).sum()) > 0.4 * n  # what alignment would look like


def test_per_sensor_pairs_are_shuffled_across_vehicles() -> None:
    """Without the shuffle, a vehicle's pairs come out together, stations ascending (the
    Bernoulli grid is walked vehicle by vehicle): ~90% ascents between neighbours. After a
    uniform shuffle, ascents and descents are equally likely among ~20,000 pairs: fraction
    0.5 with sd ~0.002; asserted within 0.03 (> 10 sd)."""
    v = 200
    q = make_query("alp", sensors(v))
    tc = np.zeros(v + 1, dtype=np.int64)
    tc[0], tc[1:] = 1800, 1
    er = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device())
    st = er.rounds[0].arrays()["station"]
    assert st.size > 15_000
    assert abs(ascent_fraction(st) - 0.5) < 0.03
    truths = np.repeat(np.arange(v + 1), tc)
    ps = q.per_station[0]  # type: ignore[index]
    assert ps is not None
    raw = ps.sample_sparse(np.random.default_rng(SEED), truths)
    assert ascent_fraction(raw.station) > 0.8  # the unshuffled order would leak grouping


# ---------------------------------------------------------------------------------------
# The device audit
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_device_refuses_a_query_over_its_epsilon_limit(mechanism: str, mode: str) -> None:
    q = make_query(mechanism, sensors(3))
    tc = truth_for(3, 100, 20)
    n = int(tc.sum())
    er = privatize(q, StationCounts(tc), np.random.default_rng(1), mode, Device(epsilon_limit=q.epsilon * 0.99))
    assert er.participants == 0 and er.refused == n
    assert er.refusal_reason is not None and "exceeds" in er.refusal_reason
    assert er.rounds == [] and er.reports == []  # nothing to send
    # at the limit exactly, the query is accepted
    ok = privatize(q, StationCounts(tc), np.random.default_rng(1), mode, Device(epsilon_limit=q.epsilon))
    assert ok.participants == n and ok.refused == 0 and ok.refusal_reason is None


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_device_refuses_a_blacklisted_sensor(mechanism: str) -> None:
    q = make_query(mechanism, sensors(3))
    banned = q.sensors[1]
    tc = truth_for(3, 100, 20)
    er = privatize(q, StationCounts(tc), np.random.default_rng(1), "per-vehicle",
                   Device(blacklist=frozenset({banned, 1})))
    assert er.participants == 0 and er.refused == int(tc.sum())
    assert er.refusal_reason is not None and "blacklisted" in er.refusal_reason and str(banned) in er.refusal_reason
    assert er.rounds == []
    assert Device(blacklist=frozenset({1, 2})).accepts(q) == (True, None)


def test_device_fails_closed_on_an_unusable_limit() -> None:
    q = make_query("sp", sensors(2))
    ok, reason = Device(epsilon_limit=float("nan")).accepts(q)
    assert not ok and reason


# ---------------------------------------------------------------------------------------
# Reproducibility
# ---------------------------------------------------------------------------------------
def _arrays(er: EpochReports) -> list[np.ndarray]:
    return [a for rnd in er.rounds for _, a in sorted(rnd.arrays().items())]


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_epoch_rng_reproduces_an_epoch(mechanism: str, mode: str) -> None:
    q = make_query(mechanism, sensors(6))
    tc = truth_for(6, 900, 50)

    def run(query: Query, seed: int = 7, epoch: int = 4_500_000, producer: int = 1) -> list[np.ndarray]:
        return _arrays(privatize(query, StationCounts(tc), epoch_rng(seed, query, epoch, producer), mode, Device()))

    base = run(q)
    again = run(q)
    assert len(base) == len(again) and all(np.array_equal(a, b) for a, b in zip(base, again, strict=True))

    def differs(other: list[np.ndarray]) -> bool:
        return len(other) != len(base) or any(not np.array_equal(a, b) for a, b in zip(base, other, strict=True))

    assert differs(run(q, seed=8))
    assert differs(run(q, epoch=4_500_001))
    assert differs(run(q, producer=2))
    assert differs(run(make_query(mechanism, sensors(6), version=2)))
    assert differs(run(make_query(mechanism, sensors(6), query_id="q-other")))


def test_producers_move_in_lockstep() -> None:
    """`wait_for_peers`: epoch i starts only when every producer has finished epoch i - 2,
    so producers drift apart by at most one epoch (below the stream app's allowed lateness)."""
    import threading
    import time

    from producers.replay import EPOCHS_DONE, wait_for_peers
    from producers.stopping import StopFlag

    peers = [[0] * 6, [0] * 6]
    peers[0][EPOCHS_DONE], peers[1][EPOCHS_DONE] = 5, 3
    stop = StopFlag()
    wait_for_peers(peers, 4, stop)  # min 3 >= 4 - 1: no wait
    released = threading.Event()

    def later() -> None:
        time.sleep(0.2)  # the peer's epoch finishing later, not a wait for an outcome
        released.set()  # before the peer's count moves: the waiter cannot see the count first
        peers[1][EPOCHS_DONE] = 4

    t0 = time.monotonic()
    threading.Thread(target=later).start()
    wait_for_peers(peers, 5, stop)  # needs min >= 4
    assert released.is_set() and time.monotonic() - t0 >= 0.15
    stop.event.set()
    wait_for_peers(peers, 99, stop)  # a stop request ends the wait


def test_stop_plan_one_stop_epoch_for_all() -> None:
    """`StopPlan` (docs/wire.md, "Ctrl-C"): the stop epoch is the newest any producer had
    begun; a producer behind completes the epochs before it and marks the stop epoch
    interrupted with nothing sent; the one in the stop epoch cuts it; nobody begins a later one."""
    from producers.stopping import StopPlan

    plan = StopPlan.local(2)
    assert [plan.begin(0, i) for i in range(3)] == [StopPlan.RUN] * 3  # producer 0 is in epoch 2
    assert [plan.begin(1, i) for i in range(2)] == [StopPlan.RUN] * 2  # producer 1 still in epoch 1
    assert not plan.requested and not plan.cuts(2)
    assert plan.request() == 3 and plan.requested
    assert plan.cuts(2) and not plan.cuts(1)  # producer 0 cuts epoch 2; producer 1 finishes epoch 1
    assert plan.begin(1, 2) == StopPlan.EMPTY  # ... then marks epoch 2 interrupted, nothing sent
    assert plan.begin(0, 3) == StopPlan.STOP and plan.begin(1, 3) == StopPlan.STOP
    assert plan.request() == 3  # decided once
    # a producer two epochs behind (never with lockstep, but the rule holds) completes both
    behind = StopPlan.local(2)
    for i in range(4):
        behind.begin(0, i)
    behind.begin(1, 0)
    behind.request()
    assert behind.begin(1, 1) == behind.begin(1, 2) == StopPlan.RUN and not behind.cuts(2)
    assert behind.begin(1, 3) == StopPlan.EMPTY
    # a stop before anything began: nothing is sent, not even an interrupted marker
    early = StopPlan.local(2)
    early.request()
    assert early.begin(0, 0) == early.begin(1, 0) == StopPlan.STOP


def _report_stop_signals(out: Any) -> None:
    """In a spawned producer-like child: 1 where SIGINT and SIGTERM are ignored."""
    import signal

    out[0] = int(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
    out[1] = int(signal.getsignal(signal.SIGTERM) == signal.SIG_IGN)


def test_producer_processes_start_ignoring_stop_signals() -> None:
    """Producer processes start ignoring SIGINT and SIGTERM (until their own handlers are in):
    a Ctrl-C or the parent's SIGTERM during their start-up must not kill one before it can
    follow the StopPlan (it would leave its epochs without markers). The parent's handlers
    are back afterwards; the stop is seen through the plan while waiting."""
    import multiprocessing as mp
    import signal
    import time

    from producers.stopping import StopFlag, StopPlan, children_ignore_stop_signals, pause_until

    ctx = mp.get_context("spawn")
    out = ctx.Array("q", 2, lock=False)
    with StopFlag() as stop:
        handler = signal.getsignal(signal.SIGTERM)
        with children_ignore_stop_signals():
            child = ctx.Process(target=_report_stop_signals, args=(out,))
            child.start()
        assert signal.getsignal(signal.SIGTERM) is handler and callable(handler)
        child.join(timeout=60)
        assert child.exitcode == 0 and list(out) == [1, 1]
        plan = StopPlan.local(1)
        plan.request()  # fixed elsewhere: no signal reached this process
        t0 = time.monotonic()
        pause_until(time.time() + 30, stop, plan)
        assert time.monotonic() - t0 < 5 and not stop.requested


@pytest.mark.parametrize("mechanism", ["unary", "rr", "alp", "fresh"])
def test_unmixed_pairs_are_the_mixed_ones_grouped_by_vehicle(mechanism: str) -> None:
    """The device path (``mix_pairs=False``) gets exactly the direct path's pairs -- the same
    (vehicle, station, report) triples, only not shuffled across vehicles (every round: the
    permutations between rounds are still drawn)."""
    q = make_query(mechanism, sensors(12))
    tc = truth_for(12, 600, 30)
    rngs = np.random.default_rng(SEED), np.random.default_rng(SEED)
    mixed = privatize(q, StationCounts(tc), rngs[0], "per-vehicle", Device())
    grouped = privatize(q, StationCounts(tc), rngs[1], "per-vehicle", Device(), mix_pairs=False)

    def triples(er: EpochReports) -> list[tuple[int, int, int, int]]:
        out = []
        for k, r in enumerate(er.rounds):
            assert isinstance(r, Bitmaps | Pairs)  # a bit-valued round: one bitmap per vehicle, the same draws
            sp = r.sparse(er.vehicles[k], 12)
            out += [(k, *t) for t in zip(sp.vehicle.tolist(), sp.station.tolist(), sp.output.tolist(), strict=True)]
        return sorted(out)

    assert triples(grouped) == triples(mixed) and len(triples(mixed)) > 100
    assert all(isinstance(r, Bitmaps) == (mechanism != "alp") for r in grouped.rounds)  # the bit-valued: every round
    assert grouped.reports == mixed.reports
    if isinstance(grouped.rounds[0], Pairs):
        owners = grouped.vehicles[0]
        assert int((np.diff(owners) < 0).sum()) <= 1  # grouped: at most two sorted runs (the No pairs, the Yes pairs)
