"""The worker keeps up at a moderate scale: 500 stations, exact tallies of a million vehicles,
SP + ALP + RR. Every estimate arrives (a count, with a generous time bound for a busy machine:
this is not a speed test -- tests/benchmarks/bench_scale.py measures speed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.replay import default_queries, fleet_size_for, load_day, replay
from schemas.kafka_io import read_to_end

from .stream_helpers import WorkerProcess, metric, pipeline_settings, wait_for

pytestmark = pytest.mark.integration

STATIONS, EPOCHS = 500, 12


def test_500_stations_tally_every_estimate_arrives(broker: str, tmp_path: Path) -> None:
    rs, ws = pipeline_settings(broker, tmp_path, synthetic_stations=STATIONS, mode="tally", expand_to=1_000_000,
                               max_epochs=EPOCHS, start_epoch=16 * 120, truth=False)
    day = load_day(rs)
    queries = default_queries(day, fleet_size_for(day, rs), rs.mechanisms)
    expected = EPOCHS * sum(q.n_stations * len(q.spec.estimator_names) for q in queries)
    worker = WorkerProcess(ws, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        summary = replay(rs, progress=False)
        assert summary.epochs == EPOCHS and summary.delivery_failures == 0
        # every epoch of every query closed (stage-2 partitions close theirs independently, so
        # the newest closed epoch says nothing of the older ones)
        wait_for(lambda: metric(worker.metrics(), "ptt_epochs_closed_total") >= EPOCHS * len(queries), 600,
                 "every epoch closed")
        text = worker.metrics()
        outcomes = "\n".join(line for line in text.splitlines() if line.startswith(
            ("ptt_epochs_closed_total", "ptt_withheld_epochs_total", "ptt_late_records_total", "ptt_dead_letters")))
        assert metric(text, "ptt_dead_letters_total") == 0, outcomes
        assert metric(text, "ptt_withheld_epochs_total") == 0, outcomes
        assert metric(text, "ptt_epochs_closed_total", closed_by="markers") == EPOCHS * len(queries), outcomes
        assert metric(text, "ptt_late_records_total") == 0, outcomes
    finally:
        worker.stop()
    records = [r for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=10) if b'"span_s":30,' in r.value]
    assert len(records) == expected  # nothing lost, nothing published twice (the epochs'; rollups aside)
