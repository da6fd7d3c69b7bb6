"""Stage 1's gap finder (``stream_app.worker.gaps``): which epochs a source partition skipped.

Checked: the first record of a (partition, query, version) reveals nothing; a jump of more
than one epoch yields one gap per skipped epoch, once (a repeat, an older epoch or the next
epoch yields none); the memory is per source partition and per query version; the gaps stay
inside the query's window and within ``horizon_epochs`` of the record; a record naming several
windows (a marker set) is taken window by window; an unknown query yields none.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schemas import Query
from stream_app.worker.gaps import GapFinder
from stream_app.worker.records import Gap

T0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
Q1 = Query(query_id="q", analyst_id="a", version=1, sensors=(1, 2), mechanism="rr", population=50,
           t_start=T0, t_end=T0 + timedelta(minutes=10))
Q2 = Q1.model_copy(update={"version": 2})
START, END = Q1.epoch_range()
KNOWN = {("q", 1): Q1, ("q", 2): Q2}


def lookup(qid: str, v: int) -> Query | None:
    return KNOWN.get((qid, v))


def epochs(gaps: list[Gap]) -> list[int]:
    return [g.epoch - START for g in gaps]


def test_a_jump_yields_one_gap_per_skipped_epoch_once() -> None:
    f = GapFinder(horizon_epochs=720)
    assert f.gaps(0, [("q", 1, START)], lookup) == []
    assert f.gaps(0, [("q", 1, START + 1)], lookup) == []  # the next epoch
    got = f.gaps(0, [("q", 1, START + 5)], lookup)
    assert got == [Gap("q", 1, START + e, 0, START + 5) for e in (2, 3, 4)]
    assert f.gaps(0, [("q", 1, START + 5)], lookup) == []  # a repeat
    assert f.gaps(0, [("q", 1, START + 3)], lookup) == []  # an older epoch (a slow producer)
    assert epochs(f.gaps(0, [("q", 1, START + 7)], lookup)) == [6]  # from the newest, not the last seen


def test_memory_is_per_source_partition_and_query_version() -> None:
    f = GapFinder(horizon_epochs=720)
    f.gaps(0, [("q", 1, START)], lookup)
    assert f.gaps(1, [("q", 1, START + 4)], lookup) == []  # partition 1's first record
    assert f.gaps(0, [("q", 2, START + 4)], lookup) == []  # version 2's first record
    got = f.gaps(0, [("q", 1, START + 3), ("q", 2, START + 6)], lookup)  # one marker set, two windows
    assert [(g.query_version, g.epoch - START, g.source_partition) for g in got] == [(1, 1, 0), (1, 2, 0), (2, 5, 0)]


@pytest.mark.parametrize(("horizon", "expected"), [(720, list(range(1, 20))), (10, [15, 16, 17, 18, 19]), (5, [])])
def test_gaps_stay_inside_the_query_window_and_the_horizon(horizon: int, expected: list[int]) -> None:
    f = GapFinder(horizon_epochs=horizon)
    f.gaps(0, [("q", 1, START)], lookup)
    assert END - START == 20
    assert epochs(f.gaps(0, [("q", 1, START + 25)], lookup)) == expected  # the record itself: past the end
    g = GapFinder(horizon_epochs=horizon)
    g.gaps(0, [("q", 1, START - 30)], lookup)  # (stage 1 refuses it; the finder still bounds the gaps)
    assert epochs(g.gaps(0, [("q", 1, START + 2)], lookup)) == [0, 1]


def test_an_unknown_query_yields_no_gap_and_a_bad_horizon_is_refused() -> None:
    f = GapFinder(horizon_epochs=10)
    f.gaps(0, [("gone", 1, 100)], lookup)
    assert f.gaps(0, [("gone", 1, 105)], lookup) == []
    with pytest.raises(ValueError, match="horizon_epochs"):
        GapFinder(horizon_epochs=0)
