"""The clock's barriers in the shuffler's state log (``state.BarrierLog``, what the runtime's
step writes): a ``barrier-<clock>`` record each, written in the step that made it and tombstoned in the step the
input passed it -- not all of them in every step's ``clock`` record (behind a backlog thousands
are pending, ~150 KB of JSON a step). No broker: the policy is real, the sends are collected and
folded as a restart folds the log.

Checked: a step that adds or passes no barrier writes no barrier record (fails if they are
rewritten each step); after any step the log's live barrier records are the policy's barriers,
so a restart (``restore_clock`` then ``restore_barriers``) has them all; a restart's barriers
are written again once and those already passed tombstoned; a ``clock`` record written before
(every barrier under ``barriers``) still restores them."""

from __future__ import annotations

from typing import Any

from schemas import SourceEpoch
from stream_app.shuffler.policy import ShufflePolicy
from stream_app.shuffler.state import BarrierLog, StateRecord, fold

E = 59_832_000


class _Log:
    """The state log as the shuffler writes it: each ``send`` a record of the current step."""

    def __init__(self) -> None:
        self.records: list[StateRecord] = []
        self.step = 0

    def send(self, key: str, value: dict[str, Any] | None) -> None:
        self.records.append(StateRecord(key, value, self.step, "a"))

    def live_barriers(self) -> list[tuple[int, dict[int, int]]]:
        out = [(int(c), {int(p): o for p, o in b.items()})
               for r in fold(self.records, self.step) if r.value and "barrier" in r.value
               for c, b in [r.value["barrier"]]]
        return sorted(out)


def _policy() -> ShufflePolicy:
    p = ShufflePolicy(min_crowd=1, lateness_epochs=1, idle_release_s=1.0, partitions=(0,))
    p.note(SourceEpoch(epoch=E, opens=True), lambda e: [], 0.0)
    p.due(0.0, frozenset(), {0: 0})  # the opening note's barrier (no offsets) passed
    return p


def _step(barriers: BarrierLog, p: ShufflePolicy, log: _Log) -> int:
    """One step's barrier records; how many."""
    log.step += 1
    before = len(log.records)
    for key, value in barriers.step(p.barriers):
        log.send(key, value)
    return len(log.records) - before


def test_each_barrier_is_written_once_and_tombstoned_once_passed() -> None:
    p, log, barriers = _policy(), _Log(), BarrierLog()
    for e in range(E, E + 30):  # the notes run ahead: 30 barriers pending
        p.note(SourceEpoch(epoch=e, device_offsets=((0, 100 * (e - E + 1)),)), lambda epoch: [], 0.0)
        assert _step(barriers, p, log) == 1
        assert log.live_barriers() == p.barriers
    assert _step(barriers, p, log) == 0  # nothing new, nothing passed: nothing written
    p.due(0.0, frozenset(), {0: 1_000})  # the input read past the first 10
    assert len(p.barriers) == 20 and _step(barriers, p, log) == 10 and log.live_barriers() == p.barriers
    p.note(SourceEpoch(epoch=E + 30, device_offsets=((0, 3_100),)), lambda epoch: [], 0.0)
    p.due(0.0, frozenset(), {0: 1_500})
    assert _step(barriers, p, log) == 6 and log.live_barriers() == p.barriers  # 5 tombstones, 1 new

    restarted = _policy()
    clock = {k: v for k, v in p.clock_state().items() if k != "barriers"}
    restarted.restore_clock(clock)
    restarted.restore_barriers(log.live_barriers())
    assert restarted.barriers == p.barriers and "barriers" not in p.clock_state()

    again = BarrierLog()
    again.restored(c for c, _ in log.live_barriers())
    restarted.due(0.0, frozenset(), {0: 2_000})  # passes 5 more before its first step
    assert _step(again, restarted, log) == 5 + len(restarted.barriers)  # tombstones, then every live one again
    assert log.live_barriers() == restarted.barriers and _step(again, restarted, log) == 0


def test_a_clock_record_written_before_still_restores_its_barriers() -> None:
    p = _policy()
    p.restore_clock({"clock": E + 3, "floor": E, "passed": E, "barriers": [[E + 2, {"0": 300}], [E + 3, {"0": 400}]]})
    p.restore_barriers([])
    assert p.barriers == [(E + 2, {0: 300}), (E + 3, {0: 400})]
    log = _Log()
    assert _step(BarrierLog(), p, log) == 2 and log.live_barriers() == p.barriers  # logged apart from now on
