"""Span queries answered by the fleet that drives all day, with the device's day cap
(``producers.trip_spans``), and the device's audit of a cap it cannot keep.

One small synthetic day (30 stations on two corridors) is driven by a fleet small enough that
many vehicles pass more than M stations a day. Every check is exact (seeded), and each is paired
with what it catches: a cap kept per span instead of per day changes the dropped total.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from producers.fleet import Device
from producers.pems import StationMeta, TrafficDay, epoch_start, read_station_raw
from producers.settings import ReplaySettings
from producers.synthetic import write_synthetic_day
from producers.trip_spans import ProducerTrips, TripSpans
from producers.trips import default_fleet_size
from schemas import Query

M = 3  # passages a device names a day


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> TrafficDay:
    sd = write_synthetic_day(tmp_path_factory.mktemp("trip-spans"), n_stations=30, seed=7)
    d = read_station_raw(sd.raw_path)
    d.attach_metadata({int(s): StationMeta(int(s), "5" if j < 15 else "10", "N" if j < 15 else "W", lane_type="ML",
                                           abs_postmile=0.5 * (j % 15)) for j, s in enumerate(d.stations)})
    return d


def _fleet(day: TrafficDay) -> int:
    """The papers' vehicles per passage: ~17 passages a vehicle, so a cap of 3 binds."""
    return default_fleet_size(int(np.where(day.has_truth, day.flows, 0).sum()))


def _query(day: TrafficDay, cap: int | None = M, span_s: int = 3600) -> Query:
    t0 = epoch_start(int(day.epochs[0]))
    return Query(query_id="flows", analyst_id="a", version=1, sensors=tuple(int(s) for s in day.stations),
                 mechanism="unary", params={"q": 0.1}, population=1000, span_s=span_s, max_passages_day=cap,
                 t_start=t0, t_end=t0 + timedelta(days=1))


def _run(day: TrafficDay, index: int, count: int, q: Query, epochs: int) -> tuple[ProducerTrips, list[int], int,
                                                                                   np.ndarray]:
    """Producer ``index`` of ``count`` through ``epochs`` epochs: its trips, each span's kept
    passages, the dropped total and the kept Yes counts plus the dropped, per station, summed."""
    trips = ProducerTrips(day, 0, _fleet(day), seed=5, index=index, count=count)
    share = trips.passages.size
    spans = TripSpans(trips, 5, q.span_s, share, day.stations.size, index)
    kept, dropped, truth = [], 0, np.zeros(day.stations.size, np.int64)
    for e in day.epochs[:epochs]:
        spans.step(int(e))
        if spans.complete and int(e) == spans.start + spans.epochs_per_span - 1:
            flows = spans.flows()
            sets, d = spans.query_sets_capped(q, day.stations, "2026-11-18")
            sets.checked(q.n_stations)  # sorted, unique, in range (else ValueError)
            assert sets.n_vehicles == share
            kept.append(int(sets.station.size))
            dropped += d
            truth += sets.yes_counts(q.n_stations) + spans.last_dropped[q.query_id]
            assert np.array_equal(sets.yes_counts(q.n_stations) + spans.last_dropped[q.query_id], flows)
    return trips, kept, dropped, truth


@pytest.mark.slow
def test_a_device_names_at_most_m_passages_a_day_and_the_rest_is_counted(day: TrafficDay) -> None:
    q = _query(day)
    trips, kept, dropped, truth = _run(day, 0, 1, q, day.epochs.size)
    per_vehicle = trips.passages.astype(np.int64)
    assert per_vehicle.max() > 3 * M, "the fleet must drive enough for the cap to bind"
    assert sum(kept) + dropped == int(per_vehicle.sum())  # every passage is either named or dropped
    assert dropped == int(np.maximum(per_vehicle - M, 0).sum())  # exactly what past M is (fails per span)
    assert sum(kept) == int(np.minimum(per_vehicle, M).sum())
    usable = np.where(day.has_truth, day.flows, 0)
    assert np.array_equal(truth, usable.sum(axis=0))  # the spans' truths are the data, named or dropped


def test_producers_share_the_day_and_each_caps_its_own(day: TrafficDay) -> None:
    q = _query(day)
    epochs = 4 * 120
    runs = [_run(day, i, 2, q, epochs) for i in range(2)]
    usable = np.where(day.has_truth, day.flows, 0)[:epochs]
    assert np.array_equal(runs[0][3] + runs[1][3], usable.sum(axis=0))
    for trips, _, dropped, _ in runs:
        assert dropped == int(np.maximum(trips.passages.astype(np.int64) - M, 0).sum())


def test_a_new_day_starts_every_count_from_zero(day: TrafficDay) -> None:
    q = _query(day, cap=1, span_s=300)
    trips = ProducerTrips(day, 0, _fleet(day), seed=5)
    spans = TripSpans(trips, 5, 300, trips.passages.size, day.stations.size)
    names = []
    for e in day.epochs[480:500]:  # two 5-minute spans of the day's busy hours
        spans.step(int(e))
    for when in ("2026-11-18", "2026-11-19"):
        sets, _ = spans.query_sets_capped(q, day.stations, when)
        names.append(int(sets.station.size))
    assert names[1] >= names[0] > 0  # the second day's count starts again


def test_a_device_refuses_a_day_cap_it_cannot_keep(day: TrafficDay) -> None:
    capped = _query(day)
    assert Device(day_caps=True).accepts(capped) == (True, None)
    ok, why = Device().accepts(capped)  # no day's identity (the span model)
    assert not ok and "--fleet-model trips" in str(why)
    assert not Device(day_caps=True).accepts(_query(day, span_s=30))[0]  # a 30-s query's cap is not kept yet
    assert Device().accepts(_query(day, cap=None)) == (True, None)


def test_a_replay_asked_for_a_day_cap_it_cannot_keep_says_how() -> None:
    with pytest.raises(ValueError, match="--fleet-model trips"):
        ReplaySettings(query_mechanisms="unary@3600//40")
    with pytest.raises(ValueError, match="span queries only"):
        ReplaySettings(query_mechanisms="unary@30//40", fleet_model="trips")
    assert ReplaySettings(query_mechanisms="alp,unary@3600//40", fleet_model="trips").fleet_model == "trips"


def test_the_replay_counts_a_day_caps_drops_per_station_and_span(day: TrafficDay) -> None:
    """The replay's span step (``producers.replay.counted_span_reports``) keeps the day cap's drops per
    span and station id: over a whole day they add up to exactly what past M is. Drops kept by
    station index, not id, or only the last span's, fail."""
    from producers.fleet import split_fleet
    from producers.replay import ReplaySummary, counted_span_reports
    from producers.spans import SpanTracker

    q = _query(day)
    fleet = _fleet(day)
    trips = ProducerTrips(day, 0, fleet, seed=5)
    spans = SpanTracker(5, fleet, day.stations, 0, trips)
    summary, settings = ReplaySummary(), ReplaySettings(seed=5, mode="tally", fleet_model="trips")
    for i, e in enumerate(day.epochs):
        for due in spans.step(int(e), [q], split_fleet(5, int(e), day.flows[i], fleet, 1)[0]):
            assert due.whole
            counted_span_reports(q, spans, settings, 0, due.start, Device(day_caps=True), None, True, summary)
    drops = summary.day_cap_drops["flows"]
    assert len(drops) > 3 and all(set(st) <= set(q.sensors) for st in drops.values())
    total = sum(n for st in drops.values() for n in st.values())
    assert total == summary.passages_dropped["flows"] == int(np.maximum(trips.passages.astype(np.int64) - M, 0).sum())
    assert summary.spans_sent["flows"] == 24
