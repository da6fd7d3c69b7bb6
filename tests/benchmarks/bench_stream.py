"""Benchmark: end-to-end per-vehicle Sampling Privacy day through the stream app.

Measures, in one run on one broker:

1. **pipeline**: from the first produced report to the last estimate published, a per-vehicle
   SP replay (query expansion to --vehicles, --epochs epochs) through one worker;
2. **raw**: producing the very same records (same sizes, same producer settings) and
   consuming them all back with kafka-python -- the broker's own produce+consume throughput;
3. **naive**: one JSON message per report (``SingleReport``) for a smaller fleet through the
   same worker, for contrast.

Read the ratio pipeline / raw (target >= 0.5x); absolute numbers vary with the machine.
Run: ``python tests/benchmarks/bench_stream.py [--vehicles N] [--epochs M]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from estimators import StationCounts
from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.replay import default_queries, fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import EndOfEpoch, SingleReport, encode_json, new_batch_id
from schemas.kafka_io import ensure_topics, publish_query
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.settings import WorkerSettings
from tests.benchmarks.common import raw_produce, stop_children_on_signals
from tests.integration.kafka_helpers import drain
from tests.integration.stream_helpers import WorkerProcess, read_estimates, wait_for


def _last_estimate_time(ws: WorkerSettings) -> float:
    """Wall-clock time (s) at which the worker produced its last estimate (record timestamps)."""
    return max(r.timestamp for r in drain(ws, ws.estimates_topic, quiet_polls=1)) / 1000.0


def _pipeline(rs: ReplaySettings, ws: WorkerSettings, expected: int, tmp: Path) -> tuple[float, int]:
    """First produce -> last estimate, both on the wall clock of this machine."""
    worker = WorkerProcess(ws, tmp / f"worker-{ws.app_id}.log").start()
    worker.wait_ready()
    try:
        t0 = time.time()
        summary = replay(rs, progress=False)
        wait_for(lambda: len(read_estimates(ws)) >= expected, 600, "estimates")
        return _last_estimate_time(ws) - t0, summary.reports
    finally:
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vehicles", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--naive-vehicles", type=int, default=1_000)
    parser.add_argument("--naive-epochs", type=int, default=2)
    args = parser.parse_args()
    stop_children_on_signals("bench_stream")  # SIGTERM/SIGINT: the cleanup below still runs
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        tmp = Path(tmp_name)

        def settings(tag: str, **kw: object) -> tuple[ReplaySettings, WorkerSettings]:
            rs = ReplaySettings(bootstrap_servers=broker.bootstrap, data_dir=tmp / "data", truth=False,
                                default_queries=False, reports_topic=f"r-{tag}", queries_topic=f"q-{tag}",
                                truth_topic=f"t-{tag}", partitions=4, **kw)  # type: ignore[arg-type]
            ws = WorkerSettings(**{k: v for k, v in rs.model_dump().items() if k in WorkerSettings.model_fields},
                                app_id=f"bench-{tag}", estimates_topic=f"e-{tag}", dead_letter_topic=f"d-{tag}",
                                web_port=free_port(), min_participants=1)
            ensure_topics(rs)
            return rs, ws

        # 1. the pipeline
        rs, ws = settings("pipe", expand_to=args.vehicles, max_epochs=args.epochs, batch_size=20_000)
        day = load_day(rs)
        sp = default_queries(day, fleet_size_for(day, rs), ("sp",))[0]  # Sampling Privacy, opted in
        publish_query(rs, sp)
        t_pipe, reports = _pipeline(rs, ws, args.epochs * sp.n_stations, tmp)
        records = drain(rs, rs.reports_topic)
        sizes = [len(r.value) for r in records]
        total = sum(sizes)

        # 2. raw produce + consume of the same bytes
        t_raw = raw_produce(rs, "raw", sizes, consume=True)

        # 3. naive: one JSON message per report
        rs_n, ws_n = settings("naive", expand_to=args.naive_vehicles, max_epochs=args.naive_epochs)
        day_n = load_day(rs_n)
        fleet_n = fleet_size_for(day_n, rs_n)
        sp_n = default_queries(day_n, fleet_n, ("sp",))[0]
        publish_query(rs_n, sp_n)
        worker = WorkerProcess(ws_n, tmp / "worker-naive.log").start()
        worker.wait_ready()
        try:
            sink = ReportSink(rs_n, rs_n.reports_topic)
            n_reports = 0
            t0 = time.time()
            for i in range(args.naive_epochs):
                epoch = int(day_n.epochs[i])
                tc = query_truth_counts(split_fleet(rs_n.seed, epoch, day_n.flows[i], fleet_n, 1)[0],
                                        day_n.stations, sp_n)
                er = privatize(sp_n, StationCounts(tc), epoch_rng(rs_n.seed, sp_n, epoch, 0), "per-vehicle", Device())
                for r in range(2):
                    per_part = {p: 0 for p in sink.partitions}
                    for v in er.rounds[r].arrays()["value"]:
                        rep = SingleReport(query_id=sp_n.query_id, query_version=1, epoch=epoch, round=r,
                                           batch_id=new_batch_id(), value=int(v))
                        key = rep.batch_id.encode()
                        p = sink.partition_for(key)
                        sink.send(encode_json(rep), key=key, partition=p)
                        per_part[p] += 1
                        n_reports += 1
                    for p, n in per_part.items():
                        sink.send(encode_json(EndOfEpoch(
                            producer_id="device", producer_index=0, producer_count=1, query_id=sp_n.query_id,
                            query_version=1, epoch=epoch, round=r, partition=p, reports_to_partition=n,
                            batches_to_partition=n, reports_total=sum(per_part.values()),
                            batches_total=sum(per_part.values()), participants=int(tc.sum()), refused=0,
                            mode="per-vehicle")), partition=p)
            sink.flush()
            wait_for(lambda: len(read_estimates(ws_n)) >= args.naive_epochs * sp_n.n_stations, 900, "naive")
            t_naive = _last_estimate_time(ws_n) - t0
            sink.close()
        finally:
            worker.stop()

    print(f"pipeline: {reports:,} reports ({args.vehicles:,} vehicles x 2 rounds x {args.epochs} epochs), "
          f"{len(records):,} records, {total / 1e6:.1f} MB, first produce -> last estimate {t_pipe:.2f}s: "
          f"{reports / t_pipe:,.0f} reports/s")
    print(f"raw produce+consume of the same {len(records):,} records: {t_raw:.2f}s "
          f"({total / t_raw / 1e6:.1f} MB/s)")
    print(f"ratio pipeline / raw (raw time / pipeline time): {t_raw / t_pipe:.2f}x")
    print(f"naive one JSON message per report: {n_reports:,} reports in {t_naive:.2f}s: "
          f"{n_reports / t_naive:,.0f} reports/s ({reports / t_pipe / (n_reports / t_naive):,.0f}x slower "
          f"than the batched pipeline)")


if __name__ == "__main__":
    main()
