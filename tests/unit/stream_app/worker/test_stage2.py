"""Stage 2's batch plan (``stream_app.worker.stage2``), pure: grouping by partition, what one
partition's outcome publishes and in which order, and the publish chunks. No Faust, no broker."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from schemas import Query
from stream_app.worker.estimate import QueryEstimators
from stream_app.worker.frames import decode_frame, frame_rows
from stream_app.worker.records import WindowId, bundle, split_bundle
from stream_app.worker.stage2 import OutputSettings, by_partition, epoch_outputs, publish_chunks
from stream_app.worker.windows import Outcome, WindowState

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)
E0 = int(T0.timestamp()) // 30
OUT = OutputSettings(confidences=(0.95,), min_participants=1, n_source_partitions=1)


def _query(qid: str, mechanism: str = "sp") -> Query:
    return Query(query_id=qid, analyst_id="a", version=1, sensors=(400_001, 400_002), mechanism=mechanism,
                 population=100, t_start=T0, t_end=T0 + timedelta(minutes=10))


QUERIES = {q.query_id: q for q in (_query("qa"), _query("qb", "rr"))}


def _closed(qid: str, epoch: int) -> WindowState:
    q = QUERIES[qid]
    st = WindowState.new(WindowId(qid, 1, epoch), q.n_rounds, q.width)
    st.close("watermark")
    return st


def _known(qid: str, version: int) -> Query | None:
    return QUERIES.get(qid)


def test_by_partition_splits_bundles_in_order_and_keeps_a_malformed_value_whole() -> None:
    b = bundle([(0, b"k1", b"first"), (0, b"k2", b"second")])
    assert len(b) == 1  # one bundle for partition 0
    _, _, value = b[0]
    plan = by_partition([(2, value), (1, b"\xff broken"), (2, value)], split_bundle)
    assert [p for p, _ in plan] == [2, 1]  # partitions in first-seen order
    assert [i for i, _ in plan[0][1]] == [0, 0, 2, 2]  # each bundle's records, in order
    assert plan[1][1] == [(1, b"\xff broken")]  # kept whole: it is dead-lettered when decoded


def test_epoch_outputs_group_by_query_then_withdrawals_and_skip_unknown_queries() -> None:
    a1, b1, a2 = _closed("qa", E0), _closed("qb", E0), _closed("qa", E0 + 1)
    ghost = WindowState.new(WindowId("ghost", 1, E0), 2, 3)  # a query the lookup no longer knows
    ghost.close("watermark")
    withdrawn = _closed("qb", E0 - 1)
    withdrawn.published = True
    outcome = Outcome(closed=[(a1, "watermark"), (b1, "watermark"), (a2, "watermark"), (ghost, "watermark")],
                      retracted=[withdrawn])
    results = list(epoch_outputs(outcome, _known, QueryEstimators.build, OUT))
    order = [(r.query.query_id, r.epoch, r.retracted) for r in results]
    assert order == [("qa", E0, False), ("qa", E0 + 1, False), ("qb", E0, False), ("qb", E0 - 1, True)]
    assert not withdrawn.published
    for st, res in zip((a1, a2, b1), results[:3], strict=True):  # each window learns its fate
        assert st.published == (res.withheld is None)


@pytest.mark.parametrize("sizes,limit", [([3, 3, 3], 4), ([10], 4), ([], 4), ([1, 1, 1, 1], 2)])
def test_publish_chunks_bound_each_chunk_and_end_with_what_is_left(sizes: list[int], limit: int) -> None:
    class Fake:
        def __init__(self, n: int, tag: int) -> None:
            self.rows = [(bytes([tag]), bytes([i])) for i in range(n)]

        def render(self) -> list[tuple[bytes, bytes]]:
            return self.rows

        def n_records(self) -> int:
            return len(self.rows)

    fakes = [Fake(n, t) for t, n in enumerate(sizes)]
    chunks = list(publish_chunks(fakes, limit))  # type: ignore[arg-type]
    assert chunks, "the last chunk is always yielded (the caller acknowledges at the end)"
    assert all(len(records) >= limit for records, _, _ in chunks[:-1])
    assert [r for records, _, _ in chunks for r in records] == [r for f in fakes for r in f.rows]
    assert [d for _, _, done in chunks for d in done] == fakes
    assert all(frames == [] for _, frames, _ in chunks)  # rows only: no frame rendered
    assert np.all([len(done) > 0 for _, _, done in chunks[:-1]])


@pytest.mark.parametrize("rows,frames", [(False, True), (True, True)])
def test_publish_chunks_render_one_frame_per_result_keyed_by_its_window(rows: bool, frames: bool) -> None:
    a1, b1, a2 = _closed("qa", E0), _closed("qb", E0), _closed("qa", E0 + 1)
    outcome = Outcome(closed=[(a1, "watermark"), (b1, "watermark"), (a2, "watermark")], retracted=[])
    results = list(epoch_outputs(outcome, _known, QueryEstimators.build, OUT))
    chunks = list(publish_chunks(results, 3, rows=rows, frames=frames))  # 2 records per result: chunks of 2
    assert [len(done) for _, _, done in chunks] == [2, 1]
    keyed = [(key, decode_frame(value)) for _, fr, _ in chunks for key, value in fr]
    assert [key for key, _ in keyed] == [WindowId(r.query.query_id, 1, r.epoch).key for r in results]
    assert [f.header["epoch"] for _, f in keyed] == [r.epoch for r in results]
    row_values = [json.loads(v) for rs, _, _ in chunks for _, v in rs]
    assert row_values == ([row for _, f in keyed for row in frame_rows(f)] if rows else [])
