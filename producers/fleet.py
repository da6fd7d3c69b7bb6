"""The simulated fleet: who is where each epoch, and what each device sends. Pure, seeded.

Vehicles have virtual identities only inside this module (positions in an array that is
shuffled every epoch); nothing that leaves it can name or link a vehicle. Every draw comes
from a generator seeded by (seed, query, version, epoch, producer), so a replay can be
reproduced and checked against the statistics core directly.

**Spans.** A query with ``span_s`` > 30 asks each device for one report per span naming the
stations it passed in it. Then a vehicle must keep its identity through the span:
:class:`SpanFleet` holds one producer's vehicles through the spans of one length. In each epoch
a vehicle is at one station or none (the epoch's split row, :func:`split_fleet`, as for 30-s
queries), and it passes a station at most once per span, so a station's true span flow -- the
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

import zlib
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from estimators import DayLedger, audit_query
from estimators.ledger import ShuffledDayLedger
from estimators.per_station import PerStation, StationSets
from estimators.registry import Layout
from schemas import Query
from schemas.epochs import EPOCH_S

__all__ = ["Device", "EpochReports", "FleetTooSmall", "SpanFleet", "cap_passages", "charge", "epoch_rng",
           "fleet_share", "privatize", "privatize_sets", "query_truth_counts", "span_flows", "span_fleet_need",
           "split_fleet"]

IntArray = npt.NDArray[np.int64]


class FleetTooSmall(ValueError):
    """The fleet cannot hold the vehicles the data puts at stations in some epoch."""


def fleet_share(fleet_size: int, index: int, count: int) -> int:
    """Vehicles owned by producer ``index`` of ``count`` (the first ones take the remainder)."""
    base, extra = divmod(fleet_size, count)
    return base + (1 if index < extra else 0)


def split_fleet(seed: int, epoch: int, flows: IntArray, fleet_size: int, producer_count: int) -> IntArray:
    """How many of each producer's vehicles are at each station: ``(producers, 1 + stations)``.

    Column 0 counts vehicles at none of the data's stations. Every producer process computes
    the same split (a seeded multivariate hypergeometric draw), then samples only its own row.
    """
    flows = np.asarray(flows, dtype=np.int64)
    at_stations = int(flows.sum())
    if at_stations > fleet_size:
        raise FleetTooSmall(f"epoch {epoch}: {at_stations} vehicles at stations but the fleet has {fleet_size}; "
                            f"use a fleet of at least the day's peak total flow")
    colors = np.concatenate([[fleet_size - at_stations], flows])
    rng = np.random.default_rng([seed, epoch, 0x5_1217])
    out = np.zeros((producer_count, colors.size), dtype=np.int64)
    remaining = colors.copy()
    for k in range(producer_count - 1):
        take = fleet_share(fleet_size, k, producer_count)
        out[k] = rng.multivariate_hypergeometric(remaining, take) if take else 0
        remaining -= out[k]
    out[-1] = remaining
    return out


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


# The epoch-by-epoch assignment (SpanFleet) needs a little room over König's bound: with
# ``_SLACK`` more vehicles than the largest span flow it never failed in the benchmark's days
# (checked at the bound itself, where it can fail: tests/unit/producers/test_fleet_span.py).
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
    (vehicle, station) -- 55 MB for 136,000 vehicles at 3,220 stations, whatever the span.
    Vehicle indices never leave this class except re-drawn per span (:meth:`passages`).

    >>> sf = SpanFleet(seed=1, span_s=90, n_vehicles=4, n_stations=3)
    >>> for e in (30, 31, 32):
    ...     sf.step(e, np.array([1, 1, 1, 1]))
    >>> sf.complete, sf.start, sf.passages().yes_counts(3).tolist()
    (True, 30, [3, 3, 3])
    """

    REPAIR_ROUNDS = 64

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
        self.start: int | None = None
        self.stepped = 0  # epochs of the current span placed, from its first on
        self._gap = False

    @property
    def complete(self) -> bool:
        """Every epoch of the current span was placed, from its first to its last."""
        return self.start is not None and not self._gap and self.stepped == self.epochs_per_span

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
            self.start, self.stepped, self._gap = start, 0, epoch != start
        elif epoch != start + self.stepped:
            self._gap = True  # an epoch of the span was skipped (or repeated): the span is not whole
        self.stepped += 1
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

    def _repair(self, rng: np.random.Generator, at: IntArray, epoch: int) -> None:
        active = np.flatnonzero(at)
        bad = active[self._has_passed(active, at[active])]
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
        rows = self._passed[rng.permutation(self.n)].ravel()
        nb = self._passed.shape[1]
        nz = np.flatnonzero(rows)
        r, c = np.nonzero(np.unpackbits(rows[nz][:, None], axis=1, bitorder="little"))
        return StationSets(self.n, nz[r] // nb, (nz[r] % nb) * 8 + c + 1)

    def query_sets(self, sets: StationSets, data_stations: IntArray, query: Query) -> StationSets:
        """:meth:`passages` (data station indices) as the query's set truths: its sensors only, in
        its station order (1..V of the query)."""
        lookup = np.zeros(self.v + 1, dtype=np.int64)
        position = {int(s): j for j, s in enumerate(data_stations)}
        for i, sensor in enumerate(query.sensors):
            j = position.get(sensor)
            if j is not None:
                lookup[j + 1] = i + 1
        st = lookup[sets.station]
        keep = st > 0
        veh, st = sets.vehicle[keep], st[keep]
        mapped = lookup[lookup > 0]
        if np.any(np.diff(mapped) < 0):  # the query orders its sensors otherwise: sort again
            order = np.argsort(veh * (query.n_stations + 1) + st, kind="stable")
            veh, st = veh[order], st[order]
        return StationSets(sets.n_vehicles, veh, st)


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
    idx = np.flatnonzero(sizes[sets.vehicle] > cap)
    order = idx[np.lexsort((rng.random(idx.size), sets.vehicle[idx]))]
    grp = sets.vehicle[order]
    rank = np.arange(grp.size) - np.searchsorted(grp, grp, side="left")
    keep = np.ones(sets.station.size, dtype=bool)
    keep[order[rank >= cap]] = False
    return StationSets(sets.n_vehicles, sets.vehicle[keep], sets.station[keep]), int((~keep).sum())


def query_truth_counts(producer_row: IntArray, data_stations: IntArray, query: Query) -> IntArray:
    """Truth counts ``(V + 1,)`` in the query's station order; index 0 = at none of its sensors
    (elsewhere, at a station the query does not monitor, or at none at all)."""
    position = {int(s): j for j, s in enumerate(data_stations)}
    counts = np.zeros(query.n_stations + 1, dtype=np.int64)
    for i, sensor in enumerate(query.sensors):
        j = position.get(sensor)
        if j is not None:
            counts[i + 1] = producer_row[j + 1]
    counts[0] = int(producer_row.sum()) - int(counts[1:].sum())
    return counts


def epoch_rng(seed: int, query: Query, epoch: int, producer_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(query.query_id.encode()), query.version, epoch, producer_index])


@dataclass(frozen=True)
class Device:
    """What every simulated device is configured to accept (Anonymized Local Privacy §IV-B query audit)."""

    epsilon_limit: float = 10.0
    blacklist: frozenset[int] = frozenset()

    def accepts(self, query: Query) -> tuple[bool, str | None]:
        result = audit_query(query.epsilon, query.sensors, self.epsilon_limit, self.blacklist)
        return result.accepted, result.reason


@dataclass
class EpochReports:
    """What one producer sends for one query and epoch.

    ``rounds[r]`` holds the arrays of round r in the wire ``layout`` (``schemas.wire``): the
    query's per-vehicle layout (``MechanismSpec.layout``: ``{"value": ...}`` for a
    station-valued mechanism, ``{"station": ..., "output": ...}`` for a per-sensor one) or
    ``counts`` (tally mode: ``{"counts": ...}``), or ``{"bitmap": rows}`` (the device path's
    bit-valued round, :func:`privatize`). ``reports[r]`` is how many reports (tally: vehicles)
    the round stands for.

    ``vehicles[r]`` (per-vehicle mode): the simulated vehicle behind each report of round r,
    in sending order -- its index in this producer's shuffled truths of the epoch. Device side
    only, like ``SparseReports.vehicle``: it never leaves the simulator; tests follow a vehicle
    onto the wire with it.
    """

    participants: int
    refused: int
    refusal_reason: str | None
    layout: Layout
    rounds: list[dict[str, npt.NDArray[np.integer]]] = field(default_factory=list)
    reports: list[int] = field(default_factory=list)
    vehicles: list[IntArray] = field(default_factory=list)


def charge(ledger: DayLedger | ShuffledDayLedger, day: str, query: Query) -> bool:
    """Charge one epoch of ``query`` to a device's ledger: its local epsilon, or (through the
    shuffler) its release's PLD at the shuffler's min_crowd. False: it would exceed the budget."""
    if isinstance(ledger, ShuffledDayLedger):
        return ledger.spend(day, query.record_key, query.spec, query.build(), query.n_stations)
    return ledger.spend(day, query.epsilon)


def _opened(query: Query, n: int, mode: str, device: Device, ledger: DayLedger | ShuffledDayLedger | None,
            day: str) -> EpochReports:
    """A report's audit and its charge to the ledger (once per report: an epoch's, or a span's):
    the refused reports, or an empty one to fill."""
    layout: Layout = "counts" if mode == "tally" else query.spec.layout
    ok, reason = device.accepts(query)
    if ok and ledger is not None and not charge(ledger, day, query):
        ok, reason = False, (f"daily privacy budget: answering would take the day's epsilon over "
                             f"{ledger.budget:g} (spent {ledger.total(day):.4g})")
    if not ok:
        return EpochReports(participants=0, refused=n, refusal_reason=reason, layout=layout,
                            rounds=[{} for _ in range(query.n_rounds)], reports=[0] * query.n_rounds)
    if mode not in ("tally", "per-vehicle"):
        raise ValueError(f"unknown mode {mode!r}")
    return EpochReports(participants=n, refused=0, refusal_reason=None, layout=layout)


def privatize(query: Query, truth_counts: IntArray, rng: np.random.Generator, mode: str,
              device: Device, ledger: DayLedger | ShuffledDayLedger | None = None, day: str = "",
              mix_pairs: bool = True) -> EpochReports:
    """Run every device of one producer for one epoch of ``query``.

    Per-vehicle mode: each vehicle privatizes its own truth; each round's reports are
    shuffled independently (no position links a vehicle's two rounds), and per-sensor
    mechanisms send only the non-default (station, report) pairs, shuffled across vehicles.
    Tally mode: the exact-tally path of the statistics core.

    With a ``ledger`` (the devices' daily privacy budget, :func:`charge`), a query whose epoch
    would take ``day``'s composed epsilon over the budget is refused, like an audit refusal.

    ``mix_pairs=False`` (the device path, ``--via-shuffler``: every device sends its own record,
    and the shuffler mixes them) leaves per-sensor pairs grouped by vehicle instead of
    shuffling ~10^8 pairs only for the device path to group them again. A permutation an
    earlier round's draws are followed by is still drawn, so every round's pairs are the direct
    path's; the last round's is not (``rng`` is the epoch's own: nothing after it draws from it).
    Every round of a bit-valued mechanism (unary RR, per-sensor RR, fresh) comes as
    ``{"bitmap": rows}``, one row of bits per vehicle (:meth:`~estimators.PerStation.sample_bits`:
    the same draws), and ``reports`` counts its set bits, the direct path's pairs.
    """
    n = int(truth_counts.sum())
    out = _opened(query, n, mode, device, ledger, day)
    if out.refused:
        return out
    samplers = query.per_station  # per-sensor mechanisms: one sampler per round
    if mode == "tally":
        if samplers is None:
            counts = query.build().tally(rng, truth_counts)
            out.rounds = [{"counts": counts[r]} for r in range(query.n_rounds)]
        else:
            out.rounds = [{"counts": ps.tally(rng, truth_counts[1:], n).ravel()} for ps in samplers]
        out.reports = [n] * query.n_rounds
        return out
    truths = np.repeat(np.arange(truth_counts.size, dtype=np.int64), truth_counts)
    rng.shuffle(truths)  # virtual identities: a vehicle is a position, re-drawn every epoch
    if samplers is None:
        reports = query.build().sample(rng, truths)
        out.vehicles = [rng.permutation(n) for _ in range(query.n_rounds)]  # one shuffle per round
        out.rounds = [{"value": reports[r][out.vehicles[r]]} for r in range(query.n_rounds)]
        out.reports = [n] * query.n_rounds
        return out
    _per_sensor_rounds(out, samplers, rng, StationSets.of_truths(truths), mix_pairs)
    return out


def privatize_sets(query: Query, sets: StationSets, rng: np.random.Generator, mode: str, device: Device,
                   ledger: DayLedger | ShuffledDayLedger | None = None, day: str = "",
                   mix_pairs: bool = True) -> EpochReports:
    """Run every device of one producer for one span report of a per-sensor ``query``: each
    vehicle's truth is its set of stations (:meth:`SpanFleet.passages`, in the query's order,
    capped: :func:`cap_passages`); a station in the set answers from the Yes row, every other
    from the No row. The rows' order is already re-drawn per span (:meth:`SpanFleet.passages`).
    Tally mode: per station, the exact tally of its span flow's Yes answers and the other
    vehicles' No answers (:meth:`~estimators.PerStation.tally` ``multi_hot``). Per-vehicle mode
    and ``mix_pairs``: as :func:`privatize`. The ledger is charged once, for the span's report.
    """
    samplers = query.per_station
    if samplers is None:
        raise ValueError(f"{query.mechanism} reports one station: it has no set truth")
    n = sets.n_vehicles
    out = _opened(query, n, mode, device, ledger, day)
    if out.refused:
        return out
    if mode == "tally":
        yes = sets.yes_counts(query.n_stations)
        out.rounds = [{"counts": ps.tally(rng, yes, n, multi_hot=True).ravel()} for ps in samplers]
        out.reports = [n] * query.n_rounds
        return out
    _per_sensor_rounds(out, samplers, rng, sets, mix_pairs)
    return out


def _per_sensor_rounds(out: EpochReports, samplers: tuple[PerStation, ...], rng: np.random.Generator,
                       sets: StationSets, mix_pairs: bool) -> None:
    """Per-vehicle mode of a per-sensor mechanism: every round's reports into ``out``."""
    n = sets.n_vehicles
    for r, ps in enumerate(samplers):  # fresh coins per round: each round sampled, shuffled and sent on its own
        last = not mix_pairs and r == len(samplers) - 1  # the generator's last draw: nothing later depends on it
        if not mix_pairs and ps.bit_valued:  # the same draws as one bitmap per device (the bitmap device report)
            bits = ps.sample_bits_sets(rng, sets)
            if not last:
                rng.permutation(bits.n_set)  # the direct path's shuffle of these pairs: later rounds draw after it
            out.rounds.append({"bitmap": bits.rows})
            out.vehicles.append(np.arange(n, dtype=np.int64))
            out.reports.append(bits.n_set)
            continue
        pairs = ps.sample_sparse_sets(rng, sets)
        if last:
            out.rounds.append({"station": pairs.station, "output": pairs.output})
            out.vehicles.append(pairs.vehicle)
            out.reports.append(int(pairs.station.size))
            continue
        order = rng.permutation(pairs.station.size)
        if mix_pairs:
            out.rounds.append({"station": pairs.station[order], "output": pairs.output[order]})
            out.vehicles.append(pairs.vehicle[order])
        else:  # the same draws; the pairs stay grouped by vehicle (two sorted runs)
            out.rounds.append({"station": pairs.station, "output": pairs.output})
            out.vehicles.append(pairs.vehicle)
        out.reports.append(int(pairs.station.size))
