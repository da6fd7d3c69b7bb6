"""The shuffler's policy (``stream_app.shuffler.policy``) behind a backlog: the replay's source
notes run far ahead of the device reports read (an unpaced replay), so the clock opens the
slots of many epochs, which stay open until the input catches up -- among them long-open span
slots (an hour's, a day's) -- and thousands of notes are kept.

* the decisions are the same as the policy's before its bookkeeping was indexed: a reference
  written here keeps the notes in a plain dict, asks whether an epoch's note is still needed by
  scanning every open slot (for every kept note, at every note once more than 4 x EPOCHS_KEPT are
  kept) and finds the due slots by computing every open slot's last epoch; driven with the same
  notes (two producers, stations without readings, interruptions, the replay's end), reports (a
  query published late that opens slots of old epochs, where a dropped note shows) and steps,
  both give the same due lists, releases and withholds, kept notes and held reports (fails if
  the counts of covering slots, the sweep's heap or the waits' heap drift from the scans);
* the work grows linearly: 10x the epochs (notes, slots, steps) costs under 20x the Python lines
  the policy executes (counted with a trace function, no clock), where the reference -- and the
  policy before -- cost over 100x (checked on the policy before: it fails here);
* the runtime's live step records (``state.LiveSteps``) look only at the steps naming a slot
  just decided or a note just dropped: every note whose ``has_note`` turned false is among the
  policy's ``dropped_notes``, and over random steps the steps found obsolete are those a scan
  of every live step finds, step for step.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from schemas import DeviceReport, Query, SourceEpoch
from stream_app.shuffler import policy as policy_module
from stream_app.shuffler.policy import EpochKey, Released, ShufflePolicy
from stream_app.shuffler.state import LiveSteps

T0 = datetime(2026, 11, 18, tzinfo=UTC)  # midnight: every span starts here
SENSORS = (1, 2, 3, 4)


def _query(query_id: str, mechanism: str, span_s: int = 30) -> Query:
    return Query(query_id=query_id, analyst_id="a", version=1, mechanism=mechanism, sensors=SENSORS,
                 population=1_000, span_s=span_s, t_start=T0, t_end=T0 + timedelta(days=1))


QUERIES = [_query("alp", "alp"), _query("unary", "unary"), _query("u300", "unary", 300),
           _query("u3600", "unary", 3600), _query("uday", "unary", 86_400)]
LATE = _query("late", "unary", 300)  # published a third into the run: its reports open slots of old epochs
S = QUERIES[0].epoch_range()[0]
GAP = range(S + 40, S + 70)  # epochs no query is active in (from the second 30-s query on): nothing covers them


class _ScanNotes:
    """The notes as the policy kept them before: a dict, and whether an open slot still needs an
    epoch's note found by scanning every open slot."""

    def __init__(self, policy: ShufflePolicy) -> None:
        self.policy = policy
        self.notes: dict[int, tuple[frozenset[int], bool]] = {}

    def __contains__(self, epoch: int) -> bool:
        return epoch in self.notes

    def __len__(self) -> int:
        return len(self.notes)

    def get(self, epoch: int) -> tuple[frozenset[int], bool]:
        return self.notes.get(epoch, (frozenset(), False))

    def add(self, epoch: int, missing: frozenset[int], interrupted: bool) -> None:
        had, was = self.get(epoch)
        self.notes[epoch] = (had | missing, was or interrupted)

    def covered(self, epoch: int) -> bool:
        return any(k[2] <= epoch < k[2] + o.query.epochs_per_span for k, o in self.policy._open.items())

    def cover(self, epochs: range) -> None:
        pass

    def uncover(self, epochs: range) -> None:
        pass

    def first_interrupted(self, epochs: range) -> int | None:
        return min([e for e in epochs if e in self.notes and self.notes[e][1]], default=None)

    def take(self, epochs: range) -> tuple[frozenset[int], bool]:
        missing: frozenset[int] = frozenset()
        interrupted = False
        for e in epochs:
            m, i = self.get(e)
            missing, interrupted = missing | m, interrupted or i
        for e in epochs:
            if not self.covered(e):
                self.notes.pop(e, None)
        return missing, interrupted

    def sweep(self, before: int) -> int:
        gone = [e for e in self.notes if e < before and not self.covered(e)]
        for e in gone:
            del self.notes[e]
        return len(gone)


class _Reference(ShufflePolicy):
    """The policy with its bookkeeping as before: :class:`_ScanNotes`, every open slot's last
    epoch computed for each :meth:`due`, the held reports summed over every open slot."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._notes = _ScanNotes(self)  # type: ignore[assignment]

    def held(self) -> int:
        return sum(r.devices for o in self._open.values() for r in o.rounds)

    def due(self, now: float, caught_up: Collection[int], positions: dict[int, int] | None = None
            ) -> list[EpochKey]:
        positions = positions or {}
        for p, vouched in self._vouched.items():
            for offs, dones in vouched.values():
                drop = int(np.searchsorted(np.asarray(offs, np.int64), positions.get(p, 0), side="right")) - 1
                if drop > 0:
                    del offs[:drop], dones[:drop]
        while self.barriers and all(positions.get(p, 0) >= o for p, o in self.barriers[0][1].items()):
            self.passed = max(self.passed, self.barriers.pop(0)[0])
        idle = self.partitions <= set(caught_up) and now - self.last_arrival >= self.idle_release_s
        horizon = self.passed - self.lateness_epochs
        last = {k: self._last_epoch(k) for k in self._open}
        return [k for k in self.open_epochs if last[k] <= horizon or (idle and last[k] <= min(self.clock, self.passed))]


def _policy(kind: type[ShufflePolicy] = ShufflePolicy) -> ShufflePolicy:
    return kind(min_crowd=2, lateness_epochs=2, idle_release_s=5.0, partitions=(0,))


def _report(q: Query, epoch: int, rng: random.Random) -> DeviceReport:
    if q.per_station is None:
        return DeviceReport(query_id=q.query_id, query_version=1, epoch=epoch, value=rng.randint(0, len(SENSORS)))
    return DeviceReport(query_id=q.query_id, query_version=1, epoch=epoch, pairs=((rng.choice(SENSORS), 1),))


def _outcome(out: object) -> tuple[object, ...]:
    if isinstance(out, Released):
        rounds = tuple((r.reports, r.devices, *(a.tolist() for a in r.data.arrays().values())) for r in out.rounds)
        return ("released", out.query.query_id, out.epoch, rounds, tuple(sorted(out.no_data)), out.interrupted)
    return ("withheld", out.query.query_id, out.epoch, out.reason, out.devices, out.detail)  # type: ignore[attr-defined]


Check = Callable[[ShufflePolicy], None]


def _drive(p: ShufflePolicy, epochs: int, observe: bool = True, seed: int = 7, check: Check | None = None
           ) -> list[object]:
    """Two producers' notes of ``epochs`` epochs, a few reports an epoch, a step every 5 epochs
    with the input read to half the notes' offsets (a backlog), then the rest read and every
    slot decided; what the policy said and kept along the way (``observe``: its kept notes,
    held reports and open slots at each step too)."""
    rng = random.Random(seed)  # noqa: S311 -- reproducible test input, not a secret
    published = [False]

    def active(epoch: int) -> list[Query]:
        return [q for q in QUERIES if q.span_s > 30 or epoch not in GAP] + ([LATE] if published[0] else [])

    said: list[object] = []
    for k in (0, 1):
        said.append(p.note(SourceEpoch(epoch=S, opens=True, producer_index=k, producer_count=2), active, 0.0))
    offset = 0
    for i in range(epochs):
        for k in (0, 1):
            offset += 10
            note = SourceEpoch(epoch=S + i, producer_index=k, producer_count=2, device_offsets=((0, offset),),
                               readings_missing=tuple(rng.sample(SENSORS, rng.choice((0, 0, 1)))),
                               interrupted=rng.random() < 0.01, ends=i == epochs - 1)
            said.append(p.note(note, active, float(i)))
        published[0] = published[0] or i >= epochs // 3
        for _ in range(4):
            q = rng.choice(QUERIES + [LATE] * 3 * published[0])
            epoch = q.span_start(rng.randint(max(p.floor, 0), p.clock + 2))
            why = p.admit(_report(q, epoch, rng), q, float(i))
            said.append(None if why is None else why.reason)
        if i % 5 == 4:
            said += _step(p, float(i), offset // 2, idle=False, observe=observe, check=check)
    for _ in range(3):  # the input read to its end, quiet: every slot decided
        said += _step(p, float(epochs + 100), offset, idle=True, observe=observe, check=check)
    return said


def _step(p: ShufflePolicy, now: float, read: int, idle: bool, observe: bool, check: Check | None = None
          ) -> list[object]:
    due = p.due(now, frozenset({0}) if idle else frozenset(), {0: read})
    said: list[object] = [("due", tuple(due))]
    said += [_outcome(p.close(key, np.random.default_rng(1), "aggregate")) for key in due]
    if check is not None:
        check(p)
    if observe:
        kept = tuple(e for e in range(S - 2, S + 3000) if p.has_note(e))
        said.append(("kept", kept, p.held(), tuple(p.open_epochs)))
    return said


@pytest.fixture
def small_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Notes of uncovered epochs dropped 5 epochs behind the clock, swept past 20 kept (120, past
    480): the sweep runs in a run of hundreds of epochs."""
    monkeypatch.setattr(policy_module, "EPOCHS_KEPT", 5)


@pytest.mark.usefixtures("small_sweep")
def test_the_same_decisions_as_scanning_every_open_slot() -> None:
    ours, reference = _drive(_policy(), 400), _drive(_policy(_Reference), 400)
    assert ours == reference
    outcomes = [s for s in ours if isinstance(s, tuple) and s[0] in ("released", "withheld")]
    assert {s[1] for s in outcomes} >= {"alp", "unary", "u300", "u3600", "uday", "late"}
    assert any(s[0] == "released" and s[4] for s in outcomes)  # notes reached releases
    assert any(s[0] == "released" and s[5] for s in outcomes)  # and interruptions
    assert any(s[0] == "withheld" for s in outcomes)
    assert "outside_open_window" not in ours


def test_the_same_decisions_at_the_policy_s_own_sweep() -> None:
    """EPOCHS_KEPT as it is: the sweep waits for 480 kept notes."""
    assert _drive(_policy(), 700, observe=False, seed=3) == _drive(_policy(_Reference), 700, observe=False, seed=3)


class _Budget(Exception):
    pass


@contextmanager
def _lines(limit: float = float("inf")) -> Iterator[list[int]]:
    """Count the Python lines executed in ``stream_app/shuffler/`` (past ``limit``: stop the run)."""
    where = str(Path(policy_module.__file__).parent)
    count = [0]

    def local(frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            count[0] += 1
            if count[0] > limit:
                raise _Budget
        return local

    def call(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename.startswith(where) else None

    sys.settrace(call)
    try:
        yield count
    finally:
        sys.settrace(None)


@pytest.mark.usefixtures("small_sweep")
def test_ten_times_the_epochs_cost_far_less_than_a_hundred_times_the_work() -> None:
    with _lines() as small:
        _drive(_policy(), 60, observe=False)
    bound = 20 * small[0]
    try:
        with _lines(bound) as large:
            _drive(_policy(), 600, observe=False)
    except _Budget:
        pytest.fail(f"600 epochs took more than {bound:,} lines, 20x the {small[0]:,} of 60 epochs")
    assert large[0] > 2 * small[0]  # the count measures the run (a day-long slot costs its 2,880 epochs either way)


@pytest.mark.usefixtures("small_sweep")
def test_every_note_dropped_is_told() -> None:
    kept: set[int] = set()
    told = 0

    def check(p: ShufflePolicy) -> None:
        nonlocal kept, told
        now = {e for e in range(S - 2, S + 3000) if p.has_note(e)}
        dropped = p.dropped_notes()
        assert kept - now <= set(dropped)
        kept, told = now, told + len(dropped)

    _drive(_policy(), 300, observe=False, check=check)
    assert told >= 300  # every epoch's note, dropped once no slot covered it


def test_live_steps_find_what_a_scan_of_every_step_finds() -> None:
    """Random steps naming random slots and notes; random decisions and drops, each told to
    :meth:`LiveSteps.touch` as the runtime does: the obsolete steps equal a full scan's."""
    rng = random.Random(11)  # noqa: S311 -- reproducible test input, not a secret
    live, scan = LiveSteps(), {}
    open_slots: set[int] = set()
    kept: set[int] = set()
    for step in range(1, 600):
        slots, notes = set(rng.sample(range(step, step + 40), rng.randint(0, 3))), set(rng.sample(range(300), 2))
        open_slots |= slots
        kept |= notes
        live.add(step, slots, notes)
        scan[step] = (slots, notes)
        decided = set(rng.sample(sorted(open_slots), min(len(open_slots), rng.randint(0, 4))))
        dropped = set(rng.sample(sorted(kept), min(len(kept), rng.randint(0, 3))))
        open_slots -= decided
        kept -= dropped
        live.touch(decided, dropped)
        got = live.obsolete(open_slots.__contains__, kept.__contains__)
        expected = [t for t, (ss, ns) in scan.items() if not ss & open_slots and not ns & kept]
        for t in expected:
            del scan[t]
        assert got == expected
    assert len(scan) < 599
