"""Estimate frames against a real broker: a worker with ``estimate_output="both"`` publishes
rows and frames for the same closed epochs, and they say the same.

Four epochs of the synthetic 6-station day, the three demo queries (SP, ALP with its four
estimators, RR): 4 x 3 = 12 frames and 4 x 6 x 6 = 144 rows. Every frame is keyed by its
window and decodes (``stream_app.worker.frames``) into exactly the ``Estimate`` records the rows
topic carries (pydantic equality: the same floats). Then ``ptt subscribe --parquet`` keeps
the frames topic in a Parquet file that pyarrow reads back with the rows' values, one row per
(query, epoch, station, estimator). Every published (query, epoch, estimator) carries its
consistent vector: non-negative, summing to at most the participants.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from producers.replay import replay
from schemas.estimates import Estimate
from stream_app.settings import WorkerSettings
from stream_app.worker.frames import decode_frame, frame_estimates
from stream_app.worker.records import WindowId

from .kafka_helpers import drain
from .stream_helpers import WorkerProcess, env_for, pipeline_settings, read_estimates, wait_for, wait_for_estimates

pytestmark = pytest.mark.integration
# a deadline, not a speed test: a `ptt` command (Python, pyarrow, matplotlib) on a machine whose
# cores are shared with other test workers took over 60 s
PTT_TIMEOUT_S = 240

EPOCHS = 4
STATIONS = 6
N_FRAMES = EPOCHS * 3
N_ESTIMATES = EPOCHS * STATIONS * (1 + 4 + 1)

Key = tuple[str, int, int, int, str]


def read_frames(ws: WorkerSettings) -> dict[bytes, bytes]:
    """The latest frame per key."""
    return {rec.key: rec.value for rec in drain(ws, ws.frames_topic, quiet_polls=2)}


def test_frames_decode_to_the_rows_and_a_parquet_day_reads_back(broker: str, tmp_path: Path) -> None:
    rs, ws = pipeline_settings(broker, tmp_path, synthetic_stations=STATIONS, max_epochs=EPOCHS)
    ws = WorkerSettings(**{**ws.model_dump(), "estimate_output": "both",
                           "frames_topic": f"frames-{uuid.uuid4().hex[:8]}"})
    replay(rs, progress=False)
    worker = WorkerProcess(ws, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        wait_for_estimates(ws, N_ESTIMATES, 90, f"{N_ESTIMATES} estimates and {N_FRAMES} frames",
                           also=lambda: len(read_frames(ws)) >= N_FRAMES)
    finally:
        worker.stop()
    rows = read_estimates(ws)
    frames = read_frames(ws)
    assert len(rows) == N_ESTIMATES and len(frames) == N_FRAMES
    from_frames: dict[Key, Estimate] = {}
    for key, value in frames.items():
        frame = decode_frame(value)
        h = frame.header
        assert key == WindowId(h["query_id"], h["query_version"], h["epoch"]).key
        assert h["withheld"] is None and frame.table.num_rows == STATIONS
        for e in frame_estimates(frame):
            from_frames[(e.query_id, e.query_version, e.epoch, e.station, e.estimator)] = e
    assert from_frames == rows
    vectors: dict[tuple[str, int, str], list[Estimate]] = {}
    for (qid, _, epoch, _, name), e in rows.items():
        vectors.setdefault((qid, epoch, name), []).append(e)
    for group in vectors.values():
        cons = [e.consistent for e in group if e.withheld is None and e.data_quality == "ok"]
        assert all(c is not None and c >= 0.0 for c in cons), group[0]
        assert sum(c for c in cons if c is not None) <= group[0].participants * (1 + 1e-12)
    assert any(e.consistent is not None for e in rows.values())

    day = tmp_path / "day.parquet"
    done = subprocess.run([sys.executable, "-m", "stream_app.cli", "subscribe", "--parquet", str(day),
                           "--frames-topic", ws.frames_topic, "--from-beginning", "--idle-timeout", "3"],
                          env=env_for(ws), capture_output=True, text=True, timeout=PTT_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {N_ESTIMATES} estimates from {N_FRAMES} frames to {day}"
    kept = pq.read_table(day).to_pylist()
    assert len(kept) == N_ESTIMATES
    for r in kept:
        e = rows[(r["query_id"], r["query_version"], r["epoch"], r["station"], r["estimator"])]
        assert r["epoch_start"] == e.epoch_start == datetime.fromisoformat(e.epoch_start.isoformat())
        assert (r["estimate"], r["sd"], r["participants"], r["reports"], r["epsilon"], r["closed_by"]) == \
               (e.estimate, e.sd, e.participants, e.reports, e.epsilon, e.closed_by)
        assert r["bounds"] == [b.model_dump() for b in e.bounds] and r["data_quality"] == e.data_quality
        assert r["consistent"] == e.consistent
        assert (r["withheld"], r["late"], r["refused"], r["missing_batches"], r["round_count_mismatch"]) == \
               (e.withheld, e.late, e.refused, e.missing_batches, e.round_count_mismatch)

    # ptt report says the same of the rows topic, the frames topic and the Parquet file; the plots
    # (drawn from what was loaded, after the summary, checked in test_report_cli) of one station
    # from the frames and the file -- their loaders' rows drawn --, none from the rows topic
    summaries = []
    for name, source in (("rows", ["--from-topic", "--no-plots"]),
                         ("frames", ["--from-frames", "--frames-topic", ws.frames_topic, "--stations", "1"]),
                         ("file", ["--estimates", str(day), "--truth-topic", ws.truth_topic, "--stations", "1"])):
        done = _ptt(ws, "report", *source, "--estimates-topic", ws.estimates_topic, "--truth-topic", ws.truth_topic,
                    "--out", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        summaries.append(json.loads((tmp_path / name / "summary.json").read_text()))
    assert summaries[0]["groups"] and sum(g["cells"] for g in summaries[0]["groups"]) == N_ESTIMATES
    assert all(g["with_truth"] == g["cells"] for g in summaries[0]["groups"])
    assert summaries[1]["groups"] == summaries[0]["groups"] == summaries[2]["groups"]


def _ptt(ws: WorkerSettings, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_app.cli", *argv], env=env_for(ws), capture_output=True,
                          text=True, timeout=PTT_TIMEOUT_S, check=False)


def test_a_frames_only_run_is_reported_from_its_frames(broker: str, tmp_path: Path) -> None:
    """A worker with ``estimate_output="frames"`` publishes no row: ``ptt report --from-frames``
    reports it (here every epoch withheld: fewer participants than the worker requires, so the
    frames' null columns too), and ``--from-topic`` says where the estimates are."""
    rs, ws = pipeline_settings(broker, tmp_path, synthetic_stations=STATIONS, max_epochs=2)
    ws = WorkerSettings(**{**ws.model_dump(), "estimate_output": "frames", "min_participants": 10**6,
                           "frames_topic": f"frames-{uuid.uuid4().hex[:8]}"})
    replay(rs, progress=False)
    worker = WorkerProcess(ws, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        wait_for(lambda: len(read_frames(ws)) >= 2 * 3, 90, "6 frames")
    finally:
        worker.stop()
    assert not read_estimates(ws)
    out = tmp_path / "report"
    done = _ptt(ws, "report", "--from-frames", "--frames-topic", ws.frames_topic, "--truth-topic", ws.truth_topic,
                "--stations", "1", "--out", str(out))  # the plots (of withheld rows) of one station
    assert done.returncode == 0, done.stderr
    groups = json.loads((out / "summary.json").read_text())["groups"]
    assert sorted(g["estimator"] for g in groups) == sorted(
        ["sp_difference", "alp_average", "alp_bottom", "alp_gls", "alp_yhat", "rr"])
    assert all(g["cells"] == g["withheld"] == 2 * STATIONS for g in groups), groups
    done = _ptt(ws, "report", "--from-topic", "--estimates-topic", ws.estimates_topic, "--no-truth",
                "--out", str(tmp_path / "none"))
    assert done.returncode == 2 and "use --from-frames" in done.stderr.replace("read them with ", "use ")
