"""Corridors: the data's stations as chains along the freeways, for the trip model
(:mod:`producers.trips`). Pure: arrays and metadata in, arrays out; no I/O.

A corridor is one direction of one freeway: the stations with the same ``freeway`` and
``direction`` (:class:`~producers.pems.StationMeta`), ordered by absolute postmile
(``abs_postmile``, the metadata's ``Abs_PM``) in the direction of travel -- increasing for N and
E, decreasing for S and W. A vehicle on a corridor passes its stations in that order, so a trip
along one never comes back to a station.

Two refinements of that grouping (the default, ``ramps="attached"``):

- ramp detectors (lane type ``OR``, on-ramp, and ``FR``, off-ramp: :data:`RAMP_TYPES`) count only
  the vehicles entering or leaving the freeway there, not the through traffic, so they are not
  links of the chain. An on-ramp leads onto it: its vehicles go on to the first chain station at
  or past its postmile (``next_station``). An off-ramp leads off it: a vehicle that leaves the
  freeway after the last chain station before the off-ramp passes the off-ramp on its way out
  (``exit_station``), and its trip ends there;
- HOV-lane detectors (``HV``) form their own chain beside the mixed-flow one (``ML`` and any
  other type): a vehicle in the HOV lane passes the HOV detectors, not the mainline ones at the
  same postmile. Ramps attach to the mixed-flow chain.

``ramps="alone"``: each ramp is a corridor of its own, linked to nothing (a passage there is a
one-station trip). ``ramps="in_chain"``: every station of a (freeway, direction) is one chain,
whatever its lane type (the plain grouping). A station without metadata, without a freeway,
with a direction other than N/S/E/W or without an absolute postmile is a single-station
corridor.

Travel time of a link: its postmile distance at ``speed_mph`` (the data's speed where the caller
has it, per station; else :data:`DEFAULT_SPEED_MPH`), in whole epochs, at least one.

>>> from producers.pems import StationMeta
>>> meta = {10: StationMeta(10, "5", "S", abs_postmile=3.0), 11: StationMeta(11, "5", "S", abs_postmile=2.5),
...         12: StationMeta(12, "5", "S", abs_postmile=1.0), 13: StationMeta(13, "5", "N", abs_postmile=1.0)}
>>> c = build_corridors(np.array([10, 11, 12, 13, 14]), meta)
>>> c.next_station.tolist(), c.travel_epochs.tolist(), c.n_corridors
([1, 2, -1, -1, -1], [1, 3, 0, 0, 0], 3)
>>> meta |= {20: StationMeta(20, "5", "S", lane_type="OR", abs_postmile=2.8),
...          21: StationMeta(21, "5", "S", lane_type="FR", abs_postmile=2.0)}
>>> c = build_corridors(np.array([10, 11, 12, 20, 21]), meta)
>>> c.next_station.tolist(), c.exit_station.tolist()
([1, 2, -1, 1, -1], [-1, 4, -1, -1, -1])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S

from .pems.model import StationMeta

__all__ = ["DEFAULT_SPEED_MPH", "RAMP_TYPES", "Corridors", "Ramps", "build_corridors", "corridor_key"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DEFAULT_SPEED_MPH = 60.0  # free-flow-ish freeway speed where the data gives none
RAMP_TYPES = frozenset({"OR", "FR"})  # PeMS lane types of on- and off-ramp detectors
Ramps = Literal["attached", "alone", "in_chain"]
_FORWARD = {"N": 1.0, "E": 1.0, "S": -1.0, "W": -1.0}  # postmile's sign in the direction of travel


@dataclass(frozen=True)
class Corridors:
    """The chains, as arrays over the data's stations (their column order in the grid).

    ``next_station[s]``: the station a vehicle passes after ``s`` if it stays on the freeway,
    -1 at a corridor's end (and after an off-ramp); ``link_miles[s]``: the postmile distance to
    it (0 where none); ``travel_epochs[s]``: whole epochs to it (at least 1; 0 where none);
    ``exit_station[s]``: the off-ramp a vehicle leaving the freeway after ``s`` passes on its way
    out (-1: none, it leaves unseen), ``exit_epochs[s]`` the epochs to it; ``corridor[s]``: the
    chain's number (a ramp is a chain of its own, linked to its freeway's by ``next_station``
    and ``exit_station``); ``position[s]``: ``s``'s place in its chain (0: first).
    """

    next_station: IntArray
    link_miles: FloatArray
    travel_epochs: IntArray
    exit_station: IntArray
    exit_epochs: IntArray
    corridor: IntArray
    position: IntArray

    @property
    def n_stations(self) -> int:
        return int(self.next_station.size)

    @property
    def n_corridors(self) -> int:
        return int(self.corridor.max()) + 1 if self.corridor.size else 0

    def lengths(self) -> IntArray:
        """Stations per corridor."""
        return np.bincount(self.corridor, minlength=self.n_corridors).astype(np.int64)


def corridor_key(meta: StationMeta | None, ramps: Ramps = "attached") -> tuple[str, str, str] | None:
    """The chain a station belongs to -- (freeway, direction, lane class) -- or None when it is a
    corridor of its own: no usable metadata, or a ramp (unless ``ramps="in_chain"``).

    >>> corridor_key(StationMeta(1, "405", "N", lane_type="HV", abs_postmile=3.2))
    ('405', 'N', 'HV')
    >>> corridor_key(StationMeta(1, "405", "N", lane_type="OR", abs_postmile=3.2)) is None
    True
    """
    if meta is None or not meta.freeway or meta.abs_postmile is None or not np.isfinite(meta.abs_postmile):
        return None
    direction = meta.direction.strip().upper()
    if direction not in _FORWARD:
        return None
    lane = meta.lane_type.strip().upper()
    if ramps == "in_chain":
        return meta.freeway, direction, ""
    if lane in RAMP_TYPES:
        return None
    return meta.freeway, direction, "HV" if lane == "HV" else ""


def _epochs(miles: FloatArray, speed: FloatArray) -> IntArray:
    """Whole epochs to drive ``miles`` at ``speed`` mph, at least one."""
    return np.maximum(1, np.rint(miles / speed * 3600.0 / EPOCH_S)).astype(np.int64)


def build_corridors(stations: npt.ArrayLike, meta: Mapping[int, StationMeta],
                    speed_mph: float | npt.ArrayLike = DEFAULT_SPEED_MPH, ramps: Ramps = "attached") -> Corridors:
    """The corridors of the data's ``stations`` (station ids, in the grid's column order) from
    their metadata; ``speed_mph`` a number or one per station (the speed from a station to the
    next is the first one's). Ties in postmile are ordered by station id. ``ramps``: "attached"
    (on-ramps lead onto their freeway's chain, off-ramps lead off it), "alone" (each ramp a
    corridor of its own, linked to nothing) or "in_chain" (links of the chain like any station)."""
    if ramps not in ("attached", "alone", "in_chain"):
        raise ValueError(f"ramps must be 'attached', 'alone' or 'in_chain', got {ramps!r}")
    ids = np.asarray(stations, dtype=np.int64)
    n = ids.size
    speed = np.broadcast_to(np.asarray(speed_mph, dtype=np.float64), (n,))
    if n and not (np.all(np.isfinite(speed)) and np.all(speed > 0)):
        raise ValueError("speed_mph must be positive and finite")
    keys: dict[tuple[str, str, str], int] = {}
    group = np.empty(n, np.int64)
    signed_pm = np.zeros(n, np.float64)
    ramp_of: dict[int, tuple[str, str, str]] = {}  # ramps to attach: station index -> its freeway's chain key
    for j, sid in enumerate(ids.tolist()):
        m = meta.get(sid)
        key = corridor_key(m, ramps)
        group[j] = -1 - j  # a corridor of its own, unless keyed: a group no other station shares
        if m is not None and m.abs_postmile is not None:
            signed_pm[j] = _FORWARD.get(m.direction.strip().upper(), 0.0) * m.abs_postmile
        if key is not None:
            group[j] = keys.setdefault(key, len(keys))
        elif ramps == "attached" and (ramp := corridor_key(m, "in_chain")) is not None:
            ramp_of[j] = ramp
    c = _chains(ids, group, signed_pm, speed)
    for j, key in ramp_of.items():
        if key in keys:
            _attach(c, j, np.flatnonzero(group == keys[key]), signed_pm, speed, meta[int(ids[j])].lane_type)
    return c


def _chains(ids: IntArray, group: IntArray, signed_pm: FloatArray, speed: FloatArray) -> Corridors:
    """Each group of stations a chain along the direction of travel."""
    n = ids.size
    order = np.lexsort((ids, signed_pm, group))  # by corridor, then along the direction of travel
    g = group[order]
    new = np.r_[True, g[1:] != g[:-1]] if n else np.zeros(0, bool)
    corridor = np.empty(n, np.int64)
    corridor[order] = np.cumsum(new) - 1
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0)) if n else np.zeros(0, np.int64)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n) - first
    linked = np.r_[~new[1:], False] if n else np.zeros(0, bool)  # order[i] -> order[i + 1] in one corridor
    next_station = np.full(n, -1, np.int64)
    link_miles = np.zeros(n, np.float64)
    travel = np.zeros(n, np.int64)
    src, dst = order[:-1][linked[:-1]], order[1:][linked[:-1]]
    next_station[src] = dst
    link_miles[src] = np.abs(signed_pm[dst] - signed_pm[src])
    travel[src] = _epochs(link_miles[src], speed[src])
    return Corridors(next_station, link_miles, travel, np.full(n, -1, np.int64), np.zeros(n, np.int64),
                     corridor, position)


def _attach(c: Corridors, j: int, chain: IntArray, signed_pm: FloatArray, speed: FloatArray, lane: str) -> None:
    """Ramp ``j`` onto its freeway's ``chain`` (in place): an on-ramp leads to the first chain
    station at or past it; an off-ramp is the way out for vehicles leaving after the last chain
    station before it (the nearest off-ramp wins when several follow one station)."""
    chain = chain[np.lexsort((chain, signed_pm[chain]))]
    pm = signed_pm[chain]
    if lane.strip().upper() == "OR":
        k = int(np.searchsorted(pm, signed_pm[j], side="left"))
        if k < chain.size:
            c.next_station[j] = chain[k]
            c.link_miles[j] = pm[k] - signed_pm[j]
            c.travel_epochs[j] = _epochs(c.link_miles[j:j + 1], speed[j:j + 1])[0]
        return
    k = int(np.searchsorted(pm, signed_pm[j], side="left")) - 1
    if k < 0:
        return
    s = chain[k]
    if c.exit_station[s] < 0 or signed_pm[j] < signed_pm[c.exit_station[s]]:
        c.exit_station[s] = j
        c.exit_epochs[s] = _epochs(np.array([signed_pm[j] - pm[k]]), speed[s:s + 1])[0]
