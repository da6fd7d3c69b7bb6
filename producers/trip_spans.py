"""Span queries answered by a fleet that drives all day (:mod:`producers.trips`), with the
device's day cap. Pure, seeded.

With ``--fleet-model trips`` a replay's vehicles keep their identity through the whole day:
:class:`ProducerTrips` steps one :class:`producers.trips.TripFleet` over the replayed epochs'
counts (every producer the same model, seeded alike; producer ``i`` of ``k`` owns the vehicles
whose id is ``i`` modulo ``k``), and :class:`TripSpans` reads a span's passages from it where
:class:`producers.spans.SpanFleet` would place them at random. A vehicle passes a station at most
once an hour in that model, so an hour's (or shorter) span flow is still the sum of the data's
30-s counts.

**The day cap on the device** (``Query.max_passages_day`` = M, :func:`cap_day`): each device
counts the passages it has named for the query today (UTC); a span's passages are named in the
order they happened while that count is below M, and past M its reports name no station -- they
are still sent and randomized, so sending reveals nothing. What the cap dropped is a diagnostic
of the simulation, per station and span (:attr:`TripSpans.last_dropped`), never published.
Vehicle ids stay here: a span's sets leave in a fresh random order (:func:`shuffled_rows`).

>>> sets = StationSets(3, np.array([0, 0, 0, 2]), np.array([1, 2, 3, 2]))
>>> named = np.array([1, 0, 0], dtype=np.int32)
>>> kept, dropped = cap_day(sets, np.array([5, 3, 4, 3]), 2, named)  # vehicle 0 passed 2, then 3, then 1
>>> kept.vehicle.tolist(), kept.station.tolist(), dropped.tolist(), named.tolist()
([0, 2], [2, 2], [1, 0, 1], [2, 0, 1])
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from estimators.per_station import StationSets
from schemas import Query
from schemas.epochs import EPOCH_S

from .corridors import build_corridors
from .pems import TrafficDay
from .trips import TripFleet

__all__ = ["ProducerTrips", "TripSpans", "cap_day", "query_lookup", "shuffled_rows"]

IntArray = npt.NDArray[np.int64]


def cap_day(sets: StationSets, when: IntArray, cap: int, named: npt.NDArray[np.int32]) -> tuple[StationSets,
                                                                                                   IntArray]:
    """Each vehicle's pairs of ``sets`` (``when[i]``: the epoch of pair ``i``) named in the order
    they happened while its day's ``named`` count is below ``cap``; ``named`` is updated in place.
    Returns the kept sets and the dropped passages per station ``(V,)`` (V = the largest station)."""
    veh, st = sets.vehicle, sets.station
    order = np.lexsort((when, veh))  # by vehicle, then by time
    first = np.searchsorted(veh[order], veh[order], side="left")
    rank = np.empty(veh.size, dtype=np.int64)
    rank[order] = np.arange(veh.size) - first
    keep = named[veh].astype(np.int64) + rank < cap
    named += np.bincount(veh[keep], minlength=named.size).astype(np.int32)
    dropped = np.bincount(st[~keep] - 1, minlength=int(st.max(initial=0))).astype(np.int64)
    return StationSets(sets.n_vehicles, veh[keep], st[keep]), dropped


def query_lookup(data_stations: IntArray, query: Query) -> IntArray:
    """Data station index (1..V of the data; 0: none) -> the query's station index (1..V of the
    query; 0: a station the query does not monitor).

    >>> from types import SimpleNamespace
    >>> query_lookup(np.array([11, 12, 13]), SimpleNamespace(sensors=(13, 11))).tolist()  # type: ignore[arg-type]
    [0, 2, 0, 1]
    """
    lookup = np.zeros(len(data_stations) + 1, dtype=np.int64)
    position = {int(s): j for j, s in enumerate(data_stations)}
    for i, sensor in enumerate(query.sensors):
        j = position.get(sensor)
        if j is not None:
            lookup[j + 1] = i + 1
    return lookup


def _cat(parts: list[IntArray]) -> IntArray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def shuffled_rows(sets: StationSets, rng: np.random.Generator) -> StationSets:
    """The same sets with the vehicles renumbered by a random permutation (and sorted again), so no
    position links a vehicle's spans."""
    perm = rng.permutation(sets.n_vehicles)
    veh = perm[sets.vehicle]
    order = np.lexsort((sets.station, veh))
    return StationSets(sets.n_vehicles, veh[order], sets.station[order])


class ProducerTrips:
    """One producer's vehicles of the day's trip fleet: :meth:`at` gives, for each replayed epoch in
    order, this producer's vehicles (its own ids 0 .. share - 1) and their data stations (1..V).
    ``day``'s flows from ``start`` (its row of the first replayed epoch) are the counts."""

    def __init__(self, day: TrafficDay, start: int, fleet_size: int, seed: int, index: int = 0,
                 count: int = 1) -> None:
        counts = np.where(day.has_truth[start:], day.flows[start:], 0)
        self.fleet = TripFleet(counts, build_corridors(day.stations, day.meta), fleet_size, seed=seed)
        self.first = int(day.epochs[start]) if day.epochs.size > start else 0
        self.index, self.count = index, count
        self.passages = np.zeros(-(-(fleet_size - index) // count), dtype=np.int32)  # this producer's, today
        self._last: tuple[int, IntArray, IntArray] | None = None

    def at(self, epoch: int) -> tuple[IntArray, IntArray]:
        """This producer's vehicles passing a station at ``epoch`` and their stations (1..V)."""
        if self._last is not None and self._last[0] == epoch:
            return self._last[1], self._last[2]
        if epoch < self.first + self.fleet.t:
            raise ValueError(f"epoch {epoch} was stepped already (the fleet is at {self.first + self.fleet.t})")
        ep = self.fleet.step()
        while self.first + self.fleet.t <= epoch:
            ep = self.fleet.step()
        mine = ep.vehicles % self.count == self.index
        veh, st = ep.vehicles[mine] // self.count, ep.stations()[mine] + 1
        np.add.at(self.passages, veh, 1)
        self._last = (epoch, veh, st)
        return veh, st


class TripSpans:
    """The spans of ``span_s`` read from :class:`ProducerTrips` (the interface of
    :class:`producers.spans.SpanFleet`: :meth:`step`, :attr:`complete`, :meth:`flows`,
    :meth:`most_passages`), and a query's capped sets at a span's end (:meth:`query_sets_capped`)."""

    def __init__(self, trips: ProducerTrips, seed: int, span_s: int, n_vehicles: int, n_stations: int,
                 producer_index: int = 0) -> None:
        self.trips, self.seed, self.span_s, self.producer_index = trips, seed, span_s, producer_index
        self.n, self.v = n_vehicles, n_stations
        self.epochs_per_span = span_s // EPOCH_S
        self.start: int | None = None
        self.stepped, self._gap, self._last = 0, False, -1
        self._veh: list[IntArray] = []
        self._st: list[IntArray] = []
        self._when: list[IntArray] = []
        self._named: dict[str, tuple[str, npt.NDArray[np.int32]]] = {}  # query version -> (UTC day, named)
        self.last_dropped: dict[str, IntArray] = {}  # query id -> the day cap's drops per station, last span

    @property
    def complete(self) -> bool:
        return self.start is not None and not self._gap and self.stepped == self.epochs_per_span

    def step(self, epoch: int, row: IntArray | None = None) -> None:
        """Read ``epoch``'s passages (``row``, the 30-s split, is not used: the trips place them)."""
        start = epoch - epoch % self.epochs_per_span
        if start != self.start:
            self._veh, self._st, self._when = [], [], []
            self.start, self.stepped, self._gap = start, 0, epoch != start
        elif epoch != start + self.stepped:
            self._gap = True
        self.stepped += 1
        self._last = epoch
        veh, st = self.trips.at(epoch)
        self._veh.append(veh)
        self._st.append(st)
        self._when.append(np.full(veh.size, epoch, dtype=np.int64))

    def _pairs(self) -> tuple[IntArray, IntArray, IntArray]:
        return _cat(self._veh), _cat(self._st), _cat(self._when)

    def flows(self) -> IntArray:
        return np.bincount(self._pairs()[1] - 1, minlength=self.v).astype(np.int64)

    def most_passages(self) -> int:
        return int(np.bincount(self._pairs()[0], minlength=1).max(initial=0))

    def query_sets_capped(self, query: Query, data_stations: IntArray, day: str) -> tuple[StationSets, int]:
        """``query``'s set truths of the span that just ended (its sensors, its order), each device's
        passages past the query's day cap dropped (:func:`cap_day`), rows in a fresh random order;
        with the passages the day cap dropped (per station: :attr:`last_dropped`)."""
        veh, st, when = self._pairs()
        qs = query_lookup(data_stations, query)[st]
        keep = qs > 0
        veh, qs, when = veh[keep], qs[keep], when[keep]
        order = np.lexsort((qs, veh))
        sets = StationSets(self.n, veh[order], qs[order])
        dropped_total = 0
        if query.max_passages_day is not None:
            was_day, named = self._named.get(query.record_key, ("", np.zeros(0, np.int32)))
            if was_day != day:
                named = np.zeros(self.n, dtype=np.int32)
            self._named[query.record_key] = (day, named)
            sets, dropped = cap_day(sets, when[order], query.max_passages_day, named)
            self.last_dropped[query.query_id] = np.pad(dropped, (0, max(0, query.n_stations - dropped.size)))
            dropped_total = int(dropped.sum())
        rng = np.random.default_rng([self.seed, self.span_s, self.start or 0, self.producer_index, 0x7D5])
        return shuffled_rows(sets, rng), dropped_total
