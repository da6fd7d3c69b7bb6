"""Corridors (``producers.corridors``): the data's stations as chains along the freeways,
ordered by absolute postmile in the direction of travel, with travel times in whole epochs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from producers.corridors import build_corridors, corridor_key
from producers.pems import StationMeta, read_metadata
from producers.synthetic import write_synthetic_day


def chain_of(c_next: list[int], first: int) -> list[int]:
    out = [first]
    while c_next[out[-1]] >= 0:
        out.append(c_next[out[-1]])
    return out


def test_each_direction_runs_its_own_way() -> None:
    """N and E go up the postmiles, S and W down; one freeway's two directions are two corridors."""
    pm = [4.0, 1.0, 3.0, 2.0]
    meta = {}
    for j, p in enumerate(pm):
        meta[100 + j] = StationMeta(100 + j, "405", "N", lane_type="ML", abs_postmile=p)
        meta[200 + j] = StationMeta(200 + j, "405", "S", lane_type="ML", abs_postmile=p)
        meta[300 + j] = StationMeta(300 + j, "10", "E", abs_postmile=p)
        meta[400 + j] = StationMeta(400 + j, "10", "W", abs_postmile=p)
    ids = np.array(sorted(meta))
    c = build_corridors(ids, meta)
    nxt = c.next_station.tolist()
    assert c.n_corridors == 4 and c.lengths().tolist() == [4, 4, 4, 4]
    for base, up in ((0, True), (4, False), (8, True), (12, False)):
        first = base + int(np.argmin(pm) if up else np.argmax(pm))
        got = [pm[j - base] for j in chain_of(nxt, first)]
        assert got == sorted(pm, reverse=not up)
        assert c.position[first] == 0
    assert np.all(c.travel_epochs[c.next_station >= 0] == 2)  # a mile at 60 mph: 60 s
    assert np.allclose(c.link_miles[c.next_station >= 0], 1.0)


def test_stations_without_usable_metadata_are_alone() -> None:
    meta = {1: StationMeta(1, "5", "N", abs_postmile=1.0), 2: StationMeta(2, "5", "N", abs_postmile=2.0),
            3: StationMeta(3, "5", "N"),  # no postmile
            4: StationMeta(4, "", "N", abs_postmile=3.0),  # no freeway
            5: StationMeta(5, "5", "X", abs_postmile=4.0)}  # no direction of travel
    c = build_corridors(np.array([1, 2, 3, 4, 5, 6]), meta)  # 6: not in the metadata
    assert c.next_station.tolist() == [1, -1, -1, -1, -1, -1]
    assert c.n_corridors == 5 and sorted(c.lengths().tolist()) == [1, 1, 1, 1, 2]


def test_ramps_lead_onto_and_off_the_chain_and_hov_lanes_chain_apart() -> None:
    """Mainline 0 -> 3 -> 6 and HOV 2 -> 5 chain apart; the on-ramp at 0.5 leads to mainline 3
    (the first at or past it), the off-ramp at 2.0 is the way out after mainline 3 (the last
    before it). "alone": ramps linked to nothing; "in_chain": one chain of every lane type."""
    types = ["ML", "OR", "HV", "ML", "FR", "HV", "ML"]
    meta = {j: StationMeta(j, "110", "N", lane_type=t, abs_postmile=0.5 * j) for j, t in enumerate(types)}
    ids = np.arange(len(types))
    c = build_corridors(ids, meta)
    assert c.next_station.tolist() == [3, 3, 5, 6, -1, -1, -1]
    assert c.exit_station.tolist() == [-1, -1, -1, 4, -1, -1, -1] and c.exit_epochs[3] == 1
    assert c.travel_epochs[1] == 2  # on-ramp at 0.5 to mainline at 1.5: a mile
    assert corridor_key(meta[1]) is None and corridor_key(meta[2]) == ("110", "N", "HV")
    alone = build_corridors(ids, meta, ramps="alone")
    assert alone.next_station.tolist() == [3, -1, 5, 6, -1, -1, -1] and np.all(alone.exit_station == -1)
    plain = build_corridors(ids, meta, ramps="in_chain")
    assert plain.next_station.tolist() == [1, 2, 3, 4, 5, 6, -1] and plain.n_corridors == 1
    with pytest.raises(ValueError, match="ramps"):
        build_corridors(ids, meta, ramps="nowhere")  # type: ignore[arg-type]


def test_the_nearest_off_ramp_is_the_way_out_and_ramps_past_the_chain_lead_nowhere() -> None:
    types = {0: ("ML", 1.0), 1: ("FR", 1.6), 2: ("FR", 1.3), 3: ("OR", 5.0), 4: ("FR", 0.5), 5: ("ML", 2.0)}
    meta = {j: StationMeta(j, "5", "N", lane_type=t, abs_postmile=p) for j, (t, p) in types.items()}
    c = build_corridors(np.arange(6), meta)
    assert c.exit_station.tolist() == [2, -1, -1, -1, -1, -1]  # 1.3 before 1.6; the off-ramp before any mainline: none
    assert c.next_station.tolist() == [5, -1, -1, -1, -1, -1]  # the on-ramp past the last mainline station: none


def test_travel_time_is_whole_epochs_at_the_given_speed() -> None:
    pm = [0.0, 0.1, 1.0, 3.0, 3.0]  # 0.1 mi: 6 s, rounds to 0 -> at least 1; a tie: 0 mi -> 1
    meta = {j: StationMeta(j, "5", "N", abs_postmile=p) for j, p in enumerate(pm)}
    c = build_corridors(np.arange(5), meta)
    assert c.travel_epochs.tolist() == [1, 2, 4, 1, 0]
    slow = build_corridors(np.arange(5), meta, speed_mph=np.array([30.0, 30.0, 15.0, 60.0, 60.0]))
    assert slow.travel_epochs.tolist() == [1, 4, 16, 1, 0]
    with pytest.raises(ValueError, match="speed"):
        build_corridors(np.arange(5), meta, speed_mph=0.0)


@pytest.mark.slow
def test_the_synthetic_days_metadata_makes_long_corridors(tmp_path: Path) -> None:
    """The synthetic day's metadata (random freeway, direction and Abs_PM per station) read back
    through the reader: its mainline stations chain into (freeway, direction) corridors."""
    sd = write_synthetic_day(tmp_path, n_stations=400, seed=11)
    meta, _ = read_metadata(sd.meta_path)
    assert all(m.abs_postmile is not None for m in meta.values())
    c = build_corridors(np.array(sd.stations), meta)
    lane = np.array([meta[s].lane_type for s in sd.stations])
    assert c.lengths().max() > 5 and np.all(c.next_station[lane == "FR"] == -1)
    assert np.all(lane[c.next_station[lane == "OR"][c.next_station[lane == "OR"] >= 0]] == "ML")
    assert np.all(lane[c.exit_station[c.exit_station >= 0]] == "FR") and np.count_nonzero(c.exit_station >= 0) > 10
    linked = (c.next_station >= 0) & (lane == "ML")
    assert np.all(c.corridor[c.next_station[linked]] == c.corridor[linked])
    assert np.all(c.position[c.next_station[linked]] == c.position[linked] + 1)
