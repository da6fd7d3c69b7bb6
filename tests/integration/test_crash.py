"""A worker SIGKILLed at the point that used to lose data, against a real broker and worker.

The loss found in the randomized restart test (`test_adversarial.py`): stage 2 put its window
state into Faust's changelog buffer (``Table.send_changelog``) and returned; Faust's commit
"flushed" that buffer with a 0.1 s timeout per message, so on a loaded machine the input
offsets were committed while the state they stand for was still in the buffer. A SIGKILL
then lost the state, and the committed offsets kept the stage records from being read again:
the epoch was withheld, "1 batch(es) the markers announce never arrived".

Here the state writes are made slow on purpose (``fault_state_write_delay_s``, a fault
injection setting) and the worker is killed the moment its consumer group has committed past
the stage record of the epoch's first batch. With the fix the commit cannot come before the
state write is acknowledged, so the kill loses nothing: after a restart the epoch is
published from every batch. With the state written through the buffer (the old code) the
same kill loses the first batch -- checked by putting the old write back.

The same slow state writes, with rows and frames on, give a kill between an epoch's published
frame and its state write: the frame is published again after the restart, byte for byte --
also when the restarted worker's start task (its producers) comes after stage 2
(``fault_start_delay_s``).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from producers.fleet import EpochReports
from producers.replay import default_queries, fleet_size_for, load_day
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import Query
from schemas.kafka_io import ensure_topics
from stream_app.settings import WorkerSettings
from stream_app.subscribe import latest_frames
from stream_app.worker.estimate import QueryEstimators
from stream_app.worker.frames import decode_frame, frame_estimates

from .kafka_helpers import drain
from .stream_helpers import (
    EpochSender,
    WorkerProcess,
    estimates_by_query,
    genuine_reports,
    pipeline_settings,
    publish_queries,
    wait_for,
)

pytestmark = pytest.mark.integration


def _stage_records_committed(ws: WorkerSettings) -> bool:
    """The worker's group has committed, on every stage-2 partition, past every stage record
    (ticks aside) written so far."""
    last: dict[int, int] = {}
    for rec in drain(ws, ws.partials_topic, quiet_polls=1, timeout_s=10):
        if rec.key != b"tick":
            last[rec.partition] = max(last.get(rec.partition, -1), rec.offset)
    if not last:
        return False
    # a consumer of the worker's group that never joins it: it only asks the committed offsets
    consumer = KafkaConsumer(**ws.client_kwargs(), group_id=ws.app_id, enable_auto_commit=False)
    try:
        return all((consumer.committed(TopicPartition(ws.partials_topic, p)) or -1) > off for p, off in last.items())
    finally:
        consumer.close()


def _alp_epoch(broker: str, tmp_path: Path, **worker: Any) -> tuple[ReplaySettings, WorkerSettings, Query,
                                                                    EpochReports, int, ReportSink]:
    """Fresh topics, the day's ALP query published, its first epoch's genuine reports (not yet
    sent), the epoch, and a sink to send them; ``worker`` updates the worker's settings."""
    rs, ws = pipeline_settings(broker, tmp_path)
    ws = ws.model_copy(update=worker)
    ensure_topics(rs)
    day = load_day(rs)
    fleet = fleet_size_for(day, rs)
    q = next(q for q in default_queries(day, fleet, rs.mechanisms) if q.mechanism == "alp")
    publish_queries(rs, [q])
    return rs, ws, q, genuine_reports(rs, day, 0, fleet, q), int(day.epochs[0]), ReportSink(rs, rs.reports_topic)


def test_sigkill_once_the_input_is_committed_loses_nothing(broker: str, tmp_path: Path) -> None:
    rs, ws, q, er, epoch, sink = _alp_epoch(broker, tmp_path)
    slow = ws.model_copy(update={"fault_state_write_delay_s": 4.0})
    w = WorkerProcess(slow, tmp_path / "slow.log").start()
    try:
        w.wait_ready()
        sender = EpochSender(sink, q, epoch, er, f"p0-{uuid.uuid4().hex[:8]}", batch_size=50)
        assert len(sender.chunks) >= 2
        sender.batches(1)
        sink.flush()
        wait_for(lambda: _stage_records_committed(ws), 90, "the first batch's stage record committed")
        w.kill()  # the losing point of the old code: input committed, state maybe not written
        w = WorkerProcess(ws, tmp_path / "restarted.log").start()
        w.wait_ready()
        sender.batches()
        sender.markers()
        sink.flush()
        rows = q.n_stations * len(QueryEstimators.build(q).estimators)

        def published() -> bool:
            return sum(1 for k in estimates_by_query(ws).get(q.query_id, {}) if k[0] == epoch) >= rows

        try:
            wait_for(published, 120, "the epoch's estimates")
        except TimeoutError as exc:  # say what the restarted worker had done
            seen = [line for line in w.metrics().splitlines() if line.startswith(("ptt_dead_letters_total{",
                    "ptt_reports_total{", "ptt_records_total{", "ptt_newest_seen_epoch{", "ptt_late_records_total{"))]
            raise TimeoutError(f"{exc}; the restarted worker's metrics: {seen}") from exc
    finally:
        w.stop()
        sink.close()
    got = [e for k, e in estimates_by_query(ws)[q.query_id].items() if k[0] == epoch]
    assert got and all(e.withheld is None for e in got), {e.withheld for e in got}
    assert all(e.reports == sender.sent_reports() and e.closed_by == "markers" for e in got)


def _frame_records(ws: WorkerSettings) -> list[tuple[bytes, bytes]]:
    return [(rec.key, rec.value) for rec in drain(ws, ws.frames_topic, quiet_polls=1, timeout_s=10)]


def test_sigkill_between_the_frames_and_the_state_publishes_the_same_frame_again(broker: str,
                                                                                 tmp_path: Path) -> None:
    """With rows and frames on (``estimate_output="both"``) and the state writes made slow, the
    worker is killed the moment an epoch's frame is on the topic: its estimates are published
    and acknowledged, its window state not yet written. The restarted worker closes the epoch
    again and publishes its frame again -- the same key and the same bytes -- and its rows
    again, the same. A subscriber that keeps the latest frame per key sees one frame, whose
    estimates are exactly the rows (docs/wire.md, "Estimate frames", after a crash)."""
    rs, ws, q, er, epoch, sink = _alp_epoch(broker, tmp_path, estimate_output="both",
                                            frames_topic=f"frames-{uuid.uuid4().hex[:8]}")
    w = WorkerProcess(ws.model_copy(update={"fault_state_write_delay_s": 8.0}), tmp_path / "slow.log").start()
    try:
        w.wait_ready()
        sender = EpochSender(sink, q, epoch, er, f"p0-{uuid.uuid4().hex[:8]}", batch_size=50)
        sender.batches()
        sender.markers()
        sink.flush()
        wait_for(lambda: len(_frame_records(ws)) >= 1, 120, "the epoch's frame")
        w.kill()  # estimates acknowledged, the closing batch's state write still waiting
        # its start task held: stage 2 decides the epoch again before anything else started a
        # producer (a restart's race under load; its rollup forward once failed on it: internal_error)
        w = WorkerProcess(ws.model_copy(update={"fault_start_delay_s": 60.0}), tmp_path / "restarted.log").start()
        w.wait_ready()
        wait_for(lambda: len(_frame_records(ws)) >= 2, 120, "the epoch's frame published again")
    finally:
        w.stop()
        sink.close()
    frames = _frame_records(ws)
    assert len(frames) == 2 and frames[0] == frames[1]  # the same key, the same bytes
    (value,) = latest_frames(frames)
    rows = estimates_by_query(ws)[q.query_id]
    assert {(e.epoch, e.station, e.estimator): e for e in frame_estimates(decode_frame(value))} == rows
    assert len(rows) == q.n_stations * len(QueryEstimators.build(q).estimators)
    assert all(e.withheld is None and e.reports == sender.sent_reports() for e in rows.values())
    assert len(drain(ws, ws.estimates_topic, quiet_polls=1)) == 2 * len(rows)  # the rows again too, deduplicated above
    assert drain(ws, ws.dead_letter_topic, quiet_polls=1) == []
