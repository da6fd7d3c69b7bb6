"""Gap records in the window policy (``stream_app.worker.windows``, issue 24 item 4: no epoch absent).

Checked, with a real query so the closed windows go through ``stream_app.worker.estimate``:

* a ``Gap`` opens an ``empty`` window and does nothing else: it does not move the watermark
  (no claim on any source partition), adds no counts or markers, leaves an open or closed
  window as it is (no late count, no idle reset), is ignored when it or the record that revealed
  it lies beyond the horizon, or for an unknown query; ``empty`` survives ``encode``/``decode``;
* the empty window closes by the watermark once passed and idle, or by the stall rule, and is
  withheld ``no_reports`` with a reason that says no producer wrote anything -- never published;
* the epochs around the gap are decided exactly as without the gap records;
* the first real record of an empty window -- open, or already closed and withheld -- opens it
  afresh: the epoch then closes by its markers and publishes the same estimates as a run that
  never saw the gap, and nothing is counted late (a gap made by a forged record far ahead cannot
  change a genuine epoch).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from schemas import Query
from stream_app.worker.estimate import EpochResult, QueryEstimators, epoch_results
from stream_app.worker.records import BatchPartial, Gap, MarkerPartial, Partial, Tick, WindowId
from stream_app.worker.windows import Outcome, Watermarks, WindowPolicy, WindowState

T0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
Q = Query(query_id="q-gap", analyst_id="a", version=1, sensors=(1, 2), mechanism="rr", population=50,
          t_start=T0, t_end=T0 + timedelta(hours=1))
QE = QueryEstimators.build(Q)
E0 = Q.epoch_range()[0]
N = 40
LATER = (E0 + 1000) * 30.0  # a tick clock hours after these epochs: a replay (no wall-clock closing)


def genuine(epoch: int) -> list[Partial]:
    """One producer's tally of the epoch on the one source partition, and its marker."""
    counts = np.array([28 + epoch % 3, 12 - epoch % 3, 25, 15], dtype=np.int64)
    return [BatchPartial(Q.query_id, 1, epoch, 0, 0, "p0", f"{epoch:032x}", N, True, counts),
            MarkerPartial(Q.query_id, 1, epoch, 0, 0, "p0", 0, 1, N, 1, N, 0, False)]


def gap(epoch: int, until: int | None = None) -> Gap:
    return Gap(Q.query_id, 1, epoch, 0, epoch + 1 if until is None else until)


class Run:
    """The policy over one stage-2 partition, states kept as bytes between calls (as the table)."""

    def __init__(self, **kw: float) -> None:
        self.policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=2, **kw)  # type: ignore[arg-type]
        self.wm = Watermarks()
        self.store: dict[WindowId, bytes] = {}
        self.results: dict[int, EpochResult] = {}  # epoch -> its latest outcome
        self.late = 0

    def feed(self, items: Sequence[Partial]) -> Outcome:
        def load(w: WindowId) -> WindowState | None:
            return WindowState.decode(self.store[w]) if w in self.store else None

        out = self.policy.apply(self.wm, load, lambda w: (Q.n_rounds, Q.width), items)
        closed = epoch_results(QE, out.closed, (0.95,), 1, 1)
        self.results.update({r.epoch: r for r in closed})
        self.store.update({w: st.encode() for w, st in out.touched.items()})
        self.late += sum(out.late.values())
        return out


def summary(results: dict[int, EpochResult]) -> dict[int, tuple[object, ...]]:
    return {e: (r.withheld_code, r.closed_by, r.participants,
                {n: v.estimate.tolist() for n, v in r.values.items()}) for e, r in results.items()}


def test_a_gap_opens_an_empty_window_that_closes_withheld_no_reports() -> None:
    run = Run(watermark_idle_s=10.0)
    run.feed([Tick(LATER + 1000), *genuine(E0), *genuine(E0 + 1)])
    newest = dict(run.wm.newest)
    closed = run.store[WindowId(Q.query_id, 1, E0 + 1)]
    out = run.feed([gap(E0 + 2), gap(E0 + 3), gap(E0 + 1)])  # E0 + 1 is closed already
    assert run.wm.newest == newest, "a gap claims nothing about any source partition"
    assert run.late == 0 and run.store[WindowId(Q.query_id, 1, E0 + 1)] == closed
    assert sorted(w.epoch - E0 for w in run.wm.open) == [2, 3] and out.closed == []
    assert sorted(w.epoch - E0 for w in out.touched) == [2, 3]  # the closed window is not rewritten
    st = WindowState.decode(run.store[WindowId(Q.query_id, 1, E0 + 2)])
    assert st.empty and not st.closed and not st.seen and not st.markers and int(st.counts.sum()) == 0
    run.feed([Tick(LATER + 1005), *genuine(E0 + 4), *genuine(E0 + 5), *genuine(E0 + 6)])
    assert set(run.results) == {E0, E0 + 1, E0 + 4, E0 + 5, E0 + 6}  # the gaps' windows wait until idle
    run.feed([gap(E0 + 2), Tick(LATER + 1010)])  # a repeated gap does not reset the idle time
    for e in (E0 + 2, E0 + 3):
        r = run.results[e]
        assert r.withheld_code == "no_reports" and r.closed_by == "watermark" and r.values == {}
        assert r.withheld is not None and "no producer wrote anything" in r.withheld
    assert run.late == 0

    plain = Run(watermark_idle_s=10.0)  # the same records without the gaps
    plain.feed([Tick(LATER + 1000), *genuine(E0), *genuine(E0 + 1)])
    plain.feed([Tick(LATER + 1005), *genuine(E0 + 4), *genuine(E0 + 5), *genuine(E0 + 6)])
    plain.feed([Tick(LATER + 1010)])
    got = summary(run.results)
    assert {e: got[e] for e in plain.results} == summary(plain.results)
    assert set(got) - set(plain.results) == {E0 + 2, E0 + 3}
    assert all(r.withheld is None for r in plain.results.values())


def test_the_stall_rule_closes_a_gap_window_the_watermark_never_passes() -> None:
    run = Run(watermark_idle_s=10.0, stall_close_s=60.0)
    run.feed([Tick(LATER), *genuine(E0), gap(E0 + 5), Tick(LATER + 59)])
    assert E0 + 5 not in run.results
    run.feed([Tick(LATER + 61)])
    assert run.results[E0 + 5].withheld_code == "no_reports"


def test_a_gap_of_an_epoch_not_over_yet_closes_only_by_the_wall_clock() -> None:
    """Live: a forged marker far ahead moves the watermark past future epochs; their gap windows
    wait (neither the watermark nor the stall rule closes them) until the epoch has ended plus
    the grace, and data arriving meanwhile is counted as usual."""
    now = (E0 + 1) * 30.0
    run = Run(watermark_idle_s=10.0, stall_close_s=60.0, wall_clock_grace_s=60.0)
    run.feed([Tick(now), *genuine(E0), *[gap(E0 + e) for e in range(1, 20)], *genuine(E0 + 20)[1:]])
    run.feed([Tick(now + 100.0)])  # all idle, passed by the watermark and stalled; only epoch 1 is over
    assert {e - E0 for e, r in run.results.items() if r.withheld_code == "no_reports"} == {1}
    run.feed(genuine(E0 + 6))  # genuine data of an epoch still to come
    run.feed([Tick((E0 + 8) * 30.0 + 61.0)])
    assert {e - E0 for e, r in run.results.items() if r.withheld_code == "no_reports"} == {1, 2, 3, 4, 5, 7}
    assert run.results[E0 + 7].closed_by == "wall_clock" and run.results[E0 + 6].withheld is None
    assert run.late == 0


def test_a_gap_beyond_the_horizon_or_of_an_unknown_query_opens_nothing() -> None:
    policy = WindowPolicy(n_source_partitions=1, horizon_epochs=10)
    wm = Watermarks()
    policy.apply(wm, lambda w: None, lambda w: (1, 4), genuine(E0))
    out = policy.apply(wm, lambda w: None, lambda w: (1, 4), [gap(E0 + 11), gap(E0 + 9), gap(E0 + 8, E0 + 11)])
    assert [w.epoch - E0 for w in out.touched] == [9]  # a gap whose record lies beyond the horizon: none
    out = policy.apply(wm, lambda w: None, lambda w: None, [gap(E0 + 3)])
    assert out.touched == {} and out.rejected == []


def test_data_after_the_gap_opens_the_window_afresh_even_once_withheld() -> None:
    """A forged record far ahead made gaps for epochs whose genuine data comes later: those
    epochs end exactly as without the gaps (the no_reports is superseded), none counted late."""
    run = Run(watermark_idle_s=10.0)
    run.feed([Tick(LATER), *genuine(E0)])
    run.feed([gap(E0 + e) for e in range(1, 6)])
    run.feed(genuine(E0 + 8)[1:])  # a forged marker at E0 + 8: the watermark jumps past the gaps
    run.feed([Tick(LATER + 20)])
    assert all(run.results[E0 + e].withheld_code == "no_reports" for e in range(1, 6))
    before = run.results[E0 + 2]
    run.feed(genuine(E0 + 1)[:1])  # data into a closed gap window, then into an open one
    run.feed([gap(E0 + 7), *genuine(E0 + 7)[:1]])
    run.feed([*genuine(E0 + 1)[1:], *genuine(E0 + 2), *genuine(E0 + 7)[1:]])
    assert run.late == 0 and run.results[E0 + 2] is not before

    plain = Run(watermark_idle_s=10.0)
    plain.feed([Tick(LATER), *genuine(E0)])
    plain.feed(genuine(E0 + 8)[1:])
    plain.feed([Tick(LATER + 20)])
    plain.feed(genuine(E0 + 1)[:1])
    plain.feed(genuine(E0 + 7)[:1])
    plain.feed([*genuine(E0 + 1)[1:], *genuine(E0 + 2), *genuine(E0 + 7)[1:]])
    got, want = summary(run.results), summary(plain.results)
    for e in (E0 + 1, E0 + 2, E0 + 7):
        assert got[e] == want[e] and want[e][0] is None and want[e][1] == "markers"
    for w in (E0 + 1, E0 + 2):  # born late as without the gap
        a = WindowState.decode(run.store[WindowId(Q.query_id, 1, w)])
        assert not a.empty and a.born_late
    assert {e - E0 for e, r in run.results.items() if r.withheld_code == "no_reports"} == {3, 4, 5}
