"""Epoch windows: state as plain arrays, and a pure policy that decides when they close.

A window is one ``(query id, version, epoch)``. Its state (:class:`WindowState`) holds the
summed count arrays of every round (per-partition partial counts simply add: the merge is
addition, which is what lets one or many workers, and a restart, give the same numbers),
the batch ids seen (deduplication) and the producers' end-of-epoch markers.

:class:`WindowPolicy` is pure (quix-streams' ``process_window``): given the watermark state,
a way to load windows and a batch of stage records, it returns the windows it updated and
the ones that closed, with the reason. An epoch closes when

1. end-of-epoch markers from every producer have arrived from every source partition for
   every round, and every batch they announce has arrived too ("markers": a batch that a
   broker's retry put behind its producer's markers is waited for; one that never comes
   leaves the epoch to the watermark, withheld as ``missing_batches``), or
2. the event-time watermark -- the smallest, over source partitions, of the newest epoch
   seen from it, and, when the markers name several producers (shuffler instances each write
   to every partition), over every producer's newest marker on every partition, so that the
   fastest instance does not pass the epochs a slower one is still releasing (a producer the
   markers name that never marks holds it back: rule 4 then closes) -- has passed the epoch
   by more than the allowed lateness, and the window has
   been idle (no record added) for ``watermark_idle_s`` of the workers' tick clock
   ("watermark"), or
3. for live data, a wall-clock grace after the epoch's end has passed ("wall_clock"), or
4. the stream stalled: the window has received nothing for ``stall_close_s`` of the tick
   clock (a producer died before it marked the epoch and nothing later comes to move the
   watermark past it): it closes as by the watermark, and its incomplete markers withhold it
   -- no epoch is left without an outcome ("watermark"),

whichever comes first. After closing only a small record stays (to count late records).

**Spans.** A query with a longer ``span_s`` has one window per span, keyed by its first epoch
(stage 1 dead-letters any other as ``misaligned_span``). Rule 1 is unchanged; rules 2-4 and
``born_late`` read the span's *last* epoch (first + epochs per span - 1) where an epoch's is read.
The Faust agent only reads, calls, writes and emits.

**No epoch disappears.** The watermark is made of claims a writer controls: well-formed
markers far ahead (inside the horizon) on every partition move it at once. Two rules keep that
from erasing epochs whose genuine data is still arriving:

* a window the watermark has passed closes only once it has been *idle* for
  ``watermark_idle_s`` (measured by the :class:`~stream_app.worker.records.Tick` records every worker
  sends, so it is part of the partition's data and survives restarts): genuine data still
  flowing into it keeps it open until its markers complete it;
* records of an epoch the watermark passed before any of its data arrived here open a window
  all the same (``born_late``). It closes by its markers like any other (then it is published
  as usual), or, idle and incomplete, by the watermark -- and is then withheld as ``late``.
  Either way the epoch has an outcome; it is never dropped as "late" without one.

**No epoch absent.** A :class:`~stream_app.worker.records.Gap` (stage 1 saw a source partition skip
the epoch, :mod:`stream_app.worker.gaps`) opens an ``empty`` window and does nothing else: no counts,
no markers, no claim on the watermark, no idle time reset; none when the record that revealed
it lies beyond the horizon (that record is refused). An empty window of an epoch that has not
ended by the tick clock closes only by the wall clock (rule 3), never by rules 2 or 4: a
forged live record far ahead does not make future epochs ``no_reports``. Nothing more
arriving, it closes by the rules above and is withheld ``no_reports``. The first real record
of an empty window opens it afresh, as if the gap had never come (``born_late`` decided then),
even once it closed: a gap made by a forged record far ahead cannot change the outcome of a
genuine epoch (its ``no_reports`` is superseded by the epoch's own outcome).

>>> import numpy as np
>>> from stream_app.worker.records import BatchPartial, MarkerPartial
>>> policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=2)
>>> wm = Watermarks()
>>> b = BatchPartial("q", 1, 7, 0, 0, "p", "a" * 32, 2, True, np.array([1, 1]))
>>> m = MarkerPartial("q", 1, 7, 0, 0, "p", 0, 1, 2, 1, 2, 0, False)
>>> out = policy.apply(wm, lambda w: None, lambda w: (1, 2), [b, m])
>>> [(s.wid.epoch, reason) for s, reason in out.closed]
[(7, 'markers')]
>>> out.closed[0][0].closed_by
'markers'
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S
from schemas.wire import FRAME_LENGTH

from .records import BatchPartial, Gap, MarkerPartial, Partial, Tick, WindowId

__all__ = ["SHUFFLE_NULL_CODES", "CloseReason", "Marker", "Outcome", "Watermarks", "WindowPolicy", "WindowState"]

IntArray = npt.NDArray[np.int64]
CloseReason = Literal["markers", "watermark", "wall_clock"]
_STATE_MAGIC = b"PTW1"


@dataclass(frozen=True)
class Marker:
    producer_id: str
    producer_count: int
    batches: int
    reports: int
    participants: int
    refused: int
    interrupted: bool
    readings_missing: tuple[int, ...] = ()
    shuffle_size: int | None = None  # attested by a shuffler (None: not attested)
    release: str | None = None  # what that shuffler released, "permuted" or "aggregate" (None: not said)
    withheld: str | None = None  # a shuffler withheld the epoch: "no_reports" or "below_min_crowd"


def _order(m: Marker) -> tuple[Any, ...]:
    """A total order on markers (``astuple``, with an absent shuffle size, release or withheld
    reason below any)."""
    return (*astuple(m)[:-3], -1 if m.shuffle_size is None else m.shuffle_size, m.release or "", m.withheld or "")


#: why an epoch's shuffled epsilon is null (a metric label): no producer's attestation for some
#: (round, producer) -- the direct path --, an attested size above what that producer released, or
#: producers that attest different releases (shufflers run with different ``--release``)
SHUFFLE_NULL_CODES = ("not_attested", "exceeds_released", "mixed_release")

MarkerSlot = tuple[int, int, int]  # (round, producer index, source partition)


def _decoded_marker(f: list[Any]) -> Marker:
    # state written before a field existed has fewer entries: readings_missing (7), shuffle_size (8),
    # release (9), withheld (10)
    return Marker(str(f[0]), int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), bool(f[6]),
                  tuple(int(i) for i in f[7]) if len(f) > 7 else (),
                  int(f[8]) if len(f) > 8 and f[8] is not None else None,
                  str(f[9]) if len(f) > 9 and f[9] is not None else None,
                  str(f[10]) if len(f) > 10 and f[10] is not None else None)


def _marker(p: MarkerPartial) -> Marker:
    return Marker(p.producer_id, p.producer_count, p.batches, p.reports, p.participants, p.refused, p.interrupted,
                  tuple(p.readings_missing), p.shuffle_size, p.release, p.withheld)


@dataclass
class WindowState:
    """The state of one (query, version, epoch)."""

    wid: WindowId
    n_rounds: int
    width: int
    counts: IntArray
    reports: IntArray  # (R,) reports counted per round
    tallied: IntArray  # (R,) vehicles counted by exact tallies per round
    seen: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # batch id -> (round, producer, partition)
    markers: dict[MarkerSlot, Marker] = field(default_factory=dict)
    conflicting: set[MarkerSlot] = field(default_factory=set)
    closed_by: CloseReason | None = None
    late: int = 0
    duplicates: int = 0
    published: bool = False  # closed and its estimates were published (not withheld)
    born_late: bool = False  # opened after the watermark had passed its epoch
    empty: bool = False  # opened by a Gap and nothing else (no producer wrote anything for it)
    span: int = 1  # epochs the window covers: its query's epochs_per_span (wid.epoch is the span's first)
    retract: bool = False  # transient: a closed epoch's published estimates must be withdrawn

    @classmethod
    def new(cls, wid: WindowId, n_rounds: int, width: int, span: int = 1) -> WindowState:
        if span < 1:
            raise ValueError(f"a window spans at least one epoch, not {span}")
        return cls(wid, n_rounds, width, np.zeros((n_rounds, width), dtype=np.int64),
                   np.zeros(n_rounds, dtype=np.int64), np.zeros(n_rounds, dtype=np.int64), span=span)

    @property
    def last_epoch(self) -> int:
        """The last 30-s epoch the window covers (its own epoch, or its span's last)."""
        return self.wid.epoch + self.span - 1

    @property
    def closed(self) -> bool:
        return self.closed_by is not None

    # -- accumulate ------------------------------------------------------------------------
    def add(self, p: BatchPartial | MarkerPartial) -> Literal["added", "duplicate", "late"]:
        """Add a batch or a marker; duplicates (same batch id / same marker) count once."""
        if self.closed:
            self.late += 1
            if isinstance(p, MarkerPartial):
                slot = (p.round, p.producer_index, p.source_partition)
                held = self.markers.get(slot)
                if held is not None and held != _marker(p) and slot not in self.conflicting:
                    # The epoch closed on a marker set that a later, different marker for the
                    # same slot contradicts (e.g. forged markers that completed the set before
                    # the producer's own): what was published must be withdrawn, once.
                    self.retract = self.published and not self.conflicting
                    self.conflicting.add(slot)
            return "late"
        if isinstance(p, BatchPartial):
            if p.batch_id in self.seen:
                self.duplicates += 1
                return "duplicate"
            if p.counts.shape != (self.width,) or not 0 <= p.round < self.n_rounds:
                raise ValueError(f"batch of width {p.counts.size} round {p.round} for a window of width "
                                 f"{self.width} with {self.n_rounds} rounds")
            self.seen[p.batch_id] = (p.round, p.producer_id, p.source_partition)
            self.counts[p.round] += p.counts
            self.reports[p.round] += p.reports
            if p.tallied:
                self.tallied[p.round] += p.reports
            return "added"
        slot = (p.round, p.producer_index, p.source_partition)
        marker = _marker(p)
        held = self.markers.get(slot)
        if held is not None:
            if held == marker:
                self.duplicates += 1
                return "duplicate"
            # Two different markers claim the same producer slot: neither wins by order; the
            # epoch is withheld with the reason (estimate.py). The slot keeps the smaller of
            # the two (a fixed rule), so what the withheld epoch still reports (participants,
            # refused, missing batches) and the stored state do not depend on arrival order.
            self.conflicting.add(slot)
            self.markers[slot] = min(held, marker, key=_order)
            return "added"
        self.markers[slot] = marker
        return "added"

    # -- what the markers say -------------------------------------------------------------
    def producer_count(self) -> int | None:
        counts = {m.producer_count for m in self.markers.values()}
        return max(counts) if counts else None

    def markers_complete(self, n_partitions: int) -> bool:
        k = self.producer_count()
        if k is None or len(self.markers) < self.n_rounds * k * n_partitions:  # cheap necessary test
            return False
        return all((r, i, p) in self.markers
                   for r in range(self.n_rounds) for i in range(k) for p in range(n_partitions))

    def missing_marker_slots(self, n_partitions: int) -> list[tuple[int, int, int]]:
        """The (round, producer, partition) slots whose marker has not arrived (markers known)."""
        k = self.producer_count() or 0
        return [(r, i, p) for r in range(self.n_rounds) for i in range(k) for p in range(n_partitions)
                if (r, i, p) not in self.markers]

    def participants(self) -> tuple[int | None, list[int]]:
        """(vehicles that answered, producer indices without a round-0 marker)."""
        per_producer = {i: m.participants for (r, i, _), m in self.markers.items() if r == 0}
        missing = [i for i in range(self.producer_count() or 0) if i not in per_producer]
        return (sum(per_producer.values()) if per_producer else None), missing

    def no_source_data(self) -> frozenset[int]:
        """Station indices whose source reading the producers say is missing (replays only)."""
        return frozenset(i for (r, _, _), m in self.markers.items() if r == 0 for i in m.readings_missing)

    def interrupted(self) -> bool:
        """A producer stopped in the middle of this epoch (its markers say so)."""
        return any(m.interrupted for m in self.markers.values())

    def refused(self) -> int:
        return sum({i: m.refused for (r, i, _), m in self.markers.items() if r == 0}.values())

    def missing_batches(self) -> int:
        """Batches the markers announce per (producer, partition, round) but that never came."""
        seen: Counter[tuple[int, str, int]] = Counter(self.seen.values())
        return sum(max(0, m.batches - seen[(r, m.producer_id, p)]) for (r, _, p), m in self.markers.items())

    def shuffle_size(self, n_partitions: int, per_sensor: bool) -> tuple[int | None, str | None]:
        """``(n, None)``: the smallest shuffle any producer attests for any round of this epoch,
        the ``n`` of its shuffled epsilon; or ``(None, code)`` (:data:`SHUFFLE_NULL_CODES`).

        Every (round, producer) must attest on every partition (markers complete), else
        ``not_attested``: one unshuffled producer's reports are not hidden among the others'.
        A producer's size (the smallest it claims over partitions) cannot exceed what it
        released in that round -- the reports its markers declare over all partitions for a
        station-valued mechanism (one report per device; the worker holds the arrived reports
        to that total), the round's participants for a per-sensor one (a device's report is its
        pairs, possibly none) -- else ``exceeds_released``: a size that cannot be true proves
        nothing, and is never published as a smaller epsilon."""
        if not self.markers_complete(n_partitions):
            return None, "not_attested"
        sizes: dict[tuple[int, int], int] = {}
        released: dict[tuple[int, int], int] = {}
        unattested = False
        for (r, i, _), m in self.markers.items():
            if per_sensor:  # what it released: over all its partitions' markers, attesting or not
                released[(r, i)] = min(released.get((r, i), m.participants), m.participants)
            else:
                released[(r, i)] = released.get((r, i), 0) + m.reports
            if m.shuffle_size is None:
                unattested = True
            else:
                sizes[(r, i)] = min(sizes.get((r, i), m.shuffle_size), m.shuffle_size)
        if any(n > released[k] for k, n in sizes.items()):
            return None, "exceeds_released"
        if unattested or not sizes:
            return None, "not_attested"
        return min(sizes.values()), None

    def release(self) -> str | None:
        """What the attesting producers released: ``"permuted"`` or ``"aggregate"`` (a marker that
        attests a shuffle size without naming its release comes from a shuffler from before the
        field, which permuted); None when no marker attests, or when they name different ones."""
        kinds = {m.release or "permuted" for m in self.markers.values() if m.shuffle_size is not None}
        return kinds.pop() if len(kinds) == 1 else None

    def withheld_by_producer(self) -> str | None:
        """A shuffler's reason for withholding the epoch (``no_reports`` or ``below_min_crowd``),
        when any producer's marker gives one: the first, in order."""
        return min((m.withheld for m in self.markers.values() if m.withheld is not None), default=None)

    def close(self, reason: CloseReason) -> None:
        self.closed_by = reason

    # -- binary encoding --------------------------------------------------------------------
    def encode(self) -> bytes:
        head: dict[str, Any] = {
            "q": self.wid.query_id, "v": self.wid.query_version, "e": self.wid.epoch, "r": self.n_rounds,
            "w": self.width, "closed_by": self.closed_by, "late": self.late, "dup": self.duplicates,
            "published": self.published, "born_late": self.born_late, **({"empty": True} if self.empty else {}),
            **({"span": self.span} if self.span != 1 else {})}
        blob = b""
        # a closed window keeps only what late records need: the markers (to spot a conflicting
        # late one) and the report counts, not the batch ids or the count arrays
        head["reports"] = self.reports.tolist()
        head["tallied"] = self.tallied.tolist()
        # an unattested marker is stored as before the shuffle size, release and withheld reason
        # existed (state stays readable both ways)
        head["markers"] = [[*slot, m.producer_id, m.producer_count, m.batches, m.reports, m.participants,
                            m.refused, m.interrupted, list(m.readings_missing),
                            *(() if m.shuffle_size is None and m.release is None and m.withheld is None
                              else (m.shuffle_size,)),
                            *(() if m.release is None and m.withheld is None else (m.release,)),
                            *(() if m.withheld is None else (m.withheld,))]
                           for slot, m in self.markers.items()]
        head["conflicting"] = [list(s) for s in sorted(self.conflicting)]
        if self.closed_by is None:
            head["seen"] = [[b, *v] for b, v in self.seen.items()]
            blob = np.ascontiguousarray(self.counts, dtype="<i8").tobytes()
        h = json.dumps(head, separators=(",", ":")).encode()
        return b"".join([_STATE_MAGIC, FRAME_LENGTH.pack(len(h)), h, blob])

    @classmethod
    def decode(cls, data: bytes) -> WindowState:
        if data[:4] != _STATE_MAGIC:
            raise ValueError("not a window state")
        (hlen,) = FRAME_LENGTH.unpack_from(data, 4)
        h = json.loads(data[8:8 + hlen])
        r, w = int(h["r"]), int(h["w"])
        st = cls.new(WindowId(h["q"], h["v"], h["e"]), r, w, int(h.get("span", 1)))
        st.closed_by, st.late, st.duplicates = h["closed_by"], h["late"], h["dup"]
        st.published = bool(h.get("published", False))
        st.born_late = bool(h.get("born_late", False))
        st.empty = bool(h.get("empty", False))
        st.reports = np.asarray(h["reports"], dtype=np.int64)
        st.tallied = np.asarray(h["tallied"], dtype=np.int64)
        st.markers = {(int(a), int(b), int(c)): _decoded_marker(rest) for a, b, c, *rest in h["markers"]}
        st.conflicting = {(int(a), int(b), int(c)) for a, b, c in h["conflicting"]}
        if st.closed_by is None:
            st.counts = np.frombuffer(data, dtype="<i8", count=r * w, offset=8 + hlen).astype(np.int64).reshape(r, w)
            st.seen = {b: (int(rr), str(prod), int(part)) for b, rr, prod, part in h["seen"]}
        return st


@dataclass
class Watermarks:
    """Per stage-2 partition: the newest epoch seen from each source partition, the windows
    still open here, the tick clock (the newest wall-clock time a :class:`Tick` brought) and
    when each open window last received a record, by that clock. ``dirty`` says it changed
    since it was loaded (then it must be written back: restarts depend on it)."""

    newest: dict[int, int] = field(default_factory=dict)  # source partition -> epoch
    marked: dict[tuple[int, int], int] = field(default_factory=dict)  # (source partition, producer index) -> epoch
    producers: tuple[int, int] = (-1, 1)  # (epoch, producer count) of the newest marker's claim
    open: dict[WindowId, int] = field(default_factory=dict)  # open window -> its last epoch (insertion order)
    clock_s: float | None = None  # newest tick time seen on this partition
    active: dict[WindowId, float] = field(default_factory=dict)  # open window -> last record, tick clock
    dirty: bool = False

    def tick(self, now_s: float) -> None:
        """Advance the tick clock; open windows without an activity time get this one."""
        if self.clock_s is None or now_s > self.clock_s:
            self.clock_s = now_s
            self.dirty = True
        for w in self.open:
            if w not in self.active:
                self.active[w] = self.clock_s
                self.dirty = True

    def touch(self, wid: WindowId) -> None:
        """``wid`` just received a record (its idle time starts again)."""
        if self.clock_s is not None and self.active.get(wid) != self.clock_s:
            self.active[wid] = self.clock_s
            self.dirty = True

    def see(self, source_partition: int, epoch: int) -> None:
        if epoch > self.newest.get(source_partition, -1):
            self.newest[source_partition] = epoch
            self.dirty = True

    def mark(self, source_partition: int, producer_index: int, producer_count: int, epoch: int) -> None:
        """Producer ``producer_index`` of ``producer_count`` marked ``epoch`` on the partition."""
        slot = (source_partition, producer_index)
        if epoch > self.marked.get(slot, -1):
            self.marked[slot] = epoch
            self.dirty = True
        if (epoch, producer_count) > self.producers:
            self.producers = (epoch, producer_count)
            self.dirty = True

    def saw(self, item: BatchPartial | MarkerPartial) -> None:
        """A batch or marker of its window's epoch came from its source partition."""
        self.see(item.source_partition, item.window.epoch)
        if isinstance(item, MarkerPartial):
            self.mark(item.source_partition, item.producer_index, item.producer_count, item.window.epoch)

    def watermark(self, n_partitions: int) -> int | None:
        """The smallest newest-epoch over all source partitions (None until all were seen) and,
        when the newest marker names several producers, over every (partition, producer) slot
        of their markers too: each producer writes to every partition, so a partition's newest
        epoch follows the fastest one; a slower one's epochs are not passed until it marks them
        (None until every slot was marked).

        >>> wm = Watermarks()
        >>> wm.see(0, 9); wm.mark(0, 0, 2, 9)
        >>> wm.watermark(1) is None  # producer 1 of 2 has marked nothing yet
        True
        >>> wm.mark(0, 1, 2, 4); wm.watermark(1)
        4
        """
        if any(p not in self.newest for p in range(n_partitions)):
            return None
        wm = min(self.newest[p] for p in range(n_partitions))
        k = self.producers[1]
        if k < 2:
            return wm
        slots = [(p, i) for p in range(n_partitions) for i in range(k)]
        if any(s not in self.marked for s in slots):
            return None
        return min(wm, *(self.marked[s] for s in slots))

    def track(self, wid: WindowId, last: int | None = None) -> None:
        """Keep ``wid`` open; ``last``: the last epoch it covers (a span's; None: its own epoch)."""
        if wid not in self.open:
            self.open[wid] = wid.epoch if last is None else last
            self.dirty = True

    def untrack(self, wid: WindowId) -> None:
        if self.open.pop(wid, None) is not None:
            self.dirty = True
        self.active.pop(wid, None)

    def too_old(self, epoch: int, n_partitions: int, lateness: int) -> bool:
        """An epoch the watermark passed before any of its data arrived here (its window is
        ``born_late``)."""
        wm = self.watermark(n_partitions)
        return wm is not None and epoch < wm - lateness

    def due(self, n_partitions: int, lateness: int, idle_s: float = 0.0) -> list[WindowId]:
        """Open windows whose last epoch the watermark has passed by more than ``lateness``
        epochs and that have received nothing for ``idle_s`` of the tick clock (0: at once)."""
        wm = self.watermark(n_partitions)
        if wm is None:
            return []
        passed = [w for w, e in self.open.items() if e < wm - lateness]
        if idle_s <= 0 or not passed:
            return passed
        clock = self.clock_s
        if clock is None:  # no tick yet: idleness cannot be told
            return []
        return [w for w in passed if clock - self.active.get(w, clock) >= idle_s]

    def encode(self) -> bytes:
        return json.dumps({"newest": sorted(self.newest.items()),
                           "marked": [[p, i, e] for (p, i), e in sorted(self.marked.items())],
                           "producers": list(self.producers),
                           "open": [[w.query_id, w.query_version, w.epoch, *([last] if last != w.epoch else [])]
                                    for w, last in self.open.items()],
                           "clock": self.clock_s,
                           "active": [[w.query_id, w.query_version, w.epoch, t] for w, t in self.active.items()]},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes | None) -> Watermarks:
        if not data:
            return cls()
        d = json.loads(data)
        clock = d.get("clock")
        epoch, count = d.get("producers", (-1, 1))
        return cls(newest={int(p): int(e) for p, e in d["newest"]},
                   marked={(int(p), int(i)): int(e) for p, i, e in d.get("marked", [])},
                   producers=(int(epoch), int(count)),
                   open={WindowId(q, int(v), int(e)): int(rest[0]) if rest else int(e) for q, v, e, *rest in d["open"]},
                   clock_s=None if clock is None else float(clock),
                   active={WindowId(q, int(v), int(e)): float(t) for q, v, e, t in d.get("active", [])})


@dataclass
class Outcome:
    """What one batch of stage records did to one stage-2 partition."""

    touched: dict[WindowId, WindowState] = field(default_factory=dict)
    closed: list[tuple[WindowState, CloseReason]] = field(default_factory=list)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)  # (index in items, reason, detail)
    retracted: list[WindowState] = field(default_factory=list)  # closed epochs whose estimates are withdrawn
    reports: Counter[str] = field(default_factory=Counter)  # query -> reports added
    late: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    newest: dict[str, int] = field(default_factory=dict)  # query -> newest epoch seen


Loader = Callable[[WindowId], "WindowState | None"]
Shape = Callable[[WindowId], "tuple[int, ...] | None"]  # (rounds, width[, epochs per span])


@dataclass(frozen=True)
class WindowPolicy:
    """Decides, from data only, when windows close (see the module doc). Pure."""

    n_source_partitions: int
    allowed_lateness_epochs: int = 2
    wall_clock_grace_s: float = 60.0
    live_horizon_s: float = 3600.0
    horizon_epochs: int = 720
    watermark_idle_s: float = 0.0
    stall_close_s: float = 0.0  # 0: a stalled window waits for the watermark forever
    epoch_s: int = EPOCH_S

    @property
    def quorum(self) -> int:
        """Source partitions that must agree before an epoch counts as reached: a majority."""
        return self.n_source_partitions // 2 + 1

    def agreed_epoch(self, wm: Watermarks) -> int | None:
        """The newest epoch a quorum of source partitions has reached (None before a quorum
        has been seen). Records further than ``horizon_epochs`` ahead of it are refused, so no
        single partition -- and no writer on a minority of partitions -- can drag time forward."""
        seen = sorted(wm.newest.values(), reverse=True)
        return seen[self.quorum - 1] if len(seen) >= self.quorum else None

    def _close_stalled(self, wm: Watermarks, get: Callable[[WindowId], WindowState | None],
                       close: Callable[[WindowState, CloseReason], None]) -> None:
        """Rule 4 (module doc): windows that received nothing for ``stall_close_s`` of the tick clock."""
        clock = wm.clock_s
        if self.stall_close_s <= 0 or clock is None:
            return
        for wid in [w for w in wm.open if clock - wm.active.get(w, clock) >= self.stall_close_s]:
            st = get(wid)
            if st is None or st.closed:
                wm.untrack(wid)
                continue
            if not self._unended(st, clock):
                close(st, "watermark")

    def _unended(self, st: WindowState, clock: float | None) -> bool:
        """An empty window whose epoch has not ended (plus the grace) by the tick clock: only the
        wall clock closes it (a forged live record far ahead makes no future epoch no_reports)."""
        return st.empty and clock is not None and (st.last_epoch + 1) * self.epoch_s + self.wall_clock_grace_s > clock

    def apply(self, wm: Watermarks, load: Loader, shape: Shape, items: Sequence[Partial]) -> Outcome:
        """Apply ``items`` in order. ``load`` reads a window's stored state (None if new);
        ``shape`` gives (rounds, width) of a window's query -- and, for a span query, its epochs
        per span -- None if the query is unknown."""
        out = Outcome()

        def get(wid: WindowId) -> WindowState | None:
            st = out.touched.get(wid)
            if st is None:
                st = load(wid)
                if st is not None:
                    out.touched[wid] = st
            return st

        def close(st: WindowState, reason: CloseReason) -> None:
            st.close(reason)
            wm.untrack(st.wid)
            out.touched[st.wid] = st
            out.closed.append((st, reason))

        def close_due() -> None:
            for due in wm.due(self.n_source_partitions, self.allowed_lateness_epochs, self.watermark_idle_s):
                other = get(due)
                if other is None or other.closed:
                    wm.untrack(due)
                    continue
                if not self._unended(other, wm.clock_s):
                    close(other, "watermark")

        for index, item in enumerate(items):
            if isinstance(item, Tick):
                wm.tick(item.now_s)
                for wid, last in list(wm.open.items()):
                    age = item.now_s - (last + 1) * self.epoch_s
                    st = get(wid)
                    if st is not None and not st.closed and self.wall_clock_grace_s < age < self.live_horizon_s:
                        close(st, "wall_clock")
                close_due()
                self._close_stalled(wm, get, close)
                continue
            wid = item.window
            qid = wid.query_id
            agreed = self.agreed_epoch(wm)
            if isinstance(item, Gap):  # opens an empty window, nothing else (the module doc)
                # an existing window is only read (not rewritten): a gap changes nothing there
                if (agreed is None or item.until <= agreed + self.horizon_epochs) and wid not in out.touched \
                        and load(wid) is None and (dims := shape(wid)) is not None:
                    out.touched[wid] = st = WindowState.new(wid, *dims)
                    st.empty = True
                    wm.track(wid, st.last_epoch)
                    wm.touch(wid)
                continue
            if agreed is not None and wid.epoch > agreed + self.horizon_epochs:
                out.rejected.append((index, "too_far_ahead", f"epoch {wid.epoch} is more than "
                                     f"{self.horizon_epochs} epochs ahead of {agreed}, the newest epoch a quorum "
                                     f"of {self.quorum} source partitions has reached"))
                continue
            st = get(wid)
            if st is not None and st.empty:  # a gap's window: this first real record opens it afresh
                st = out.touched[wid] = WindowState.new(wid, st.n_rounds, st.width, st.span)
                st.born_late = wm.too_old(st.last_epoch, self.n_source_partitions, self.allowed_lateness_epochs)
            elif st is None:
                dims = shape(wid)
                if dims is None:  # stage 1 knew the query; this worker cannot find it: never silent
                    out.rejected.append((index, "unknown_query", f"query {qid!r} version {wid.query_version} "
                                                                 f"is not known to this worker"))
                    continue
                st = WindowState.new(wid, *dims)
                # its epoch (its span's last) was passed before any of its data came: it still gets an outcome
                st.born_late = wm.too_old(st.last_epoch, self.n_source_partitions, self.allowed_lateness_epochs)
                out.touched[wid] = st
            result = st.add(item)
            if st.retract:
                st.retract = False
                out.retracted.append(st)
            if result == "late":
                out.late[qid] += 1
            elif result == "duplicate":
                out.duplicates[qid] += 1
            else:
                if isinstance(item, BatchPartial):
                    out.reports[qid] += item.reports
                if not st.closed:
                    wm.track(wid, st.last_epoch)
                    wm.touch(wid)
            wm.saw(item)
            out.newest[qid] = max(out.newest.get(qid, wid.epoch), wid.epoch)
            if not st.closed and st.markers_complete(self.n_source_partitions) and not st.missing_batches():
                close(st, "markers")
            close_due()
        return out
