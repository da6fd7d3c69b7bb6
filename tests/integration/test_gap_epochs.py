"""No epoch absent on the direct path when NOTHING arrived for some epochs (issue 24, item 4).

A replay of epochs 0-4; once the worker has closed them, a replay of epochs 8-10 of the same
queries (``start_epoch``): no producer wrote anything for epochs 5-7. Each of them ends
withheld ``no_reports`` for every query -- a row per station and estimator, none published,
none absent -- and every other epoch is published exactly as the statistics core computes it
from the same seeded fleet (what a run without the gap publishes: the fleet is seeded per
epoch). The 5-minute rollup over epochs 0-9 is decided, withheld with the first gap epoch's
reason, rather than waiting forever.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.replay import fleet_size_for, load_day, replay
from schemas.kafka_io import read_queries

from .stream_helpers import WorkerProcess, core_estimates, metric, pipeline_settings, read_estimates, wait_for

pytestmark = pytest.mark.integration

FIRST, GAP, LATER = range(0, 5), range(5, 8), range(8, 11)


def test_epochs_nobody_wrote_are_withheld_no_reports_and_the_others_published_as_without_the_gap(
        broker: str, tmp_path: Path) -> None:
    rs, ws = pipeline_settings(broker, tmp_path, max_epochs=len(FIRST))
    ws = ws.model_copy(update={"watermark_idle_s": 2.0, "stall_close_s": 20.0})
    replay(rs, progress=False)
    day = load_day(rs)
    queries = read_queries(rs)
    assert len(queries) == 3

    def epochs_seen() -> set[tuple[str, int]]:
        return {(k[0], k[2]) for k in read_estimates(ws)}

    def wanted(indices: range) -> set[tuple[str, int]]:
        return {(q.query_id, int(day.epochs[i])) for q in queries for i in indices}

    w = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        w.wait_ready()
        wait_for(lambda: epochs_seen() >= wanted(FIRST), 120, "epochs 0-4 closed")
        replay(rs.model_copy(update={"start_epoch": LATER.start, "max_epochs": len(LATER)}), progress=False)
        wait_for(lambda: epochs_seen() >= wanted(FIRST) | wanted(GAP) | wanted(LATER), 150,
                 "a row for every epoch 0-10 of every query")
        wait_for(lambda: any(k[2] == int(day.epochs[0]) for k in read_estimates(ws, span_s=300)), 60,
                 "the 5-minute rollup over epochs 0-9")
        text = w.metrics()
    finally:
        w.stop()

    got = read_estimates(ws)
    assert {(k[0], k[2]) for k in got} == wanted(range(0, 11))
    fleet = fleet_size_for(day, rs)
    for q in queries:
        names = q.spec.estimator_names
        for i in GAP:
            rows = [got[(q.query_id, q.version, int(day.epochs[i]), s, n)] for s in q.sensors for n in names]
            assert all(e.withheld is not None and e.withheld.startswith("no_reports: no producer wrote anything")
                       and e.estimate is None and e.participants == 0 and e.reports == 0 for e in rows), rows[0]
        for i in [*FIRST, *LATER]:
            for name, (values, bounds, n) in core_estimates(q, rs, day, i, fleet, ws.confidences).items():
                for j, station in enumerate(q.sensors):
                    e = got[(q.query_id, q.version, int(day.epochs[i]), station, name)]
                    assert e.withheld is None and e.participants == n and e.closed_by == "markers", e
                    assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)
                    for b in e.bounds:
                        lo, hi = bounds[b.confidence]
                        assert (b.lower, b.upper) == pytest.approx((lo[j], hi[j]), rel=1e-12, abs=1e-9)
        assert metric(text, "ptt_withheld_epochs_total", query=q.query_id, reason="no_reports") == len(GAP)
        assert metric(text, "ptt_withheld_epochs_total", query=q.query_id) == len(GAP)
    assert metric(text, "ptt_late_records_total") == 0 and metric(text, "ptt_dead_letters_total") == 0

    rollups = read_estimates(ws, span_s=300)
    first = int(day.epochs[0])
    assert first % 10 == 0, "precondition: the day starts on a 5-minute boundary"
    for q in queries:
        rows = [e for k, e in rollups.items() if k[0] == q.query_id and k[2] == first]
        assert len(rows) == q.n_stations * len(q.spec.estimator_names)
        why = f"epoch {first + GAP.start} withheld (and 2 more of its epochs): no_reports"
        assert all(e.withheld is not None and e.withheld.startswith(why) for e in rows), rows[0]
