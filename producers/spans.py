"""The fleet through spans: vehicles that keep their identity through a span. Pure, seeded.

A query with ``span_s`` > 30 asks each device for one report per span naming the
stations it passed in it. Then a vehicle must keep its identity through the span:
:class:`SpanFleet` holds one producer's vehicles through the spans of one length. In each epoch
a vehicle is at one station or none (the epoch's split row, :func:`producers.fleet.split_fleet`, as
for 30-s queries), and it passes a station at most once per span, so a station's true span flow -- the
distinct vehicles passing it in the span -- is exactly the sum of the data's 30-s counts over the
span (what PeMS's 5-minute flows are, and what the span's ground truth is). Such an assignment
is a proper edge colouring of the bipartite multigraph epochs x stations (``flows[e, s]`` edges)
with the fleet's vehicles as colours; by König's edge-colouring theorem one exists iff the fleet
holds at least ``max(max_e T_e, max_s F_s)`` (``T_e``: an epoch's vehicles at stations,
``F_s``: a station's span flow). :class:`SpanFleet` builds it epoch by epoch (a seeded random
placement, conflicts repaired by swaps), which needs a little more than that bound;
:func:`span_fleet_need` sizes the fleet with that slack and a margin for the random split over
producers, and :class:`FleetTooSmall` names the span, station and sizes when it cannot.
At a span's end its rows are re-ordered at random (:meth:`SpanFleet.passages`): device ``j`` of a
span is a random vehicle, so nothing that leaves the module links a vehicle's spans.

**The cap and its bias.** A query's ``passages`` (P, ``max_passages``) caps the stations one
report names: a vehicle that passed more of the query's stations reports a uniformly random P
of them (:func:`cap_passages`). The dropped passages are missing from the truth the devices
privatize, so a station's estimated span flow is biased low by the dropped passages of that
station: E[estimate] = F_s - D_s, where D_s = sum over the vehicles with k > P passages that
passed s of (k - P) / k in expectation. The overall bias is exactly the dropped count
:func:`cap_passages` returns (sum over vehicles of max(0, k - P)); a replay can measure it per
station by comparing :meth:`~estimators.per_station.StationSets.yes_counts` before and after the
cap, or against the ground truth (the sum of the 30-s truth over the span). At the default P
(one per epoch of the span) nothing is ever dropped: a vehicle passes at most one station an
epoch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from estimators import DayLedger
from estimators.ledger import ShuffledDayLedger
from estimators.per_station import StationSets, YesCounts
from producers.fleet import query_truth_counts
from schemas import Query
from schemas.epochs import EPOCH_S

from .fleet import Device, EpochReports, FleetTooSmall, epoch_rng, privatize
from .pems import epoch_start
from .trip_spans import ProducerTrips, TripSpans, query_lookup

__all__ = ["SpanDue", "SpanFleet", "SpanTracker", "cap_passages", "fleet_need", "span_fleet_need", "span_flows",
           "span_reports"]

IntArray = npt.NDArray[np.int64]


def span_flows(epochs: IntArray, flows: IntArray, span_s: int) -> tuple[IntArray, IntArray, IntArray]:
    """Per span of ``span_s`` seconds (aligned on the epoch clock) that ``epochs`` touch: its first
    epoch, each station's span flow (the sum of its 30-s counts, ``(spans, stations)``) and the
    largest epoch total in it.

    >>> starts, f, peak = span_flows(np.array([9, 10, 11, 12]), np.array([[1, 0], [2, 3], [0, 4], [5, 5]]), 60)
    >>> starts.tolist(), f.tolist(), peak.tolist()
    ([8, 10, 12], [[1, 0], [2, 7], [5, 5]], [1, 5, 10])
    """
    epochs = np.asarray(epochs, dtype=np.int64)
    flows = np.asarray(flows, dtype=np.int64)
    per = span_s // EPOCH_S
    if epochs.size == 0:
        return np.zeros(0, np.int64), np.zeros((0, flows.shape[1] if flows.ndim == 2 else 0), np.int64), \
            np.zeros(0, np.int64)
    starts_all = epochs - epochs % per
    cut = np.flatnonzero(np.r_[True, starts_all[1:] != starts_all[:-1]])
    return (starts_all[cut], np.add.reduceat(flows, cut, axis=0),
            np.maximum.reduceat(flows.sum(axis=1), cut))


# The epoch-by-epoch placement (SpanFleet) may need a little room over König's bound (it is
# greedy in time); with none at all it placed every span of the synthetic 16-station day at the
# bound itself (hourly and 5-minute, one producer), and a failure is a FleetTooSmall, never a
# wrong span. The room: 2% and at least 4 vehicles.
_SLACK = 0.02
_SLACK_MIN = 4
_Z = 6.0  # sd of a producer's share of a span flow the margin covers (a 6-sd excess: < 1e-9)


def span_fleet_need(epochs: IntArray, flows: IntArray, span_s: int, producer_count: int = 1) -> int:
    """The fleet a replay with ``producer_count`` producers needs for spans of ``span_s``: at
    least every span's ``max(max_e T_e, max_s F_s)`` (König's bound), with room for the
    epoch-by-epoch assignment (2%, at least 4 vehicles) and, over several producers, for a
    producer's random share of a span flow (the split is hypergeometric per epoch: a share ``p``
    of a flow F has sd at most sqrt(F p (1 - p)); 6 sd of it, scaled to the whole fleet).

    >>> span_fleet_need(np.array([0, 1]), np.array([[50, 0], [40, 10]]), 60)
    94
    >>> span_fleet_need(np.array([0, 1]), np.array([[50, 0], [40, 10]]), 60, producer_count=4)
    193
    """
    _, f, peak = span_flows(epochs, flows, span_s)
    if f.size == 0:
        return 0
    need = int(max(f.max(), peak.max()))
    room = max(int(np.ceil(need * _SLACK)), _SLACK_MIN)
    if producer_count > 1:  # F p + z sqrt(F p (1 - p)) <= N p  =>  N >= F + z sqrt(F (count - 1))
        room += int(np.ceil(_Z * np.sqrt(need * (producer_count - 1))))
    return need + room


class SpanFleet:
    """One producer's vehicles, each keeping its identity through the spans of ``span_s``.

    :meth:`step` places the producer's vehicles of one epoch (its row of :func:`split_fleet`:
    ``row[0]`` vehicles at no station, ``row[s]`` at data station ``s``) so that no vehicle passes
    a station twice in a span: a seeded random placement of the vehicles, then every vehicle put
    at a station it already passed is swapped with a random other vehicle of the epoch (one at a
    station the first has not passed and that has not passed the first's, or an idle one), in
    vectorised rounds; the few left after them get a partner picked among all that fit.
    :meth:`passages` gives every vehicle's stations of the span (at its end). State: one bit per
    (vehicle, station) -- 55 MB for 136,000 vehicles at 3,220 stations, whatever the span -- and,
    for spans of up to ``HISTORY_EPOCHS`` epochs, each vehicle's stations in passing order
    (33 MB an hour at that scale), from which :meth:`passages` reads faster.

    Cost (tests/benchmarks/bench_span_fleet.py, the synthetic 3,220-station day's busiest hour,
    138,885 vehicles, one producer): :meth:`step` 17 ms an epoch (~1,800x real time; 2.3% of one
    epoch of a 30-s unary query's per-vehicle bitmaps, 0.71 s, in the same run; ~2,640 placements
    repaired an epoch); the span's end 0.7 s to read the passages, 2.6 s to cap them at 20, once
    an hour. 5-minute spans: 17 ms an epoch, 0.1 s at the span's end.
    Vehicle indices never leave this class except re-drawn per span (:meth:`passages`).

    >>> sf = SpanFleet(seed=1, span_s=90, n_vehicles=4, n_stations=3)
    >>> for e in (30, 31, 32):
    ...     sf.step(e, np.array([1, 1, 1, 1]))
    >>> sf.complete, sf.start, sf.passages().yes_counts(3).tolist()
    (True, 30, [3, 3, 3])
    """

    REPAIR_ROUNDS = 64
    HISTORY_EPOCHS = 240

    def __init__(self, seed: int, span_s: int, n_vehicles: int, n_stations: int, producer_index: int = 0,
                 station_ids: IntArray | None = None) -> None:
        if span_s % EPOCH_S or span_s <= 0:
            raise ValueError(f"span_s must be a positive multiple of {EPOCH_S}, got {span_s}")
        self.seed, self.span_s, self.producer_index = seed, span_s, producer_index
        self.n, self.v = n_vehicles, n_stations
        self.epochs_per_span = span_s // EPOCH_S
        self.station_ids = station_ids
        self._passed = np.zeros((n_vehicles, -(-n_stations // 8)), dtype=np.uint8)
        self._flow = np.zeros(n_stations, dtype=np.int64)
        self._count = np.zeros(n_vehicles, dtype=np.int32)  # each vehicle's passages so far this span
        # spans of up to HISTORY_EPOCHS epochs also keep each vehicle's stations in the order passed
        # (2-4 bytes a vehicle and epoch: 33 MB an hour at the papers' scale), read back faster
        self._history = (np.zeros((n_vehicles, self.epochs_per_span),
                                  dtype=np.int16 if n_stations < 2**15 else np.int32)
                         if self.epochs_per_span <= self.HISTORY_EPOCHS else None)
        self.start: int | None = None
        self.stepped = 0  # epochs of the current span placed, from its first on
        self._gap = False
        self._last = -1  # the last epoch placed
        self.repairs = 0  # placements at a station the vehicle had passed, repaired (all spans)

    @property
    def complete(self) -> bool:
        """Every epoch of the current span was placed, from its first to its last."""
        return self.start is not None and not self._gap and self.stepped == self.epochs_per_span

    def most_passages(self) -> int:
        """The most stations one vehicle passed so far this span (over all the data's stations)."""
        return int(self._count.max(initial=0))

    def flows(self) -> IntArray:
        """Each station's passages so far in the current span (its span flow at the end)."""
        return self._flow.copy()

    def _name(self, s: int) -> str:
        return f"station {int(self.station_ids[s - 1])}" if self.station_ids is not None else f"station #{s}"

    def _has_passed(self, veh: IntArray, st: IntArray) -> npt.NDArray[np.bool_]:
        """Whether vehicle ``veh[i]`` passed station ``st[i]`` (0: none, never) this span."""
        b = np.maximum(st, 1) - 1
        bit: npt.NDArray[np.bool_] = ((self._passed[veh, b >> 3] >> (b & 7).astype(np.uint8)) & 1).astype(bool)
        return bit & (st > 0)

    def step(self, epoch: int, row: IntArray) -> None:
        """Place this epoch's vehicles; a new span (``epoch`` its first, or any epoch of a span
        other than the current one) starts from nobody having passed anything."""
        row = np.asarray(row, dtype=np.int64)
        if row.shape != (self.v + 1,) or np.any(row < 0) or int(row.sum()) != self.n:
            raise ValueError(f"a row of {self.v + 1} counts summing to the producer's {self.n} vehicles")
        start = epoch - epoch % self.epochs_per_span
        if start != self.start:
            self._passed[:] = 0
            self._flow[:] = 0
            self._count[:] = 0
            if self._history is not None:
                self._history[:] = 0
            self.start, self.stepped, self._gap = start, 0, epoch != start
        elif epoch <= self._last:
            raise ValueError(f"epoch {epoch} comes after epoch {self._last} of its span: placed twice")
        elif epoch != start + self.stepped:
            self._gap = True  # an epoch of the span was skipped: the span is not whole
        self.stepped += 1
        self._last = epoch
        self._flow += row[1:]
        over = np.flatnonzero(self._flow > self.n)
        if over.size:
            s = int(over[0]) + 1
            raise FleetTooSmall(
                f"span of {self.span_s} s from epoch {start}: {self._name(s)} has {int(self._flow[s - 1]):,} "
                f"passages by epoch {epoch} but producer {self.producer_index} has {self.n:,} vehicles, each "
                f"passing a station at most once a span; give a fleet of at least the largest span flow "
                f"(fleet_size_for with the span queries)")
        rng = np.random.default_rng([self.seed, self.span_s, epoch, self.producer_index, 0x5BA9])
        at = np.repeat(np.arange(self.v + 1, dtype=np.int64), row)
        rng.shuffle(at)  # at[vehicle] = its station this epoch (0: none)
        self._repair(rng, at, epoch)
        active = np.flatnonzero(at)
        b = at[active] - 1
        self._passed[active, b >> 3] |= (1 << (b & 7)).astype(np.uint8)  # one station per vehicle: no repeats
        if self._history is not None:
            self._history[active, self._count[active]] = at[active]
        self._count[active] += 1

    def _repair(self, rng: np.random.Generator, at: IntArray, epoch: int) -> None:
        active = np.flatnonzero(at)
        bad = active[self._has_passed(active, at[active])]
        self.repairs += int(bad.size)
        if not bad.size:
            return
        is_bad = np.zeros(self.n, dtype=bool)
        is_bad[bad] = True
        for _ in range(self.REPAIR_ROUNDS):  # random partners, all conflicts at once
            u = rng.integers(0, self.n, size=bad.size)
            keep = ~is_bad[u]
            keep[np.setdiff1d(np.arange(u.size), np.unique(u, return_index=True)[1], assume_unique=True)] = False
            v, u = bad[keep], u[keep]
            sv, su = at[v], at[u]
            ok = ~self._has_passed(u, sv) & ~self._has_passed(v, su)
            v, u = v[ok], u[ok]
            at[v], at[u] = su[ok], sv[ok]
            is_bad[v] = False
            bad = bad[is_bad[bad]]
            if not bad.size:
                return
        everyone = np.arange(self.n)
        for v_ in bad.tolist():  # the rest: a partner among all that fit, if any
            s = int(at[v_])
            fits = ~is_bad & ~self._has_passed(everyone, np.full(self.n, s)) \
                & ~self._has_passed(np.full(self.n, v_), at)
            fits[v_] = False
            cand = np.flatnonzero(fits)
            if not cand.size:
                raise FleetTooSmall(
                    f"span of {self.span_s} s from epoch {self.start}: at epoch {epoch} no vehicle of producer "
                    f"{self.producer_index}'s {self.n:,} can take {self._name(s)} ({int(self._flow[s - 1]):,} "
                    f"passages of it so far in the span, {self.n - int((at == 0).sum()):,} vehicles at stations "
                    f"this epoch); give a larger fleet (span_fleet_need)")
            u_ = int(cand[rng.integers(cand.size)])
            at[v_], at[u_] = at[u_], s
            is_bad[v_] = False

    def passages(self) -> StationSets:
        """Every vehicle's stations of the current span (data station indices 1..V), the rows in
        a fresh random order (seeded by the span): position ``j`` is a random vehicle, drawn again
        every span, so no position links a vehicle's spans."""
        if self.start is None:
            return StationSets(self.n, np.zeros(0, np.int64), np.zeros(0, np.int64))
        rng = np.random.default_rng([self.seed, self.span_s, self.start, self.producer_index, 0x9E5])
        order = rng.permutation(self.n)
        if self._history is not None:  # each row's stations sorted, the zeros (no passage) first
            hist = np.sort(self._history[order], axis=1)
            station = hist[hist > 0].astype(np.int64)
            return StationSets(self.n, np.repeat(np.arange(self.n, dtype=np.int64), self._count[order]), station)
        rows = self._passed[order]
        flat = rows.ravel()
        nz = np.flatnonzero(flat)  # the bytes with a passage, by vehicle then byte
        vals = flat[nz]
        owner = np.repeat(np.arange(self.n, dtype=np.int64), np.count_nonzero(rows, axis=1))
        col = nz - owner * rows.shape[1]
        bit = np.flatnonzero(np.unpackbits(vals, bitorder="little"))  # 8 per byte, lowest first
        at = bit >> 3
        return StationSets(self.n, owner[at], col[at] * 8 + (bit & 7) + 1)

    def query_sets(self, sets: StationSets, data_stations: IntArray, query: Query) -> StationSets:
        """:meth:`passages` (data station indices) as the query's set truths: its sensors only, in
        its station order (1..V of the query)."""
        if query.sensors == tuple(int(s) for s in data_stations):  # the data's stations in its order
            return sets
        lookup = query_lookup(data_stations, query)
        st = lookup[sets.station]
        keep = st > 0
        veh, st = sets.vehicle[keep], st[keep]
        mapped = lookup[lookup > 0]
        if np.any(np.diff(mapped) < 0):  # the query orders its sensors otherwise: sort again
            order = np.argsort(veh * (query.n_stations + 1) + st, kind="stable")
            veh, st = veh[order], st[order]
        return StationSets(sets.n_vehicles, veh, st)


@dataclass(frozen=True)
class SpanDue:
    """A span query whose span ends at this epoch: its first epoch (``start``, the epoch its
    reports and markers carry), whether the replay covered it whole (then its report is sent;
    else ``reason`` says why not), and the data's stations without a reading in some epoch of
    it (``readings_missing``, PeMS ids)."""

    query: Query
    start: int
    whole: bool
    reason: str | None
    readings_missing: frozenset[int]


@dataclass
class _Open:
    query: Query
    start: int
    seen: int
    contiguous: bool
    last: int
    gaps: set[int]


class SpanTracker:
    """One producer's span queries through a replay (pure): one :class:`SpanFleet` per span
    length in play, and per query (version) the span it is in.

    A span is reported only when it is *whole*: the query was active in every one of its epochs
    from its first, the replay placed all of them, and the fleet could hold it. So a span that
    began before the replay's first epoch (or before the query's ``t_start``, or a new version)
    is not reported: :meth:`step` returns it with the reason, to be counted. A span the replay
    stops in (a stop, or the end of the replayed epochs) is :meth:`open_spans`: its markers say
    interrupted with nothing sent.

    >>> from datetime import datetime, timedelta, timezone
    >>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    >>> q = Query(query_id="h", analyst_id="a", version=1, sensors=(11, 12), mechanism="unary", population=9,
    ...           span_s=90, t_start=t0, t_end=t0 + timedelta(days=1))
    >>> tr = SpanTracker(seed=1, n_vehicles=4, data_stations=np.array([11, 12]))
    >>> [(e, d.start, d.whole, d.reason) for e in range(59, 63) for d in tr.step(e, [q], np.array([2, 1, 1]))]
    [(59, 57, False, 'the replay did not cover the span from its first epoch'), (62, 60, True, None)]
    >>> tr.truth(q).yes_counts(2).tolist(), tr.yes_counts(q).tolist(), tr.capped(q)
    ([3, 3], [3, 3], False)
    >>> tr.step(63, [q], np.array([2, 1, 1])), [s for _, s, _ in tr.open_spans(63)]
    ([], [63])
    """

    def __init__(self, seed: int, n_vehicles: int, data_stations: IntArray, producer_index: int = 0,
                 trips: ProducerTrips | None = None) -> None:
        self.seed, self.n, self.producer_index = seed, n_vehicles, producer_index
        self.data_stations = np.asarray(data_stations, dtype=np.int64)
        self.trips = trips  # a fleet that drives all day (--fleet-model trips): spans read from it
        self.fleets: dict[int, SpanFleet | TripSpans] = {}
        self.failed: dict[int, tuple[int, str]] = {}  # span_s -> (span start, why)
        self._open: dict[str, _Open] = {}
        self._ended: dict[int, int] = {}  # span_s -> the start of its span that just ended whole
        self._sets: dict[int, StationSets] = {}  # span_s -> that span's passages, read once when asked
        self.station_drops: IntArray | None = None  # the day cap's drops in the last span read, per station

    def step(self, epoch: int, queries: Sequence[Query], row: IntArray | None,
             no_data: Collection[int] = ()) -> list[SpanDue]:
        """This epoch of the replay: ``queries`` the active ones (30-s ones are ignored),
        ``row`` this producer's split row (None: the epoch was not run), ``no_data`` the data's
        stations without a reading. Returns the span queries whose span ends at this epoch."""
        span_qs = [q for q in queries if q.is_span]
        self._ended.clear()  # what ended at the last epoch is gone: the fleets place a new one now
        self._sets.clear()
        for span_s in sorted({q.span_s for q in span_qs}):
            if row is None:
                continue
            per = span_s // EPOCH_S
            start = epoch - epoch % per
            if self.failed.get(span_s, (None, ""))[0] == start:
                continue
            sf = self.fleets.get(span_s)
            if sf is None:
                sf = self.fleets[span_s] = (
                    SpanFleet(self.seed, span_s, self.n, self.data_stations.size, self.producer_index,
                              self.data_stations) if self.trips is None else
                    TripSpans(self.trips, self.seed, span_s, self.n, self.data_stations.size, self.producer_index))
            try:
                sf.step(epoch, row)
            except FleetTooSmall as exc:
                self.failed[span_s] = (start, str(exc))
                continue
            if epoch == start + per - 1 and sf.complete:
                self._ended[span_s] = start
        due: list[SpanDue] = []
        for q in span_qs:
            start = q.span_start(epoch)
            op = self._open.get(q.record_key)
            if op is None or op.start != start:
                op = self._open[q.record_key] = _Open(q, start, 0, epoch == start, epoch, set())
            op.last = epoch
            op.gaps.update(int(s) for s in no_data)
            if row is None:  # not run (the stop epoch): the span stays open, to be marked interrupted
                op.contiguous = False
                continue
            op.contiguous &= epoch == start + op.seen
            op.seen += 1
            if epoch != start + q.epochs_per_span - 1:
                continue
            del self._open[q.record_key]
            failed = self.failed.get(q.span_s)
            ended = self._ended.get(q.span_s)
            if not (op.contiguous and op.seen == q.epochs_per_span):
                why: str | None = ("the replay did not cover the span from its first epoch" if not op.contiguous
                                   and op.seen < q.epochs_per_span else "the query was not active in every epoch of it")
            elif failed is not None and failed[0] == start:
                why = failed[1]
            elif ended != start:
                why = "the fleet did not place every epoch of it"
            else:
                why = None
            due.append(SpanDue(q, start, why is None, why, frozenset(op.gaps)))
        return due

    def _fleet_of_ended(self, query: Query) -> SpanFleet | TripSpans:
        if query.span_s not in self._ended:
            raise ValueError(f"no whole span of {query.span_s} s has ended at this epoch")
        return self.fleets[query.span_s]

    def truth(self, query: Query, day: str = "") -> StationSets:
        """The set truths (query order, uncapped) of ``query``'s span that just ended whole (at the
        epoch last stepped; its passages are read once per span length, when first asked). From a
        fleet that drives all day: past the query's day cap (of UTC ``day``) dropped, the drops
        counted in :attr:`day_dropped`."""
        sf = self._fleet_of_ended(query)
        if isinstance(sf, TripSpans):
            sets, _ = sf.query_sets_capped(query, self.data_stations, day)
            self.station_drops = sf.last_dropped.get(query.query_id) if query.max_passages_day is not None else None
            return sets
        if query.span_s not in self._sets:
            self._sets[query.span_s] = sf.passages()
        return sf.query_sets(self._sets[query.span_s], self.data_stations, query)

    @property
    def day_dropped(self) -> int:
        """The day cap's drops in the last span read (:attr:`station_drops`, summed)."""
        return 0 if self.station_drops is None else int(self.station_drops.sum())

    def capped(self, query: Query) -> bool:
        """Whether ``query``'s cap on passages may bind in its span that just ended (some vehicle
        passed more stations than the query's ``passages``); if not, its set truths' Yes counts
        are :meth:`yes_counts`, without reading the sets."""
        sf = self._fleet_of_ended(query)
        return isinstance(sf, TripSpans) or sf.most_passages() > query.passages

    def yes_counts(self, query: Query) -> IntArray:
        """Per station of ``query`` (its order) the distinct vehicles that passed it in its span
        that just ended: the span flow (the sum of its 30-s counts), uncapped."""
        flows = self._fleet_of_ended(query).flows()
        return query_truth_counts(np.r_[0, flows], self.data_stations, query)[1:]  # the data's order -> the query's

    def open_spans(self, epoch: int) -> list[tuple[Query, int, frozenset[int]]]:
        """The span queries active at ``epoch`` whose span has begun and not ended: (query, span
        start, stations without a reading so far)."""
        return [(op.query, op.start, frozenset(op.gaps)) for op in self._open.values() if op.last == epoch]


def cap_passages(sets: StationSets, cap: int, rng: np.random.Generator) -> tuple[StationSets, int]:
    """Each vehicle's set cut to at most ``cap`` stations, a uniformly random ``cap`` of a larger
    set (random keys, the ``cap`` smallest kept); with the number of passages dropped, exactly
    ``sum(max(0, k - cap))`` over the vehicles' set sizes ``k``. Draws only if some set is over.

    >>> sets = StationSets(2, np.array([0, 0, 0, 1]), np.array([1, 2, 3, 2]))
    >>> capped, dropped = cap_passages(sets, 2, np.random.default_rng(0))
    >>> capped.sizes().tolist(), dropped
    ([2, 1], 1)
    """
    if cap < 1:
        raise ValueError("the cap must be at least one station")
    sizes = sets.sizes()
    if sizes.size == 0 or int(sizes.max()) <= cap:
        return sets, 0
    over = np.flatnonzero(sizes > cap)  # the vehicles over the cap, and their pairs (by vehicle)
    k = sizes[over]
    idx = np.flatnonzero(sizes[sets.vehicle] > cap)
    first = np.cumsum(k) - k
    keys = np.full((over.size, int(k.max())), np.inf)  # a row per vehicle over: its keys, then padding
    keys[np.repeat(np.arange(over.size), k), np.arange(idx.size) - np.repeat(first, k)] = rng.random(idx.size)
    pick = np.argpartition(keys, cap - 1, axis=1)[:, :cap]  # each row's cap smallest keys (never padding)
    keep = np.ones(sets.station.size, dtype=bool)
    keep[idx] = False
    keep[idx[(first[:, None] + pick).ravel()]] = True
    return StationSets(sets.n_vehicles, sets.vehicle[keep], sets.station[keep]), int((~keep).sum())


def fleet_need(epochs: IntArray, flows: IntArray, producer_count: int, spans: Iterable[int] = ()
               ) -> tuple[int, str]:
    """The fewest vehicles a replay of ``flows`` needs and why: the peak total flow (vehicles at
    stations in one epoch), or for span queries (``spans``: their ``span_s``) the largest span
    flow of any station with room (:func:`span_fleet_need`), whichever is larger.

    >>> fleet_need(np.array([0, 1]), np.array([[50, 0], [40, 10]]), 1, {60})
    (94, 'the largest 60-s span flow of a station with room for 1 producer(s): 94')
    """
    flows = np.asarray(flows, dtype=np.int64)
    peak = int(flows.sum(axis=1).max()) if flows.size else 0
    need, why = peak, f"the day's peak total flow {peak:,}"
    for span_s in sorted({int(s) for s in spans if s > EPOCH_S}):
        got = span_fleet_need(epochs, flows, span_s, producer_count)
        if got > need:
            need, why = got, (f"the largest {span_s}-s span flow of a station with room for "
                              f"{producer_count} producer(s): {got:,}")
    return need, why


def span_reports(q: Query, spans: SpanTracker, seed: int, index: int, start: int, mode: str, device: Device,
                 ledger: DayLedger | ShuffledDayLedger | None = None, mix_pairs: bool = True
                 ) -> tuple[EpochReports, int]:
    """Producer ``index``'s devices' one report each for ``q``'s span from epoch ``start`` (which
    just ended whole): the set of stations each vehicle passed, capped at the query's
    ``passages`` (:func:`cap_passages`), privatized and charged once
    (:func:`producers.fleet.privatize`, the generator :func:`producers.fleet.epoch_rng` of the
    span's first epoch); with the passages the cap dropped (0 when refused). In tally mode with
    a cap that cannot bind, the span flows are tallied without reading the sets (a
    :class:`~estimators.per_station.YesCounts` truth, the same draws: the cap draws nothing then)."""
    rng = epoch_rng(seed, q, start, index)
    day = epoch_start(start).date().isoformat()
    if mode == "tally" and not spans.capped(q):  # the exact tally needs only the span flows: no sets read
        return privatize(q, YesCounts(spans.yes_counts(q), spans.n), rng, mode, device, ledger, day), 0
    spans.station_drops = None
    sets, dropped = cap_passages(spans.truth(q, day), q.passages, rng)
    er = privatize(q, sets, rng, mode, device, ledger, day, mix_pairs)
    return er, 0 if er.refused else dropped + spans.day_dropped
