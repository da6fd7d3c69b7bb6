"""The shuffler's state log: keyed records a compacted topic can shrink, and how a restart folds them.

Every transaction (a *step*) writes, to the instance's state topic, beside what it releases:

* ``step-<s>``: the replay's notes it took and the keyed digests of the devices its slots
  took, while any of their epochs is open. Once every epoch they went to is decided (released
  or withheld), a later step writes a **tombstone** for ``step-<s>``.
* ``held-<query>-<version>-<epoch>``: an open epoch's admitted reports as counts (per round:
  devices, and the nonzero counts of the policy's layout), the whole epoch's, rewritten by each
  step that adds to it and tombstoned in the step that decides it -- the state topic holds no
  report longer than its epoch is open, and a record's size is bounded by the query's
  stations x reports, not by how many devices report. (A log written before counts were held
  has the admitted reports one by one in ``step-<s>``'s ``admit``; a restart still reads it.)
* ``decided-<query>-<version>-<epoch>``: an epoch that was decided (late reports are refused).
* ``salt``: the secret salt, once; ``clock``: the policy's epoch clock and the newest epoch
  each input partition showed (what the tombstoned steps' reports had advanced).
* ``barrier-<clock>``: one of the clock's barriers (the input offsets below which every report
  of the epochs up to ``clock`` lies), written once and tombstoned once the input is read past
  it -- not every barrier in each step's ``clock`` record, which behind a backlog holds
  thousands. (A ``clock`` record written before holds them all under ``barriers``; a restart
  still reads it.)

Each record carries two headers: ``s``, its step, and ``inc``, the writing process's random
incarnation id. A restart keeps the records of committed steps (``s <= `` the step committed
with the input offsets) written by the *last* incarnation that wrote that step (an aborted
incarnation's records stay visible on a broker that shows aborted records -- Tansu does), then
the last record of each key, a tombstone deleting it. That is exactly what a compacted topic
keeps, so folding the whole log and folding its compaction give the same state
(tests/unit/stream_app/shuffler/test_state.py). Records written before keys existed (no
headers; one record per step holding ``admit``, ``decided`` and ``salt``) are read as the last
record of their step.

>>> log = [StateRecord("step-1", {"admit": [[0, "r"]]}, 1, "a"),
...        StateRecord("step-2", {"admit": [[0, "x"]]}, 2, "a"),   # step 2 aborted ...
...        StateRecord("step-2", {"admit": [[1, "y"]]}, 2, "b"),   # ... and redone
...        StateRecord("step-1", None, 3, "b"),                   # its epoch decided: tombstone
...        StateRecord("step-4", {"admit": [[0, "z"]]}, 4, "b")]  # not committed
>>> [(r.key, r.value) for r in fold(log, committed_step=3)]
[('step-2', {'admit': [[1, 'y']]})]
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LEGACY", "BarrierLog", "LiveSteps", "StateRecord", "barrier_key", "compact", "decided_key", "fold",
           "from_kafka", "headers", "held_key", "logged_step", "step_key"]

LEGACY = "legacy"  # the incarnation of records written before the log was keyed


@dataclass(frozen=True)
class StateRecord:
    """One state record: its key, its JSON value (None: a tombstone), step and incarnation."""

    key: str
    value: dict[str, Any] | None
    s: int
    inc: str


def step_key(step: int) -> str:
    return f"step-{step}"


def held_key(query_id: str, version: int, epoch: int) -> str:
    return f"held-{query_id}-{version}-{epoch}"


def decided_key(query_id: str, version: int, epoch: int) -> str:
    return f"decided-{query_id}-{version}-{epoch}"


def barrier_key(clock: int) -> str:
    return f"barrier-{clock}"


def headers(step: int, inc: str) -> list[tuple[str, bytes]]:
    return [("s", str(step).encode()), ("inc", inc.encode())]


def from_kafka(key: bytes | None, value: bytes | None, record_headers: Sequence[tuple[str, bytes]]) -> StateRecord:
    """A consumed record; a legacy one (no headers, no key) becomes its step's ``legacy-step``."""
    h = dict(record_headers or ())
    if "s" not in h:  # written before the log was keyed: one record per step
        body = json.loads(value or b"{}")
        return StateRecord(f"legacy-{step_key(int(body['s']))}", body, int(body["s"]), LEGACY)
    return StateRecord((key or b"").decode(), json.loads(value) if value is not None else None, int(h["s"]),
                       h["inc"].decode())


def fold(records: Iterable[StateRecord], committed_step: int) -> list[StateRecord]:
    """The live state: records of committed steps by the last incarnation that wrote each step,
    the last per key, tombstoned keys dropped; in step order (log order within a step)."""
    records = list(records)
    writer: dict[int, str] = {}
    for r in records:
        if r.s <= committed_step:
            writer[r.s] = r.inc
    latest: dict[str, tuple[int, StateRecord]] = {}
    for i, r in enumerate(records):
        if r.s <= committed_step and writer[r.s] == r.inc:
            latest[r.key] = (i, r)
    live = [(r.s, i, r) for i, r in latest.values() if r.value is not None]
    return [r for _, _, r in sorted(live, key=lambda t: (t[0], t[1]))]


def logged_step(records: Sequence[StateRecord]) -> int:
    """The newest step the log proves committed, for a restart that finds no committed offsets
    (the consumer group's expired): the step before the newest one the log's last writer wrote.
    An incarnation writes step s + 1 only once step s committed, and starts at the committed
    step + 1; whether its own newest step committed the log cannot say, so that step is done
    again -- from the input offsets of the step before (the ``clock`` record), to the same
    release under the same batch ids (runtime.py), which the worker counts once.

    >>> logged_step([StateRecord("clock", {}, 4, "a"), StateRecord("clock", {}, 5, "b"),
    ...              StateRecord("clock", {}, 6, "b")])
    5
    >>> logged_step([])
    0
    """
    if not records:
        return 0
    last = records[-1].inc
    return max(0, max(r.s for r in records if r.inc == last) - 1)


class LiveSteps:
    """The steps whose ``step-<s>`` record is live: each with the slots (epoch keys) its reports
    went to and the note epochs it took. A step is obsolete once none of its slots is open and
    none of its notes kept; only the steps that name a slot just decided or a note just dropped
    (:meth:`touch`), and those just added, are looked at -- not every live step at every step
    (behind a backlog thousands are live).

    >>> live = LiveSteps()
    >>> live.add(1, {("q", 1, 10)}, {10}); live.add(2, {("q", 1, 11)}, set())
    >>> live.obsolete(is_open=lambda k: True, has_note=lambda e: True)
    []
    >>> live.touch(slots=[("q", 1, 10)], notes=[])  # decided; its note still kept
    >>> live.obsolete(is_open=lambda k: k != ("q", 1, 10), has_note=lambda e: True), 1 in live
    ([], True)
    >>> live.touch(slots=[], notes=[10])  # the note dropped
    >>> live.obsolete(is_open=lambda k: k != ("q", 1, 10), has_note=lambda e: False), 1 in live
    ([1], False)
    """

    def __init__(self) -> None:
        self._steps: dict[int, tuple[frozenset[Any], frozenset[int]]] = {}
        self._by: defaultdict[Hashable, set[int]] = defaultdict(set)  # ("slot", key) or ("note", epoch) -> steps
        self._look: set[int] = set()  # the steps to look at next

    def __contains__(self, step: int) -> bool:
        return step in self._steps

    def add(self, step: int, slots: Iterable[Any], notes: Iterable[int]) -> None:
        """Step ``step``'s record is live (looked at the next time, as one that names nothing)."""
        self._steps[step] = (frozenset(slots), frozenset(notes))
        for ref in self._refs(step):
            self._by[ref].add(step)
        self._look.add(step)

    def touch(self, slots: Iterable[Any], notes: Iterable[int]) -> None:
        """These slots were decided and these notes dropped: the steps naming them are looked at."""
        for ref in [*(("slot", k) for k in slots), *(("note", e) for e in notes)]:
            self._look.update(self._by.get(ref, ()))

    def touch_all(self) -> None:
        """Every live step is looked at (a restart's: what was decided before it is unknown)."""
        self._look.update(self._steps)

    def obsolete(self, is_open: Callable[[Any], bool], has_note: Callable[[int], bool]) -> list[int]:
        """The steps looked at that are obsolete now, in step order; they are live no more."""
        gone = []
        for step in sorted(self._look):
            slots, notes = self._steps.get(step, (None, None))
            if slots is None or notes is None or any(map(is_open, slots)) or any(map(has_note, notes)):
                continue
            for ref in self._refs(step):
                self._by[ref].discard(step)
                if not self._by[ref]:
                    del self._by[ref]
            del self._steps[step]
            gone.append(step)
        self._look.clear()
        return gone

    def _refs(self, step: int) -> list[Hashable]:
        slots, notes = self._steps[step]
        return [*(("slot", k) for k in slots), *(("note", e) for e in notes)]


class BarrierLog:
    """The clock's barriers as ``barrier-<clock>`` records: what a step writes, given the
    policy's barriers then -- a record for each new one (clocks only grow: they are at the end
    of the list) and a tombstone for each passed one (they were at its start); a restart's are
    written again, or tombstoned, once.

    >>> log = BarrierLog()
    >>> log.step([(10, {0: 5}), (11, {0: 9})])
    [('barrier-10', {'barrier': [10, {'0': 5}]}), ('barrier-11', {'barrier': [11, {'0': 9}]})]
    >>> log.step([(11, {0: 9})]), log.step([(11, {0: 9})])  # 10 passed; then nothing changed
    ([('barrier-10', None)], [])
    """

    def __init__(self) -> None:
        self._logged: deque[int] = deque()  # the clocks whose records are live in the log
        self._restored: list[int] = []

    def restored(self, clocks: Iterable[int]) -> None:
        """A restart read these barrier records."""
        self._restored.extend(clocks)

    def step(self, barriers: Sequence[tuple[int, dict[int, int]]]) -> list[tuple[str, dict[str, Any] | None]]:
        """The records (key, value; None: a tombstone) that bring the log to ``barriers``."""
        out: list[tuple[str, dict[str, Any] | None]] = []
        if self._restored:
            live = {c for c, _ in barriers}
            out += [(barrier_key(c), None) for c in self._restored if c not in live]
            self._restored = []
            self._logged.clear()  # every live barrier written again below
        logged = self._logged
        while logged and (not barriers or logged[0] < barriers[0][0]):
            out.append((barrier_key(logged.popleft()), None))
        new = []
        for c, b in reversed(barriers):
            if logged and c <= logged[-1]:
                break
            new.append((c, b))
        for c, b in reversed(new):
            out.append((barrier_key(c), {"barrier": [c, {str(p): o for p, o in b.items()}]}))
            logged.append(c)
        return out


def compact(records: Iterable[StateRecord]) -> list[StateRecord]:
    """What a compacted topic keeps of a committed log (as a ``read_committed`` consumer sees
    it; Kafka's cleaner discards aborted records): the last record of each key, in log order
    (a tombstone may be kept or gone). For tests: ``fold(compact(log)) == fold(log)``."""
    records = list(records)
    last = {r.key: i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i]
