"""A span query (``span_s`` 300: one report per device per 5 minutes) through a real broker and a
real worker, its records and markers sent by hand as a span producer sends them (the span's
first epoch, markers at its end).

* each span is published exactly once (a row per station, closed by its markers) with
  ``span_s`` 300 and ``epoch`` the span's first, and its estimates are the statistics core's
  per-station linear estimator applied to the same counts (a set truth: each vehicle passed up
  to P stations of the span);
* a record at another epoch of a span is dead-lettered ``misaligned_span`` (with its reason)
  and counted; nothing of it reaches the estimates;
* the span query feeds no rollup, and its station series are the flows' (``span_s`` label).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

import estimators as E
from producers.sink import ReportSink
from schemas import EndOfEpoch, Query, encode_batch, encode_json, new_batch_id
from schemas.estimates import Estimate

from .kafka_helpers import drain
from .stream_helpers import WorkerProcess, metric, pipeline_settings, publish_queries, wait_for

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # on the hour: a 5-minute span starts here
S0 = int(T0.timestamp()) // 30
SENSORS = (400_001, 400_017, 400_230, 401_002)
N = 300  # vehicles reporting per span
SPANS = (S0, S0 + 10, S0 + 20)


def _tally(q: Query, epoch: int, counts: np.ndarray) -> bytes:
    return encode_batch({"kind": "tally", "query_id": q.query_id, "query_version": q.version, "epoch": epoch,
                         "round": 0, "producer_id": "p0-span", "layout": "counts", "n_stations": q.n_stations,
                         "n_outputs": q.n_outputs, "batch_id": new_batch_id(), "reports": N},
                        {"counts": counts.ravel().astype(np.int64)})


def _marker(q: Query, epoch: int, partition: int, sent_here: bool) -> bytes:
    return encode_json(EndOfEpoch(
        producer_id="p0-span", producer_index=0, producer_count=1, query_id=q.query_id, query_version=q.version,
        epoch=epoch, round=0, partition=partition, reports_to_partition=N if sent_here else 0,
        batches_to_partition=int(sent_here), reports_total=N, batches_total=1, participants=N, refused=0,
        mode="tally", span_s=q.span_s))


def test_a_span_query_is_published_once_per_span_and_a_misaligned_record_is_a_dead_letter(
        broker: str, tmp_path: Path) -> None:
    rs, ws = pipeline_settings(broker, tmp_path)
    q = Query(query_id="flow-5min", analyst_id="a", version=1, sensors=SENSORS, mechanism="unary", population=1_000,
              span_s=300, t_start=T0, t_end=T0 + timedelta(minutes=30))
    publish_queries(rs, [q])
    mech = q.build()
    rng = np.random.default_rng(7)
    truth = np.array([120, 260, 35, 0])  # passages per station: 415 over 300 vehicles (P = 4 a span)
    table = mech.output_table(0)  # rows: No, Yes; each station's answer from the Yes row iff passed in the span
    ones = {s: rng.binomial(truth, table[1, 1]) + rng.binomial(N - truth, table[0, 1]) for s in SPANS}
    counts = {s: np.stack([N - ones[s], ones[s]], axis=1) for s in SPANS}  # (V, outputs)
    sink = ReportSink(rs, rs.reports_topic)
    try:
        misaligned = _tally(q, S0 + 13, counts[S0 + 10])  # inside the second span: not its first epoch
        sink.send(misaligned, key=b"misaligned", partition=1)
        for s in SPANS:
            sink.send(_tally(q, s, counts[s]), key=new_batch_id().encode(), partition=0)
            for p in range(rs.partitions):
                sink.send(_marker(q, s, p, p == 0), key=new_batch_id().encode(), partition=p)
        sink.flush()
    finally:
        sink.close()
    assert sink.failed == 0, sink.failure_reasons

    def rows() -> list[Estimate]:
        return [Estimate.model_validate_json(r.value) for r in drain(ws, ws.estimates_topic, quiet_polls=2)]

    w = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        w.wait_ready()
        wait_for(lambda: {e.epoch for e in rows()} >= set(SPANS), 180, "a row for every span")
        wait_for(lambda: metric(w.metrics(), "ptt_dead_letters_total", reason="misaligned_span") == 1, 60,
                 "the misaligned record's dead letter counted")
        text = w.metrics()
    finally:
        w.stop()

    got = rows()
    assert len(got) == len(SPANS) * q.n_stations  # one row per station and span, nothing else (no rollup)
    est = E.rr_estimator(mech, name="unary")
    for s in SPANS:
        span_rows = {e.station: e for e in got if e.epoch == s}
        assert set(span_rows) == set(SENSORS)
        values = est.estimate(counts[s][:, None, :], N)
        for j, station in enumerate(SENSORS):
            e = span_rows[station]
            assert e.span_s == 300 and e.withheld is None and e.closed_by == "markers" and e.participants == N
            assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)
    letters = [json.loads(r.value) for r in drain(ws, ws.dead_letter_topic, quiet_polls=2)]
    assert [(x["reason"], x["partition"]) for x in letters] == [("misaligned_span", 1)]
    assert f"epoch {S0 + 13} is not the first epoch of a 300-s span" in letters[0]["detail"]
    assert metric(text, "ptt_dead_letters_total") == 1
    assert metric(text, "ptt_epochs_closed_total", query=q.query_id, closed_by="markers") == len(SPANS)
    flows = [ln for ln in text.splitlines() if ln.startswith("ptt_rollup_vehicles{") and q.query_id in ln]
    assert len(flows) == q.n_stations and all('span_s="300"' in ln for ln in flows)
    assert metric(text, "ptt_rollups_total", query=q.query_id) == 0
