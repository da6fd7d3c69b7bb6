"""A day's passages per vehicle and what a per-day cap drops (``producers.trip_stats``), on
hand-made epochs and on a trip fleet's day."""

from __future__ import annotations

import numpy as np
import pytest

from producers.corridors import build_corridors
from producers.pems import StationMeta
from producers.trip_stats import DayTally, TripLengths, cap_summary, dropped_passages
from producers.trips import EpochPassages, TripFleet


def test_the_cap_drops_every_passage_past_a_vehicles_mth() -> None:
    counts = np.array([0, 0, 3, 10, 50, 200])
    d = cap_summary(counts, caps=(5, 40, 240))
    assert (d.vehicles, d.passages, d.max) == (6, 263, 200)
    assert d.mean == pytest.approx(263 / 6) and d.idle_share == pytest.approx(2 / 6)
    assert d.p50 == pytest.approx(6.5) and d.p99 == pytest.approx(np.percentile(counts, 99))
    assert d.dropped_share == {5: pytest.approx((5 + 45 + 195) / 263), 40: pytest.approx(170 / 263), 240: 0.0}
    assert dropped_passages(counts, 40) == 170
    assert d.to_json()["dropped_share"]["40"] == pytest.approx(170 / 263)
    assert cap_summary(np.zeros(0, np.int64)).passages == 0


def test_the_tally_puts_each_dropped_passage_at_its_station_and_hour() -> None:
    """One vehicle passes station 0 in four epochs an hour apart, another station 1 once: at a
    cap of 2 the third and fourth passages are dropped, in hours 2 and 3."""
    tally = DayTally(2, 2, caps=(2, 3), hours=24)
    for t in (0, 120, 240, 360):
        veh = np.array([0, 1]) if t == 0 else np.array([0])
        offsets = np.array([0, 1, 2]) if t == 0 else np.array([0, 1, 1])
        tally.add(EpochPassages(t, offsets, veh, np.ones(veh.size, bool)))
    assert tally.counts.tolist() == [4, 1]
    got = tally.dropped(2)
    assert got.shape == (2, 24) and got.sum() == 2 and got[0, 2] == 1 and got[0, 3] == 1
    assert tally.dropped(3)[0, 3] == 1 and tally.dropped(3).sum() == 1
    assert tally.summary().dropped_share[2] == pytest.approx(2 / 5)


def test_a_fleets_day_dropped_by_station_and_hour_adds_up_to_the_cap_summary() -> None:
    """On a trip fleet's day: every station-hour's dropped passages add up to sum(max(0, k - M)),
    and the trip lengths add up to the day's passages, one trip per start."""
    rng = np.random.default_rng(4)
    n_st = 12
    meta = {s: StationMeta(s, "5", "N", abs_postmile=0.5 * s) for s in range(n_st)}
    counts = rng.poisson(20, (2880, n_st))
    fleet = TripFleet(counts, build_corridors(np.arange(n_st), meta), seed=2)
    tally = DayTally(fleet.n_vehicles, n_st, caps=(5, 20, 40))
    lengths = TripLengths(fleet.n_vehicles)
    for ep in fleet:
        tally.add(ep)
        lengths.add(ep)
    for m in tally.caps:
        assert tally.dropped(m).sum() == dropped_passages(tally.counts, m) > 0
    hist = lengths.histogram()
    assert int((hist * np.arange(hist.size)).sum()) == int(counts.sum())
    assert int(hist.sum()) == fleet.trips_started and hist.size > 5
