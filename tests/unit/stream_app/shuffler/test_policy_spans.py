"""The shuffler's policy (``stream_app.shuffler.policy``) for a span query (``Query.span_s``): one
slot per span, at its first epoch.

* a report for any other epoch of the span is refused ``misaligned_span`` (``refuse`` and its
  array form ``passing`` agree);
* the clock opens empty slots only at span starts (every span gets an outcome, no epoch inside
  a span does);
* by event time a span's slot is due only once the clock has passed the span's LAST epoch by
  the lateness (a 30-s query's slot of the span's first epoch is due long before): fails if the
  span is ignored; by the end of input, only once the clock has reached the span's last epoch;
* the released span carries the notes of every epoch of it (stations without a reading, an
  interruption), and those notes are kept until the span is decided even if a 30-s slot of the
  same epoch closes first;
* an interrupted note inside a span, or the replay's last note (``ends``), cuts the span's slot:
  due once the clock passes that epoch, released interrupted -- whether the note comes after the
  slot opened or before (another producer ahead).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from schemas import DeviceReport, Query, SourceEpoch
from stream_app.shuffler.policy import Released, ShufflePolicy

T0 = datetime(2026, 11, 18, tzinfo=UTC)  # midnight: a span start
FLOW = Query(query_id="flow", analyst_id="a", version=1, mechanism="rr", sensors=(1, 2, 3), population=100,
             span_s=300, t_start=T0, t_end=T0 + timedelta(days=1))
LIVE = FLOW.model_copy(update={"query_id": "live", "span_s": 30})
S = FLOW.epoch_range()[0]
SPAN = FLOW.epochs_per_span
LATE = 2


def active(epoch: int) -> list[Query]:
    return [FLOW, LIVE]


def report(q: Query, epoch: int, station: int = 1) -> DeviceReport:
    return DeviceReport(query_id=q.query_id, query_version=1, epoch=epoch, pairs=((station, 1),))


def policy() -> ShufflePolicy:
    p = ShufflePolicy(min_crowd=1, lateness_epochs=LATE, idle_release_s=5.0, partitions=(0,), ahead_epochs=SPAN)
    assert p.note(SourceEpoch(epoch=S, opens=True), active, 0.0) is None
    return p


def finish(p: ShufflePolicy, epoch: int, **over: object) -> None:
    assert p.note(SourceEpoch(epoch=epoch, device_offsets=((0, 0),), **over), active, 0.0) is None


def test_a_report_inside_a_span_is_refused_misaligned() -> None:
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    why = p.admit(report(FLOW, S + 3), FLOW, 0.0)
    assert why is not None and why.reason == "misaligned_span"
    assert p.admit(report(LIVE, S + 3), LIVE, 0.0) is None  # a 30-s query's epoch is fine
    epochs = np.array([S, S + 3, S + 9], np.int64)
    ok = p.passing(FLOW, epochs, np.zeros(3, np.int64), pairs_fit=np.ones(3, bool))
    assert ok.tolist() == [True, False, False]
    assert [p.refuse(report(FLOW, int(e)), FLOW) is None for e in epochs] == ok.tolist()


def test_the_clock_opens_slots_only_at_span_starts() -> None:
    p = policy()
    for e in range(S, S + 2 * SPAN):
        finish(p, e)
    flow = sorted(k[2] - S for k in p.open_epochs if k[0] == "flow")
    assert flow == [0, SPAN]
    assert len([k for k in p.open_epochs if k[0] == "live"]) == 2 * SPAN  # a 30-s query: every epoch


def test_a_span_s_slot_is_due_only_past_its_last_epoch() -> None:
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    assert p.admit(report(LIVE, S), LIVE, 0.0) is None
    for e in range(S, S + SPAN - 1 + LATE):  # the clock up to the span's last epoch + the lateness - 1
        finish(p, e)
        due = p.due(0.0, caught_up=frozenset(), positions={0: 0})
        assert ("flow", 1, S) not in due, e - S
        for k in due:
            p.close(k, np.random.default_rng(0))
    assert ("live", 1, S) in p.decided  # the 30-s epoch went long ago
    finish(p, S + SPAN - 1 + LATE)
    assert ("flow", 1, S) in p.due(0.0, caught_up=frozenset(), positions={0: 0})


def test_end_of_input_waits_for_the_span_s_last_epoch() -> None:
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    for e in range(S, S + SPAN - 1):
        finish(p, e)
    assert ("flow", 1, S) not in p.due(100.0, caught_up=frozenset({0}), positions={0: 0})
    finish(p, S + SPAN - 1)
    assert ("flow", 1, S) in p.due(100.0, caught_up=frozenset({0}), positions={0: 0})


def test_the_released_span_carries_every_epoch_s_notes() -> None:
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    for e in range(S, S + SPAN + LATE):
        finish(p, e, readings_missing=(2,) if e == S + 4 else (3,) if e == S + 9 else ())
        for k in p.due(0.0, caught_up=frozenset(), positions={0: 0}):
            if k[0] == "live":  # the 30-s slots of the span's epochs close first: the span keeps their notes
                p.close(k, np.random.default_rng(0))
    out = p.close(("flow", 1, S), np.random.default_rng(0))
    assert isinstance(out, Released) and set(out.no_data) == {2, 3} and not out.interrupted
    assert not any(p.has_note(e) for e in range(S, S + SPAN))  # used, then dropped


def test_an_interruption_anywhere_in_the_span_reaches_it() -> None:
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    for e in range(S, S + SPAN):
        finish(p, e, interrupted=e == S + 6)
    out = p.close(("flow", 1, S), np.random.default_rng(0))
    assert isinstance(out, Released) and out.interrupted


def test_a_span_a_replay_stopped_in_is_decided_interrupted_without_waiting_for_its_end() -> None:
    """A replay stopped inside a span (its note says ``interrupted``) sends nothing more of the
    span: the slot is due once the clock passes the interrupted epoch by the lateness, and is
    released as interrupted -- not left open until the span's end, which never comes (fails if the
    note is ignored: the slot is still open)."""
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    for e in range(S, S + 3):
        finish(p, e)
    finish(p, S + 3, interrupted=True)
    for e in range(S + 4, S + 3 + LATE + 1):
        finish(p, e)
    due = p.due(0.0, caught_up=frozenset(), positions={0: 0})
    assert ("flow", 1, S) in due
    out = p.close(("flow", 1, S), np.random.default_rng(0), "aggregate")
    assert isinstance(out, Released) and out.interrupted


def test_a_span_the_replay_ends_inside_is_cut_short_and_its_last_30s_epoch_is_not() -> None:
    """The replay's last note (``ends``: nothing follows it) inside a span: the span's slot is due
    once the clock passes that epoch by the lateness and is released interrupted (no report of
    it will come), while the 30-s query's slot of that same epoch is released as usual (fails if
    ``ends`` is ignored: the span stays open; or if it interrupts the epoch itself)."""
    p = policy()
    assert p.admit(report(FLOW, S), FLOW, 0.0) is None
    for e in range(S, S + 4):
        assert p.admit(report(LIVE, e), LIVE, 0.0) is None
        finish(p, e, ends=e == S + 3)
    idle = p.due(10.0, caught_up=frozenset({0}), positions={0: 0})
    assert ("flow", 1, S) in idle and ("live", 1, S + 3) in idle
    span = p.close(("flow", 1, S), np.random.default_rng(0), "aggregate")
    last = p.close(("live", 1, S + 3), np.random.default_rng(0), "aggregate")
    assert isinstance(span, Released) and span.interrupted
    assert isinstance(last, Released) and not last.interrupted and last.rounds[0].devices == 1


def test_an_interruption_noted_before_the_span_s_slot_opens_still_cuts_it() -> None:
    """Two producers: the one ahead stops inside the span (its note of S + 3, interrupted) before
    the other has finished the span's first epoch, so the clock opens the span's slot only after
    that note: the slot is cut there all the same -- due at the end of input once the clock
    reaches S + 3 and released interrupted (fails if only notes arriving after the slot opened
    cut it: the slot waits for S + SPAN - 1, which the clock never reaches)."""
    p = ShufflePolicy(min_crowd=1, lateness_epochs=LATE, idle_release_s=5.0, partitions=(0,), ahead_epochs=SPAN)
    for k in (0, 1):
        assert p.note(SourceEpoch(epoch=S, opens=True, producer_index=k, producer_count=2), active, 0.0) is None
    for e in range(S, S + 4):
        finish(p, e, producer_index=1, producer_count=2, interrupted=e == S + 3)
    assert not p.open_epochs  # the other producer has not finished S: no slot yet
    for e in range(S, S + 4):
        finish(p, e, producer_index=0, producer_count=2)
    assert p.clock == S + 3 and ("flow", 1, S) in p.due(100.0, caught_up=frozenset({0}), positions={0: 0})
    out = p.close(("flow", 1, S), np.random.default_rng(0))
    assert isinstance(out, Released) and out.interrupted
