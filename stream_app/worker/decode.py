"""Stage 1 logic: one record of the reports topic -> a typed stage record for stage 2, or
the reason it goes to the dead-letter topic. No Faust here; the app calls it per record.

What a record may claim is bounded by its query before anything is counted: report and
vehicle counts by the query's population, producer counts by ``max_producers``, epochs by
the query's window. The mechanism-specific work (which layouts a query takes, how reports
become count arrays) is the registry's (:meth:`estimators.MechanismSpec.accumulate`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from estimators import SpecError
from estimators.reports import Pairs, Values, round_from_arrays
from schemas import (
    DecodedBatch,
    EndOfEpoch,
    EndOfEpochSet,
    GroundTruth,
    Query,
    SingleReport,
    WireError,
    decode_record,
)
from schemas.estimates import Rejected

from .records import BatchPartial, MarkerPartial

__all__ = ["REASONS", "GraceBudget", "Rejected", "Stage1Pass", "Stage1Result", "UnknownQueryWait", "stage1_pass",
           "to_partials"]

log = logging.getLogger(__name__)

# every reason a record can be dead-lettered for (schemas.WireError reasons, then stage 1's)
REASONS = ("empty", "bad_encoding", "truncated", "bad_header", "size_mismatch", "bad_layout", "out_of_range",
           "bad_json_record", "unknown_query", "outside_query_window", "misaligned_span", "bad_round",
           "mismatched_sizes", "wrong_layout", "bad_marker", "out_of_bounds", "too_far_ahead", "unexpected_record",
           "internal_error")

QueryLookup = Callable[[str, int], Query | None]


class GraceBudget:
    """How long stage 1 may still hold records of a query it does not know yet: at most
    ``per_window_s`` of such waiting in any ``window_s``. A genuine start-up race needs one
    wait; a writer trickling records of made-up queries would otherwise stall every batch by
    the full grace. Once spent, unknown queries are dead-lettered after one read of the
    queries topic.

    >>> b = GraceBudget(10.0, window_s=60.0)
    >>> b.available(now=0.0)
    10.0
    >>> b.spend(now=0.0, seconds=8.0)
    >>> b.available(now=1.0)
    2.0
    >>> b.available(now=60.5)  # the wait has left the window
    10.0
    """

    def __init__(self, per_window_s: float, window_s: float = 60.0) -> None:
        self.per_window_s = per_window_s
        self.window_s = window_s
        self._spent: deque[tuple[float, float]] = deque()

    def available(self, now: float) -> float:
        while self._spent and self._spent[0][0] <= now - self.window_s:
            self._spent.popleft()
        return max(0.0, self.per_window_s - sum(s for _, s in self._spent))

    def spend(self, now: float, seconds: float) -> None:
        if seconds > 0:
            self._spent.append((now, seconds))
DEFAULT_MAX_PRODUCERS = 64


def _check_query(lookup: QueryLookup, query_id: str, version: int, epoch: int, rnd: int) -> Query | Rejected:
    q = lookup(query_id, version)
    if q is None:
        return Rejected("unknown_query", f"no query {query_id!r} version {version}")
    start, end = q.epoch_range()
    if not start <= epoch < end:
        return Rejected("outside_query_window", f"epoch {epoch} outside {q.record_key}'s [{start}, {end})")
    if q.span_start(epoch) != epoch:  # a span's reports and markers carry its first epoch (schemas.Query)
        return Rejected("misaligned_span", f"epoch {epoch} is not the first epoch of a {q.span_s}-s span of "
                                           f"{q.record_key} (that span starts at epoch {q.span_start(epoch)})")
    if rnd >= q.n_rounds:
        return Rejected("bad_round", f"round {rnd} but {q.mechanism} has {q.n_rounds} round(s)")
    return q


def _max_reports(q: Query, layout: str) -> int:
    """The most reports one record can honestly stand for: one per vehicle, or (pairs) one per
    vehicle and sensor."""
    return q.population * (q.n_stations if layout == "pairs" else 1)


def _batch(b: DecodedBatch, q: Query, partition: int) -> BatchPartial | Rejected:
    h = b.header
    mech = q.build()
    if h.n_stations != q.n_stations or h.n_outputs != mech.n_outputs:
        return Rejected("mismatched_sizes", f"batch for {h.n_stations} stations x {h.n_outputs} outputs, "
                                            f"query has {q.n_stations} x {mech.n_outputs}")
    if h.reports > _max_reports(q, h.layout):
        return Rejected("out_of_bounds", f"{h.reports} reports in one record; the query's population is "
                                         f"{q.population}")
    if h.layout == "counts":
        c = b.arrays["counts"]
        if c.size and int(c.max()) > q.population:
            return Rejected("out_of_bounds", f"a count of {int(c.max())} exceeds the population {q.population}")
    try:
        counts = q.spec.accumulate(mech, q.n_stations, round_from_arrays(h.layout, b.arrays, h.reports))
    except SpecError as exc:
        return Rejected(exc.reason, exc.detail)
    return BatchPartial(h.query_id, h.query_version, h.epoch, h.round, partition, h.producer_id, h.batch_id,
                        h.reports, h.layout == "counts", counts)


def _single(r: SingleReport, q: Query, partition: int) -> BatchPartial | Rejected:
    v = q.n_stations
    mech = q.build()
    if q.spec.per_sensor:
        d = q.default_report
        if r.pairs is None or any(s > v or o >= mech.n_outputs or o == d for s, o in r.pairs):
            return Rejected("out_of_range", f"a {q.mechanism} report needs pairs with station 1..{v} and a "
                                            f"non-default report < {mech.n_outputs} (default {d})")
        if len({s for s, _ in r.pairs}) != len(r.pairs):
            return Rejected("out_of_range", "a station appears twice in one report")
        rnd: Values | Pairs = Pairs(np.array([s for s, _ in r.pairs], dtype=np.int64),
                                    np.array([o for _, o in r.pairs], dtype=np.int64))
    else:
        if r.value is None or r.value > v:
            return Rejected("out_of_range", f"a {q.mechanism} report needs a value in 0..{v}")
        rnd = Values(np.array([r.value], dtype=np.int64))
    reports = rnd.n_reports
    try:
        counts = q.spec.accumulate(mech, v, rnd)
    except SpecError as exc:
        return Rejected(exc.reason, exc.detail)
    return BatchPartial(r.query_id, r.query_version, r.epoch, r.round, partition, "device", r.batch_id, reports,
                        False, counts)


def _marker(m: EndOfEpoch, q: Query, partition: int, max_producers: int) -> MarkerPartial | Rejected:
    if m.span_s is not None and m.span_s != q.span_s:
        return Rejected("bad_marker", f"marker for a {m.span_s}-s span; {q.record_key}'s span is {q.span_s} s")
    if m.producer_count > max_producers:
        return Rejected("bad_marker", f"producer count {m.producer_count} above the configured maximum "
                                      f"{max_producers}")
    if m.producer_index >= m.producer_count:
        return Rejected("bad_marker", f"producer index {m.producer_index} of {m.producer_count}")
    if m.partition != partition:
        return Rejected("bad_marker", f"marker for partition {m.partition} arrived on {partition}")
    if m.participants + m.refused > q.population:
        return Rejected("bad_marker", f"{m.participants} participants and {m.refused} refusals exceed the "
                                      f"population {q.population}")
    limit = _max_reports(q, "pairs" if q.spec.per_sensor else "values")
    if max(m.reports_total, m.reports_to_partition) > limit or m.reports_to_partition > m.reports_total \
            or m.batches_to_partition > m.batches_total or m.batches_total > limit:
        return Rejected("bad_marker", "report or batch counts out of bounds")
    if any(i > q.n_stations for i in m.readings_missing) or len(set(m.readings_missing)) != len(m.readings_missing):
        return Rejected("bad_marker", f"readings_missing must name distinct station indices 1..{q.n_stations}")
    if m.shuffle_size is not None and m.shuffle_size > q.population:
        return Rejected("bad_marker", f"shuffle size {m.shuffle_size} above the population {q.population} (a "
                                      f"slot holds at most one report per device)")
    return MarkerPartial(m.query_id, m.query_version, m.epoch, m.round, partition, m.producer_id, m.producer_index,
                         m.producer_count, m.reports_to_partition, m.batches_to_partition, m.participants,
                         m.refused, m.interrupted, tuple(m.readings_missing), m.shuffle_size,
                         m.release, m.withheld)


Stage1Result = BatchPartial | MarkerPartial | Rejected


def to_partials(value: bytes | None, partition: int, lookup: QueryLookup,
                max_producers: int = DEFAULT_MAX_PRODUCERS) -> list[Stage1Result]:
    """What stage 1 forwards for one record of the reports topic, or why it cannot: one result,
    or one per marker of an :class:`~schemas.EndOfEpochSet` (each bounded on its own; a
    rejected marker's reason names its place in the set)."""
    try:
        item = decode_record(value)
    except WireError as exc:
        return [Rejected(exc.reason, exc.detail)]
    if isinstance(item, GroundTruth):
        return [Rejected("unexpected_record", "ground truth belongs on the truth topic")]
    if isinstance(item, EndOfEpochSet):
        out: list[Stage1Result] = []
        for i, m in enumerate(item.markers):
            res = _marker_of(m, partition, lookup, max_producers)
            out.append(Rejected(res.reason, f"marker {i + 1} of {len(item.markers)}: {res.detail}")
                       if isinstance(res, Rejected) else res)
        return out
    if isinstance(item, DecodedBatch):
        h = item.header
        q = _check_query(lookup, h.query_id, h.query_version, h.epoch, h.round)
        return [q if isinstance(q, Rejected) else _batch(item, q, partition)]
    if isinstance(item, EndOfEpoch):
        return [_marker_of(item, partition, lookup, max_producers)]
    q = _check_query(lookup, item.query_id, item.query_version, item.epoch, item.round)
    return [q if isinstance(q, Rejected) else _single(item, q, partition)]


def _marker_of(m: EndOfEpoch, partition: int, lookup: QueryLookup, max_producers: int) -> MarkerPartial | Rejected:
    q = _check_query(lookup, m.query_id, m.query_version, m.epoch, m.round)
    return q if isinstance(q, Rejected) else _marker(m, q, partition, max_producers)


@dataclass(frozen=True)
class UnknownQueryWait:
    """When stage 1 may still hold a batch's records that name a query it does not know yet
    (pure: the clock is passed in).

    A record may wait while the grace lasts (``grace_s``, what :class:`GraceBudget` allows),
    and beyond it until the queries topic has been read to its end after the batch arrived
    (``caught_up``: a reader still catching up proves nothing), for at most ``patience_s``.

    >>> w = UnknownQueryWait(started_s=100.0, grace_s=2.0, patience_s=120.0)
    >>> w.may_wait(101.0), w.may_wait(150.0), w.may_wait(221.0)
    (True, True, False)
    >>> done = UnknownQueryWait(100.0, 2.0, 120.0, caught_up=True)
    >>> done.may_wait(101.0), done.may_wait(103.0)
    (True, False)
    """

    started_s: float
    grace_s: float
    patience_s: float
    caught_up: bool = False

    def may_wait(self, now_s: float) -> bool:
        return now_s < self.started_s + self.grace_s or (
            not self.caught_up and now_s < self.started_s + self.patience_s)

    def pause_s(self, now_s: float) -> float:
        """How long to pause before the next read of the queries topic."""
        return min(0.5, max(0.0, self.started_s + self.grace_s - now_s)) if self.caught_up else 0.5


@dataclass
class Stage1Pass:
    """One pass of stage 1 over a batch: what is decided (in input order, each record's
    results: stage records or rejections), and what still waits for its query."""

    done: list[tuple[int, list[Stage1Result]]] = field(default_factory=list)  # (index, results)
    waiting: list[int] = field(default_factory=list)  # indices, in input order


def stage1_pass(records: Sequence[tuple[bytes | None, int]], lookup: QueryLookup, may_wait: bool,
                max_producers: int = DEFAULT_MAX_PRODUCERS) -> Stage1Pass:
    """Decide each ``(value, source partition)`` of a batch, in order.

    A record naming a query not known yet waits (when ``may_wait``), and so does **every later
    record of its source partition**: stage 2's watermark and closing rules read each source
    partition in order, and a later epoch overtaking an earlier one would move the watermark
    past data that is only waiting (a start-up race with the query cache lost epochs that
    way). Records of other partitions go on. Decoding is pure, so a waiting record is decided
    again in a later pass.

    >>> from schemas import EndOfEpoch, encode_json
    >>> def marker(q: str, p: int) -> bytes:
    ...     return encode_json(EndOfEpoch(producer_id="p", producer_index=0, producer_count=1, query_id=q,
    ...         query_version=1, epoch=0, round=0, partition=p, reports_to_partition=0, batches_to_partition=0,
    ...         reports_total=0, batches_total=0, participants=0, refused=0, mode="per-vehicle"))
    >>> step = stage1_pass([(marker("new", 0), 0), (b"junk", 0), (b"junk", 1)], lambda q, v: None, may_wait=True)
    >>> step.waiting, [(i, [r.reason for r in rs]) for i, rs in step.done]
    ([0, 1], [(2, ['bad_encoding'])])
    """
    out = Stage1Pass()
    blocked: set[int] = set()
    for index, (value, partition) in enumerate(records):
        if partition in blocked:
            out.waiting.append(index)
            continue
        try:
            results = to_partials(value, partition, lookup, max_producers)
        except Exception as exc:  # never crash on a record; keep it for inspection
            log.exception("stage 1 failed on a record of partition %s", partition)
            results = [Rejected("internal_error", f"{type(exc).__name__}: {exc}")]
        if may_wait and any(isinstance(r, Rejected) and r.reason == "unknown_query" for r in results):
            blocked.add(partition)
            out.waiting.append(index)
            continue
        out.done.append((index, results))
    return out
