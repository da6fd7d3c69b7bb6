"""``ptt demo``: everything on one machine with nothing configured.

Starts the embedded broker, publishes the demo queries (Sampling Privacy, ALP, RR over all
stations) and replays the synthetic day at a watchable speed. Ctrl-C stops cleanly: the
replay flushes and marks what it sent, the broker is stopped, no process is left behind.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from producers.local_broker import LocalBroker
from producers.replay import replay
from producers.settings import ReplaySettings

__all__ = ["run_demo"]


def run_demo(speed: float = 120.0, max_epochs: int | None = None, stations: int = 16,
             port: int | None = None, data_dir: Path | None = None) -> int:
    with tempfile.TemporaryDirectory(prefix="ptt-demo-") as tmp, \
            LocalBroker(port=port, log_path=Path(tmp) / "broker.log") as broker:
        print(f"embedded Kafka-protocol broker at {broker.bootstrap} (memory only; log {tmp}/broker.log)")
        print(f"  list the queries:   ptt analyst list --bootstrap-servers {broker.bootstrap}")
        print("  reports topic:      ptt.reports   ground truth: ptt.truth   queries: ptt.queries")
        print(f"replaying the synthetic day ({stations} stations) at {speed:g}x real time; Ctrl-C stops",
              flush=True)
        settings = ReplaySettings(bootstrap_servers=broker.bootstrap, speed=speed, max_epochs=max_epochs,
                                  synthetic_stations=stations, data_dir=data_dir or Path(tmp) / "data")
        summary = replay(settings, progress=True)
        print(f"data: {summary.data_quality}")
        print(f"replayed {summary.epochs} epochs: {summary.reports:,} reports in {summary.records:,} records "
              f"from a fleet of {summary.fleet_size:,} vehicles in {summary.elapsed_s:.1f}s"
              + (" (interrupted)" if summary.interrupted else ""))
        if summary.delivery_failures:
            print(f"{summary.delivery_failures} records could not be delivered", file=sys.stderr)
            return 1
    return 130 if summary.interrupted else 0
