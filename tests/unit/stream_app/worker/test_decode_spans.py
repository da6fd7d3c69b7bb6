"""Stage 1 (``stream_app.worker.decode.to_partials``) for a query with a longer span (``Query.span_s``):
its reports and markers carry the span's first epoch.

* a batch, a single report and a marker at a span's first epoch (inside the query's window)
  become stage records keyed by that epoch;
* the same at any other epoch of the span is dead-lettered ``misaligned_span`` with a reason
  naming the span's first epoch -- for batches, single reports, markers and each marker of a
  set; a 30-s query (span 1 epoch) never is;
* the claim checks still hold for span queries: a count above the population is
  ``out_of_bounds``, participants above it a ``bad_marker``, a span's first epoch outside the
  query's window ``outside_query_window``;
* a marker that says its span (``EndOfEpoch.span_s``) must say the query's (else
  ``bad_marker``); one that says none is taken.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from schemas import EndOfEpoch, EndOfEpochSet, Query, SingleReport, encode_batch, encode_json, new_batch_id
from stream_app.worker.decode import REASONS, Rejected, Stage1Result, to_partials
from stream_app.worker.records import BatchPartial, MarkerPartial

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # on the hour: a 5-minute span starts here
E0 = int(T0.timestamp()) // 30
SENSORS = (400_001, 400_017, 400_230)
SPAN = Query(query_id="q-5min", analyst_id="a", version=1, sensors=SENSORS, mechanism="rr", population=500,
             span_s=300, t_start=T0, t_end=T0 + timedelta(hours=1))
EPOCH30 = SPAN.model_copy(update={"query_id": "q-30s", "span_s": 30})
QUERIES = {(q.query_id, q.version): q for q in (SPAN, EPOCH30)}


def lookup(query_id: str, version: int) -> Query | None:
    return QUERIES.get((query_id, version))


def batch(q: Query, epoch: int, station: list[int], **over: Any) -> bytes:
    h = {"query_id": q.query_id, "query_version": q.version, "epoch": epoch, "round": 0, "producer_id": "p0",
         "n_stations": q.n_stations, "n_outputs": q.n_outputs, "kind": "reports", "layout": "pairs",
         "batch_id": new_batch_id(), "reports": len(station), **over}
    return encode_batch(h, {"station": np.array(station, np.int64), "output": np.ones(len(station), np.int64)})


def tally(q: Query, epoch: int, counts: np.ndarray, reports: int) -> bytes:
    h = {"query_id": q.query_id, "query_version": q.version, "epoch": epoch, "round": 0, "producer_id": "p0",
         "n_stations": q.n_stations, "n_outputs": q.n_outputs, "kind": "tally", "layout": "counts",
         "batch_id": new_batch_id(), "reports": reports}
    return encode_batch(h, {"counts": counts})


def marker(q: Query, epoch: int, **over: Any) -> EndOfEpoch:
    f: dict[str, Any] = {"producer_id": "p0", "producer_index": 0, "producer_count": 1, "query_id": q.query_id,
                         "query_version": q.version, "epoch": epoch, "round": 0, "partition": 0,
                         "reports_to_partition": 3, "batches_to_partition": 1, "reports_total": 3,
                         "batches_total": 1, "participants": 40, "refused": 0, "mode": "per-vehicle", **over}
    return EndOfEpoch(**f)


def single(q: Query, epoch: int) -> bytes:
    return encode_json(SingleReport(query_id=q.query_id, query_version=q.version, epoch=epoch,
                                    batch_id=new_batch_id(), pairs=((1, 1), (3, 1))))


def one(value: bytes) -> Stage1Result:
    out = to_partials(value, 0, lookup)
    assert len(out) == 1, out
    return out[0]


def test_the_reason_is_a_known_one() -> None:
    assert "misaligned_span" in REASONS


@pytest.mark.parametrize("start", [E0, E0 + 10, E0 + 110])
def test_records_at_a_span_start_become_stage_records_of_that_span(start: int) -> None:
    b = one(batch(SPAN, start, [1, 2, 3]))
    assert isinstance(b, BatchPartial) and b.window.epoch == start and b.reports == 3
    s = one(single(SPAN, start))
    assert isinstance(s, BatchPartial) and s.window.epoch == start
    m = one(encode_json(marker(SPAN, start)))
    assert isinstance(m, MarkerPartial) and m.window.epoch == start and m.participants == 40


@pytest.mark.parametrize("offset", [1, 5, 9])
def test_any_other_epoch_of_a_span_is_dead_lettered_misaligned(offset: int) -> None:
    epoch = E0 + 10 + offset
    for value in (batch(SPAN, epoch, [1]), single(SPAN, epoch), encode_json(marker(SPAN, epoch))):
        r = one(value)
        assert isinstance(r, Rejected) and r.reason == "misaligned_span", r
        assert f"starts at epoch {E0 + 10}" in r.detail
    # the same epoch is fine for a 30-s query
    assert isinstance(one(batch(EPOCH30, epoch, [1])), BatchPartial)


def test_each_marker_of_a_set_is_checked_on_its_own() -> None:
    good, bad = marker(EPOCH30, E0 + 21), marker(SPAN, E0 + 21)  # a set shares its epoch
    out = to_partials(encode_json(EndOfEpochSet(markers=(good, bad))), 0, lookup)
    assert isinstance(out[0], MarkerPartial)
    assert isinstance(out[1], Rejected) and out[1].reason == "misaligned_span" and out[1].detail.startswith("marker 2")


def test_claim_checks_still_hold_for_a_span_query() -> None:
    over = np.zeros(SPAN.n_stations * SPAN.n_outputs, np.int64)
    over[1] = SPAN.population + 1  # a count above the population
    r = one(tally(SPAN, E0, over, reports=1))
    assert isinstance(r, Rejected) and r.reason == "out_of_bounds"
    r = one(encode_json(marker(SPAN, E0, participants=SPAN.population + 1)))
    assert isinstance(r, Rejected) and r.reason == "bad_marker"
    start, end = SPAN.epoch_range()
    r = one(batch(SPAN, end, [1]))  # a span start, but past the window
    assert isinstance(r, Rejected) and r.reason == "outside_query_window"


def test_a_marker_that_says_its_span_must_say_the_query_s() -> None:
    assert isinstance(one(encode_json(marker(SPAN, E0, span_s=300))), MarkerPartial)
    r = one(encode_json(marker(SPAN, E0, span_s=3600)))
    assert isinstance(r, Rejected) and r.reason == "bad_marker" and "300" in r.detail
    r = one(encode_json(marker(EPOCH30, E0 + 3, span_s=300)))
    assert isinstance(r, Rejected) and r.reason == "bad_marker"
