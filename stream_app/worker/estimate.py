"""From a closed window to estimates: the statistics core applied to all stations at once,
kept as arrays (:class:`EpochResult`) and rendered as estimate records without building a
pydantic object per row. The records follow :class:`schemas.estimates.Estimate` field for
field (a test validates rendered samples against the model and the JSON Schema).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from estimators import LinearEstimator, project_capped_simplex
from estimators.fleet import round_down_2sig
from estimators.ledger import report_epsilon_shuffled
from schemas import Query
from schemas.epochs import EPOCH_S, epoch_start

from .windows import CloseReason, WindowState

log = logging.getLogger(__name__)

__all__ = ["WITHHELD_CODES", "EpochResult", "QueryEstimators", "ShuffledEpsilon", "StationEstimates", "epoch_result",
           "epoch_results", "retraction", "round_down_2sig", "shuffle_needs"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class QueryEstimators:
    """The estimators of one query version, built once (station-valued views are large)."""

    query: Query
    estimators: dict[str, LinearEstimator]

    @classmethod
    def build(cls, query: Query) -> QueryEstimators:
        return cls(query, query.spec.estimators(query.build()))


@dataclass(frozen=True)
class StationEstimates:
    """One estimator's estimates for every station of a query: ``(V,)`` and ``(C, V)`` arrays.

    ``consistent``: the estimates projected onto ``{x >= 0, sum(x) <= P x participants}`` (P = 1
    for a 30-s epoch, ``Query.passages`` for a span) over the query's stations
    (``estimators.consistency``); None where not computed (published as null).
    """

    estimate: FloatArray
    sd: FloatArray
    lower: FloatArray
    upper: FloatArray
    consistent: FloatArray | None = None


@dataclass
class EpochResult:
    """Everything published for one closed (query, epoch): per-estimator arrays, or the reason
    the whole epoch is withheld."""

    query: Query
    epoch: int
    closed_by: CloseReason
    confidences: tuple[float, ...]
    participants: int
    reports: int
    round_reports: list[int]
    late: int
    refused: int
    missing_batches: int
    withheld: str | None
    withheld_code: str | None = None
    no_source_data: frozenset[int] = frozenset()  # station indices (1..V) without a source reading
    retracted: bool = False  # re-publication that withdraws an epoch already published
    values: dict[str, StationEstimates] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    # central epsilon of the epoch's release at the smallest attested shuffle (ShuffledEpsilon);
    # None when not attested (``shuffle_null`` says why, SHUFFLE_NULL_CODES) or infinite
    epsilon_shuffled: float | None = None
    shuffle_null: str | None = None
    # seconds covered: the query's span (30 s: an epoch), or a rollup's (stream_app.worker.rollups)
    span_s: int = EPOCH_S
    # station indices (1..V) published without a number (estimate, sd, bounds, consistent null): a
    # rollup's or a span query's stations with an epoch of no source data in the span
    # (stream_app.worker.rollups, "Missing is not a flow")
    blank: frozenset[int] = frozenset()
    release: str | None = None  # what the shuffler released ("permuted", "aggregate"); None: not attested

    @property
    def round_count_mismatch(self) -> int:
        return self.round_reports[1] - self.round_reports[0] if len(self.round_reports) == 2 else 0

    def n_records(self) -> int:
        return self.query.n_stations * len(self.query.spec.estimator_names)

    def header(self) -> dict[str, Any]:
        """The fields every estimate record of this epoch shares (and a frame carries once)."""
        q = self.query
        return {"query_id": q.query_id, "query_version": q.version, "mechanism": q.mechanism,
                "epoch": self.epoch, "epoch_start": epoch_start(self.epoch).isoformat(), "span_s": self.span_s,
                "reports": self.reports, "participants": self.participants,
                "epsilon": q.epsilon if math.isfinite(q.epsilon) else None,
                "epsilon_shuffled": self.epsilon_shuffled, "release": self.release,
                "withheld": self.withheld, "closed_by": self.closed_by,
                "round_count_mismatch": self.round_count_mismatch, "late": self.late, "refused": self.refused,
                "missing_batches": self.missing_batches}

    def render(self) -> list[tuple[bytes, bytes]]:
        """(key, JSON value) of every estimate record: one per station and estimator.

        The common fields are serialized once; per row only the station and numbers change.
        """
        q = self.query
        head = json.dumps({"kind": "estimate", **self.header()}, separators=(",", ":"))[:-1]  # without the "}"
        keys = [str(s).encode() for s in q.sensors]
        quality = [',"data_quality":"no_source_data"' if i + 1 in self.no_source_data else ',"data_quality":"ok"'
                   for i in range(q.n_stations)]
        out: list[tuple[bytes, bytes]] = []
        tail = ',"estimate":null,"sd":null,"bounds":[],"consistent":null'
        for name in q.spec.estimator_names:
            prefix = f'{head},"estimator":"{name}","station":'
            if self.withheld is not None:
                out.extend((k, f"{prefix}{s}{tail}{dq}}}".encode())
                           for k, s, dq in zip(keys, q.sensors, quality, strict=True))
                continue
            v = self.values[name]
            est, sd = v.estimate.tolist(), v.sd.tolist()
            lows, ups = v.lower.tolist(), v.upper.tolist()
            cons = (["null"] * q.n_stations if v.consistent is None else
                    ["null" if i + 1 in self.no_source_data else repr(x) for i, x in enumerate(v.consistent.tolist())])
            confs = [json.dumps(c) for c in self.confidences]
            for i, s in enumerate(q.sensors):
                if i + 1 in self.blank:
                    out.append((keys[i], f"{prefix}{s}{tail}{quality[i]}}}".encode()))
                    continue
                bounds = ",".join(f'{{"confidence":{c},"lower":{lows[j][i]!r},"upper":{ups[j][i]!r}}}'
                                  for j, c in enumerate(confs))
                out.append((keys[i], f'{prefix}{s},"estimate":{est[i]!r},"sd":{sd[i]!r},"bounds":[{bounds}]'
                                     f',"consistent":{cons[i]}{quality[i]}}}'.encode()))
        return out


class ShuffledEpsilon:
    """The central epsilon of an epoch's release, ``spec.shuffled_epsilon(mech, V, n, delta, release)``,
    cached per (query, version), release and ``n`` rounded DOWN to two significant digits: one call may
    take about a second, and epochs of one query see many nearby sizes. Rounding down is safe:
    the shuffled epsilon decreases as the shuffle grows, so the value at the rounded-down size
    is an upper bound of the value at the true size (never an understatement; at most ~10 %
    fewer reports assumed). Bounded: the cache is emptied past ``max_entries``.

    Thread-safe: the worker fills it off its event loop (:meth:`warm` in an executor) before the
    closed epochs are estimated, where :meth:`get` then only looks up."""

    def __init__(self, delta: float, max_entries: int = 4096) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"delta {delta} is not in (0, 1)")
        self.delta = delta
        self.max_entries = max_entries
        self._values: dict[tuple[str, int, int, str], float] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(q: Query, n: int, release: str = "permuted") -> tuple[str, int, int, str]:
        return q.query_id, q.version, round_down_2sig(n), release

    def cached(self, q: Query, n: int, release: str = "permuted") -> bool:
        return self.key(q, n, release) in self._values

    def get(self, q: Query, n: int, release: str = "permuted") -> float:
        """The shuffled epsilon of ``q``'s ``release`` at shuffle size ``n`` (computed now if not cached)."""
        k = self.key(q, n, release)
        value = self._values.get(k)
        if value is None:
            try:
                value = report_epsilon_shuffled(q.spec, q.build(), q.n_stations, k[2], release, self.delta,
                                                q.passages)
            except Exception:  # a bound that fails is published as null (NaN is not finite), never a crash
                log.exception("shuffled epsilon of %s at n=%d failed", q.record_key, k[2])
                value = math.nan  # cached too: not tried again on the event loop
            with self._lock:
                if len(self._values) >= self.max_entries:
                    self._values.clear()
                self._values[k] = value
        return value

    def warm(self, needed: Sequence[tuple[Query, int, str]]) -> None:
        """Compute what ``needed`` (query, shuffle size, release) lacks (call it off the event loop)."""
        for q, n, release in needed:
            self.get(q, n, release)


#: bounded codes of why an epoch is withheld (a metric label); the text says more
WITHHELD_CODES = ("conflicting_markers", "late", "participants_unknown", "missing_markers", "interrupted",
                  "no_reports", "below_min_crowd", "notes_refused", "release_mismatch", "too_few_participants",
                  "missing_batches", "impossible_counts", "internal")
IMPOSSIBLE_AT = 1e-9  # false-alarm rate per station of the plausibility check


def _declared(w: WindowState) -> list[int] | None:
    """Reports the markers say were sent per round (None without markers). Meaningful once the
    markers are complete, which is when the caller uses it."""
    k = w.producer_count()
    if k is None:
        return None
    out = [0] * w.n_rounds
    for (r, _, _), m in w.markers.items():
        out[r] += m.reports
    return out


def _withheld(w: WindowState, q: Query, participants: int | None, missing: list[int], n: int,
              min_participants: int, row_totals: npt.NDArray[np.int64],
              n_partitions: int) -> tuple[str, str] | None:
    if w.empty:  # opened by a gap (stream_app.worker.gaps): no record of this epoch arrived at all
        return "no_reports", ("no_reports: no producer wrote anything for this epoch (later epochs of the query "
                              "arrived; no record of this one did)")
    if w.conflicting:
        slots = ", ".join(f"round {r} producer {i} partition {p}" for r, i, p in sorted(w.conflicting)[:5])
        return "conflicting_markers", f"conflicting end-of-epoch markers for the same producer slot ({slots})"
    if w.born_late and w.closed_by != "markers":
        return "late", ("late: this epoch's first records arrived after the watermark had passed it, and its "
                        "end-of-epoch markers never completed it")
    if q.spec.per_sensor and participants is None:
        return "participants_unknown", "participants unknown: no end-of-epoch marker arrived"
    if missing:  # some producers' markers came, others' not: their reports may be missing too
        return "participants_unknown", f"participants unknown: no marker from producer(s) {missing[:10]}"
    if w.producer_count() is not None and not w.markers_complete(n_partitions):
        absent = w.missing_marker_slots(n_partitions)
        return "missing_markers", (f"{len(absent)} end-of-epoch marker(s) never arrived (round, producer, partition: "
                                   f"{absent[:5]}): batches sent to those partitions may be missing")
    if w.interrupted():
        return "interrupted", "epoch interrupted: a producer stopped in the middle of it"
    by_shuffler = w.withheld_by_producer()
    if by_shuffler == "no_reports":
        return "no_reports", "no_reports: the shuffler held no device report for this epoch"
    if by_shuffler == "notes_refused":
        return "notes_refused", ("notes_refused: the shuffler refused source notes that could have opened this "
                                 "epoch's window (unsigned, badly signed or from the future), so it released none "
                                 "of it")
    if by_shuffler == "release_mismatch":
        return "release_mismatch", ("release_mismatch: the query fixes another release than the shuffler's, which "
                                    "refused to serve it")
    if by_shuffler is not None:
        return "below_min_crowd", ("below_min_crowd: a round held fewer device reports than the shuffler's minimum "
                                   "crowd, so it released none of the epoch")
    if n < min_participants:
        return "too_few_participants", f"fewer than {min_participants} participating vehicles ({n})"
    if n > q.population:
        return "impossible_counts", f"impossible: {n} participants for a query over a population of {q.population}"
    if row_totals.size and int(row_totals.max()) > n:
        return "impossible_counts", (f"impossible counts: {int(row_totals.max())} reports in one round and "
                                     f"station for {n} participants (injected or replayed reports)")
    declared = _declared(w) if w.markers_complete(n_partitions) else None
    arrived = w.reports.tolist()
    if declared is not None and any(a > d for a, d in zip(arrived, declared, strict=True)):
        return "impossible_counts", (f"more reports arrived ({arrived}) than the producers' markers declare "
                                     f"({declared}): injected or re-sent reports")
    if w.missing_batches() or (declared is not None and arrived != declared):
        return "missing_batches", (f"{w.missing_batches()} batch(es) the markers announce never arrived "
                                   f"(reports {arrived} of {declared})")
    if not q.spec.per_sensor and participants is not None and any(a != participants for a in arrived):
        return "impossible_counts", (f"round reports {arrived} differ from the {participants} participants "
                                     f"(one report per vehicle and round)")
    return None


def retraction(q: Query, w: WindowState, confidences: Sequence[float]) -> EpochResult:
    """Withdraw a closed epoch's estimates: every station re-published as withheld, with the
    reason (a later marker contradicts the ones the epoch closed on). Subscribers keep the
    latest record per (query, epoch, station, estimator)."""
    participants, _ = w.participants()
    slots = ", ".join(f"round {r} producer {i} partition {p}" for r, i, p in sorted(w.conflicting)[:5])
    return EpochResult(query=q, epoch=w.wid.epoch, closed_by=w.closed_by or "markers",
                       confidences=tuple(confidences), participants=participants or 0,
                       reports=int(w.reports.sum()), round_reports=w.reports.tolist(), late=w.late,
                       refused=w.refused(), missing_batches=0, withheld_code="conflicting_markers", retracted=True,
                       span_s=q.span_s,
                       withheld=f"withdrawn: a later end-of-epoch marker contradicts the ones this epoch "
                                f"closed on ({slots})")


def epoch_result(qe: QueryEstimators, w: WindowState, closed_by: CloseReason, confidences: Sequence[float],
                 min_participants: int, n_partitions: int = 1, shuffled: ShuffledEpsilon | None = None) -> EpochResult:
    """Every station's estimate by every estimator of the query, for a closed window."""
    return epoch_results(qe, [(w, closed_by)], confidences, min_participants, n_partitions, shuffled)[0]


def _attested(q: Query, w: WindowState, n_partitions: int) -> tuple[int | None, str | None, str | None]:
    """(shuffle size, release, why null) of a closed window: the size and release its producers attest."""
    n, code = w.shuffle_size(n_partitions, q.spec.per_sensor)
    if n is None:
        return None, None, code
    release = w.release()
    return (n, release, None) if release is not None else (None, None, "mixed_release")


def _shuffled(q: Query, w: WindowState, n_partitions: int,
              shuffled: ShuffledEpsilon | None) -> tuple[float | None, str | None, str | None]:
    """(epsilon_shuffled, why null, release) of a closed window; all None without a cache."""
    if shuffled is None:
        return None, None, None
    n, release, code = _attested(q, w, n_partitions)
    if n is None or release is None:
        return None, code, None
    eps = shuffled.get(q, n, release)  # NaN when the bound failed: null, never a lost epoch
    return (eps if math.isfinite(eps) else None), None, release


def shuffle_needs(q: Query, windows: Sequence[WindowState], n_partitions: int,
                  shuffled: ShuffledEpsilon) -> list[tuple[Query, int, str]]:
    """The (query, shuffle size, release) the closing ``windows`` need and ``shuffled`` lacks."""
    out: list[tuple[Query, int, str]] = []
    for w in windows:
        n, release, _ = _attested(q, w, n_partitions)
        if n is not None and release is not None and not shuffled.cached(q, n, release):
            out.append((q, n, release))
    return out


def _round_reports(q: Query, w: WindowState) -> list[int]:
    """Reports per round as published. Station-valued: the reports counted. Per-sensor: the
    non-default answers counted -- what per-vehicle ``pairs`` carry, and what an exact tally (the
    shuffler's aggregate release, ``--mode tally``) holds beside its implied default answers -- so
    the figure does not depend on how the counts travelled."""
    if not q.spec.per_sensor:
        return [int(x) for x in w.reports]
    mech = q.build()
    default = q.spec.default_report(mech)
    c = w.counts.reshape(w.n_rounds, q.n_stations, mech.n_outputs)
    return [int(x) for x in c.sum(axis=(1, 2)) - c[:, :, default].sum(axis=1)]


def epoch_results(qe: QueryEstimators, closed: Sequence[tuple[WindowState, CloseReason]],
                  confidences: Sequence[float], min_participants: int, n_partitions: int = 1,
                  shuffled: ShuffledEpsilon | None = None) -> list[EpochResult]:
    """:func:`epoch_result` for several closed windows of one query version at once: the
    estimator arithmetic runs once on a ``(windows, stations)`` stack, not once per window
    (a backlog closes many epochs per batch; at few stations the per-call cost dominates).
    The results are identical to closing the windows one by one. With ``shuffled``, each
    result carries its epoch's shuffled epsilon (or why it is null)."""
    q = qe.query
    spec = q.spec
    mech = q.build()
    results: list[EpochResult] = []
    live: list[tuple[EpochResult, IntArray, int]] = []  # not withheld: (result, completed counts, n)
    for w, closed_by in closed:
        participants, missing = w.participants()
        # station-valued mechanisms send exactly one report per vehicle and round
        n = (participants or 0) if spec.per_sensor else max(participants or 0, *w.reports.tolist())
        row_totals = spec.row_totals(mech, q.n_stations, w.counts)
        why = _withheld(w, q, participants, missing, n, min_participants, row_totals, n_partitions)
        per_round = _round_reports(q, w)
        res = EpochResult(query=q, epoch=w.wid.epoch, closed_by=closed_by, confidences=tuple(confidences),
                          participants=n, reports=sum(per_round), round_reports=per_round,
                          late=w.late, refused=w.refused(), missing_batches=w.missing_batches(),
                          withheld=None if why is None else why[1], no_source_data=w.no_source_data(),
                          withheld_code=None if why is None else why[0], span_s=q.span_s,
                          # a span's flow over a reading gap: no number, as a rollup's ("Missing is not a flow")
                          blank=w.no_source_data() if q.is_span else frozenset())
        res.epsilon_shuffled, res.shuffle_null, res.release = _shuffled(q, w, n_partitions, shuffled)
        results.append(res)
        if why is None:
            live.append((res, spec.complete(mech, q.n_stations, w.counts, n), n))
    for start in range(0, len(live), _STACK):
        _estimate_stack(qe, live[start:start + _STACK], confidences)
    return results


_STACK = 32  # windows estimated together (bounded memory at thousands of stations)


def _estimate_stack(qe: QueryEstimators, live: Sequence[tuple[EpochResult, IntArray, int]],
                    confidences: Sequence[float]) -> None:
    spec = qe.query.spec
    counts = np.stack([c for _, c, _ in live])  # (k, V, R, O)
    ns = np.array([[n] for _, _, n in live], dtype=np.float64)  # (k, 1)
    head = qe.estimators[spec.headline]
    bad = ~head.consistent(head.estimate(counts, ns), ns, 1.0 - IMPOSSIBLE_AT)  # (k, V)
    values: dict[str, tuple[FloatArray, FloatArray, FloatArray, FloatArray]] = {}
    for name, est in qe.estimators.items():
        v = est.estimate(counts, ns)
        sd = np.sqrt(np.maximum(est.variance(np.maximum(v, 0.0), ns), 0.0))
        ints = [est.score_interval(v, ns, c) for c in confidences]
        values[name] = (v, sd, np.stack([lo for lo, _ in ints], axis=1), np.stack([hi for _, hi in ints], axis=1))
    finite = np.all(np.isfinite(np.stack([v for v, *_ in values.values()])), axis=(0, 2))  # (k,)
    consistent = {name: np.full_like(v, np.nan) for name, (v, *_) in values.items()}
    cap = ns * qe.query.passages  # the cap: every vehicle is at one station or none (a span's: at most P)
    for name, (v, *_) in values.items():
        consistent[name][finite] = project_capped_simplex(v[finite], cap[finite])
    for i, (res, _, n) in enumerate(live):
        if bad[i].any():
            res.withheld_code = "impossible_counts"
            res.withheld = (f"impossible counts at {int(bad[i].sum())} station(s) for {n} participants "
                            f"(p < {IMPOSSIBLE_AT:g} each): forged participants or injected reports")
            continue
        for name, (v, sd, lower, upper) in values.items():
            if not all(np.all(np.isfinite(a[i])) for a in (v, sd, lower, upper)):
                res.values.clear()
                res.withheld, res.withheld_code = "internal: a non-finite estimate", "internal"
                break
            res.values[name] = StationEstimates(v[i], sd[i], lower[i], upper[i], consistent[name][i])
        else:
            res.extra = spec.extra_statistics(qe.query.build(), n)
