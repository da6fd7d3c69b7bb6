"""Rollups: 5-minute and hourly sums of each station's per-epoch estimates. Pure policy and
state, as :mod:`stream_app.worker.windows` is for epochs.

A rollup is one ``(query id, version, span, first epoch)``, spans of :data:`SPANS` epochs
(10: 5 minutes, 120: an hour), aligned on the epoch clock (an hour rollup starts on a UTC
hour). When stage 2 has decided an epoch (published or withheld it) it sends an
:class:`~stream_app.worker.records.EpochSummary` -- the estimates and their variances, or why it was
withheld -- keyed by the epoch's hour (:func:`route_key`), so every rollup of an epoch lives on
one stage-2 partition, in the same changelog-backed table as the windows.

:class:`RollupPolicy` adds summaries to the rollups' states (:class:`RollupState`); a summary
of an epoch already added is ignored (a restarted stage 2 may send it twice), so the sums
neither lose nor double an epoch. Once every epoch of a rollup is decided the rollup is
*decided*: published as the sum of its epochs' estimates -- kept exactly (:func:`fixed_sum`), so the
sum is the same whatever order the epochs arrive in, and rounded to a float once --, sd from the summed variances
(the epochs' estimates are independent), bounds from the score interval of the sum
(:func:`rollup_result`; docs/statistics.md, "Rollups") -- or, if any epoch was withheld,
withheld with the first such epoch and its code. Its ``release`` is its epochs' (``permuted`` if
they disagree: the aggregate counts are a function of the permuted reports, so ``permuted``
bounds what was released of every epoch; null if any epoch's is null, as ``epsilon_shuffled``
is). An epoch withdrawn after its rollup was published withdraws the rollup too.

**Missing is not a flow.** A station without source data in any epoch of the rollup is
``no_source_data`` and published *without a number* (estimate, sd, bounds and consistent null):
its epochs without a reading carry no truth, so their estimates summed with the others' would
read as a flow over the whole span -- smaller by the missing epochs' traffic, with bounds that
hold no truth (docs/statistics.md, "Rollups"). A partial sum over the epochs with data was the
alternative; it reads as a flow just as easily when its count of epochs is overlooked.

Only 30-s queries are rolled up (:func:`rolls_up`): a span query's own estimate is its flow,
and a sum of its spans would add noise a longer span query avoids.

An epoch withheld ``no_reports`` (nothing arrived for it) holds nothing, so it does not end the
rollup's sums: it withholds the rollup with its reason, and if the epoch's data comes after all
(a gap's window opened afresh, :mod:`stream_app.worker.windows`), its new summary replaces it and the
rollup is decided again -- published when nothing else withholds it.

>>> import numpy as np
>>> from stream_app.worker.records import EpochSummary
>>> def summary(epoch, est):
...     a = np.array([est])
...     return EpochSummary("q", 1, epoch, "markers", None, None, False, 40, 40, (40,), 0, 0, 0, None, (), ("rr",),
...                         a, a * 0 + 4.0)
>>> policy = RollupPolicy(spans=(2,))
>>> out = policy.apply(lambda rid: None, [summary(10, [1.0, 2.0])])
>>> out.decided
[]
>>> held = {rid: st for rid, st in out.touched.items()}
>>> out = policy.apply(held.get, [summary(11, [3.0, 5.0]), summary(10, [1.0, 2.0])])
>>> [(st.rid.start, st.rid.span_s, st.estimate.tolist(), st.variance.tolist()) for st in out.decided]
[(10, 60, [[4.0, 7.0]], [[8.0, 8.0]])]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from schemas import Query
from schemas.epochs import EPOCH_S
from schemas.wire import FRAME_LENGTH

from .estimate import EpochResult, QueryEstimators, StationEstimates
from .records import EpochSummary

__all__ = ["FIXED_BITS", "SPANS", "RollupId", "RollupOutcome", "RollupPolicy", "RollupState", "Window", "add_fixed",
           "fixed_sum", "from_fixed", "rollup_result", "rolls_up", "route_key", "summary_of", "version_window"]

FloatArray = npt.NDArray[np.float64]
SPANS = (10, 120)  # epochs per rollup: 5 minutes, an hour
HOUR = 120
_PREFIX = b"__ru__\x1f"
_STATE_MAGIC = b"PTR1"
_CLOSE_ORDER = ("markers", "wall_clock", "watermark")  # a rollup's closed_by: the weakest of its epochs'
# a rollup's release: the most revealing of its epochs' (the aggregate counts are a function of the permuted reports)
_RELEASE_ORDER = ("aggregate", "permuted")


@dataclass(frozen=True)
class RollupId:
    """(query id, version, span in epochs, first epoch): the key of a rollup."""

    query_id: str
    query_version: int
    span: int
    start: int

    @property
    def key(self) -> bytes:
        """Table key (a prefix no window key has: a window key starts with the query id)."""
        return _PREFIX + f"{self.query_id}\x1f{self.query_version}\x1f{self.span}\x1f{self.start}".encode()

    @property
    def span_s(self) -> int:
        return self.span * EPOCH_S


def rollups_of(query_id: str, version: int, epoch: int, spans: Sequence[int] = SPANS) -> list[RollupId]:
    """The rollups an epoch belongs to, one per span."""
    return [RollupId(query_id, version, s, epoch - epoch % s) for s in spans]


FIXED_BITS = 48  # a rollup's sums are kept exactly, in units of 2**-48 (fixed_sum)
_LIMB = 62  # an exact sum is hi * 2**62 + lo, 0 <= lo < 2**62, two int64 limbs (room for a carry)
_LOW = np.int64((1 << _LIMB) - 1)
_FIXED_LIMIT = 2.0 ** 64  # the largest summand taken: its hi limb stays below 2**51
FixedSums = npt.NDArray[np.int64]  # (2, *shape): the hi and lo limbs


def fixed_sum(x: npt.ArrayLike) -> FixedSums:
    """``x`` as exact integers in units of ``2**-FIXED_BITS`` (each value floored to that grid, the
    only rounding: 3.6e-15 vehicles), held as two int64 limbs ``(hi, lo)``. Adding these
    (:func:`add_fixed`) is exact integer addition, so a rollup's sums are the same bits whatever
    order its epochs arrive in; :func:`from_fixed` turns a sum into floats once.

    >>> a, b, c = 0.1, 0.2, 0.3
    >>> (a + b) + c == a + (b + c)  # floats: the order shows in the last bits
    False
    >>> x, y, z = fixed_sum([a]), fixed_sum([b]), fixed_sum([c])
    >>> from_fixed(add_fixed(add_fixed(x, y), z)) == from_fixed(add_fixed(x, add_fixed(y, z)))
    array([ True])
    >>> from_fixed(fixed_sum([-2.5, 1e9, 0.0])).tolist()
    [-2.5, 1000000000.0, 0.0]
    """
    v = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(v)) or np.any(np.abs(v) >= _FIXED_LIMIT):
        raise ValueError(f"a rollup sums finite values below {_FIXED_LIMIT:g} in magnitude")
    m, e = np.frexp(v)  # v = m * 2**e exactly, |m| in [0.5, 1)
    mant = (m * 2.0 ** 53).astype(np.int64)  # exact: m has 53 bits
    k = e.astype(np.int64) - 53 + FIXED_BITS  # v * 2**FIXED_BITS = mant * 2**k
    up = np.clip(k, 0, 63)
    # k >= 0: mant * 2**k; its low limb from the wrapped shift (the low bits survive a wrap), its
    # high limb by an arithmetic (flooring) shift; k < 0: floor(mant / 2**-k), a shift that saturates
    shifted = np.where(k >= 0, np.left_shift(mant, up), np.right_shift(mant, np.clip(-k, 0, 63)))
    lo = shifted & _LOW
    hi = np.where(k >= 0,
                  np.where(k <= _LIMB, np.right_shift(mant, np.clip(_LIMB - k, 0, 63)),
                           np.left_shift(mant, np.clip(k - _LIMB, 0, 63))),
                  np.right_shift(shifted, _LIMB))
    lo = np.where((k >= 0) & (k >= _LIMB), 0, lo)
    return np.stack([hi, lo]).astype(np.int64)


def add_fixed(a: FixedSums, b: FixedSums) -> FixedSums:
    """The exact sum of two :func:`fixed_sum` values (the low limb's carry moved up)."""
    lo = a[1] + b[1]  # < 2**63: no overflow
    return np.stack([a[0] + b[0] + np.right_shift(lo, _LIMB), lo & _LOW])


def from_fixed(a: FixedSums) -> FloatArray:
    """Floats of exact sums: a function of the sums alone, so order-free. The low limb is taken
    in ``[-2**61, 2**61)`` (a sum below 8,192 vehicles in magnitude is one limb: rounded once,
    to within 1e-12 vehicles) and added to the high one's exact float (within an ulp or so)."""
    neg = a[1] >= (1 << (_LIMB - 1))
    hi = (a[0] + neg).astype(np.float64) * 2.0 ** (_LIMB - FIXED_BITS)
    lo = (a[1] - np.where(neg, np.int64(1 << _LIMB), np.int64(0))).astype(np.float64) * 2.0 ** -FIXED_BITS
    out: FloatArray = hi + lo
    return out


def rolls_up(q: Query) -> bool:
    """Whether ``q``'s decided epochs feed rollups: 30-s queries only (the module doc)."""
    return not q.is_span


def route_key(s: EpochSummary) -> bytes:
    """The partials-topic key of an epoch's summary: its query and hour (not its version), so
    that all the rollups it feeds (every span divides an hour), and those of the query's other
    versions in that hour, are on one stage-2 partition."""
    return _PREFIX + f"{s.query_id}\x1f{s.epoch - s.epoch % HOUR}".encode()


Window = Callable[[str, int], "tuple[int, int] | None"]


def version_window(known: Callable[[str, int], Query | None], query_id: str, version: int) -> tuple[int, int] | None:
    """The epochs ``[first, end)`` in which a query version is the one answered, as far as the
    known versions tell (``schemas.query.active_queries``): its own window, cut where a newer
    version's starts. None if the version is unknown.

    >>> from datetime import UTC, datetime, timedelta
    >>> t0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
    >>> v1 = Query(query_id="q", analyst_id="a", version=1, sensors=(1,), mechanism="rr", population=9,
    ...            t_start=t0, t_end=t0 + timedelta(hours=2))
    >>> v2 = v1.model_copy(update={"version": 2, "t_start": t0 + timedelta(minutes=7)})
    >>> versions = {1: v1, 2: v2}
    >>> first, end = version_window(lambda q, v: versions.get(v), "q", 1)
    >>> end - first  # seven minutes, then version 2
    14
    """
    q = known(query_id, version)
    if q is None:
        return None
    first, end = q.epoch_range()
    later = version + 1
    while (w := known(query_id, later)) is not None:
        end = min(end, -(-int(w.t_start.timestamp()) // EPOCH_S))  # from its first epoch starting at/after T_start
        later += 1
    return first, max(first, end)


def summary_of(res: EpochResult) -> EpochSummary:
    """What a decided epoch's result contributes to its rollups."""
    q = res.query
    names = tuple(q.spec.estimator_names)
    live = res.withheld is None and not res.retracted
    est = np.stack([res.values[n].estimate for n in names]) if live else np.zeros((0, 0))
    var = np.stack([np.square(res.values[n].sd) for n in names]) if live else np.zeros((0, 0))
    return EpochSummary(q.query_id, q.version, res.epoch, res.closed_by, res.withheld_code, res.withheld,
                        res.retracted, res.participants, res.reports, tuple(res.round_reports), res.late,
                        res.refused, res.missing_batches, res.epsilon_shuffled, tuple(sorted(res.no_source_data)),
                        names, est.astype(np.float64), var.astype(np.float64), res.release)


@dataclass
class RollupState:
    """The running sums of one rollup. ``estimate``/``variance`` are ``(estimators, stations)``
    (None before a published epoch arrives, and once the rollup is decided or withheld)."""

    rid: RollupId
    done: list[bool]  # per epoch of the span: decided and added
    estimators: tuple[str, ...] = ()
    # the exact sums of the epochs' estimates and variances, in units of 2**-FIXED_BITS (fixed_sum):
    # integer addition does not depend on the order the epochs arrive in
    sums: tuple[FixedSums, FixedSums] | None = None
    no_source: list[int] = field(default_factory=list)  # station indices (1..V), sorted
    participants: int = 0
    reports: int = 0
    round_reports: list[int] = field(default_factory=list)
    late: int = 0
    refused: int = 0
    missing_batches: int = 0
    epsilon_shuffled: float | None = None
    unshuffled: bool = False  # some epoch had no shuffled epsilon: the rollup's is null
    release: str | None = None  # the most revealing of its epochs' releases (_RELEASE_ORDER)
    unreleased: bool = False  # some epoch had no attested release: the rollup's is null
    closed_by: str = "markers"
    withheld: tuple[int, str, str] | None = None  # (epoch, code, reason) of the first withheld epoch
    withheld_epochs: int = 0
    empty: dict[int, str] = field(default_factory=dict)  # epoch offset -> why, of epochs withheld no_reports
    decided: bool = False  # every epoch decided and the rollup's outcome emitted
    published: bool = False  # decided and published (not withheld)
    retracted: bool = False

    @classmethod
    def new(cls, rid: RollupId) -> RollupState:
        return cls(rid, [False] * rid.span)

    @property
    def estimate(self) -> FloatArray | None:
        """The summed estimates ``(estimators, stations)``: the exact sum, rounded once (None: no sums held)."""
        return None if self.sums is None else from_fixed(self.sums[0])

    @property
    def variance(self) -> FloatArray | None:
        """The summed variances, as :attr:`estimate`."""
        return None if self.sums is None else from_fixed(self.sums[1])

    def add(self, s: EpochSummary) -> bool:
        """Add an epoch's summary; False if it changed nothing (a duplicate)."""
        i = s.epoch - self.rid.start
        if not 0 <= i < self.rid.span:
            raise ValueError(f"epoch {s.epoch} is not in rollup {self.rid}")
        if s.retracted:
            self.done[i] = True
            return self._withhold(s, retract=True)
        if s.withheld_code == "no_reports":  # holds nothing: kept apart, the sums stay (the module doc)
            if self.done[i]:
                return False
            self.done[i] = True
            self.empty[i] = s.withheld or "no_reports"
            return True
        if self.done[i] and self.empty.pop(i, None) is None:
            return False
        self.done[i] = True
        self.participants += s.participants
        self.reports += s.reports
        self.round_reports = [a + b for a, b in zip(self.round_reports or [0] * len(s.round_reports),
                                                    s.round_reports, strict=True)]
        self.late += s.late
        self.refused += s.refused
        self.missing_batches += s.missing_batches
        if s.epsilon_shuffled is None:
            self.unshuffled = True
        else:
            self.epsilon_shuffled = max(self.epsilon_shuffled or 0.0, s.epsilon_shuffled)
        if s.release is None:
            self.unreleased = True
        elif self.release is None or _RELEASE_ORDER.index(s.release) > _RELEASE_ORDER.index(self.release):
            self.release = s.release
        if _CLOSE_ORDER.index(s.closed_by) > _CLOSE_ORDER.index(self.closed_by):
            self.closed_by = s.closed_by
        if s.withheld is not None:
            return self._withhold(s, retract=False)
        if self.withheld is None:
            if self.sums is None:
                self.estimators = s.estimators
                self.sums = fixed_sum(s.estimate), fixed_sum(s.variance)
            elif s.estimators != self.estimators or s.estimate.shape != self.sums[0].shape[1:]:
                raise ValueError(f"epoch {s.epoch} has estimators {s.estimators} of shape {s.estimate.shape}; "
                                 f"rollup {self.rid} has {self.estimators} of shape {self.sums[0].shape[1:]}")
            else:
                self.sums = (add_fixed(self.sums[0], fixed_sum(s.estimate)),
                             add_fixed(self.sums[1], fixed_sum(s.variance)))
            if s.no_source_data:
                self.no_source = sorted(set(self.no_source) | set(s.no_source_data))
        return True

    def _withhold(self, s: EpochSummary, retract: bool) -> bool:
        code = s.withheld_code or "internal"
        why = s.withheld or code
        first = self.withheld is None or s.epoch < self.withheld[0]
        if retract:
            if self.withheld is not None and self.withheld[0] == s.epoch and self.withheld[1] == code:
                return False  # this epoch's withdrawal is already held
            self.retracted = self.published
            self.published = False
        else:
            self.withheld_epochs += 1
        if first or retract:
            self.withheld = (s.epoch, code, why)
        self.sums = None  # nothing of it will be published
        return True

    def outside(self, first: int, end: int) -> bool:
        """Mark the epochs outside the version's ``[first, end)`` as decided and withhold the
        rollup for them (they will never come); True if that changed anything."""
        lo, hi = self.rid.start, self.rid.start + self.rid.span
        gone = [i for i in range(self.rid.span) if not self.done[i] and not first <= lo + i < end]
        if not gone:
            return False
        for i in gone:
            self.done[i] = True
        e = lo + gone[0]
        if self.withheld is None or e < self.withheld[0]:
            why = f"{len(gone)} of its epochs [{lo}, {hi}) are outside the query version's [{first}, {end})"
            self.withheld = (e, "outside_query_window", why)
        self.withheld_epochs += 1
        self.sums = None
        return True

    @property
    def complete(self) -> bool:
        return all(self.done)

    def first_withheld(self) -> tuple[int, str, str] | None:
        """(epoch, code, reason) of the first epoch that withholds the rollup (None: none does)."""
        gaps = [(self.rid.start + i, "no_reports", why) for i, why in self.empty.items()]
        return min([*gaps, *([] if self.withheld is None else [self.withheld])], default=None)

    def reason(self) -> str | None:
        """Why the rollup is withheld (None: it is not)."""
        first = self.first_withheld()
        if first is None:
            return None
        epoch, code, why = first
        n = self.withheld_epochs + len(self.empty)
        more = f" (and {n - 1} more of its epochs)" if n > 1 else ""
        return f"epoch {epoch} withheld{more}: {code}: {why}"

    # -- binary encoding ----------------------------------------------------------------------
    def encode(self) -> bytes:
        r = self.rid
        head = {"q": r.query_id, "v": r.query_version, "span": r.span, "start": r.start,
                "done": sum(1 << i for i, d in enumerate(self.done) if d), "estimators": list(self.estimators),
                "no_source": self.no_source, "participants": self.participants, "reports": self.reports,
                "round_reports": self.round_reports, "late": self.late, "refused": self.refused,
                "missing_batches": self.missing_batches, "epsilon_shuffled": self.epsilon_shuffled,
                "unshuffled": self.unshuffled, "release": self.release, "unreleased": self.unreleased,
                "closed_by": self.closed_by,
                "withheld": None if self.withheld is None else list(self.withheld),
                "withheld_epochs": self.withheld_epochs, "empty": sorted(self.empty.items()),
                "decided": self.decided, "published": self.published,
                "retracted": self.retracted, "shape": None}
        blob = b""
        if self.sums is not None and (not self.decided or self.empty):
            head["shape"] = list(self.sums[0].shape[1:])
            head["fixed"] = FIXED_BITS  # the sums' unit (a state written before: float64 sums)
            blob = b"".join(np.ascontiguousarray(a, "<i8").tobytes() for a in self.sums)
        h = json.dumps(head, separators=(",", ":")).encode()
        return b"".join([_STATE_MAGIC, FRAME_LENGTH.pack(len(h)), h, blob])

    @classmethod
    def decode(cls, data: bytes) -> RollupState:
        if data[:4] != _STATE_MAGIC:
            raise ValueError("not a rollup state")
        (hlen,) = FRAME_LENGTH.unpack_from(data, 4)
        h = json.loads(data[8:8 + hlen])
        rid = RollupId(h["q"], int(h["v"]), int(h["span"]), int(h["start"]))
        st = cls(rid, [bool(h["done"] >> i & 1) for i in range(rid.span)], tuple(h["estimators"]),
                 no_source=list(h["no_source"]), participants=h["participants"], reports=h["reports"],
                 round_reports=list(h["round_reports"]), late=h["late"], refused=h["refused"],
                 missing_batches=h["missing_batches"], epsilon_shuffled=h["epsilon_shuffled"],
                 unshuffled=h["unshuffled"], closed_by=h["closed_by"],
                 # a state written before the release fields: the release of the epochs it holds is unknown
                 release=h.get("release"), unreleased=h.get("unreleased", h["done"] != 0),
                 withheld=None if h["withheld"] is None else
                 (int(h["withheld"][0]), str(h["withheld"][1]), str(h["withheld"][2])),
                 withheld_epochs=h["withheld_epochs"], empty={int(i): str(w) for i, w in h.get("empty", [])},
                 decided=h["decided"], published=h["published"],
                 retracted=h["retracted"])
        if h["shape"] is not None:
            shape = tuple(h["shape"])
            size = shape[0] * shape[1]
            off = 8 + hlen
            if h.get("fixed") == FIXED_BITS:
                whole = np.frombuffer(data, "<i8", 4 * size, off).astype(np.int64).reshape(2, 2, *shape)
                st.sums = whole[0], whole[1]
            else:  # float64 sums, from before the exact ones
                est = np.frombuffer(data, "<f8", size, off).reshape(shape)
                var = np.frombuffer(data, "<f8", size, off + 8 * size).reshape(shape)
                st.sums = fixed_sum(est), fixed_sum(var)
        return st


@dataclass
class RollupOutcome:
    """What one batch of summaries did: the states to write, the rollups decided now (publish
    or withhold each once) and the published rollups now withdrawn."""

    touched: dict[RollupId, RollupState] = field(default_factory=dict)
    decided: list[RollupState] = field(default_factory=list)
    retracted: list[RollupState] = field(default_factory=list)


@dataclass(frozen=True)
class RollupPolicy:
    """Adds epoch summaries to rollups and decides them (the module doc). Pure."""

    spans: tuple[int, ...] = SPANS

    def apply(self, load: Callable[[RollupId], RollupState | None], items: Sequence[EpochSummary],
              window: Window | None = None) -> RollupOutcome:
        """Add ``items``; ``window`` (:func:`version_window`) gives a version's epochs: a rollup
        reaching outside them is withheld once its epochs inside are decided (the others never
        come), also for the older versions of the query a newer one cuts short."""
        out = RollupOutcome()

        def decide(st: RollupState, redecide: bool = False) -> None:
            out.touched[st.rid] = st
            if st.complete and (not st.decided or redecide):
                st.decided = True
                st.published = st.first_withheld() is None
                out.decided.append(st)

        for s in items:
            for rid in rollups_of(s.query_id, s.query_version, s.epoch, self.spans):
                st = out.touched.get(rid) or load(rid) or RollupState.new(rid)
                was_published = st.published
                superseding = st.decided and s.epoch - rid.start in st.empty and s.withheld_code != "no_reports"
                span = window(s.query_id, s.query_version) if window is not None else None
                changed = st.add(s)
                changed = (span is not None and not st.decided and st.outside(*span)) or changed
                if not changed:
                    continue
                out.touched[rid] = st
                if st.decided and not superseding:
                    if was_published and st.retracted:
                        out.retracted.append(st)
                    continue
                decide(st, redecide=superseding)
                if window is None:
                    continue
                for v in range(1, s.query_version):  # the older versions' rollup here: cut short by this one?
                    old = RollupId(s.query_id, v, rid.span, rid.start)
                    prev = out.touched.get(old) or load(old)
                    older = window(s.query_id, v)
                    if prev is not None and older is not None and not prev.decided and prev.outside(*older):
                        decide(prev)
        return out


def rollup_result(qe: QueryEstimators, st: RollupState, confidences: Sequence[float]) -> EpochResult:
    """A decided rollup as an estimate result (rendered as rows and frames like an epoch's):
    ``epoch`` its first epoch, ``span_s`` its length, ``release`` its epochs'; per estimator the summed estimates, the
    sd of the summed variances, and the score interval of the sum at ``participants`` summed
    over its epochs (docs/statistics.md, "Rollups"). A station with an epoch of no source data
    is published without a number (``blank``: its truth over the span is unknown, and the sum
    would read as a flow; the module doc)."""
    q = qe.query
    res = EpochResult(query=q, epoch=st.rid.start, closed_by=st.closed_by,  # type: ignore[arg-type]
                      confidences=tuple(confidences), participants=st.participants, reports=st.reports,
                      round_reports=list(st.round_reports), late=st.late, refused=st.refused,
                      missing_batches=st.missing_batches, withheld=st.reason(),
                      withheld_code=None if (first := st.first_withheld()) is None else first[1],
                      no_source_data=frozenset(st.no_source), retracted=st.retracted, span_s=st.rid.span_s,
                      epsilon_shuffled=None if st.unshuffled else st.epsilon_shuffled,
                      release=None if st.unreleased else st.release, blank=frozenset(st.no_source))
    sums, variances = st.estimate, st.variance  # each converts the whole (k, V) fixed-point sums: once
    if res.withheld is not None or sums is None or variances is None:
        if res.withheld is None:
            res.withheld, res.withheld_code = "internal: a rollup without sums", "internal"
        return res
    n = float(st.participants)
    blank = np.array(sorted(st.no_source), dtype=np.int64) - 1
    for j, name in enumerate(st.estimators):
        est = qe.estimators[name]
        total = sums[j]
        sd = np.sqrt(np.maximum(variances[j], 0.0))
        ints = [est.score_interval(total, n, c) for c in confidences]
        lower, upper = np.stack([lo for lo, _ in ints]), np.stack([hi for _, hi in ints])
        for a in (total, sd, lower.T, upper.T):  # no number where a station had no source data
            a[blank] = np.nan
        res.values[name] = StationEstimates(total, sd, lower, upper, None)
    return res
