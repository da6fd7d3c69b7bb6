"""The shuffler's pure policy: which device reports a slot takes, when an epoch's slots are due,
and what a due epoch releases (a uniform permutation) or withholds (and why). No I/O, no clock
of its own: the runtime (:mod:`stream_app.shuffler.runtime`) passes the time and the state of
its input partitions.

A *slot* is one (query, version, epoch, round); an epoch's slots (every round of one query
version and epoch) are decided together, so the worker never sees one round without the other.

**The clock is trusted time only** (docs/wire.md, "The shuffler"): a replay's per-epoch source
notes (:meth:`ShufflePolicy.note`, from the topic only the replay principal may write) or the
shuffler's own wall clock (:meth:`ShufflePolicy.advance`). Device reports never move it, however
many there are: a report for an epoch outside the *open window* -- from the clock's first epoch
to ``ahead_epochs`` past it -- is refused as ``outside_open_window`` and opens nothing. Every
epoch the clock passes gets a slot for each active query, so none goes undecided.

When an epoch is due:

1. *event time*: the clock has passed the epoch by ``lateness_epochs`` and the input is read up
   to the offsets the replay's notes vouched for (below them lies every report of those
   epochs; the wall clock's epochs count as read once passed);
2. *end of input*: the epoch is at most the clock, every input partition has been read to its
   end and nothing arrived for ``idle_release_s`` (the last epochs of a replay, a quiet night).

**How far a note may move the clock**: its MAC is the runtime's check
(:meth:`schemas.enrollment.Enrollment.check_note`), its lead the policy's
(:meth:`ShufflePolicy.note_refusal`; the rule is :mod:`.notes`'): beyond it, ``note_from_future``.

A due epoch whose every round holds at least ``min_crowd`` device reports is released as the
runtime's ``release`` says (a query that fixes another is withheld ``release_mismatch``):
``permuted``, each round's reports sorted, then permuted uniformly at random by the runtime's
generator; or ``aggregate``, only each round's counts in the wire's exact-tally layout (per-sensor:
the implied default reports filled in). A smaller crowd is withheld ``below_min_crowd``, an epoch
nobody reported for ``no_reports`` -- either ``notes_refused`` when a source note of the epoch or
of the ``ahead_epochs`` before it was refused (its window may not have opened). A report for an
epoch already decided is refused as ``late``.

A span query (``Query.span_s``) has one slot per span, at the span's first epoch (a report naming
any other epoch is refused as ``misaligned_span``); the rules above read the span's *last* epoch
(the clock must pass it), and the released span carries the notes of all its epochs (a station
without a reading in any of them, interrupted if any was).

>>> from datetime import datetime, timezone
>>> from schemas import DeviceReport, Query
>>> t0 = datetime(2026, 11, 18, tzinfo=timezone.utc)
>>> q = Query(query_id="q", analyst_id="a", version=1, mechanism="sp", sensors=(1, 2), population=10,
...           t_start=t0, t_end=t0.replace(day=19))
>>> p = ShufflePolicy(min_crowd=2, lateness_epochs=1, idle_release_s=5.0, partitions=(0,))
>>> e = q.epoch_range()[0]
>>> p.admit(DeviceReport(query_id="q", query_version=1, epoch=e, value=1), q, 0.0).reason  # no clock yet
'outside_open_window'
>>> p.note(SourceEpoch(epoch=e, opens=True), lambda epoch: [q], 0.0)  # the replay begins with epoch e
>>> for v in (1, 2):
...     for r in (0, 1):
...         assert p.admit(DeviceReport(query_id="q", query_version=1, epoch=e, round=r, value=v), q, 0.0) is None
>>> p.note(SourceEpoch(epoch=e, device_offsets=((0, 4),)), lambda epoch: [q], 1.0)  # ... and finished it
>>> p.due(2.0, caught_up=frozenset(), positions={0: 4})
[]
>>> p.due(9.0, caught_up=frozenset({0}), positions={0: 4})
[('q', 1, 59832000)]
>>> out = p.close(('q', 1, e), np.random.default_rng(1))
>>> sorted(out.rounds[0].data.arrays()["value"].tolist()), out.rounds[0].devices
([1, 2], 2)
>>> for v in (1, 2, 2):
...     assert p.admit(DeviceReport(query_id="q", query_version=1, epoch=e + 1, round=0, value=v), q, 0.0) is None
...     assert p.admit(DeviceReport(query_id="q", query_version=1, epoch=e + 1, round=1, value=0), q, 0.0) is None
>>> agg = p.close(('q', 1, e + 1), np.random.default_rng(1), release="aggregate")
>>> [(r.data.arrays()["counts"].tolist(), r.reports, r.devices) for r in agg.rounds]
[([0, 1, 2], 3, 3), ([3, 0, 0], 3, 3)]
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from estimators.reports import Counts, empty_round, expand_counts
from schemas import DeviceReport, Query, SourceEpoch
from schemas.estimates import Rejected

from .kept import KeptNotes
from .notes import NoteBound
from .outcome import Released, ReleasedRound, Withheld
from .payload import check_payload

__all__ = ["EpochKey", "Released", "ReleasedRound", "ShufflePolicy", "Withheld"]

EpochKey = tuple[str, int, int]  # (query id, version, epoch)
Active = Callable[[int], Iterable[Query]]  # the queries active in an epoch
IntArray = npt.NDArray[np.int64]
EPOCHS_KEPT = 120  # source notes of epochs without reports are kept this many epochs behind the clock


@dataclass
class _Round:
    """A round's admitted reports, as counts: a release depends on the reports' multiset only
    (a permuted release sorts them first), so the counts are all a slot keeps. Station-valued:
    ``counts[v]``, devices that sent value ``v`` (0..V); per-sensor: ``counts[s * O + o]``,
    pairs (station ``s`` 1..V, report ``o``) over the round's devices."""

    counts: IntArray
    devices: int = 0


def _round(query: Query) -> _Round:
    n_out = query.n_outputs
    size = n_out if query.per_station is None else (query.n_stations + 1) * n_out
    return _Round(np.zeros(size, np.int64))


@dataclass
class _Open:
    query: Query
    rounds: list[_Round]
    cut: int | None = None  # the first epoch of its span a replay's note says was interrupted


class ShufflePolicy:
    """Admit, hold, decide. ``partitions``: the input (device topic) partitions this instance reads.
    Behind a backlog thousands of slots are open, none scanned per note or step: the kept notes
    count the slots covering each epoch (:mod:`.kept`), the slots wait in a heap by epoch (:meth:`due`)."""

    def __init__(self, min_crowd: int, lateness_epochs: int, idle_release_s: float,
                 partitions: Iterable[int], ahead_epochs: int = 2, note_lead_epochs: int = 3,
                 note_pace: float = 0.0) -> None:
        self.min_crowd = min_crowd
        self.notes = NoteBound(note_lead_epochs, note_pace, lateness_epochs)
        self.lateness_epochs = lateness_epochs
        self.idle_release_s = idle_release_s
        self.ahead_epochs = ahead_epochs
        self.partitions = frozenset(partitions)
        self.clock = -1  # trusted: the newest epoch every source finished (or the wall clock's last ended one)
        self.floor = -1  # the first epoch the clock opened (-1: no clock yet)
        self.passed = -1  # the newest clock value whose input is all read (its barrier passed)
        self.sources: dict[int, int] = {}  # replay producer index -> the newest epoch it finished
        self.source_count = 1
        self.ends: dict[int, int] = {}  # per input partition: the newest end offset a source note vouched for
        self.barriers: list[tuple[int, dict[int, int]]] = []  # (clock, the input offsets its epochs lie below)
        # per input partition, per producer: the offsets its notes vouched for and the epochs it had finished
        self._vouched: dict[int, dict[int, tuple[list[int], list[int]]]] = {}
        self.last_arrival = 0.0
        self._open: dict[EpochKey, _Open] = {}
        self._held = 0  # device reports held in open slots (:meth:`held`)
        self._waits: list[tuple[int, EpochKey]] = []  # (the epoch an open slot waits for, its key): a heap
        self.decided: set[EpochKey] = set()
        self._decided_epochs: set[int] = set()
        self._notes = KeptNotes()  # epoch -> (stations without data, interrupted), and the open slots covering it
        self.ended: int | None = None  # the epoch a replay's note said it ends with (spans past it: cut short)

    @property
    def open_epochs(self) -> list[EpochKey]:
        return sorted(self._open, key=_oldest_first)

    def open_count(self) -> int:
        """How many slots are open."""
        return len(self._open)

    def clock_state(self) -> dict[str, Any]:
        """The trusted clock as a JSON-able dict (the state log's ``clock`` record); its
        ``barriers`` are records of their own (the runtime's, :func:`.state.barrier_key`)."""
        return {"clock": self.clock, "floor": self.floor, "passed": self.passed, "ended": self.ended,
                "sources": {str(k): e for k, e in self.sources.items()}, "count": self.source_count,
                "ends": {str(p): o for p, o in self.ends.items()}}

    def restore_clock(self, state: dict[str, Any]) -> None:
        """Restoring after a restart: the trusted clock as :meth:`clock_state` gave it (the
        notes that advanced it may be gone from a compacted state topic)."""
        self.clock = max(self.clock, int(state.get("clock", -1)))
        self.floor = int(state.get("floor", self.floor))
        self.passed = max(self.passed, int(state.get("passed", -1)))
        self._end_at(self.ended if state.get("ended") is None else int(state["ended"]))
        self.sources.update({int(k): int(e) for k, e in state.get("sources", {}).items()})
        self.source_count = int(state.get("count", self.source_count))
        self.ends.update({int(p): int(o) for p, o in state.get("ends", {}).items()})
        self.barriers = [(int(c), {int(p): int(o) for p, o in b.items()}) for c, b in state.get("barriers", ())]

    def restore_barriers(self, barriers: Iterable[tuple[int, dict[int, int]]]) -> None:
        """Restoring after a restart: the clock's barriers logged apart from the clock, joined to
        those :meth:`restore_clock` gave, in clock order."""
        merged = dict(self.barriers) | dict(barriers)
        self.barriers = sorted(merged.items())

    def is_open(self, key: EpochKey) -> bool:
        """Whether ``key``'s epoch still holds reports (not decided)."""
        return key in self._open

    def has_note(self, epoch: int) -> bool:
        """Whether a replay's note of ``epoch`` is still kept (not yet used by every close)."""
        return epoch in self._notes

    def dropped_notes(self) -> list[int]:
        """The epochs whose kept note was dropped since the last call (the runtime asks each step:
        the state records naming only those notes and decided slots are obsolete)."""
        return self._notes.drain_dropped()

    def held(self) -> int:
        """Device reports held in open epochs (every round's)."""
        return self._held

    def in_window(self, epoch: int, clock: int | None = None) -> bool:
        """Whether the trusted clock has opened ``epoch``: from the clock's first epoch up to
        ``ahead_epochs`` past it (the epochs devices may be reporting for now); ``clock``: the
        clock where the report lies in the input (:meth:`window_clock`; None: the clock now)."""
        return 0 <= self.floor <= epoch <= (self.clock if clock is None else clock) + self.ahead_epochs

    def window_clock(self, partition: int, offsets: IntArray) -> IntArray:
        """The trusted clock *where* reports lie in the input: for a report at ``offsets`` of
        input ``partition``, the clock the replay's notes had vouched for below that offset --
        per producer the newest epoch it finished whose note's acknowledged offsets of the
        partition are at or below it, the oldest over the producers (a producer whose notes
        vouch nothing for the partition counts at the epoch it finished), and never past the
        clock now. So a report is judged at the time it was written, not when the shuffler got
        to it: however far the notes run ahead of a backlog of device reports, a report sent
        for an epoch beyond the window of its own moment stays outside it.

        >>> p = ShufflePolicy(min_crowd=1, lateness_epochs=1, idle_release_s=1.0, partitions=(0,))
        >>> p.note(SourceEpoch(epoch=10, opens=True), lambda epoch: [], 0.0)  # the clock starts at 9
        >>> for e, end in ((10, 100), (11, 250)):
        ...     p.note(SourceEpoch(epoch=e, device_offsets=((0, end),)), lambda epoch: [], 0.0)
        >>> p.window_clock(0, np.array([50, 100, 249, 250, 900])).tolist(), p.clock
        ([9, 10, 10, 11, 11], 11)
        """
        out = np.full(offsets.shape, self.clock, np.int64)
        vouched = self._vouched.get(partition)
        if not vouched:
            return out
        for k in range(self.source_count):
            got = vouched.get(k)
            if got is None:
                np.minimum(out, self.sources.get(k, -1), out=out)
                continue
            offs, dones = got
            at = np.searchsorted(np.asarray(offs, np.int64), offsets, side="right") - 1
            first = self.floor - 1 if self.floor >= 0 else -1  # below its first such note: the clock's first value
            np.minimum(out, np.where(at >= 0, np.asarray(dones, np.int64)[np.maximum(at, 0)], first), out=out)
        return out

    def admit(self, report: DeviceReport, query: Query | None, now: float, clock: int | None = None
              ) -> Rejected | None:
        """Take one device report into its slot, or say why not (the dead letter's reason).
        A report never moves the clock: one for an epoch the clock has not opened (or long
        before it started) is refused as ``outside_open_window`` and opens nothing (``clock``:
        where it lies in the input, :meth:`window_clock`; None: the clock now)."""
        why = self.refuse(report, query, clock)
        if why is not None or query is None:
            return why
        key = (query.query_id, query.version, report.epoch)
        why = self.reserve(key, report.round, query)
        if why is not None:
            return why
        counts = self._open[key].rounds[report.round].counts
        if report.value is not None:
            counts[report.value] += 1
        elif report.pairs:  # distinct stations (refuse checked): one fancy-index add
            pairs = np.asarray(report.pairs, dtype=np.int64)
            counts[pairs[:, 0] * query.n_outputs + pairs[:, 1]] += 1
        self.last_arrival = now
        self.notes.vouch(report.epoch, self.clock, now)
        return None

    def refuse(self, report: DeviceReport, query: Query | None, clock: int | None = None) -> Rejected | None:
        """Why ``report`` cannot be admitted, whatever else arrives (None: it can, if its slot
        has room -- :meth:`reserve`); no side effect. :meth:`passing` is its array form;
        ``clock``: the clock where the report lies in the input (:meth:`window_clock`)."""
        if query is None:
            return Rejected("unknown_query", f"no query {report.query_id!r} version {report.query_version}")
        start, end = query.epoch_range()
        if not start <= report.epoch < end:
            return Rejected("outside_query_window",
                            f"epoch {report.epoch} outside {query.record_key}'s [{start}, {end})")
        if query.span_start(report.epoch) != report.epoch:  # a span's slot is its first epoch's
            return Rejected("misaligned_span", f"epoch {report.epoch} is not the first epoch of a {query.span_s}-s "
                                               f"span of {query.record_key}")
        if report.round >= query.n_rounds:
            return Rejected("bad_round", f"round {report.round} but {query.mechanism} has {query.n_rounds} round(s)")
        key = (query.query_id, query.version, report.epoch)
        if key in self.decided:
            return Rejected("late", f"{query.record_key} epoch {report.epoch} was already released or withheld")
        if not self.in_window(report.epoch, clock):
            return Rejected("outside_open_window",
                            f"epoch {report.epoch} outside the open window [{self.floor}, "
                            f"{(self.clock if clock is None else clock) + self.ahead_epochs}] of the trusted clock")
        # a device's pairs as two columns, split once (through builtins, no per-pair Python loop)
        stations, outputs = zip(*report.pairs, strict=True) if report.pairs else ((), ())
        return check_payload(report, query, stations, outputs)

    def passing(self, query: Query | None, epoch: IntArray, rnd: IntArray, value: IntArray | None = None,
                bitmap_stations: IntArray | None = None, clock: IntArray | None = None,
                pairs_fit: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """:meth:`refuse` over many reports of one query version at once: whether each passes
        (its reason, if not, is :meth:`refuse`'s). ``value``: station-valued reports' values;
        ``bitmap_stations``: else, bitmap reports' station counts (every bitmap bit is a pair
        ``(s, 1)``, so only the query's V and report 1 are checked here; padding bits are the
        decoder's); ``pairs_fit``: else, pair reports' :func:`.payload.pairs_fit`; ``clock``: each
        report's :meth:`window_clock` (None: the clock now)."""
        if query is None:
            return np.zeros(epoch.size, bool)
        start, end = query.epoch_range()
        ok: npt.NDArray[np.bool_] = (epoch >= start) & (epoch < end) & (rnd < query.n_rounds)
        ok &= epoch % query.epochs_per_span == 0  # a span query's reports name their span's first epoch
        ok &= (self.floor >= 0) & (epoch >= self.floor) & (epoch <= (self.clock if clock is None else clock)
                                                             + self.ahead_epochs)
        decided = [e for e in np.unique(epoch).tolist() if (query.query_id, query.version, e) in self.decided]
        if decided:
            ok &= ~np.isin(epoch, np.asarray(decided, np.int64))
        if value is not None:
            return ok & (query.per_station is None) & (value >= 0) & (value <= query.n_stations)
        if pairs_fit is not None:
            return ok & (query.per_station is not None) & pairs_fit
        if bitmap_stations is None:
            raise ValueError("passing needs value, bitmap_stations or pairs_fit")
        fits = query.per_station is not None and query.n_outputs > 1 and query.default_report != 1
        out: npt.NDArray[np.bool_] = ok & fits & (bitmap_stations == query.n_stations)
        return out

    def reserve(self, key: EpochKey, rnd: int, query: Query) -> Rejected | None:
        """Count one more device in round ``rnd`` of ``key``'s slot (opened if need be) -- a
        report :meth:`refuse` passed -- or ``slot_full``: a slot holds at most one report per
        device of the query's population. The report's counts follow (:meth:`add`)."""
        slot = self._open.get(key) or self._new_slot(key, query)
        r = slot.rounds[rnd]
        if r.devices >= query.population:
            return Rejected("slot_full", f"{query.record_key} epoch {key[2]} round {rnd} already holds "
                                         f"{r.devices} reports, the query's population")
        r.devices += 1
        self._held += 1
        return None

    def room(self, key: EpochKey, rnd: int, query: Query) -> int:
        """How many more devices round ``rnd`` of ``key``'s slot takes (:meth:`reserve`)."""
        slot = self._open.get(key)
        return query.population - (0 if slot is None else slot.rounds[rnd].devices)

    def reserve_many(self, key: EpochKey, rnd: int, query: Query, n: int) -> None:
        """:meth:`reserve` ``n`` times, when :meth:`room` has space for them all."""
        slot = self._open.get(key) or self._new_slot(key, query)
        if slot.rounds[rnd].devices + n > query.population:
            raise ValueError("reserve_many past the slot's room")
        slot.rounds[rnd].devices += n
        self._held += n

    def add(self, key: EpochKey, rnd: int, counts: IntArray, now: float) -> None:
        """Add reserved reports' counts (the :class:`_Round` layout) to round ``rnd`` of ``key``."""
        self._open[key].rounds[rnd].counts += counts
        self.last_arrival = now
        self.notes.vouch(key[2], self.clock, now)

    def held_state(self, key: EpochKey) -> list[dict[str, Any]]:
        """An open epoch's rounds as the state log keeps them: devices and the nonzero counts."""
        out = []
        for r in self._open[key].rounds:
            nz = np.flatnonzero(r.counts)
            out.append({"devices": r.devices, "index": nz.tolist(), "count": r.counts[nz].tolist()})
        return out

    def restore_held(self, key: EpochKey, query: Query, rounds: list[dict[str, Any]]) -> None:
        """Restoring after a restart: an open epoch's rounds as :meth:`held_state` gave them."""
        slot = self._new_slot(key, query)
        for r, got in zip(slot.rounds, rounds, strict=True):
            r.devices = int(got["devices"])
            self._held += r.devices
            r.counts[np.asarray(got["index"], np.int64)] = np.asarray(got["count"], np.int64)

    def note_refusal(self, note: SourceEpoch, now: float, wall_epoch: int | None = None) -> Rejected | None:
        """Why a note (its MAC verified) may not move the clock (:mod:`.notes`:
        ``note_from_future``); ``wall_epoch``: the host's epoch, with the wall clock."""
        return self.notes.refusal(note, self.clock, now, wall_epoch)

    def note_refused(self, epoch: int) -> None:
        """A note of ``epoch`` was refused (untrusted, from the future): an epoch it could
        have opened that is withheld says ``notes_refused`` (:meth:`close`)."""
        self.notes.refused(epoch)

    def note(self, note: SourceEpoch, active: Active, now: float) -> Rejected | None:
        """Take a replay's source note of an epoch (:class:`~schemas.SourceEpoch`, from the
        topic only the replay may write): the producer finished the epoch (or, ``opens``, begins
        with it), the device-topic offsets its reports of it lie below, the stations without a
        source reading and whether the replay stopped in it; several producers' notes of one
        epoch add up. The clock is the oldest epoch every producer finished (``active``: the
        queries of an epoch, for :meth:`advance`). Refused as ``late`` once an epoch of that
        number was decided."""
        if not note.opens and note.epoch in self._decided_epochs:
            return Rejected("late", f"source metadata of epoch {note.epoch}, already released or withheld")
        if not note.opens:
            self._notes.add(note.epoch, frozenset(note.readings_missing), note.interrupted)
            for k, o in self._open.items() if note.interrupted else ():  # the open slots it cuts
                if k[2] <= note.epoch < k[2] + o.query.epochs_per_span and (o.cut is None or note.epoch < o.cut):
                    o.cut = note.epoch
                    self._wait(k)
            if note.ends:
                self._end_at(note.epoch)
        done = note.epoch - 1 if note.opens else note.epoch
        for p, offset in note.device_offsets:
            if p in self.partitions:
                self.ends[p] = max(self.ends.get(p, 0), offset)
                offs, dones = self._vouched.setdefault(p, {}).setdefault(note.producer_index, ([], []))
                if not offs or (offset >= offs[-1] and done >= dones[-1]):
                    offs.append(offset)
                    dones.append(done)
        self.sources[note.producer_index] = max(self.sources.get(note.producer_index, -1), done)
        self.source_count = note.producer_count
        if all(k in self.sources for k in range(self.source_count)):
            self.advance(min(self.sources[k] for k in range(self.source_count)), active, dict(self.ends))
            self.notes.vouch(-1, self.clock, now)
        self.last_arrival = now
        if len(self._notes) > 4 * EPOCHS_KEPT:  # notes of epochs no open slot covers, long past: dropped
            self._notes.sweep(before=self.clock - EPOCHS_KEPT)
        return None

    def advance(self, clock: int, active: Active, barrier: dict[int, int] | None = None) -> None:
        """Move the trusted clock to ``clock`` (never back). Every epoch it passes gets a slot
        for each of its ``active`` queries that holds none, so no epoch goes undecided (one
        nobody reported for is withheld ``no_reports``). ``barrier``: the input offsets below
        which every report of epochs up to ``clock`` lies (None: the wall clock, whose epochs
        count as read once passed)."""
        if clock <= self.clock:
            return
        epochs = range(self.clock + 1, clock + 1) if self.floor >= 0 else range(0)
        if self.floor < 0:
            self.floor = clock + 1
        self.clock = clock
        for e in epochs:
            self._open_empty(e, active)
        if barrier is None:
            self.passed = clock
        else:
            self.barriers.append((clock, barrier))

    def reopen(self, active: Active) -> None:
        """Restoring after a restart: the empty slots the clock opened (no record holds them)."""
        for e in range(max(self.floor, 0), self.clock + 1):
            self._open_empty(e, active)

    def _open_empty(self, epoch: int, active: Active) -> None:
        for q in active(epoch):
            if q.span_start(epoch) != epoch:  # a span query has one slot per span, at its first epoch
                continue
            key = (q.query_id, q.version, epoch)
            if key not in self._open and key not in self.decided:
                self._new_slot(key, q)

    def _new_slot(self, key: EpochKey, query: Query) -> _Open:
        """Open ``key``'s slot, cut at the first epoch of its span a kept note says was interrupted
        (a later note cuts it in :meth:`note`: :meth:`due` looks the cut up, never rescans the span)."""
        span = range(key[2], key[2] + query.epochs_per_span)
        if key in self._open:  # replaced (a restart's held counts)
            self._held -= sum(r.devices for r in self._open[key].rounds)
        else:
            self._notes.cover(span)
        slot = self._open[key] = _Open(query, [_round(query) for _ in range(query.n_rounds)],
                                       self._notes.first_interrupted(span))
        self._wait(key)
        return slot

    def _drop_slot(self, key: EpochKey) -> _Open:
        """Take ``key``'s open slot away (decided): the epochs it covered are covered by one slot
        fewer, its reports are held no more (its entry in the waits goes stale)."""
        slot = self._open.pop(key)
        self._notes.uncover(range(key[2], key[2] + slot.query.epochs_per_span))
        self._held -= sum(r.devices for r in slot.rounds)
        return slot

    def _end_at(self, epoch: int | None) -> None:
        """The replay ends with ``epoch``: the open spans it ends inside wait for it, no longer."""
        if epoch != self.ended:
            self.ended = epoch
            for k in [k for k, o in self._open.items() if o.query.epochs_per_span > 1]:
                self._wait(k)

    def _wait(self, key: EpochKey) -> None:
        """Enter open ``key`` in the waits at the epoch it waits for now (an earlier entry goes stale)."""
        heapq.heappush(self._waits, (self._last_epoch(key), key))
        if len(self._waits) > 2 * len(self._open) + 64:  # mostly stale: rebuilt (amortized O(1))
            self._waits = sorted((self._last_epoch(k), k) for k in self._open)

    def _waiting(self, bound: int) -> list[EpochKey]:
        """The open slots that wait for an epoch at most ``bound``: the entries popped below
        it, stale ones dropped, the others entered again (a slot stays open until closed)."""
        found: dict[EpochKey, int] = {}
        while self._waits and self._waits[0][0] <= bound:
            last, key = heapq.heappop(self._waits)
            if key in self._open and self._last_epoch(key) == last:
                found[key] = last
        for key, last in found.items():
            heapq.heappush(self._waits, (last, key))
        return list(found)

    def due(self, now: float, caught_up: Collection[int], positions: dict[int, int] | None = None
            ) -> list[EpochKey]:
        """The open epochs whose deadline has passed (module docstring), oldest first;
        ``positions``: how far each input partition is read."""
        positions = positions or {}
        for p, vouched in self._vouched.items():  # what lies behind the positions is needed no more
            for offs, dones in vouched.values():
                drop = int(np.searchsorted(np.asarray(offs, np.int64), positions.get(p, 0), side="right")) - 1
                if drop > 0:
                    del offs[:drop], dones[:drop]
        while self.barriers and all(positions.get(p, 0) >= o for p, o in self.barriers[0][1].items()):
            self.passed = max(self.passed, self.barriers.pop(0)[0])
        idle = self.partitions <= set(caught_up) and now - self.last_arrival >= self.idle_release_s
        horizon = self.passed - self.lateness_epochs  # by event time; at the end of input, up to the clock
        bound = max(horizon, min(self.clock, self.passed)) if idle else horizon
        return sorted(self._waiting(bound), key=_oldest_first)

    def _last_epoch(self, key: EpochKey) -> int:
        """The epoch an open slot waits for: its own, or its span's last -- or the first epoch of
        the span a replay's note says it was interrupted in (no report of the span comes later)."""
        slot = self._open[key]
        last = key[2] + slot.query.epochs_per_span - 1 if slot.cut is None else slot.cut
        ended = self.ended if self._cut_short(key) else None  # the replay ended inside the span
        return last if ended is None else min(last, ended)

    def _cut_short(self, key: EpochKey) -> bool:
        """Whether a replay ended inside this open span (its note of ``ends``)."""
        span = self._open[key].query.epochs_per_span
        return span > 1 and self.ended is not None and key[2] <= self.ended < key[2] + span - 1

    def _span(self, key: EpochKey) -> range:
        """The epochs an open slot covers: its own, or its span's."""
        return range(key[2], key[2] + self._open[key].query.epochs_per_span)

    def close(self, key: EpochKey, rng: np.random.Generator, release: str = "permuted") -> Released | Withheld:
        """Decide a due epoch: release its rounds -- ``"permuted"`` (the reports, by ``rng``) or
        ``"aggregate"`` (their counts; ``rng`` unused) -- or withhold it (too small a crowd, a
        refused note, a query that fixes another release: module docstring)."""
        span = self._span(key)
        cut_short = self._cut_short(key)
        slot = self._drop_slot(key)
        self._decide(key)
        devices = tuple(r.devices for r in slot.rounds)
        no_data, interrupted = self._notes.take(span)  # a span's: any epoch of it
        interrupted = interrupted or cut_short  # a span the replay ended inside: cut short, as a stop
        q = slot.query
        if q.release is not None and q.release != release:  # never released under another release
            return Withheld(q, key[2], "release_mismatch", devices,
                            f"{q.record_key} fixes the {q.release} release; this shuffler releases {release}")
        per_sensor = q.spec.per_sensor
        if interrupted:  # withheld by the worker as interrupted, as without the shuffler: nothing released
            return Released(q, key[2], tuple(ReleasedRound(empty_round(per_sensor), d) for d in devices),
                            no_data, True)
        if max(devices) == 0 or min(devices) < self.min_crowd:
            refused = self.notes.refused_near(key[2], self.ahead_epochs)
            said = (f"device reports per round {list(devices)}, "
                    + ("none at all" if max(devices) == 0 else f"below min_crowd {self.min_crowd}"))
            if refused:
                return Withheld(q, key[2], "notes_refused", devices,
                                f"{said}, and {refused} source note(s) that could have opened its window were "
                                "refused (untrusted_note, note_from_future): its reports may have been refused")
            return Withheld(q, key[2], "no_reports" if max(devices) == 0 else "below_min_crowd", devices, said)
        if release == "aggregate":
            return Released(q, key[2], tuple(ReleasedRound(Counts(_counts(q, r), r.devices), r.devices)
                                             for r in slot.rounds), no_data)
        if release != "permuted":
            raise ValueError(f"unknown release {release!r}: permuted or aggregate")
        # sorted first (from the counts): the result depends on the reports and rng only
        return Released(q, key[2], tuple(ReleasedRound(expand_counts(r.counts, rng, per_sensor, q.n_outputs),
                                                       r.devices) for r in slot.rounds), no_data)

    def mark_decided(self, key: EpochKey) -> None:
        """Restoring after a restart: this epoch was decided before (its held reports go)."""
        span = range(key[2], key[2] + 1)
        if key in self._open:
            span = self._span(key)
            self._drop_slot(key)
        self._decide(key)
        self._notes.take(span)

    def _decide(self, key: EpochKey) -> None:
        self.decided.add(key)
        self._decided_epochs.add(key[2])


def _oldest_first(key: EpochKey) -> tuple[int, str, int]:
    return key[2], key[0], key[1]


def _counts(query: Query, r: _Round) -> IntArray:
    """A round's exact tally (``schemas.wire``, layout ``counts``): station-valued, how many
    devices sent each value 0..V; per-sensor, ``(V, O)`` row-major, how many devices gave each
    report at each station -- the pairs counted, the devices without a pair at a station counted
    at the implied default report -- so every row sums to the devices."""
    if query.per_station is None:
        return r.counts.copy()
    n_out = query.n_outputs
    table = r.counts[n_out:].reshape(query.n_stations, n_out).copy()
    default = query.default_report
    if default is None:  # every per-sensor mechanism has one (the registry's)
        raise ValueError(f"{query.mechanism} has no implied default report")
    table[:, default] += r.devices - table.sum(axis=1)
    return table.ravel()
