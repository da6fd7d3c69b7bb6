"""The trip fleet (``producers.trips``): vehicles that keep their identity all day and drive
trips along corridors, matching the data's counts exactly.

One small synthetic day (30 stations with the reader's glitches: missing cells, a dead
detector) is driven once per setting and its passages kept as (epoch, station, vehicle) rows;
every property is checked on those rows, never on the fleet's own bookkeeping. Everything is
seeded: the checks are exact, not Monte Carlo. Each check is paired with the broken variant it
catches (the rest rule off, uniform activity, vehicles placed at random each epoch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from producers.corridors import Corridors, build_corridors
from producers.fleet import FleetTooSmall
from producers.pems import StationMeta, TrafficDay, read_station_raw
from producers.synthetic import write_synthetic_day
from producers.trip_stats import DayTally
from producers.trips import (
    PAPERS_VEHICLES,
    SYNTHETIC_3220_PASSAGES,
    EpochPassages,
    TripFleet,
    default_fleet_size,
    trip_fleet_need,
    usable_counts,
)

IntArray = npt.NDArray[np.int64]
HOUR = 120  # epochs


@dataclass
class Drive:
    """A whole day's passages, sorted by (vehicle, epoch), and the day's per-vehicle counts."""

    epoch: IntArray
    station: IntArray
    vehicle: IntArray
    started: npt.NDArray[np.bool_]
    per_epoch: list[EpochPassages]
    counts: npt.NDArray[np.int32]


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> TrafficDay:
    sd = write_synthetic_day(tmp_path_factory.mktemp("trip-day"), n_stations=30, seed=7)
    return read_station_raw(sd.raw_path)


@pytest.fixture(scope="module")
def corridors(day: TrafficDay) -> Corridors:
    """Two corridors of 15 stations half a mile apart: I-5 northbound, I-10 westbound."""
    meta = {int(s): StationMeta(int(s), "5" if j < 15 else "10", "N" if j < 15 else "W", lane_type="ML",
                                abs_postmile=0.5 * (j % 15)) for j, s in enumerate(day.stations)}
    return build_corridors(day.stations, meta)


def counts_of(day: TrafficDay) -> IntArray:
    return usable_counts(day.flows, day.has_truth)


def drive(fleet: TripFleet) -> Drive:
    per_epoch = list(fleet)
    tally = DayTally(fleet.n_vehicles, fleet.corridors.n_stations)
    for ep in per_epoch:
        tally.add(ep)
    e = np.concatenate([np.full(ep.vehicles.size, ep.index) for ep in per_epoch])
    s = np.concatenate([ep.stations() for ep in per_epoch])
    v = np.concatenate([ep.vehicles for ep in per_epoch])
    started = np.concatenate([ep.started for ep in per_epoch])
    order = np.lexsort((e, v))
    return Drive(e[order], s[order], v[order], started[order], per_epoch, tally.counts)


@pytest.fixture(scope="module")
def driven(day: TrafficDay, corridors: Corridors) -> Drive:
    return drive(TripFleet(counts_of(day), corridors, seed=3))


def chained(d: Drive, corridors: Corridors, max_wait: int = 1) -> npt.NDArray[np.bool_]:
    """Per passage after a vehicle's first: whether it is the next station of the corridor after
    the vehicle's previous passage, reached in the link's travel time (plus up to ``max_wait``)."""
    same = d.vehicle[1:] == d.vehicle[:-1]
    prev = d.station[:-1]
    gap = d.epoch[1:] - d.epoch[:-1]
    tt = corridors.travel_epochs[prev]
    out: npt.NDArray[np.bool_] = same & (d.station[1:] == corridors.next_station[prev]) & (gap >= tt) \
        & (gap <= tt + max_wait)
    return out


@pytest.mark.slow
def test_every_cell_holds_exactly_its_count_of_distinct_vehicles(day: TrafficDay, driven: Drive) -> None:
    """The truth stays the data: at every (epoch, station) exactly its count of vehicles, none
    where the grid has no truth (the day's missing cells and dead detector)."""
    counts = counts_of(day)
    assert int((~day.has_truth).sum()) > 100 and int(day.flows[~day.has_truth].sum()) == 0
    assert len(driven.per_epoch) == counts.shape[0]
    for ep in driven.per_epoch:
        assert np.array_equal(np.diff(ep.offsets), counts[ep.index]), ep.index
        assert ep.offsets[-1] == ep.vehicles.size == ep.started.size
    cells = np.zeros_like(counts)
    np.add.at(cells, (driven.epoch, driven.station), 1)
    assert np.array_equal(cells, counts)
    assert int(driven.counts.sum()) == int(counts.sum())


def test_a_vehicle_passes_at_most_one_station_an_epoch(driven: Drive) -> None:
    for ep in driven.per_epoch:
        assert np.unique(ep.vehicles).size == ep.vehicles.size, ep.index
    assert not np.any((driven.vehicle[1:] == driven.vehicle[:-1]) & (driven.epoch[1:] == driven.epoch[:-1]))


def repeats_within_an_hour(d: Drive) -> tuple[int, int]:
    """Pairs of passages of one vehicle at one station less than an hour apart, and hour-aligned
    spans (from the grid's first epoch) in which a vehicle passes a station twice."""
    order = np.lexsort((d.epoch, d.station, d.vehicle))
    e, s, v = d.epoch[order], d.station[order], d.vehicle[order]
    same = (v[1:] == v[:-1]) & (s[1:] == s[:-1])
    close = int(np.count_nonzero(same & (e[1:] - e[:-1] < HOUR)))
    in_span = int(np.count_nonzero(same & (e[1:] // HOUR == e[:-1] // HOUR)))
    return close, in_span


@pytest.mark.slow
def test_no_vehicle_passes_a_station_twice_within_an_hour(day: TrafficDay, corridors: Corridors,
                                                          driven: Drive) -> None:
    """A trip never comes back to a station and a vehicle rests an hour after one: two passages
    of one vehicle at one station are >= 3,600 s apart, and no hour-aligned span sees a vehicle
    twice at a station. Vehicles do come back (so the check has something to check); with the
    rest rule off (min_rest_s=0) the same check finds repeats within the hour."""
    order = np.lexsort((driven.epoch, driven.station, driven.vehicle))
    s, v = driven.station[order], driven.vehicle[order]
    assert np.count_nonzero((v[1:] == v[:-1]) & (s[1:] == s[:-1])) > 10_000  # returns, hours later
    assert repeats_within_an_hour(driven) == (0, 0)
    no_rest = drive(TripFleet(counts_of(day), corridors, seed=3, min_rest_s=0))
    close, in_span = repeats_within_an_hour(no_rest)
    assert close > 1_000 and in_span > 1_000


def test_a_trip_never_revisits_a_station(driven: Drive) -> None:
    """Within one trip (a vehicle's passages from one start to the next) the stations are distinct."""
    trip = np.cumsum(driven.started)  # rows are by vehicle then epoch, and each vehicle's first passage starts a trip
    assert driven.started[np.r_[True, driven.vehicle[1:] != driven.vehicle[:-1]]].all()
    pairs = np.unique(trip * 100 + driven.station)
    assert pairs.size == driven.station.size


def test_passages_come_in_runs_along_the_corridors(day: TrafficDay, corridors: Corridors, driven: Drive) -> None:
    """Most of a vehicle's passages follow its previous one at the corridor's next station, in
    the link's travel time: runs of ~3 stations on this day (its neighbours' counts are drawn
    independently, so a trip is often cut). Vehicles placed at random every epoch (the replay's
    split) make runs of ~1."""
    ch = chained(driven, corridors)
    runs = driven.station.size / (driven.station.size - int(ch.sum()))
    assert runs > 2.5
    # each run begins with a start: the started flags and the chain agree
    assert np.array_equal(~np.r_[False, ch], driven.started)
    rng = np.random.default_rng(0)
    counts = counts_of(day)
    n = default_fleet_size(int(counts.sum()))
    rows = [(np.full(int(c.sum()), t), np.repeat(np.arange(c.size), c), rng.choice(n, int(c.sum()), replace=False))
            for t, c in enumerate(counts)]
    e, s, v = (np.concatenate(x) for x in zip(*rows, strict=True))
    order = np.lexsort((e, v))
    placed = Drive(e[order], s[order], v[order], np.zeros(e.size, bool), [], np.zeros(0, np.int32))
    baseline = placed.station.size / (placed.station.size - int(chained(placed, corridors).sum()))
    assert baseline < 1.05


def test_some_vehicles_drive_far_more_than_others(day: TrafficDay, corridors: Corridors, driven: Drive) -> None:
    """Lognormal activity weights give a heavy tail of passages per vehicle (p99 / p50 > 3);
    uniform weights (activity_sigma=0) do not."""
    p50, p99 = np.percentile(driven.counts, [50, 99])
    assert p99 / p50 > 3.0
    flat = drive(TripFleet(counts_of(day), corridors, seed=3, activity_sigma=0.0))
    f50, f99 = np.percentile(flat.counts, [50, 99])
    assert f99 / f50 < 2.6


def test_the_same_seed_drives_the_same_day(day: TrafficDay, corridors: Corridors) -> None:
    counts = counts_of(day)[:600]
    a, b, c = (list(TripFleet(counts, corridors, n_vehicles=40_000, seed=s)) for s in (5, 5, 6))
    assert all(np.array_equal(x.vehicles, y.vehicles) and np.array_equal(x.started, y.started)
               for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x.vehicles, y.vehicles) for x, y in zip(a, c, strict=True))


def test_a_fleet_too_small_is_said(day: TrafficDay, corridors: Corridors) -> None:
    """Fewer vehicles than an epoch's passages; and enough for every epoch but not for the rests."""
    counts = counts_of(day)
    with pytest.raises(FleetTooSmall, match="give a larger fleet"):
        list(TripFleet(counts, corridors, n_vehicles=int(counts.sum(axis=1).max()) - 1))
    with pytest.raises(FleetTooSmall, match="resting 120 epochs"):
        list(TripFleet(counts, corridors, n_vehicles=3 * int(counts.sum(axis=1).max())))


def test_waiting_vehicles_arrive_late_by_at_most_max_wait(day: TrafficDay, corridors: Corridors,
                                                          driven: Drive) -> None:
    """A continuing vehicle reaches the next station in the link's travel time, or up to
    max_wait epochs later when the count had no room; with max_wait 0, exactly in it."""
    ch = chained(driven, corridors, max_wait=1)
    late = ch & ~chained(driven, corridors, max_wait=0)
    assert 0 < late.sum() < 0.5 * ch.sum()  # 43% on this day: neighbours' counts are independent draws
    assert np.array_equal(~np.r_[False, ch], driven.started)  # no continuation later than that
    strict = drive(TripFleet(counts_of(day), corridors, seed=3, max_wait_epochs=0))
    assert np.array_equal(~np.r_[False, chained(strict, corridors, max_wait=0)], strict.started)


def test_ramps_lead_onto_and_off_the_freeway() -> None:
    """An on-ramp's vehicles go on along the mainline (every on-ramp passage starts a trip); an
    off-ramp's are mostly vehicles leaving after the mainline station before it, and their trip
    ends there (the vehicle's next passage starts a new one)."""
    lanes = [("OR", 0.0, 5), ("ML", 0.5, 20), ("ML", 1.0, 20), ("FR", 1.2, 5), ("ML", 1.5, 20)]
    meta = {j: StationMeta(j, "5", "N", lane_type=t, abs_postmile=p) for j, (t, p, _) in enumerate(lanes)}
    corridors = build_corridors(np.arange(5), meta)
    counts = np.random.default_rng(1).poisson([lam for *_, lam in lanes], (600, 5))
    d = drive(TripFleet(counts, corridors, n_vehicles=30_000, seed=2, mean_trip_miles=2.0))
    assert d.started[d.station == 0].all()
    same = d.vehicle[1:] == d.vehicle[:-1]
    at_fr = np.flatnonzero(d.station[1:] == 3) + 1  # off-ramp passages that have a previous one
    came = at_fr[same[at_fr - 1] & ~d.started[at_fr]]
    assert came.size > 0.5 * np.count_nonzero(d.station == 3)
    assert np.all(d.station[came - 1] == 2) and np.all(d.epoch[came] - d.epoch[came - 1] <= 2)
    after = np.flatnonzero((d.station[:-1] == 3) & same)
    assert d.started[after + 1].all()
    from_or = np.flatnonzero((d.station[:-1] == 0) & same & ~d.started[1:])
    assert from_or.size > 0.5 * np.count_nonzero(d.station == 0) and np.all(d.station[from_or + 1] == 1)


def test_the_default_fleet_is_the_papers_ratio() -> None:
    assert default_fleet_size(SYNTHETIC_3220_PASSAGES) == PAPERS_VEHICLES
    assert default_fleet_size(SYNTHETIC_3220_PASSAGES // 10) == round(PAPERS_VEHICLES / 10)
    assert default_fleet_size(0) == 1


def test_counts_without_data_are_zero() -> None:
    got = usable_counts(np.array([[5.0, np.nan, -2.0, 7.0]]), np.array([[True, True, True, False]]))
    assert got.tolist() == [[5, 0, 0, 0]] and got.dtype == np.int64
    with pytest.raises(ValueError, match="stations"):
        TripFleet(np.zeros((2, 3)), build_corridors(np.arange(2), {}))


def test_a_few_stations_need_the_peak_hours_trips_not_the_papers_ratio(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Four stations scattered over a district (each its own corridor): a vehicle passes about one
    of them a trip, so the papers' vehicles per passage (17 passages a vehicle a day) cannot
    drive the morning peak -- every vehicle is on a trip or resting its hour -- while
    :func:`trip_fleet_need`'s fleet drives the whole day (a bound with room: a little fewer may
    do)."""
    sd = write_synthetic_day(tmp_path_factory.mktemp("few"), n_stations=4, seed=2026)
    few = read_station_raw(sd.raw_path)
    counts = counts_of(few)
    lone = build_corridors(few.stations, {int(s): StationMeta(int(s), str(j), "N", lane_type="ML", abs_postmile=0.0)
                                          for j, s in enumerate(few.stations)})
    need = trip_fleet_need(counts, lone)
    assert default_fleet_size(int(counts.sum())) < need
    with pytest.raises(FleetTooSmall):
        drive(TripFleet(counts, lone, default_fleet_size(int(counts.sum())), seed=3))
    d = drive(TripFleet(counts, lone, need, seed=3))
    assert int(d.counts.sum()) == int(counts.sum())


def test_over_dense_corridors_the_papers_ratio_is_plenty(day: TrafficDay, corridors: Corridors) -> None:
    """Two corridors of 15 stations half a mile apart: most passages continue a trip, so the
    need is far below the passages of the peak hour, and the fleet it names drives the day."""
    counts = counts_of(day)
    need = trip_fleet_need(counts, corridors)
    hour = np.convolve(counts.sum(axis=1), np.ones(HOUR + 20, np.int64), "valid").max()
    assert need < hour / 2
    assert int(drive(TripFleet(counts, corridors, need, seed=3)).counts.sum()) == int(counts.sum())
