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


def test_ramps_stand_alone_and_hov_lanes_chain_apart() -> None:
    types = ["ML", "OR", "HV", "ML", "FR", "HV", "ML"]
    meta = {j: StationMeta(j, "110", "N", lane_type=t, abs_postmile=0.5 * j) for j, t in enumerate(types)}
    ids = np.arange(len(types))
    c = build_corridors(ids, meta)
    assert c.next_station.tolist() == [3, -1, 5, 6, -1, -1, -1]
    assert corridor_key(meta[1]) is None and corridor_key(meta[2]) == ("110", "N", "HV")
    plain = build_corridors(ids, meta, ramps_alone=False)  # one chain of every lane type
    assert plain.next_station.tolist() == [1, 2, 3, 4, 5, 6, -1] and plain.n_corridors == 1


def test_travel_time_is_whole_epochs_at_the_given_speed() -> None:
    pm = [0.0, 0.1, 1.0, 3.0, 3.0]  # 0.1 mi: 6 s, rounds to 0 -> at least 1; a tie: 0 mi -> 1
    meta = {j: StationMeta(j, "5", "N", abs_postmile=p) for j, p in enumerate(pm)}
    c = build_corridors(np.arange(5), meta)
    assert c.travel_epochs.tolist() == [1, 2, 4, 1, 0]
    slow = build_corridors(np.arange(5), meta, speed_mph=np.array([30.0, 30.0, 15.0, 60.0, 60.0]))
    assert slow.travel_epochs.tolist() == [1, 4, 16, 1, 0]
    with pytest.raises(ValueError, match="speed"):
        build_corridors(np.arange(5), meta, speed_mph=0.0)


def test_the_synthetic_days_metadata_makes_long_corridors(tmp_path: Path) -> None:
    """The synthetic day's metadata (random freeway, direction and Abs_PM per station) read back
    through the reader: its mainline stations chain into (freeway, direction) corridors."""
    sd = write_synthetic_day(tmp_path, n_stations=400, seed=11)
    meta, _ = read_metadata(sd.meta_path)
    assert all(m.abs_postmile is not None for m in meta.values())
    c = build_corridors(np.array(sd.stations), meta)
    mainline = np.array([meta[s].lane_type == "ML" for s in sd.stations])
    assert c.lengths().max() > 5 and np.all(c.next_station[~mainline] == -1)
    linked = c.next_station >= 0
    assert np.all(c.corridor[c.next_station[linked]] == c.corridor[linked])
    assert np.all(c.position[c.next_station[linked]] == c.position[linked] + 1)
