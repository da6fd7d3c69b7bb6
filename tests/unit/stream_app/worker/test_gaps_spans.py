""":class:`stream_app.worker.gaps.GapFinder` for a span query: its windows are its spans' first epochs,
so a record one span after the last is no gap, and a jump of several spans yields only the span
starts skipped (never the epochs inside a span); 30-s queries are unchanged. Bounded by the
query's window as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schemas import Query
from stream_app.worker.gaps import GapFinder

T0 = datetime(2026, 11, 18, 16, tzinfo=UTC)  # on the hour: a span start
E0 = int(T0.timestamp()) // 30
FLOW = Query(query_id="flow", analyst_id="a", version=1, sensors=(1, 2), mechanism="rr", population=50, span_s=300,
             t_start=T0, t_end=T0 + timedelta(hours=1))
LIVE = FLOW.model_copy(update={"query_id": "live", "span_s": 30})


def lookup(query_id: str, version: int) -> Query | None:
    return {"flow": FLOW, "live": LIVE}.get(query_id)


def test_consecutive_spans_are_no_gap() -> None:
    f = GapFinder(horizon_epochs=720)
    assert f.gaps(0, [("flow", 1, E0)], lookup) == []
    assert f.gaps(0, [("flow", 1, E0 + 10)], lookup) == []  # the next span: the 9 epochs inside are not missing
    assert f.gaps(0, [("flow", 1, E0 + 20)], lookup) == []


def test_skipped_spans_are_gaps_at_their_starts_only() -> None:
    f = GapFinder(horizon_epochs=720)
    f.gaps(0, [("flow", 1, E0)], lookup)
    assert [g.epoch - E0 for g in f.gaps(0, [("flow", 1, E0 + 40)], lookup)] == [10, 20, 30]


def test_a_30_s_query_is_unchanged() -> None:
    f = GapFinder(horizon_epochs=720)
    f.gaps(0, [("live", 1, E0)], lookup)
    assert [g.epoch - E0 for g in f.gaps(0, [("live", 1, E0 + 4)], lookup)] == [1, 2, 3]


def test_the_horizon_and_the_window_bound_span_gaps() -> None:
    f = GapFinder(horizon_epochs=25)
    f.gaps(0, [("flow", 1, E0)], lookup)
    # 25 epochs back from E0 + 60 is E0 + 35: the first span start from there is E0 + 40
    assert [g.epoch - E0 for g in f.gaps(0, [("flow", 1, E0 + 60)], lookup)] == [40, 50]
    g = GapFinder(horizon_epochs=720)
    g.gaps(0, [("flow", 1, E0 + 100)], lookup)
    start, end = FLOW.epoch_range()
    assert [x.epoch for x in g.gaps(0, [("flow", 1, end + 20)], lookup)] == [E0 + 110]  # none past the window
