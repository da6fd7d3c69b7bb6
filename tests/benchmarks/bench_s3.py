"""Benchmark s3: the papers' 10,047,719 vehicles, per vehicle, live, through the shuffler. One
JSON line per run.

One hour (``--epochs``, default 120, from 14:00) of the synthetic 3,220-station day, the trip
fleet at the papers' ratio (``--fleet-model trips``: vehicles that drive all day; 10,047,719 at
3,220 stations), one query: hourly unary flows with a day cap of 40 passages
(``unary@3600//40``), its q planned for a day of 1 through the shuffler's aggregate release
(:func:`producers.queries.planned_flow_params`, ~1.7e-4: ~0.5 noise ones of 3,220, so every
device sends its report as station ids, :meth:`estimators.PerStation.sparse_bits`). Every
device's report is its own record through ``ptt shuffler --release aggregate`` (Kafka, the
embedded broker); one worker publishes the estimates.

The line has (as ``bench_shuffler.py``'s s2):

* ``realtime_factor = epochs x 30 / last_estimate_s`` (replay start to the last estimate row
  written, the broker's timestamps) and ``meets_bar`` (>= 6x real time: the hour in <= 10 minutes);
* ``estimates`` and ``expected_estimates`` (the span query's stations x estimators per whole span);
* ``cpu_s`` per process (replay: this process; the shuffler, the worker, the broker: /proc) and
  ``cpu_us_per_device_record`` per process;
* ``device_records``, ``device_record_bytes_mean`` (of the device topic's first 200,000), the
  passages per vehicle of the replayed hour (``vehicle_day``: mean, p50, p90, p99, max, and the
  share a cap of M drops) and ``passages_dropped_share`` (the query's day cap, what it dropped of
  the passages of the sent spans);
* ``replay_phases`` (``--profile``): the replay's CPU by phase from :mod:`cProfile` (its main
  thread's CPU clock): the fleet model (trips and their span sets), randomizing
  (:func:`producers.fleet.privatize`), encoding and sealing
  (:func:`producers.devices.device_records`), handing to librdkafka
  (:meth:`producers.sink.ReportSink.send_many`); and ``shuffler_profile``, the shuffler's top
  functions (``tests/benchmarks/cpu_profile.py``).

The devices' epsilon limit is raised (``--device-epsilon-limit``, default 1,000): the hour's
report of up to 120 stations costs epsilon ~14 per epoch of its span locally (the demo's
default limit of 10 refuses it); through the shuffler's aggregate release the day costs ~1.

Measured (2026-12-07, 2 cores shared, load 2.9-3.5; the record's first ``bench_s3`` entry;
py-spy sampled the replay and the shuffler at 20 Hz): the hour in 444 s, 8.1x real time (bar 6x
met, 10x not), all 3,220 estimates, no dead letter; 10,047,719 device records of 76.7 bytes on
average (station ids; a bitmap's report would be ~440); planned q 9.5e-4 (the replay plans at an
expected Yes of 100); CPU s replay 126 (12.6 us a record), shuffler 290 (28.8 us), worker 10.5,
broker 14. The replay by phase (py-spy samples): handing to librdkafka 78 s, sealing 35 s, the
fleet model 20 s, planning 18 s, randomizing 8.6 s, encoding 7.3 s. The shuffler: reading
(``Intake.poll``, a Python object per record) 38%, decoding 36% (of it the MAC checks 14%),
admission 13%. Passages per vehicle in the hour: mean 1.04, p50 0, p90 3, p99 17, max 70 (81%
passed none); the cap of 40 dropped 9,194 passages (0.09%).

Then with the shuffler's collector quieted (``stream_app.cli.shuffler.quiet_gc``; the record's
second entry, load 2.9-3.3, no sampler attached): the hour in 222 s, 16.2x real time, all 3,220
estimates; CPU s replay 123 (12.2 us a record), shuffler 130 (13.0 us: the held reports were
being scanned by full collections), worker 5.0, broker 11.7.

Run: ``python tests/benchmarks/record.py tests/benchmarks/bench_s3.py [--epochs 120] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import secrets
import tempfile
import time
import uuid
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

from pydantic import SecretStr

from producers.replay import replay
from producers.settings import ReplaySettings
from schemas.kafka_io import publish_query, read_to_end
from schemas.settings import cache_dir
from stream_app.cli.demo import expected_windows
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.settings import WorkerSettings
from stream_app.shuffler.settings import ShufflerSettings
from stream_app.worker.app import ensure_stream_topics
from tests.benchmarks.bench_scale import _dead, _scrape, _wait_url
from tests.benchmarks.bench_shuffler import _outcomes, _profile_top, _Shuffler
from tests.benchmarks.common import load_scenario, stop_children_on_signals
from tests.integration.stream_helpers import WorkerProcess
from tests.processes import cpu_s

BAR = 6.0  # x real time: an hour of data in 10 minutes
SAMPLE_RECORDS = 200_000  # device records read back for their mean size

# the replay's phases: (name, functions whose cumulative CPU is the phase's) -- a function's
# cumulative time holds its callees', so the phases are disjoint call trees
PHASES = {
    "fleet_model": ("fleet.py", "split_fleet"), "fleet_model_spans": ("spans.py", "step"),
    "randomizing": ("spans.py", "span_reports"), "encoding_sealing": ("devices.py", "device_records"),
    "to_librdkafka": ("sink.py", "send_many"), "source_notes": ("devices.py", "send_source_epoch"),
}


def _phases(path: Path) -> dict[str, float]:
    """The replay's CPU seconds by phase (:data:`PHASES`) and in all, from its profile."""
    stats = pstats.Stats(str(path))
    out = dict.fromkeys(PHASES, 0.0)
    total = 0.0
    for (file, _, func), (_, _, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        total += tottime
        for name, (mod, fn) in PHASES.items():
            if func == fn and Path(file).name == mod and file.find("producers") >= 0:
                out[name] += cumtime
    out = {k: round(v, 2) for k, v in out.items()}
    out["all"] = round(total, 2)
    return out


def run(broker: LocalBroker, tmp: Path, *, epochs: int, start_epoch: int, profile: bool, data_dir: Path,
        device_epsilon_limit: float) -> dict[str, Any]:
    tag = f"s3-{uuid.uuid4().hex[:8]}"
    rs = ReplaySettings(bootstrap_servers=broker.bootstrap, data_dir=data_dir, truth=False, default_queries=False,
                        query_mechanisms="unary@3600//40", fleet_model="trips",
                        reports_topic=f"r-{tag}", queries_topic=f"q-{tag}", truth_topic=f"t-{tag}", partitions=4,
                        synthetic_stations=3220, mode="per-vehicle", max_epochs=epochs, start_epoch=start_epoch,
                        via_shuffler=True, device_topic=f"dev-{tag}", device_partitions=4,
                        device_epsilon_limit=device_epsilon_limit,
                        enrollment_secret=SecretStr(secrets.token_hex(32)))  # the operator's, the fleet's too
    day, load_s, fleet, queries, base = load_scenario(rs)
    rs = rs.model_copy(update={"enrolled_devices": fleet})  # every vehicle an enrolled device (the shuffler's too)
    ws = WorkerSettings(**base, app_id=f"bench-{tag}", estimates_topic=f"e-{tag}", dead_letter_topic=f"d-{tag}",
                        web_port=free_port(), min_participants=1, estimate_output="rows")
    ensure_stream_topics(ws)
    for q in queries:
        publish_query(rs, q)
    worker = WorkerProcess(ws, tmp / f"worker-{tag}.log")
    ss = ShufflerSettings(**rs.model_dump(include=set(ShufflerSettings.model_fields)),
                          shuffler_id=f"shuf-{uuid.uuid4().hex[:8]}", dead_letter_topic=ws.dead_letter_topic,
                          min_crowd=1, idle_release_s=1.0, release="aggregate", metrics_port=0)
    prof_path = tmp / f"shuffler-{tag}.prof" if profile else None
    shuffler = _Shuffler(ss, tmp / f"shuffler-{tag}.log", prof_path)
    try:
        worker.start()
        worker.wait_ready(120)
        _wait_url(worker.url.replace("/metrics", "/ready"), 120)
        shuffler.start()
        pids = {"shuffler": shuffler.proc.pid if shuffler.proc else None,
                "worker": worker.proc.pid if worker.proc else None, "broker": broker.pid}
        cpu0 = {k: cpu_s(p) for k, p in pids.items()}
        replayed = [int(e) for e in day.epochs[start_epoch:start_epoch + epochs]]
        windows = expected_windows(queries, replayed)
        expected = sum(q.n_stations * len(q.spec.estimator_names) for q in queries) * windows
        t0 = time.time()
        replay_cpu0 = time.process_time()
        prof = cProfile.Profile(time.thread_time) if profile else None
        if prof is not None:
            prof.enable()
        summary = replay(rs, progress=False)
        if prof is not None:
            prof.disable()
            prof.dump_stats(tmp / f"replay-{tag}.prof")
        replay_s = time.time() - t0
        cpu = {"replay": time.process_time() - replay_cpu0}
        deadline = time.time() + max(600.0, 5 * replay_s)
        while time.time() < deadline and _outcomes(worker) < windows:
            time.sleep(0.5)
        cpu.update({k: cpu_s(p) - cpu0[k] for k, p in pids.items() if p is not None})
        every = [(r.timestamp, r.value) for r in read_to_end(ws, ws.estimates_topic, idle_timeout_s=5)]
        last_s = max(t for t, _ in every) / 1000.0 - t0 if every else float("nan")
        dead = int(_dead(_scrape(worker, "ptt_dead_letters_total")))
    finally:
        worker.stop()
        shuffler.stop()
    records = summary.records
    # a sample: 10M records take minutes to read back
    reader = cast(Generator[Any, None, None], read_to_end(rs, rs.device_topic, idle_timeout_s=2))
    sample = [len(r.value or b"") for r in itertools.islice(reader, SAMPLE_RECORDS)]
    reader.close()
    q = queries[0]
    vd = summary.vehicle_day
    passages = vd.passages if vd is not None else 0
    total_cpu = sum(cpu.values())
    out: dict[str, Any] = {
        "scenario": "s3", "path": "shuffler", "release": "aggregate", "stations": q.n_stations, "vehicles": fleet,
        "mode": "per-vehicle", "fleet_model": "trips", "query_mechanisms": rs.query_mechanisms,
        "q": q.params.get("q"), "sparse_reports": bool(q.per_station and q.per_station[0].sparse_bits()),
        "epochs": epochs, "start_epoch": start_epoch, "load_s": round(load_s, 2), "replay_s": round(replay_s, 2),
        "last_estimate_s": round(last_s, 2), "realtime_factor": round(epochs * 30 / last_s, 2),
        "meets_bar": epochs * 30 / last_s >= BAR and len(every) == expected,
        "estimates": len(every), "expected_estimates": expected, "dead_letters": dead,
        "refused": dict(summary.refused), "spans_sent": dict(summary.spans_sent),
        "device_records": records, "delivery_failures": summary.delivery_failures,
        "device_record_bytes_mean": round(sum(sample) / max(len(sample), 1), 1),  # of the topic's first records
        "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
        "cpu_share": {k: round(v / total_cpu, 3) for k, v in cpu.items()},
        "cpu_us_per_device_record": {k: round(1e6 * v / max(records, 1), 2) for k, v in cpu.items()},
        "vehicle_day": None if vd is None else vd.to_json(),
        "passages_dropped": dict(summary.passages_dropped),
        "passages_dropped_share": round(sum(summary.passages_dropped.values()) / passages, 5) if passages else None,
        "shuffler_summary": shuffler.summary(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    if profile:
        out["profiled"] = True
        out["replay_phases"] = _phases(tmp / f"replay-{tag}.prof")
        out["replay_profile"] = _profile_top(tmp / f"replay-{tag}.prof")
        if prof_path is not None and prof_path.exists():
            out["shuffler_profile"] = _profile_top(prof_path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=120, help="epochs replayed (120: the hour)")
    parser.add_argument("--start-epoch", type=int, default=14 * 120, help="the first (14:00), an hour's start")
    parser.add_argument("--device-epsilon-limit", type=float, default=1000.0)
    parser.add_argument("--profile", action="store_true", help="the replay and the shuffler under cProfile")
    parser.add_argument("--data-dir", type=Path, default=cache_dir("bench"),
                        help="where synthetic days and their parse cache are kept between runs")
    args = parser.parse_args()
    stop_children_on_signals("bench_s3")
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        line = run(broker, Path(tmp_name), epochs=args.epochs, start_epoch=args.start_epoch, profile=args.profile,
                   data_dir=args.data_dir, device_epsilon_limit=args.device_epsilon_limit)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
