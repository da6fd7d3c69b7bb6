"""What kind of estimate a benchmark counts a published row as (tests/benchmarks/common.py
``row_kind``): a 30-s query's epoch, a span query's span (``span_s`` > 30: its own kind, not a
rollup) or a rollup of a 30-s query -- from the worker's own row format, and from a frame header."""

from __future__ import annotations

import doctest
from datetime import UTC, datetime

from schemas.estimates import Estimate
from tests.benchmarks import common
from tests.benchmarks.common import row_kind


def _row(query_id: str, span_s: int) -> bytes:
    return Estimate(query_id=query_id, query_version=1, mechanism="unary", estimator="unary", epoch=59_832_960,
                    epoch_start=datetime(2026, 11, 18, 8, tzinfo=UTC), span_s=span_s, station=1, estimate=1.0,
                    sd=1.0, bounds=(), reports=1, participants=1, epsilon=1.0, closed_by="markers",
                    round_count_mismatch=0, late=0, refused=0, missing_batches=0).model_dump_json().encode()


def test_span_query_rows_are_their_own_kind_and_rollups_stay_rollups() -> None:
    spans = {"unary-hour", "unary-5min"}
    got = [row_kind(_row(q, s), spans) for q, s in (("unary-day", 30), ("unary-day", 300), ("unary-day", 3600),
                                                     ("unary-5min", 300), ("unary-hour", 3600))]
    assert got == ["epoch", "rollup", "rollup", "span", "span"]
    assert row_kind({"query_id": "unary-hour", "span_s": 3600}, spans) == "span"  # a frame's header
    assert row_kind({"query_id": "unary-day", "span_s": 300}, spans) == "rollup"
    assert doctest.testmod(common).failed == 0
