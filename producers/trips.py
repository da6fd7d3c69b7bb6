"""A fleet whose vehicles keep their identity all day and drive trips along corridors. Pure,
seeded, vectorized: no I/O, no per-vehicle Python loop.

PeMS gives counts, not trajectories. :class:`TripFleet` makes up trajectories that match the
counts exactly: in every epoch ``t`` and at every station ``s``, exactly ``counts[t, s]``
distinct vehicles pass ``s`` (the truth stays the data). A cell without truth (missing, a dead
detector: not :attr:`~producers.pems.TrafficDay.has_truth`; or a negative or NaN count) is no
data, and no vehicle passes there. A vehicle passes at most one station an epoch. Each epoch:

1. **Trips continue.** The vehicles on a trip that arrive at a station (:mod:`producers.corridors`:
   the next station of the corridor, its travel time in whole epochs) pass it if its count has
   room. Where they are more than the count, those that waited longest pass, then a random
   choice; the others wait for the next epoch at the same station (the jitter of real travel
   times: ``max_wait_epochs``, default 1 -- 30 s late on a link), and past that end their trips
   there. Every arrival at a cell without data finds no room.
2. **Trips start.** The rest of each count is filled by vehicles starting a trip there, drawn
   from the idle ones (not on a trip, not resting) with chance proportional to their activity
   weight: a draw with replacement from a cumulative weight table made once, the busy ones and
   repeats rejected -- successive sampling, never a pass over the fleet (one only if the idle
   ones are too few to find by drawing, the exact fallback).
3. **Trips go on or end.** After passing a station a vehicle leaves the freeway before the next
   one with chance ``1 - exp(-miles / mean_trip_miles)`` (certainly at a corridor's end) -- by the
   off-ramp there if the corridor has one (it passes that ramp's detector last) -- else it is on
   its way to the next station.

**At most once per hour at a station.** A trip runs one way along one direction of one freeway
(from an on-ramp onto it, off it by an off-ramp), so it never comes back to a station; after a
trip ends (its vehicle left the freeway, or was turned away at a full station) the vehicle rests
at least ``min_rest_s`` (default 3,600 s) before it may start another. So two passages of one
vehicle at one station are at least ``min_rest_s`` apart, and an hour-aligned span never sees a
vehicle twice at a station.

**The model's assumptions** (docs/fleet-model.md): trip lengths in miles are exponential (a
per-mile exit hazard; ``mean_trip_miles``, default 10 -- with mainline detectors about half a
mile apart, as in urban PeMS districts and on the synthetic day, 0.63 miles, a trip would pass
~16 of them on average, a few to a few dozen, if the counts always let it go on); activity
weights are lognormal (``activity_sigma``, default 1.0: a vehicle at the 99th percentile of
weight starts trips ~10x as often as the median one while both are idle); rests are exactly
``min_rest_s``; every vehicle is idle at the grid's first epoch. None of this is in the data: a
bias measured on this fleet (a per-day cap on the passages a device names,
:class:`producers.trip_stats.DayTally`) is the model's.

**Vehicle ids** are positions inside the producer (0 .. ``n_vehicles`` - 1), for its own per-vehicle
state (a day's passages so far, a span's stations): nothing that leaves the producer -- a report,
a record, a log line, a metric -- may carry or reveal them.

>>> from producers.corridors import build_corridors
>>> from producers.pems import StationMeta
>>> meta = {s: StationMeta(s, "5", "N", abs_postmile=0.5 * s) for s in range(3)}
>>> counts = np.array([[2, 0, 0], [0, 2, 0], [1, 0, 2]])
>>> fleet = TripFleet(counts, build_corridors(np.arange(3), meta), n_vehicles=50, seed=1, mean_trip_miles=1e9)
>>> day = list(fleet)  # three epochs: two vehicles drive 0 -> 1 -> 2, a third starts at 0
>>> [ep.offsets.tolist() for ep in day]
[[0, 2, 2, 2], [0, 0, 2, 2], [0, 1, 1, 3]]
>>> [ep.started.tolist() for ep in day], fleet.trips_started
([[True, True], [False, False], [True, False, False]], 3)
>>> sorted(day[0].vehicles.tolist()) == sorted(day[2].at(2).tolist())
True
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S

from .corridors import Corridors
from .fleet import FleetTooSmall

__all__ = ["PAPERS_VEHICLES", "SYNTHETIC_3220_PASSAGES", "EpochPassages", "FleetTooSmall", "TripFleet",
           "default_fleet_size", "trip_fleet_need", "usable_counts"]

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# The source papers' fleet, and the passages of the day it is set against: the synthetic
# 3,220-station day (`ptt synth --stations 3220`, its default seed and date, read with the PeMS
# reader, cells with truth only) holds 170,222,059 passages -- 16.94 per vehicle.
PAPERS_VEHICLES = 10_047_719
SYNTHETIC_3220_PASSAGES = 170_222_059
_FREE = np.iinfo(np.int32).max  # free_at of a vehicle on a trip: not idle before it ends


def default_fleet_size(total_passages: int) -> int:
    """The papers' ratio of vehicles to a day's passages: 10,047,719 vehicles for the synthetic
    3,220-station day's 170,222,059 passages, proportionally fewer for fewer (at least one).

    >>> default_fleet_size(SYNTHETIC_3220_PASSAGES), default_fleet_size(1_000_000)
    (10047719, 59027)
    """
    return max(1, round(total_passages * PAPERS_VEHICLES / SYNTHETIC_3220_PASSAGES))


def trip_fleet_need(counts: npt.ArrayLike, corridors: Corridors, min_rest_s: int = 3600,
                    mean_trip_miles: float = 10.0, slack_epochs: int = 20) -> int:
    """About the fewest vehicles :class:`TripFleet` can drive the day of ``counts`` (``(epochs,
    stations)``) with: a trip holds its vehicle while it drives and ``min_rest_s`` after, so the
    fleet must hold the trips that start in any window of the rest (and ``slack_epochs`` of
    driving). A passage starts a trip unless it continues one from the corridor's previous
    station (the share that stays on, as the fleet draws it); that many vehicles, and a tenth
    more. Monitoring a few scattered stations of a district, nearly every passage starts a trip,
    so the papers' vehicles per passage (17 passages a vehicle a day over 3,220 stations) is too
    few for the peak hour; over dense corridors it is plenty.

    >>> from producers.corridors import build_corridors
    >>> from producers.pems import StationMeta
    >>> lone = build_corridors([1, 2], {1: StationMeta(1, "5", "N", lane_type="ML", abs_postmile=0.0),
    ...                                 2: StationMeta(2, "10", "W", lane_type="ML", abs_postmile=0.0)})
    >>> trip_fleet_need([[5, 5]] * 200, lone, min_rest_s=600)  # 40 epochs of 10 trip starts, and a tenth
    440
    """
    c = usable_counts(counts).astype(np.float64)
    arriving = np.zeros_like(c)
    has_next = corridors.next_station >= 0
    stay = np.where(has_next, np.exp(-corridors.link_miles / float(mean_trip_miles)), 0.0)
    for tt in np.unique(corridors.travel_epochs[has_next]).tolist():
        src = np.flatnonzero(has_next & (corridors.travel_epochs == tt))
        if 0 < tt < c.shape[0]:
            rows = np.arange(tt, c.shape[0])[:, None]
            np.add.at(arriving, (rows, corridors.next_station[src][None, :]), c[:-tt, src] * stay[src])
    starts = np.maximum(c - arriving, 0.0).sum(axis=1)
    window = -(-int(min_rest_s) // EPOCH_S) + int(slack_epochs)
    cum = np.concatenate([[0.0], np.cumsum(starts)])
    busiest = float((cum[window:] - cum[:-window]).max()) if starts.size > window else float(cum[-1])
    return int(math.ceil(round(busiest * 1.1, 6)))


def usable_counts(flows: npt.ArrayLike, has_truth: npt.ArrayLike | None = None) -> IntArray:
    """The counts vehicles are assigned to, ``(epochs, stations)``: ``flows`` where it is data,
    0 where it is not (no truth, negative, NaN).

    >>> usable_counts(np.array([[3.0, np.nan, -1.0]]), np.array([[True, True, True]])).tolist()
    [[3, 0, 0]]
    """
    f = np.asarray(flows)
    ok = np.isfinite(f) & (f > 0) if f.dtype.kind == "f" else f > 0
    if has_truth is not None:
        ok &= np.asarray(has_truth, dtype=bool)
    return np.where(ok, f, 0).astype(np.int64)


@dataclass(frozen=True)
class EpochPassages:
    """One epoch's passages, by station (CSR): station ``s``'s vehicles are
    ``vehicles[offsets[s]:offsets[s + 1]]`` (exactly its count); ``started[i]`` is whether passage
    ``i`` begins its vehicle's trip. ``index``: the epoch's row in the grid. Vehicle ids are the
    producer's own positions: they must not leave it."""

    index: int
    offsets: IntArray
    vehicles: IntArray
    started: BoolArray

    def stations(self) -> IntArray:
        """Each passage's station (the CSR rows spelled out)."""
        return np.repeat(np.arange(self.offsets.size - 1, dtype=np.int64), np.diff(self.offsets))

    def at(self, station: int) -> IntArray:
        """The vehicles passing ``station`` in this epoch."""
        return self.vehicles[self.offsets[station]:self.offsets[station + 1]]


class TripFleet:
    """``n_vehicles`` vehicles driving the day of ``counts`` (``(epochs, stations)``, the grid's
    order; see :func:`usable_counts`) along ``corridors``; iterate (or call :meth:`step`) for each
    epoch's :class:`EpochPassages`, in order. ``n_vehicles`` defaults to
    :func:`default_fleet_size` of the day's passages. Raises :class:`FleetTooSmall` when an
    epoch's trips to start outnumber the idle vehicles. Memory: ~12 bytes a vehicle."""

    DRAW_ROUNDS = 8  # rounds of drawing with rejection before the exact fallback

    def __init__(self, counts: npt.ArrayLike, corridors: Corridors, n_vehicles: int | None = None, *,
                 seed: int = 0, min_rest_s: int = 3600, mean_trip_miles: float = 10.0,
                 activity_sigma: float = 1.0, max_wait_epochs: int = 1) -> None:
        self.counts = usable_counts(counts)
        if self.counts.ndim != 2 or self.counts.shape[1] != corridors.n_stations:
            raise ValueError(f"counts must be (epochs, {corridors.n_stations} stations), got {self.counts.shape}")
        if min_rest_s < 0 or mean_trip_miles <= 0 or activity_sigma < 0 or max_wait_epochs < 0:
            raise ValueError("min_rest_s >= 0, mean_trip_miles > 0, activity_sigma >= 0 and max_wait_epochs >= 0")
        self.corridors = corridors
        self.n_vehicles = default_fleet_size(int(self.counts.sum())) if n_vehicles is None else int(n_vehicles)
        self.rest_epochs = -(-int(min_rest_s) // EPOCH_S)
        ends = corridors.next_station < 0
        self._exit = np.where(ends, 1.0, -np.expm1(-corridors.link_miles / float(mean_trip_miles)))
        self._rng = np.random.default_rng([seed, 0x7219])
        weights = np.random.default_rng([seed, 0xACE]).lognormal(0.0, activity_sigma, self.n_vehicles)
        self._cum = np.cumsum(weights)  # the weight table: vehicle i owns [cum[i - 1], cum[i])
        del weights
        self._free_at = np.zeros(self.n_vehicles, np.int32)  # first epoch it may start a trip
        n_epochs = self.counts.shape[0]
        self._freed = np.zeros(n_epochs + self.rest_epochs + 1, np.int64)  # vehicles idle again at epoch e
        self._busy = 0  # vehicles on a trip or resting
        self.max_wait = int(max_wait_epochs)
        # epoch -> vehicles due at a station then: (vehicles, stations, epochs waited so far)
        self._arrivals: dict[int, list[tuple[IntArray, IntArray, IntArray]]] = {}
        self._accept = 0.5  # the idle share of the weight, as the last draws found it
        self.t = 0  # the next epoch's row
        self.trips_started = 0
        self.fallbacks = 0  # epochs whose starts needed the exact fallback

    def __iter__(self) -> Iterator[EpochPassages]:
        while self.t < self.counts.shape[0]:
            yield self.step()

    def step(self) -> EpochPassages:
        """The next epoch's passages."""
        t = self.t
        if t >= self.counts.shape[0]:
            raise StopIteration("the day is over")
        self._busy -= int(self._freed[t])
        count = self.counts[t]
        cont_v, cont_s = self._arrive(t, count)
        need = count - np.bincount(cont_s, minlength=count.size)
        new_v = self._draw(int(need.sum()), t)
        new_s = np.repeat(np.arange(count.size, dtype=np.int64), need)
        veh, st = np.concatenate([cont_v, new_v]), np.concatenate([cont_s, new_s])
        started = np.r_[np.zeros(cont_v.size, bool), np.ones(new_v.size, bool)]
        order = np.argsort(st, kind="stable")
        veh, st, started = veh[order], st[order], started[order]
        self._move_on(t, veh, st)
        self.t = t + 1
        offsets = np.r_[np.int64(0), np.cumsum(count)]
        return EpochPassages(t, offsets, veh, started)

    def _arrive(self, t: int, count: IntArray) -> tuple[IntArray, IntArray]:
        """The vehicles on a trip due at ``t`` that pass their station: where they outnumber its
        count, those that waited longest, then a random choice. The others wait an epoch at the
        same station, up to ``max_wait`` epochs, then end their trips."""
        got = self._arrivals.pop(t, [])
        if not got:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        veh, st, waited = (np.concatenate([g[i] for g in got]) for i in range(3))
        key = st + (self.max_wait - waited + self._rng.random(st.size)) / (self.max_wait + 1)
        order = np.argsort(key)  # by station; within one, longest waiting first, then at random
        veh, st, waited = veh[order], st[order], waited[order]
        rank = np.arange(st.size) - np.searchsorted(st, st, side="left")
        room = rank < count[st]
        wait = ~room & (waited < self.max_wait) & (t + 1 < self.counts.shape[0])
        if wait.any():
            self._arrivals.setdefault(t + 1, []).append((veh[wait], st[wait], waited[wait] + 1))
        self._end(veh[~room & ~wait], t)
        return veh[room], st[room]

    def _end(self, veh: IntArray, t: int) -> None:
        """Trips ending at ``t``: their vehicles rest until ``t + rest_epochs``."""
        if not veh.size:
            return
        self._free_at[veh] = t + self.rest_epochs
        if self.rest_epochs:
            self._freed[t + self.rest_epochs] += veh.size
        else:  # idle at once (turned away: may start at t; left after passing: from t + 1, draws done)
            self._busy -= veh.size

    def _move_on(self, t: int, veh: IntArray, st: IntArray) -> None:
        """After passing: leave the freeway (by the corridor's off-ramp there, if it has one:
        :attr:`~producers.corridors.Corridors.exit_station`) or travel to the next station."""
        c = self.corridors
        leave = self._rng.random(st.size) < self._exit[st]
        out = leave & (c.exit_station[st] >= 0)
        self._end(veh[leave & ~out], t)
        self._schedule(t, veh[out], c.exit_station[st[out]], c.exit_epochs[st[out]])
        self._schedule(t, veh[~leave], c.next_station[st[~leave]], c.travel_epochs[st[~leave]])

    def _schedule(self, t: int, veh: IntArray, dest: IntArray, epochs: IntArray) -> None:
        """Vehicles due at ``dest`` ``epochs`` after ``t`` (after the day's last epoch: not simulated)."""
        due = t + epochs
        inside = due < self.counts.shape[0]
        veh, dest, due = veh[inside], dest[inside], due[inside]
        if not due.size:
            return
        order = np.argsort(due, kind="stable")
        veh, dest, due = veh[order], dest[order], due[order]
        cut = np.flatnonzero(np.r_[True, due[1:] != due[:-1], True])
        for a, b in zip(cut[:-1].tolist(), cut[1:].tolist(), strict=True):
            self._arrivals.setdefault(int(due[a]), []).append((veh[a:b], dest[a:b], np.zeros(b - a, np.int64)))

    def _draw(self, n: int, t: int) -> IntArray:
        """``n`` distinct idle vehicles at ``t``, drawn with chance proportional to weight
        (successive sampling), in the order drawn; they are on a trip from now on."""
        if n > self.n_vehicles - self._busy:
            raise FleetTooSmall(
                f"epoch row {t}: {n:,} trips start but only {self.n_vehicles - self._busy:,} of the "
                f"{self.n_vehicles:,} vehicles are idle ({self._busy:,} on a trip or resting {self.rest_epochs} "
                f"epochs after one); give a larger fleet")
        self._busy += n
        self.trips_started += n
        parts: list[IntArray] = []
        left = n
        for _ in range(self.DRAW_ROUNDS):
            if not left:
                break
            got = self._draw_round(left, t)
            parts.append(got)
            left -= got.size
        if left:
            parts.append(self._draw_exact(left, t))
        out = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        self._free_at[out] = _FREE
        return out

    def _draw_round(self, left: int, t: int) -> IntArray:
        """Up to ``left`` distinct idle vehicles from one batch of draws with replacement."""
        k = int(min(left / max(self._accept, 0.02) * 1.2 + 64, 8 * self.n_vehicles + 64))
        u = np.sort(self._rng.random(k))  # sorted: the binary searches walk the table in order
        idx = np.searchsorted(self._cum, u * self._cum[-1], side="right")
        np.minimum(idx, self.n_vehicles - 1, out=idx)
        self._rng.shuffle(idx)  # back to the draws' own (exchangeable) order
        idle = self._free_at[idx] <= t
        self._accept = max(float(idle.mean()), 1e-6)
        idx = idx[idle]
        _, first = np.unique(idx, return_index=True)
        got: IntArray = idx[np.sort(first)][:left].astype(np.int64)
        self._free_at[got] = _FREE  # taken: a later round rejects them
        return got

    def _draw_exact(self, left: int, t: int) -> IntArray:
        """The exact fallback: ``left`` of every idle vehicle, weighted, without replacement."""
        self.fallbacks += 1
        idle = np.flatnonzero(self._free_at <= t)
        w = self._cum[idle] - np.where(idle > 0, self._cum[np.maximum(idle - 1, 0)], 0.0)
        out: IntArray = self._rng.choice(idle, size=left, replace=False, p=w / w.sum()).astype(np.int64)
        return out
