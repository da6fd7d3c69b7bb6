"""Benchmark: per-vehicle replay throughput against the raw broker throughput of the same bytes.

Starts the embedded broker, replays M epochs of the synthetic day with a Sampling Privacy
query in per-vehicle mode (one report per vehicle per round, fleet grown by query expansion),
then produces the very same number of records of the very same sizes (random bytes) with the
same producer settings into a fresh topic. Both runs share the process, the broker and the
machine; the ratio (raw time / replay time) is what to read.

Run: ``python tests/benchmarks/bench_replay.py [--vehicles N] [--epochs M] [--stations S]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from producers.replay import default_queries, fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from schemas.kafka_io import ensure_topics, publish_query
from stream_app.cli.local_broker import LocalBroker
from tests.benchmarks.common import raw_produce, stop_children_on_signals
from tests.integration.kafka_helpers import drain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vehicles", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--stations", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=20_000)
    args = parser.parse_args()
    stop_children_on_signals("bench_replay")  # SIGTERM/SIGINT: the cleanup below still runs
    with tempfile.TemporaryDirectory() as tmp, LocalBroker(log_path=Path(tmp) / "tansu.log") as broker:
        s = ReplaySettings(bootstrap_servers=broker.bootstrap, data_dir=Path(tmp), synthetic_stations=args.stations,
                           expand_to=args.vehicles, max_epochs=args.epochs, batch_size=args.batch_size,
                           truth=False, default_queries=False, reports_topic="bench-reports",
                           queries_topic="bench-queries", truth_topic="bench-truth", partitions=4)
        ensure_topics(s)
        day = load_day(s)
        sp = default_queries(day, fleet_size_for(day, s), ("sp",))[0]  # Sampling Privacy, opted in
        publish_query(s, sp)
        t0 = time.perf_counter()
        summary = replay(s, progress=False)
        t_replay = time.perf_counter() - t0
        records = drain(s, s.reports_topic)
        sizes = [len(r.value) for r in records]
        total = sum(sizes)

        t_raw = raw_produce(s, "bench-raw", sizes)

    print(f"replay: {summary.epochs} epochs, {summary.reports:,} reports ({args.vehicles:,} vehicles x 2 rounds), "
          f"{len(records):,} records incl. markers, {total / 1e6:.1f} MB")
    print(f"replay (per-vehicle, end to end): {t_replay:.2f}s  {summary.reports / t_replay:,.0f} reports/s  "
          f"{total / t_replay / 1e6:.1f} MB/s")
    print(f"raw produce of the same bytes:     {t_raw:.2f}s  {total / t_raw / 1e6:.1f} MB/s")
    print(f"ratio (raw time / replay time):    {t_raw / t_replay:.2f}x")


if __name__ == "__main__":
    main()
