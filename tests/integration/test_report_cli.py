"""``ptt report`` against a real broker: a short replay, a real worker, then the report read
from the topics and from saved JSON lines (``ptt subscribe --json``) must say the same.

Four epochs of the synthetic 6-station day, the three demo queries (SP, ALP with its four
estimators, RR): 4 x 6 x (1 + 4 + 1) = 144 estimates. The summary's cells must equal the
estimates on the topic, per (query, estimator) and in total; the default plots are the three
headline estimators at the six stations, PNGs of 1,200 x 500 px.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from matplotlib import image as mpimg

from producers.replay import replay
from producers.settings import ReplaySettings
from stream_app.settings import WorkerSettings

from .kafka_helpers import drain
from .stream_helpers import WorkerProcess, env_for, pipeline_settings, read_estimates, wait_for_estimates

pytestmark = pytest.mark.integration
# a deadline, not a speed test: a `ptt` command (Python, pyarrow, matplotlib) on a machine whose
# cores are shared with other test workers took over 60 s
PTT_TIMEOUT_S = 240

EPOCHS = 4
STATIONS = 6
ESTIMATORS = {"sp-day": ["sp_difference"], "alp-day": ["alp_average", "alp_bottom", "alp_gls", "alp_yhat"],
              "rr-day": ["rr"]}
N_ESTIMATES = EPOCHS * STATIONS * sum(len(v) for v in ESTIMATORS.values())


def _settings(broker: str, tmp: Path) -> tuple[ReplaySettings, WorkerSettings]:
    return pipeline_settings(broker, tmp, synthetic_stations=STATIONS, max_epochs=EPOCHS)


def _ptt(ws: WorkerSettings, *argv: str, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream_app.cli", *argv], env=env_for(ws), stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=PTT_TIMEOUT_S, check=False)


def _groups(out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    doc = json.loads((out / "summary.json").read_text())
    return {(g["query_id"], g["estimator"]): g for g in doc["groups"]}


def test_report_from_the_topics_and_from_saved_lines(broker: str, tmp_path: Path) -> None:
    rs, ws = _settings(broker, tmp_path)
    replay(rs, progress=False)
    worker = WorkerProcess(ws, tmp_path / "worker.log").start()
    try:
        worker.wait_ready()
        wait_for_estimates(ws, N_ESTIMATES, 60)
    finally:
        worker.stop()
    published = read_estimates(ws)
    assert len(published) == N_ESTIMATES

    topic_out = tmp_path / "from-topic"
    done = _ptt(ws, "report", "--from-topic", "--bootstrap-servers", broker, "--estimates-topic",
                ws.estimates_topic, "--truth-topic", ws.truth_topic, "--out", str(topic_out))
    assert done.returncode == 0, done.stderr
    assert (topic_out / "summary.txt").read_text() in done.stdout
    groups = _groups(topic_out)
    assert sum(g["cells"] for g in groups.values()) == N_ESTIMATES
    assert sorted(groups) == sorted((q, e) for q, names in ESTIMATORS.items() for e in names)
    for (qid, name), g in groups.items():
        expected = sum(1 for k in published if k[0] == qid and k[4] == name)
        assert g["cells"] == expected == EPOCHS * STATIONS
        assert (g["withheld"], g["without_truth"], g["with_truth"]) == (0, 0, expected)
        assert set(g["coverage"]) == {"0.95", "0.99"} and all(0 <= v <= 1 for v in g["coverage"].values())
        assert g["mae"] is not None and g["mean_width"]["0.99"] >= g["mean_width"]["0.95"] > 0
    pngs = sorted(topic_out.glob("*.png"))
    assert len(pngs) == 3 * STATIONS  # one headline estimator per query, the six stations
    assert {p.name.split("_", 1)[0] for p in pngs} == set(ESTIMATORS)
    for p in pngs:
        assert mpimg.imread(p).shape[:2] == (500, 1200)

    # the same estimates saved by `ptt subscribe --json`, the truth saved from its topic
    saved = tmp_path / "estimates.jsonl"
    with saved.open("w") as fh:
        sub = _ptt(ws, "subscribe", "--json", "--from-beginning", "--idle-timeout", "3", "--topic",
                   ws.estimates_topic, "--bootstrap-servers", broker, stdout=fh)
    assert sub.returncode == 0, sub.stderr
    assert len(saved.read_text().splitlines()) == N_ESTIMATES
    # the default table: one line per closed (query, epoch) and estimator, each query's epochs in order, none
    # partial, every line within 120 columns
    table = _ptt(ws, "subscribe", "--from-beginning", "--idle-timeout", "3", "--topic", ws.estimates_topic,
                 "--bootstrap-servers", broker)
    assert table.returncode == 0, table.stderr
    header, *rest = table.stdout.splitlines()
    lines = [line for line in rest if line[:1].isdigit()]
    assert header.startswith("epoch start") and "clipped at 0" in " ".join(rest[:3])
    assert all(len(line) <= 120 for line in table.stdout.splitlines()), table.stdout
    assert len(lines) == EPOCHS * sum(len(n) for n in ESTIMATORS.values()), lines
    assert not any("partial" in line for line in lines), lines
    for qid, names in ESTIMATORS.items():
        mine = [line for line in lines if line.split()[1] == qid]
        assert len(mine) == EPOCHS * len(names) and mine == sorted(mine), mine
        assert all(line.split()[3] == str(STATIONS) for line in mine)
        assert sorted(line.split()[7] for line in mine) == sorted(list(names) * EPOCHS), mine
    truth = tmp_path / "truth.jsonl"
    truth.write_bytes(b"\n".join(rec.value for rec in drain(rs, rs.truth_topic)) + b"\n")
    file_out = tmp_path / "from-file"
    done = _ptt(ws, "report", "--estimates", str(saved), "--truth", str(truth), "--out", str(file_out))
    assert done.returncode == 0, done.stderr
    assert _groups(file_out) == groups
    assert sorted(p.name for p in file_out.glob("*.png")) == [p.name for p in pngs]

    # saved estimates with the truth from its topic; a filter; then nothing matching: exit 2
    mixed_out = tmp_path / "mixed"
    done = _ptt(ws, "report", "--estimates", str(saved), "--truth-topic", ws.truth_topic, "--bootstrap-servers",
                broker, "--query", "sp-day", "--no-plots", "--out", str(mixed_out))  # the plots: checked above
    assert done.returncode == 0, done.stderr
    assert _groups(mixed_out) == {k: v for k, v in groups.items() if k[0] == "sp-day"}
    done = _ptt(ws, "report", "--from-topic", "--bootstrap-servers", broker, "--estimates-topic",
                ws.estimates_topic, "--no-truth", "--station", "1", "--out", str(tmp_path / "none"))
    assert done.returncode == 2 and done.stderr.startswith("ptt report: error: no matching estimates")
    done = _ptt(ws, "report", "--from-topic", "--bootstrap-servers", broker, "--estimates-topic",
                f"missing-{uuid.uuid4().hex[:8]}", "--out", str(tmp_path / "none"))
    assert done.returncode == 2 and "does not exist" in done.stderr and done.stderr.count("\n") == 1
    done = _ptt(ws, "report", "--from-topic", "--bootstrap-servers", broker, "--estimates-topic",
                ws.estimates_topic, "--truth-topic", f"missing-{uuid.uuid4().hex[:8]}", "--out", str(tmp_path / "none"))
    assert done.returncode == 2 and "--no-truth" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "none").exists()


FLOW_EPOCHS = 130  # an hour (the day starts on a UTC hour) and a bit: 13 five-minute rollups, one hourly
FLOW_QUERIES = {"rr-day": "rr", "unary-day": "unary"}  # query -> its headline estimator


def test_report_of_saved_files_plots_and_scores_flows_by_span(broker: str, tmp_path: Path) -> None:
    """A real worker's 5-minute and hourly rollups, saved by ``ptt subscribe --json`` with the
    truth topic, reported by ``ptt report --estimates --truth``: a flows plot per (query, span),
    the summary scores each query at each span (every cell scored or named as left out), and
    every scored hourly cell's truth is the replayed day's sum of its 120 epochs -- a station
    with an epoch without a reading has none."""
    import numpy as np

    from producers.replay import load_day
    from stream_app import report as R

    rs, ws = pipeline_settings(broker, tmp_path, synthetic_stations=STATIONS, max_epochs=FLOW_EPOCHS,
                               query_mechanisms=",".join(q.split("-")[0] for q in FLOW_QUERIES))
    replay(rs, progress=False)
    worker = WorkerProcess(ws, tmp_path / "worker.log").start()
    hourly = STATIONS * sum(len(_estimators(q)) for q in FLOW_QUERIES)
    try:
        worker.wait_ready()
        wait_for_estimates(ws, hourly, 240, f"{hourly} hourly rollups", span_s=3600)
    finally:
        worker.stop()
    saved = tmp_path / "estimates.jsonl"
    with saved.open("w") as fh:
        sub = _ptt(ws, "subscribe", "--json", "--from-beginning", "--idle-timeout", "3", "--topic",
                   ws.estimates_topic, "--bootstrap-servers", broker, stdout=fh)
    assert sub.returncode == 0, sub.stderr
    # the flows view: one line per flow of each query's headline estimator, within 120 columns, each
    # (query, span, epoch) after a line saying what it is (no span query here: the rollups as they close)
    flows = _ptt(ws, "subscribe", "--flows", "--from-beginning", "--idle-timeout", "3", "--topic",
                 ws.estimates_topic, "--bootstrap-servers", broker)
    assert flows.returncode == 0, flows.stderr
    header, *rest = flows.stdout.splitlines()
    lines = [x for x in rest if x[:4].isdigit()]
    labels = [x for x in rest if x.startswith("-- ")]
    assert header.startswith("span start") and all(len(x) <= 120 for x in flows.stdout.splitlines())
    headline = [json.loads(x) for x in saved.read_text().splitlines()]
    headline = [e for e in headline if e["span_s"] != 30 and e["estimator"] == FLOW_QUERIES[e["query_id"]]]
    assert len(lines) == len(headline) == 2 * STATIONS * (FLOW_EPOCHS // 10 + 1), len(lines)
    assert {(x[26:].split()[0], x[26:].split()[1]) for x in lines} == {(q, "rollup") for q in FLOW_QUERIES}
    assert len(labels) == 2 * (FLOW_EPOCHS // 10 + 1) and all("rollups of a 30-s query (each sums " in x
                                                               for x in labels), labels
    truth = tmp_path / "truth.jsonl"
    truth.write_bytes(b"\n".join(rec.value for rec in drain(rs, rs.truth_topic)) + b"\n")
    out = tmp_path / "report"
    done = _ptt(ws, "report", "--estimates", str(saved), "--truth", str(truth), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "filtered out" not in done.stdout and "flows by span" in done.stdout

    rows: dict[tuple[str, int, str], int] = {}
    for line in saved.read_text().splitlines():
        e = json.loads(line)
        key = (e["query_id"], e["span_s"], e["estimator"])
        rows[key] = rows.get(key, 0) + 1
    doc = json.loads((out / "summary.json").read_text())
    groups = {(g["query_id"], g["span_s"], g["estimator"]): g for g in doc["groups"]}
    assert {k[:2] for k in groups} == {(q, s) for q in FLOW_QUERIES for s in (30, 300, 3600)}
    for key, g in groups.items():
        assert g["cells"] == rows[key], key  # every saved row is in its group (the file has each once)
        assert g["with_truth"] + sum(g["left_out"].values()) == g["cells"], (key, g["left_out"])
        assert g["kind"] == {30: "epoch", 300: "rollup", 3600: "rollup"}[key[1]]
        if key[1] == 300:
            assert g["with_truth"] > 0 and set(g["coverage"]) == {"0.95", "0.99"} and g["mae"] is not None
            assert sum(b["cells"] for b in g["coverage_by_truth_bin"]) == g["with_truth"]
    assert sum(groups[(q, 3600, e)]["cells"] for q, e in FLOW_QUERIES.items()) == 2 * STATIONS
    for qid, name in FLOW_QUERIES.items():
        for span in (300, 3600):
            png = out / f"{qid}_flows_{span}s_{name}.png"
            assert png.name in doc["plots"], (png.name, doc["plots"])
            h, w = mpimg.imread(png).shape[:2]
            assert w == 1200 and (h - R.FLOW_HEAD_PX) % R.FLOW_PANEL_PX == 0 and h > R.FLOW_HEAD_PX

    # the hourly truth the report holds the flows against is the replayed day's sum over the hour
    day = load_day(rs)
    loaded, t = R.load_estimates(saved.read_text().splitlines()), R.load_truth(truth.read_text().splitlines())
    cells = [c for c in R.join(loaded.rows, t.truth, t.epoch_ids) if c.row.span_s == 3600]
    col = {int(s): j for j, s in enumerate(day.stations)}
    first = int(np.searchsorted(day.epochs, cells[0].row.epoch))
    for c in cells:
        j = col[c.row.station]
        hour = slice(first, first + 120)
        if day.has_truth[hour, j].all():
            assert c.truth == int(day.flows[hour, j].sum()), c
        else:
            assert c.truth is None and c.missing == R.NO_READING, c


def _estimators(query_id: str) -> list[str]:
    from estimators.registry import get_spec

    return list(get_spec(query_id.split("-")[0]).estimator_names)
