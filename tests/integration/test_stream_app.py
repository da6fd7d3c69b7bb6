"""The stream app with a real broker and real Faust worker processes."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producers.replay import fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import encode_batch, new_batch_id
from schemas.kafka_io import read_queries
from stream_app.cli.local_broker import free_port
from stream_app.settings import WorkerSettings

from .kafka_helpers import drain
from .stream_helpers import (
    WorkerProcess,
    core_estimates,
    metric,
    pipeline_settings,
    read_estimates,
    start_replay_thread,
    wait_for,
    wait_for_estimates,
)

pytestmark = pytest.mark.integration

ESTIMATORS_PER_QUERY = {"sp": 1, "alp": 4, "rr": 1}


def _settings(broker: str, tmp: Path, **replay_kw: object) -> tuple[ReplaySettings, WorkerSettings]:
    return pipeline_settings(broker, tmp, **replay_kw)


def _expected_records(rs: ReplaySettings, epochs: int) -> int:
    queries = read_queries(rs)
    return epochs * sum(ESTIMATORS_PER_QUERY[q.mechanism] * q.n_stations for q in queries)


def _assert_matches_core(rs: ReplaySettings, ws: WorkerSettings, epochs: int, start: int = 0) -> None:
    got = read_estimates(ws)
    day = load_day(rs)
    fleet = fleet_size_for(day, rs)
    for q in read_queries(rs):
        for i in range(start, start + epochs):
            core = core_estimates(q, rs, day, i, fleet, ws.confidences)
            for name, (values, bounds, n) in core.items():
                for j, station in enumerate(q.sensors):
                    e = got[(q.query_id, q.version, int(day.epochs[i]), station, name)]
                    assert e.withheld is None and e.participants == n and e.closed_by == "markers"
                    assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)
                    for b in e.bounds:
                        lo, hi = bounds[b.confidence]
                        assert (b.lower, b.upper) == pytest.approx((lo[j], hi[j]), rel=1e-12, abs=1e-9)


def _run(ws: WorkerSettings, tmp: Path, name: str = "w") -> WorkerProcess:
    w = WorkerProcess(ws, tmp / f"{name}-{ws.web_port}.log").start()
    w.wait_ready()
    return w


_TASK_LINE = re.compile(r"read (\d+) committed (\d+) highwater (\d+) \(faust active True; aiokafka position "
                        r"(\d+), paused False, awaiting reset False\)")


def _partition_lines(page: str, topic: str) -> list[str]:
    """The lines of the worker's /debug/tasks ``page`` about ``topic``'s partitions."""
    return [line for line in page.splitlines() if line.strip().startswith(f"{topic}[")]


def _all_committed(lines: list[str]) -> bool:
    """Every partition line says its offset is committed at the partition's high-water mark."""
    found = [_TASK_LINE.search(line) for line in lines]
    return bool(lines) and all(m is not None and m.group(2) == m.group(3) for m in found)


def _wait_estimates(ws: WorkerSettings, n: int, timeout_s: float = 120.0) -> None:
    wait_for_estimates(ws, n, timeout_s)


def _ready_statuses(w: WorkerProcess, timeout_s: float = 90.0) -> list[int]:
    """The distinct answers of /ready, in order, from the worker's start until it answers 200."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert w.proc is not None and w.proc.poll() is None, w.log.read_text()[-3000:]
        status = w.ready_status()
        if status is not None and (not seen or seen[-1] != status):
            seen.append(status)
        if status == 200:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"/ready never answered 200 within {timeout_s}s (answers: {seen})")


def test_end_to_end_matches_the_statistics_core(broker: str, tmp_path: Path) -> None:
    """Also the worker's pages: /ready answers 503 until the worker has its partitions and
    recovered tables, then 200; /metrics?name[]=... renders only the named series."""
    rs, ws = _settings(broker, tmp_path, max_epochs=6)
    replay(rs, progress=False)
    w = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        assert _ready_statuses(w) == [503, 200]  # the web server answers before the partitions are assigned
        n = _expected_records(rs, 6)
        _wait_estimates(ws, n)
        _assert_matches_core(rs, ws, 6)
        text = w.metrics()
        assert metric(text, "ptt_epochs_closed_total", closed_by="markers") == 6 * 3
        assert metric(text, "ptt_dead_letters_total") == 0
        day = load_day(rs)
        assert metric(text, "ptt_ground_truth_epoch") == int(day.epochs[5])
        assert w.ready_status() == 200
        only = w.metrics("ptt_epochs_closed_total", "ptt_ground_truth_epoch")
        samples = [line.split("{")[0].split(" ")[0] for line in only.splitlines() if not line.startswith("#")]
        assert set(samples) == {"ptt_epochs_closed_total", "ptt_ground_truth_epoch"}, only
        assert metric(only, "ptt_epochs_closed_total", closed_by="markers") == 6 * 3
        assert metric(only, "ptt_ground_truth_epoch") == int(day.epochs[5])
        everything = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
        assert {"ptt_estimate_vehicles", "ptt_records_total"} <= everything  # unrestricted: every family
        assert any(name.startswith("faust_") for name in everything)
        # /debug/tasks: every reports partition read to its end, asked for by Faust, and
        # aiokafka's fetch position where the reading stopped; the offsets are committed every
        # few seconds after the estimates are out, so the page is read until they are in
        wait_for(lambda: _all_committed(_partition_lines(w.tasks(), ws.reports_topic)), 60.0,
                 "every reports partition's offset committed at its end")
        parts = _partition_lines(w.tasks(), ws.reports_topic)
        assert len(parts) == rs.partitions, parts
        for line in parts:
            m = _TASK_LINE.search(line)
            assert m is not None, line
            read_, committed, high, position = map(int, m.groups())
            assert read_ + 1 == committed == high == position, line
    finally:
        w.stop()
    assert len(read_estimates(ws)) == n  # nothing else was published


def test_one_and_two_workers_give_identical_estimates(broker: str, tmp_path: Path) -> None:
    rs1, ws1 = _settings(broker, tmp_path, max_epochs=5)
    rs2, ws2 = _settings(broker, tmp_path, max_epochs=5)
    replay(rs1, progress=False)
    replay(rs2, progress=False)
    one = _run(ws1, tmp_path, "one")
    twins = [_run(ws2, tmp_path, "a"), _run(ws2.model_copy(update={"web_port": free_port()}), tmp_path, "b")]
    try:
        n = _expected_records(rs1, 5)
        _wait_estimates(ws1, n)
        _wait_estimates(ws2, n)
    finally:
        for w in (one, *twins):
            w.stop()
    a = {k[:1] + k[2:]: e.model_dump(exclude={"query_id"}) for k, e in read_estimates(ws1).items()}
    b = {k[:1] + k[2:]: e.model_dump(exclude={"query_id"}) for k, e in read_estimates(ws2).items()}
    assert a == b and len(a) == n


def test_sigkill_mid_day_and_restart_loses_nothing(broker: str, tmp_path: Path) -> None:
    rs, ws = _settings(broker, tmp_path, max_epochs=30, speed=150.0)  # one epoch per 0.2 s
    w = _run(ws, tmp_path, "first")
    runner = start_replay_thread(rs)
    day = load_day(rs)
    # mid-day: a few epochs closed, most still to come
    wait_for(lambda: metric(w.metrics(), "ptt_last_closed_epoch") >= 3 * int(day.epochs[3]), 120, "epoch 3 closed")
    w.kill()  # no goodbye (waits until the process is gone)
    w2 = _run(ws, tmp_path, "second")
    try:
        runner.result(120)
        _wait_estimates(ws, _expected_records(rs, 30), timeout_s=180)
        _assert_matches_core(rs, ws, 30)
        text = w2.metrics()
        assert metric(text, "ptt_dead_letters_total") == 0, [
            line for line in text.splitlines() if line.startswith("ptt_dead_letters_total{") and not
            line.endswith(" 0.0")]
    finally:
        w2.stop()


def test_malformed_flood_goes_to_dead_letters_and_changes_nothing(broker: str, tmp_path: Path) -> None:
    rs, ws = _settings(broker, tmp_path, max_epochs=4)
    replay(rs, progress=False)
    day = load_day(rs)
    q = next(q for q in read_queries(rs) if q.mechanism == "sp")
    sink = ReportSink(rs, rs.reports_topic)
    rng = np.random.default_rng(3)
    sent: Counter[str] = Counter()

    def send(value: bytes, reason: str) -> None:
        key = new_batch_id().encode()
        sink.send(value, key=key, partition=sink.partition_for(key))
        sent[reason] += 1

    base = {"kind": "reports", "query_id": q.query_id, "query_version": 1, "epoch": int(day.epochs[1]), "round": 0,
            "producer_id": "intruder", "layout": "values", "n_stations": q.n_stations, "n_outputs": q.n_stations + 1}
    for _ in range(40):
        send(rng.bytes(int(rng.integers(1, 300))), "bad_encoding")
        send(b"PTT1" + rng.bytes(30), "truncated_or_bad_header")
        send(encode_batch({**base, "query_version": 9, "batch_id": new_batch_id(), "reports": 2},
                          {"value": np.array([1, 2])}), "unknown_query")
        send(encode_batch({**base, "n_stations": q.n_stations + 1, "n_outputs": q.n_stations + 2,
                           "batch_id": new_batch_id(), "reports": 2}, {"value": np.array([1, 2])}), "mismatched_sizes")
        send(encode_batch({**base, "epoch": 1, "batch_id": new_batch_id(), "reports": 1}, {"value": np.array([1])}),
             "outside_query_window")
        send(b'{"kind": "report", "query_id": "sp-day"}', "bad_json_record")
    sink.flush()
    sink.close()
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, _expected_records(rs, 4))
        wait_for(lambda: metric(w.metrics(), "ptt_dead_letters_total") >= sum(sent.values()), 60, "dead letters")
        _assert_matches_core(rs, ws, 4)
        letters = [rec for rec in drain(ws, ws.dead_letter_topic)]
        assert len(letters) == sum(sent.values()) == 240
        reasons = Counter(rec.key.decode() for rec in letters)
        assert reasons["unknown_query"] == 40 and reasons["mismatched_sizes"] == 40
        assert reasons["outside_query_window"] == 40 and reasons["bad_json_record"] == 40
        assert reasons["bad_encoding"] == 40
        assert sum(v for k, v in reasons.items() if k in ("truncated", "bad_header", "size_mismatch")) == 40
    finally:
        w.stop()


def test_late_records_are_counted_and_kept_out(broker: str, tmp_path: Path) -> None:
    """A straggler for a closed epoch is counted late and changes nothing. A straggler for an
    epoch the watermark passed before any of its data came opens that epoch's window all the
    same ("born late"): once idle it closes by the watermark and is withheld as ``late`` -- an
    outcome, never a silent drop -- and nothing else is republished or changed."""
    rs, ws = _settings(broker, tmp_path, start_epoch=10, max_epochs=6)
    replay(rs, progress=False)
    w = _run(ws, tmp_path)
    try:
        n = _expected_records(rs, 6)
        _wait_estimates(ws, n)
        before = read_estimates(ws)
        day = load_day(rs)
        q = next(q for q in read_queries(rs) if q.mechanism == "sp")
        sink = ReportSink(rs, rs.reports_topic)

        def straggle(index: int) -> None:
            batch_id = new_batch_id()
            late = encode_batch({"kind": "reports", "query_id": q.query_id, "query_version": 1,
                                 "epoch": int(day.epochs[index]), "round": 1, "producer_id": "straggler",
                                 "layout": "values", "n_stations": q.n_stations, "n_outputs": q.n_stations + 1,
                                 "batch_id": batch_id, "reports": 50}, {"value": np.full(50, 1)})
            sink.send(late, key=batch_id.encode(), partition=sink.partition_for(batch_id.encode()))
            sink.flush()

        straggle(10)  # a closed epoch
        wait_for(lambda: metric(w.metrics(), "ptt_late_records_total", query=q.query_id) == 1, 60, "a late record")
        straggle(2)  # never seen: inside the query's window, below the watermark
        wait_for(lambda: metric(w.metrics(), "ptt_withheld_epochs_total", query=q.query_id, reason="late") == 1,
                 120, "the born-late epoch withheld as late")
        sink.close()
        after = read_estimates(ws)
        born_late = int(day.epochs[2])
        assert {k: v for k, v in after.items() if k[2] != born_late} == before  # nothing else changed
        mine = [e for k, e in after.items() if k[2] == born_late]
        assert len(mine) == q.n_stations and all(e.withheld and e.withheld.startswith("late:") for e in mine)
        assert all(e.closed_by == "watermark" and e.estimate is None for e in mine)
        assert metric(w.metrics(), "ptt_late_records_total", query=q.query_id) == 1
    finally:
        w.stop()


def test_interval_coverage_over_a_replayed_day(broker: str, tmp_path: Path) -> None:
    """480 epochs (05:00-09:00, the morning peak) x 6 stations, exact-tally mode; the
    published bounds against the day's truths, cells (station, epoch) taken together.

    Not too narrow: ALP and RR cover >= nominal - 2 points over all 2,880 cells. Sampling
    Privacy cannot be held to nominal over a whole day: at truth 0 or 1 coverage is forced to
    100% (the estimate is 0 with probability >= 0.55), so it is held to nominal - 2 on cells
    with truth >= 20 and, over all cells, to the exact expected coverage of the day's truths
    (computed from Binomial(Yes, pis)) +- 2 points.

    Not too wide: at 95%, ALP and RR cover <= 98.5% (above nominal, as cells with few
    vehicles over-cover: measured 95.2-96.5%); and the published interval with its half-width
    scaled by 0.8 covers less than nominal -- at 95% and 99% for ALP and RR (measured at most
    91.3% / 97.0%), at 95% for SP's busy cells (90.0%). An interval 1.25 times too wide or more,
    so scaled, covers nominal or more. The scaled interval of an estimate is the statistics
    core's at the estimate whose error is stretched by 1 / 0.8 (``Y + (est - Y) / 0.8``): the
    published bounds are first checked to be the core's intervals at the published estimate.

    False-failure rates (the cells are independent, each covered with its own probability:
    the binomial SE at the measured coverage bounds the spread): every limit is >= 5.5 SE away
    from the measured value (SP's 95% scaled coverage on its 1,089 busy cells: 5.5 SE; the
    rest >= 5.6 SE), < 2e-8 per check, < 1e-6 for the test.
    """
    from scipy.stats import binom

    import estimators as E

    rs, ws = _settings(broker, tmp_path, mode="tally", start_epoch=600, max_epochs=480)
    replay(rs, progress=False)
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, _expected_records(rs, 480), timeout_s=300)
    finally:
        w.stop()
    got = read_estimates(ws)
    day = load_day(rs)
    truth = {(int(day.epochs[i]), int(s)): int(day.flows[i, j])
             for i in range(600, 1080) for j, s in enumerate(day.stations)}
    core: dict[str, tuple[E.LinearEstimator, tuple[int, ...]]] = {}
    for q in read_queries(rs):
        mech = q.build()
        ests = ({"sp_difference": E.sp_difference(mech)} if q.mechanism == "sp" else
                E.alp_estimators(mech) if q.mechanism == "alp" else {"rr": E.rr_estimator(mech)})
        core.update({name: (est, q.sensors) for name, est in ests.items()})
    by_est: dict[str, list[tuple[int, Any]]] = {}
    for (_, _, epoch, station, name), e in got.items():
        by_est.setdefault(name, []).append((truth[(epoch, station)], e))
    assert set(by_est) == set(core), (set(by_est), set(core))

    def interval(name: str, station_index: np.ndarray, values: np.ndarray, n: np.ndarray,
                 lvl: float) -> tuple[np.ndarray, np.ndarray]:
        """The core's score interval of ``values`` (one per cell, at its station)."""
        est, sensors = core[name]
        full = np.zeros((values.size, len(sensors)))
        cells = np.arange(values.size)
        full[cells, station_index] = values
        lo, hi = est.score_interval(full, n[:, None], lvl)
        return lo[cells, station_index], hi[cells, station_index]

    sp = E.sp_difference(E.sampling_privacy(6), stations=[1])
    bad: list[str] = []
    for name, cells in by_est.items():
        ys = np.array([y for y, _ in cells], dtype=np.float64)
        est = np.array([e.estimate for _, e in cells], dtype=np.float64)
        n = np.array([e.participants for _, e in cells], dtype=np.float64)
        j = np.array([core[name][1].index(e.station) for _, e in cells])
        busy = ys >= 20
        held = busy if name == "sp_difference" else np.ones(ys.size, dtype=bool)
        assert held.sum() > 500, (name, held.sum())
        for lvl in (0.95, 0.99):
            lo = np.array([next(b.lower for b in e.bounds if b.confidence == lvl) for _, e in cells])
            hi = np.array([next(b.upper for b in e.bounds if b.confidence == lvl) for _, e in cells])
            np.testing.assert_allclose(np.stack([lo, hi]), np.stack(interval(name, j, est, n, lvl)),
                                       rtol=1e-9, atol=1e-6, err_msg=f"{name} {lvl}")
            cov = float(np.mean(((lo <= ys) & (ys <= hi))[held]))
            scaled_lo, scaled_hi = interval(name, j, ys + (est - ys) / 0.8, n, lvl)
            scaled = float(np.mean(((scaled_lo <= ys) & (ys <= scaled_hi))[held]))
            if cov < lvl - 0.02:
                bad.append(f"{name} {lvl:.0%}: coverage {cov:.2%} below nominal - 2 points (too narrow)")
            if lvl == 0.95 and name != "sp_difference" and cov > 0.985:
                bad.append(f"{name} {lvl:.0%}: coverage {cov:.2%} above 98.5% (too wide)")
            if (lvl == 0.95 or name != "sp_difference") and scaled >= lvl:
                bad.append(f"{name} {lvl:.0%}: scaled by 0.8 the intervals still cover {scaled:.2%} (too wide)")
            if name == "sp_difference":
                expected = []
                for y in ys.astype(int):
                    k = np.arange(y + 1)
                    e_lo, e_hi = sp.score_interval(k / 0.45, 1e6, lvl)
                    expected.append(float((binom.pmf(k, y, 0.45) * ((e_lo <= y) & (y <= e_hi))).sum()))
                all_cov = float(np.mean((lo <= ys) & (ys <= hi)))
                if abs(all_cov - np.mean(expected)) > 0.02:
                    bad.append(f"{name} {lvl:.0%}: coverage {all_cov:.2%} over all cells, exact expectation "
                               f"{np.mean(expected):.2%}")
    assert not bad, "\n".join(bad)


def test_metrics_pass_promtool_and_labels_are_bounded(broker: str, tmp_path: Path, promtool: str) -> None:
    rs, ws = _settings(broker, tmp_path, max_epochs=2)
    replay(rs, progress=False)
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, _expected_records(rs, 2))
        text = w.metrics()
    finally:
        w.stop()
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    allowed = {"query", "mechanism", "estimator", "station", "confidence", "round", "reason", "closed_by", "kind",
               "statistic", "topic", "partition", "le", "quantile", "release", "state"}
    for line in text.splitlines():
        if line.startswith("ptt_") and "{" in line:
            labels = {kv.split("=")[0] for kv in line[line.index("{") + 1:line.index("}")].split(",")}
            assert labels <= allowed, line
    day = load_day(rs)
    for s in day.stations:
        assert f'station="{int(s)}"' in text
    assert metric(text, "ptt_query_epsilon", query="sp-day") > 0
    assert metric(text, "ptt_query_crowd_size_vehicles", query="alp-day", statistic="mean") > 0


def test_duplicate_deliveries_count_once(broker: str, tmp_path: Path) -> None:
    """One epoch sent by hand: round 0's batch is delivered twice (same batch id) before the
    markers; the estimate equals the statistics core's and the duplicate is counted."""
    import estimators as E
    from estimators import StationCounts
    from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
    from producers.replay import default_queries
    from schemas import EndOfEpoch, encode_json
    from schemas.kafka_io import ensure_topics, publish_query

    rs, ws = _settings(broker, tmp_path)
    ensure_topics(rs)
    day = load_day(rs)
    fleet = fleet_size_for(day, rs)
    q = next(q for q in default_queries(day, fleet, rs.mechanisms) if q.mechanism == "sp")
    publish_query(rs, q)
    epoch = int(day.epochs[0])
    tc = query_truth_counts(split_fleet(rs.seed, epoch, day.flows[0], fleet, 1)[0], day.stations, q)
    er = privatize(q, StationCounts(tc), epoch_rng(rs.seed, q, epoch, 0), "per-vehicle", Device())
    sink = ReportSink(rs, rs.reports_topic)
    for r in range(2):
        batch_id = new_batch_id()
        value = encode_batch({"kind": "reports", "query_id": q.query_id, "query_version": 1, "epoch": epoch,
                              "round": r, "producer_id": "p0-hand", "layout": "values", "n_stations": q.n_stations,
                              "n_outputs": q.n_stations + 1, "batch_id": batch_id, "reports": fleet},
                             {"value": er.rounds[r].arrays()["value"]})
        part = sink.partition_for(batch_id.encode())
        for _ in range(2 if r == 0 else 1):  # round 0 delivered twice
            sink.send(value, key=batch_id.encode(), partition=part)
        for p in sink.partitions:
            mine = p == part
            sink.send(encode_json(EndOfEpoch(
                producer_id="p0-hand", producer_index=0, producer_count=1, query_id=q.query_id, query_version=1,
                epoch=epoch, round=r, partition=p, reports_to_partition=fleet if mine else 0,
                batches_to_partition=1 if mine else 0, reports_total=fleet, batches_total=1, participants=fleet,
                refused=0, mode="per-vehicle")), partition=p)
    sink.close()
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, q.n_stations)
        wait_for(lambda: metric(w.metrics(), "ptt_duplicate_records_total", query=q.query_id) == 1, 30, "dup")
    finally:
        w.stop()
    got = read_estimates(ws)
    counts = E.station_counts(q.build(), np.stack([np.bincount(er.rounds[r].arrays()["value"],
                                                               minlength=q.n_stations + 1) for r in range(2)]))
    want = E.sp_difference(q.build()).estimate(counts, fleet)
    for j, station in enumerate(q.sensors):
        e = got[(q.query_id, 1, epoch, station, "sp_difference")]
        assert e.estimate == pytest.approx(want[j]) and e.reports == 2 * fleet and e.missing_batches == 0


def test_a_small_daily_budget_shows_refusals_end_to_end(broker: str, tmp_path: Path) -> None:
    """Devices with a daily privacy budget of 10 answer the three demo queries (ALP 1.31, RR 4.84,
    SP 1.91 per epoch) until the next epoch of a query would take the day over 10; from then on
    that query is refused. The markers carry it, the estimates' ``refused`` field shows it (and
    those epochs are withheld: nobody answered), and so does ``ptt_refused_vehicles_total``."""
    from estimators import DayLedger

    rs, ws = _settings(broker, tmp_path, max_epochs=3, device_daily_budget=10.0)
    summary = replay(rs, progress=False)
    assert summary.refused  # the replay's own summary counts them too
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, _expected_records(rs, 3))
        text = w.metrics()
        queries = sorted(read_queries(rs), key=lambda q: q.query_id)  # the order devices answer them in
        counted = {q.query_id: metric(text, "ptt_refused_vehicles_total", query=q.query_id) for q in queries}
    finally:
        w.stop()
    est = read_estimates(ws)
    fleet = fleet_size_for(load_day(rs), rs)
    epochs = sorted({k[2] for k in est})
    ledger, want = DayLedger(10.0), {}
    for epoch in epochs:  # the devices' own bookkeeping, replayed here
        for q in queries:
            want[(q.query_id, epoch)] = not ledger.spend("day", q.epsilon)
    assert any(want.values()) and not all(want.values())
    for (qid, _, epoch, _, _), e in est.items():
        refused = want[(qid, epoch)]
        assert e.refused == (fleet if refused else 0), (qid, epoch, e.refused)
        if refused:
            assert e.withheld is not None and e.participants == 0
    for q in queries:
        assert counted[q.query_id] == fleet * sum(want[(q.query_id, epoch)] for epoch in epochs)


def test_missing_readings_are_marked_end_to_end(broker: str, tmp_path: Path) -> None:
    """The synthetic day has a block of absent rows and a dead detector. Replaying epochs that
    cover one: the ground truth names those cells as having no truth, and their estimates come
    out with data_quality "no_source_data" (all others "ok")."""
    rs0, _ = _settings(broker, tmp_path)
    day = load_day(rs0)
    gaps = np.flatnonzero(~day.has_truth.all(axis=1))
    assert gaps.size  # the synthetic day has some
    start = int(gaps[0])
    rs, ws = _settings(broker, tmp_path, start_epoch=start, max_epochs=2)
    replay(rs, progress=False)
    w = _run(ws, tmp_path)
    try:
        _wait_estimates(ws, _expected_records(rs, 2))
    finally:
        w.stop()
    no_truth = {(int(day.epochs[start + i]), int(s)) for i in range(2)
                for s in day.stations[~day.has_truth[start + i]]}
    est = read_estimates(ws)
    flagged = {(e.epoch, e.station) for e in est.values() if e.data_quality == "no_source_data"}
    assert flagged == no_truth and no_truth
