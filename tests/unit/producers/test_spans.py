"""Vehicles that keep their identity through a span (``producers.spans``: ``SpanFleet``,
``SpanTracker``), the cap on a report's passages (``cap_passages``), the fleet a span needs
(``span_fleet_need``) and a span report's privatization of set truths
(``producers.fleet.privatize`` of a ``StationSets`` or ``YesCounts`` truth).

The identity checks are exact (fixed seeds, deterministic). Each Monte Carlo bound states its
false-failure rate for a random seed under a correct implementation.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

import estimators as E
from estimators.per_station import StationSets
from producers.fleet import Device, FleetTooSmall, epoch_rng, fleet_share, privatize, split_fleet
from producers.pems import TrafficDay, read_station_raw
from producers.spans import SpanFleet, SpanTracker, cap_passages, span_fleet_need, span_flows, span_reports
from producers.synthetic import write_synthetic_day
from schemas import Query

T0 = datetime(2026, 11, 18, 8, 0, tzinfo=UTC)


def make_query(mechanism: str, sensors: tuple[int, ...], span_s: int = 300, **extra: object) -> Query:
    return Query(query_id="q-span", analyst_id="analyst-1", version=1, sensors=sensors, mechanism=mechanism,
                 population=50_000, span_s=span_s, t_start=T0, t_end=T0 + timedelta(days=1), **extra)


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> TrafficDay:
    sd = write_synthetic_day(tmp_path_factory.mktemp("span-day"), n_stations=12, seed=31)
    return read_station_raw(sd.raw_path)


def run_spans(day: TrafficDay, span_s: int, fleet: int, count: int, epochs: slice) -> list[dict[int, StationSets]]:
    """Every producer's SpanFleet over ``epochs`` of the day; per producer, span start -> passages."""
    out: list[dict[int, StationSets]] = []
    for k in range(count):
        sf = SpanFleet(5, span_s, fleet_share(fleet, k, count), day.stations.size, k, day.stations)
        got: dict[int, StationSets] = {}
        for e, row in zip(day.epochs[epochs], day.flows[epochs], strict=True):
            sf.step(int(e), split_fleet(5, int(e), row, fleet, count)[k])
            if sf.complete:
                assert sf.start is not None
                got[sf.start] = sf.passages()
        out.append(got)
    return out


@pytest.mark.parametrize(("span_s", "count"), [(300, 1), (300, 3), (3600, 1), (3600, 2)])
def test_a_stations_distinct_vehicles_in_a_span_are_the_sum_of_its_30s_counts(
        day: TrafficDay, span_s: int, count: int) -> None:
    """The ground truth of a span: per station, the distinct vehicles that passed it (one bit
    per vehicle and station) equal the sum of the data's 30-s counts over the span, exactly, for
    every whole span of the morning peak (07:00-09:30 local) -- what fails if a vehicle is placed
    at a station it already passed (a repeat collapses into one bit). Fleet: span_fleet_need."""
    morning = slice(14 * 120, 14 * 120 + 300)  # 07:00-09:30 Pacific in the day's grid (UTC-8 day)
    fleet = max(span_fleet_need(day.epochs, day.flows, span_s, count), int(day.flows.sum(axis=1).max()))
    starts, flows, _ = span_flows(day.epochs[morning], day.flows[morning], span_s)
    per = span_s // 30
    whole = {int(s): f for s, f in zip(starts, flows, strict=True)
             if np.count_nonzero((day.epochs[morning] - day.epochs[morning] % per) == s) == per}
    assert len(whole) >= (300 // per) - 1 and max(int(f.max()) for f in whole.values()) > fleet // 4
    spans = run_spans(day, span_s, fleet, count, morning)
    for start, truth in whole.items():
        total = np.zeros(day.stations.size, dtype=np.int64)
        for got in spans:
            sets = got[start]
            assert sets.n_vehicles in {fleet_share(fleet, k, count) for k in range(count)}
            assert int(sets.sizes().max(initial=0)) <= per  # at most one station an epoch
            total += sets.yes_counts(day.stations.size)
        assert np.array_equal(total, truth), start


def test_the_targeted_repair_alone_keeps_the_spans_exact(day: TrafficDay, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no random swap rounds every conflict goes through the last step (a partner among all
    that fit): the spans are still exact."""
    monkeypatch.setattr(SpanFleet, "REPAIR_ROUNDS", 0)
    morning = slice(14 * 120, 14 * 120 + 40)
    fleet = span_fleet_need(day.epochs, day.flows, 600)
    starts, flows, _ = span_flows(day.epochs[morning], day.flows[morning], 600)
    got = run_spans(day, 600, fleet, 1, morning)[0]
    checked = 0
    for s, f in zip(starts, flows, strict=True):
        if int(s) in got:
            assert np.array_equal(got[int(s)].yes_counts(day.stations.size), f)
            checked += 1
    assert checked >= 1


def test_a_fleet_smaller_than_a_span_flow_is_refused_with_the_sizes() -> None:
    sf = SpanFleet(1, 90, 5, 3, station_ids=np.array([401, 402, 403]))
    sf.step(30, np.array([1, 4, 0, 0]))
    with pytest.raises(FleetTooSmall, match=r"span of 90 s from epoch 30: station 401 has 6 passages by epoch 31 "
                                            r"but producer 0 has 5 vehicles"):
        sf.step(31, np.array([3, 2, 0, 0]))  # station 401: 6 passages of 5 vehicles


def test_a_span_is_whole_only_from_its_first_epoch_to_its_last() -> None:
    sf = SpanFleet(1, 90, 4, 2)
    sf.step(31, np.array([4, 0, 0]))  # the span began at epoch 30: not replayed
    sf.step(32, np.array([4, 0, 0]))
    assert sf.start == 30 and not sf.complete
    for e in (33, 34, 35):
        sf.step(e, np.array([2, 1, 1]))
    assert sf.start == 33 and sf.complete
    assert np.array_equal(sf.flows(), [3, 3])
    sf.step(36, np.array([4, 0, 0]))
    sf.step(38, np.array([4, 0, 0]))  # 37 skipped
    assert not sf.complete
    with pytest.raises(ValueError, match="summing to the producer's 4"):
        sf.step(39, np.array([1, 1, 1]))
    with pytest.raises(ValueError, match="placed twice"):
        sf.step(38, np.array([4, 0, 0]))


def test_passages_are_seeded_and_drawn_again_every_span() -> None:
    """The same seed gives the same span; the rows' order is re-drawn per span, so the vehicle
    at one position carries no identity from span to span: a vehicle that passes a station in
    every epoch of the day is at a different position in (almost) every span."""
    def spans(seed: int) -> list[StationSets]:
        sf = SpanFleet(seed, 60, 50, 2)
        out = []
        for e in range(40):
            sf.step(e, np.array([48, 1, 1]))  # two vehicles a epoch
            if sf.complete:
                out.append(sf.passages())
        return out

    a, b = spans(3), spans(3)
    assert all(np.array_equal(x.vehicle, y.vehicle) and np.array_equal(x.station, y.station)
               for x, y in zip(a, b, strict=True))
    assert len(a) == 20 and len({tuple(x.vehicle.tolist()) for x in a}) > 15


# ---------------------------------------------------------------------------------------
# the cap: a uniformly random P of a larger set, and exactly the dropped passages
# ---------------------------------------------------------------------------------------
def test_cap_drops_exactly_what_the_cap_implies_and_keeps_a_subset() -> None:
    rng = np.random.default_rng(2)
    n, v, cap = 3000, 40, 5
    sizes = rng.integers(0, 13, size=n)
    vehicle = np.repeat(np.arange(n), sizes)
    station = np.concatenate([np.sort(rng.choice(v, k, replace=False)) + 1 for k in sizes])
    sets = StationSets(n, vehicle, station)
    capped, dropped = cap_passages(sets, cap, np.random.default_rng(3))
    assert dropped == int(np.maximum(sizes - cap, 0).sum()) > 0
    assert np.array_equal(capped.sizes(), np.minimum(sizes, cap))
    def key(s: StationSets) -> set[int]:
        return set((s.vehicle * (v + 1) + s.station).tolist())

    assert key(capped) <= key(sets)
    capped.checked(v)  # still sorted, unique
    same, none = cap_passages(sets, 12, np.random.default_rng(3))
    assert none == 0 and same is sets


def test_cap_keeps_a_uniformly_random_subset() -> None:
    """A vehicle of 8 stations capped at 3 keeps each with chance 3/8, whichever its place in
    the set (a cap keeping the first 3 would keep stations 1-3 always). 20,000 vehicles: each
    station's rate within 5 sd of 3/8 (false-failure < 6e-7 each, < 5e-6 in all)."""
    n = 20_000
    sets = StationSets(n, np.repeat(np.arange(n), 8), np.tile(np.arange(1, 9), n))
    capped, dropped = cap_passages(sets, 3, np.random.default_rng(4))
    assert dropped == 5 * n
    rate = capped.yes_counts(8) / n
    assert np.all(np.abs(rate - 3 / 8) < 5 * np.sqrt(3 / 8 * 5 / 8 / n))


# ---------------------------------------------------------------------------------------
# privatize of set truths: one report per device per span, the set truth answered per station
# ---------------------------------------------------------------------------------------
def random_sets(seed: int, n: int, v: int, most: int) -> StationSets:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, most + 1, size=n)
    return StationSets(n, np.repeat(np.arange(n), sizes),
                       np.concatenate([np.sort(rng.choice(v, k, replace=False)) + 1 for k in sizes]))


@pytest.mark.parametrize("mode", ["tally", "per-vehicle"])
@pytest.mark.parametrize("mix_pairs", [True, False])
def test_privatizing_sets_answers_every_passed_station(mode: str, mix_pairs: bool) -> None:
    """Unary RR at q: each station's count of 1s has mean yes (1 - q) + (n - yes) q over the
    set truths' Yes counts (which sum to ~3.5 n here). Per station within 5 sd (false-failure
    < 6e-7 each, < 2e-5 over the 30 stations of the 4 cases). A set reduced to one station
    would lower the busiest stations' means by > 100 sd."""
    v, n, q = 30, 6000, 0.2
    query = make_query("unary", tuple(range(101, 101 + v)), params={"q": q})
    sets = random_sets(8, n, v, 6)
    er = privatize(query, sets, np.random.default_rng(9), mode, Device(1e3), mix_pairs=mix_pairs)
    assert (er.participants, er.refused) == (n, 0) and len(er.rounds) == 1
    arrays = er.rounds[0].arrays()
    if mode == "tally":
        ones = arrays["counts"].reshape(v, 2)[:, 1]
    elif "bitmap" in arrays:
        ones = np.unpackbits(arrays["bitmap"].astype(np.uint8), axis=1, count=v, bitorder="little").sum(axis=0)
    else:
        ones = np.bincount(arrays["station"] - 1, minlength=v)
    yes = sets.yes_counts(v)
    assert int(yes.sum()) > 3 * n
    mean = yes * (1 - q) + (n - yes) * q
    assert np.all(np.abs(ones - mean) < 5 * np.sqrt(n * q * (1 - q)))


def test_privatizing_sets_charges_the_ledger_once_a_span_report() -> None:
    query = make_query("unary", (1, 2, 3), span_s=300)
    ledger = E.DayLedger(2.5 * query.epsilon)
    sets = random_sets(1, 10, 3, 2)
    for _ in range(2):
        er = privatize(query, sets, np.random.default_rng(0), "tally", Device(), ledger, "2026-11-18")
        assert er.refused == 0
    er = privatize(query, sets, np.random.default_rng(0), "tally", Device(), ledger, "2026-11-18")
    assert er.refused == 10 and "daily privacy budget" in (er.refusal_reason or "")


def test_privatizing_sets_needs_a_per_sensor_query() -> None:
    query = Query(query_id="q", analyst_id="a", version=1, sensors=(1, 2), mechanism="sp", population=10,
                  t_start=T0, t_end=T0 + timedelta(hours=1))
    with pytest.raises(ValueError, match="no set truth"):
        privatize(query, random_sets(1, 4, 2, 1), np.random.default_rng(0), "tally", Device())


def test_query_sets_follow_the_querys_sensors_and_order() -> None:
    sf = SpanFleet(1, 60, 3, 4, station_ids=np.array([11, 12, 13, 14]))
    data = StationSets(3, np.array([0, 0, 1, 2, 2]), np.array([1, 4, 2, 3, 4]))
    query = make_query("unary", (14, 12, 99, 11), span_s=60)
    got = sf.query_sets(data, np.array([11, 12, 13, 14]), query)
    assert got.vehicle.tolist() == [0, 0, 1, 2] and got.station.tolist() == [1, 4, 2, 1]
    got.checked(4)


def test_span_fleet_need_is_koenigs_bound_with_room(tmp_path: Path) -> None:
    epochs = np.arange(120, 130)
    flows = np.array([[3, 1]] * 10)  # station 0: 30 passages in the 300-s span
    assert span_fleet_need(epochs, flows, 30) == 4 + 4  # the epoch total, with the least room
    assert span_fleet_need(epochs, flows, 300) == 30 + 4
    assert span_fleet_need(epochs, flows, 300, 3) == 30 + 4 + int(np.ceil(6 * np.sqrt(60)))
    assert span_fleet_need(np.zeros(0, np.int64), np.zeros((0, 2), np.int64), 300) == 0


# ---------------------------------------------------------------------------------------
# SpanTracker: only whole spans are reported; the rest is counted with the reason
# ---------------------------------------------------------------------------------------
def test_tracker_reports_only_whole_spans_and_says_why_not() -> None:
    q = make_query("unary", (11, 12), span_s=90)
    q30 = make_query("alp", (11, 12), span_s=30)
    tr = SpanTracker(seed=1, n_vehicles=5, data_stations=np.array([11, 12]))
    row = np.array([3, 1, 1])
    due = {e: tr.step(e, [q, q30], row, {12} if e == 61 else ()) for e in range(59, 66)}
    assert [(d.start, d.whole) for ds in due.values() for d in ds] == [(57, False), (60, True), (63, True)]
    assert "first epoch" in (due[59][0].reason or "")
    assert due[62][0].readings_missing == frozenset({12}) and due[65][0].readings_missing == frozenset()
    # a query active only from the middle of a span (a new version): not reported
    q2 = q.model_copy(update={"version": 2})
    tr.step(66, [q], row)
    got = [d for e in (67, 68) for d in tr.step(e, [q2], row)]
    assert [(d.query.version, d.start, d.whole) for d in got] == [(2, 66, False)]
    # the stop epoch (not run): the span stays open, to be marked interrupted
    assert tr.step(69, [q], row) == [] and tr.step(70, [q], None) == []
    assert [(oq.record_key, start) for oq, start, _ in tr.open_spans(70)] == [(q.record_key, 69)]
    assert tr.open_spans(71) == []


def test_tracker_refuses_a_span_the_fleet_cannot_hold_and_goes_on() -> None:
    q = make_query("unary", (11,), span_s=90)
    tr = SpanTracker(seed=1, n_vehicles=2, data_stations=np.array([11]), producer_index=0)
    rows = {60: [2, 0], 61: [1, 1], 62: [1, 1], 63: [0, 2], 64: [1, 1], 65: [1, 1]}
    due = [d for e, r in rows.items() for d in tr.step(e, [q], np.array(r))]
    assert [(d.start, d.whole) for d in due] == [(60, True), (63, False)]
    assert "station 11 has 3 passages by epoch 64" in (due[1].reason or "")
    with pytest.raises(ValueError, match="no whole span"):
        SpanTracker(1, 2, np.array([11])).truth(q)


def test_the_tally_of_span_flows_is_the_tally_of_the_sets(day: TrafficDay) -> None:
    """In tally mode with a cap that cannot bind, span_reports tallies the span flows without
    reading the sets: the same counts, draw for draw, as privatize over the sets; with a
    binding cap it reads them and counts the dropped passages."""
    q = make_query("unary", tuple(int(s) for s in day.stations[::-1]), span_s=300)  # another order
    q_cap = make_query("unary", tuple(int(s) for s in day.stations), span_s=300,
                       max_passages=2).model_copy(update={"query_id": "q-cap"})
    fleet = span_fleet_need(day.epochs, day.flows, 300)
    tr = SpanTracker(5, fleet, day.stations)
    first = int(np.flatnonzero(day.epochs % 10 == 0)[200])
    for i in range(first, first + 10):
        due = tr.step(int(day.epochs[i]), [q, q_cap], split_fleet(5, int(day.epochs[i]), day.flows[i], fleet, 1)[0])
    assert [d.whole for d in due] == [True, True], [d.reason for d in due]
    start = due[0].start
    assert not tr.capped(q) and tr.capped(q_cap)
    np.testing.assert_array_equal(tr.yes_counts(q), tr.truth(q).yes_counts(q.n_stations))
    dev = Device(1e3)
    fast, dropped = span_reports(q, tr, 5, 0, start, "tally", dev)
    slow = privatize(q, tr.truth(q), epoch_rng(5, q, start, 0), "tally", dev)
    assert dropped == 0
    np.testing.assert_array_equal(fast.rounds[0].arrays()["counts"], slow.rounds[0].arrays()["counts"])
    _, dropped = span_reports(q_cap, tr, 5, 0, start, "tally", dev)
    assert dropped == int(np.maximum(tr.truth(q_cap).sizes() - 2, 0).sum()) > 0


@pytest.mark.parametrize("span_s", [300, 3600])
def test_both_read_backs_of_a_span_agree(day: TrafficDay, span_s: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of up to HISTORY_EPOCHS epochs are read back from each vehicle's stations in passing
    order, longer ones from the bit per (vehicle, station): the same passages, in the same order."""
    fleet = span_fleet_need(day.epochs, day.flows, span_s)
    a = SpanFleet(9, span_s, fleet, day.stations.size)
    monkeypatch.setattr(SpanFleet, "HISTORY_EPOCHS", 0)
    b = SpanFleet(9, span_s, fleet, day.stations.size)
    per = span_s // 30
    first = int(np.flatnonzero(day.epochs % per == 0)[0]) + 14 * 120  # a span of the morning
    for i in range(first, first + per):
        e = int(day.epochs[i])
        row = split_fleet(9, e, day.flows[i], fleet, 1)[0]
        a.step(e, row)
        b.step(e, row)
    assert a.complete and b.complete
    x, y = a.passages(), b.passages()
    assert x.station.size > 0
    assert np.array_equal(x.vehicle, y.vehicle) and np.array_equal(x.station, y.station)
