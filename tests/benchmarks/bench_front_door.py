"""Benchmark: the shuffler's HTTP front door (``ptt shuffler --http-port``), accepted device
reports per second. One JSON line per scenario.

Scenarios (``--only`` picks some): ``h1`` at 500 stations, ``h2`` at 3,220 (the papers' scale).
Per scenario: the synthetic day's fleet privatizes one busy epoch for the demo's default
queries (Sampling Privacy's two rounds, ALP, RR) as ``ptt replay --via-shuffler --transport
http`` does -- one request per device holding its reports of the epoch, framed binary
(``producers/devices.py``) -- encoded before the clock starts; at most ``--devices`` requests.
Then the bench's :class:`~producers.http_client.DeviceClient` (``--concurrency`` requests in
flight over keep-alive connections, one process) posts them all to a ``ptt shuffler
--http-port`` whose clock a source note opened for that epoch, so the shuffler takes each
report into its state as it would in a replay (its loop runs beside the door in the same
process). Each line has:

* ``reports_per_s``, ``requests_per_s``: accepted (202: every record acknowledged by the
  broker, acks=all) over the wall time from the first request to the last answer;
* ``reports_per_request``, ``request_bytes`` (mean body size), ``p50_ms``/``p99_ms`` per request;
* ``shuffler_read_all_after_s``: how long after the last answer the shuffler had read (committed)
  every accepted report -- whether its loop keeps up with its door;
* ``cpu_s`` of the shuffler process (front door + shuffler loop), the client (this process)
  and the broker over the run, and ``cpu_share``; ``load_average`` when it started (the
  machine is shared);
* ``fleet_reports_per_s``: what the papers' fleet needs -- 47,719 devices x the default
  queries' report records per device and epoch (``reports_per_request``) / 30 s -- and
  ``fits_real_time`` (``reports_per_s`` >= that).

Measured on 2 cores shared with other sessions (docs/operations.md, "Benchmarks", has the
numbers and the load).

Run: ``python tests/benchmarks/bench_front_door.py [--only h1,h2] [--devices 20000] [--concurrency 64]``
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from pydantic import SecretStr

from producers.devices import DeviceRequests
from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.http_client import DeviceClient
from producers.replay import device_records
from producers.settings import ReplaySettings
from schemas import SourceEpoch, encode_json
from schemas.device_http import frame
from schemas.kafka_io import ensure_topics, publish_query
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.shuffler.settings import ShufflerSettings
from tests.benchmarks.bench_shuffler import _cpu_s, _Shuffler
from tests.benchmarks.common import load_scenario, stop_children_on_signals

PAPER_FLEET = 47_719
_STARTED: list[_Shuffler] = []


def _requests(rs: ReplaySettings, limit: int) -> tuple[int, list[list[bytes]], int, list[Any]]:
    """The busiest epoch's device requests (at most ``limit``), the epoch, the fleet, the queries."""
    day, _, fleet, queries, _ = load_scenario(rs)
    i = int(day.flows.sum(axis=1).argmax())
    epoch = int(day.epochs[i])
    share = split_fleet(rs.seed, epoch, day.flows[i], fleet, 1)[0]
    devices = DeviceRequests()
    enrollment = rs.enrollment()  # the simulated fleet stands in for the enrolled devices
    for q in queries:
        er = privatize(q, query_truth_counts(share, day.stations, q), epoch_rng(rs.seed, q, epoch, 0),
                       "per-vehicle", Device())
        devices.add(device_records(q, epoch, er, enrollment))
    return epoch, [d for d in devices.devices if d][:limit], fleet, queries


def _post_timed(client: DeviceClient, requests: list[list[bytes]]) -> tuple[float, list[float]]:
    """Wall seconds for all requests, and each request's latency (ms)."""
    import asyncio

    latencies: list[float] = []

    async def run() -> None:
        gate = asyncio.Semaphore(client.concurrency)

        async def one(records: list[bytes]) -> None:
            async with gate:
                t = time.perf_counter()
                await client._post(frame(records), "application/octet-stream")  # noqa: SLF001 - timing each
                latencies.append(1000 * (time.perf_counter() - t))

        await asyncio.gather(*(one(r) for r in requests))

    t0 = time.perf_counter()
    asyncio.run_coroutine_threadsafe(run(), client._loop).result()  # noqa: SLF001 - the client's own loop
    return time.perf_counter() - t0, latencies


def _committed(ss: ShufflerSettings) -> int:
    """Device records the shuffler has committed as read (its group's offsets; a fresh topic)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**ss.client_kwargs(), group_id=ss.transactional_id, enable_auto_commit=False)
    try:
        return sum(c.committed(TopicPartition(ss.device_topic, p)) or 0 for p in range(ss.device_partitions))
    finally:
        c.close()


def _wait_read(ss: ShufflerSettings, n: int, timeout_s: float) -> float | None:
    """Seconds until the shuffler has read ``n`` device records (None: not within the timeout)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if _committed(ss) >= n:
            return time.perf_counter() - t0
        time.sleep(0.2)
    return None


def run(name: str, broker: LocalBroker, tmp: Path, stations: int, limit: int, concurrency: int,
        data_dir: Path) -> dict[str, Any]:
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    rs = ReplaySettings(bootstrap_servers=broker.bootstrap, data_dir=data_dir, truth=False, default_queries=False,
                        reports_topic=f"r-{tag}", queries_topic=f"q-{tag}", truth_topic=f"t-{tag}", partitions=4,
                        synthetic_stations=stations, via_shuffler=True, device_topic=f"dev-{tag}",
                        device_partitions=4, enrollment_secret=SecretStr(secrets.token_hex(32)))
    epoch, requests, fleet, queries = _requests(rs, limit)
    for q in queries:
        publish_query(rs, q)
    ss = ShufflerSettings(**rs.model_dump(include=set(ShufflerSettings.model_fields)), shuffler_id=f"s-{tag}",
                          dead_letter_topic=f"d-{tag}", metrics_port=0, http_port=free_port(),
                          http_max_reports=64, http_max_body_bytes=1024 * 1024, http_device_reports_per_s=1e6,
                          http_device_burst=1_000_000)
    ensure_topics(ss, {ss.source_topic: 1, ss.device_topic: 4})
    opener = KafkaProducer(**ss.client_kwargs(), acks="all")
    opener.send(ss.source_topic, key=b"source-epoch", value=encode_json(SourceEpoch(epoch=epoch, opens=True)),
                partition=0)
    opener.flush()
    opener.close()
    shuffler = _Shuffler(ss, tmp / f"shuffler-{tag}.log", None)
    _STARTED.append(shuffler)
    shuffler.start()
    load = os.getloadavg()[0]
    client = DeviceClient(f"http://127.0.0.1:{ss.http_port}", concurrency=concurrency, attempts=3)
    try:
        pid = shuffler.proc.pid if shuffler.proc else None
        cpu0 = {"shuffler": _cpu_s(pid), "client": _cpu_s(os.getpid()), "broker": _cpu_s(broker.pid)}
        wall, latencies = _post_timed(client, requests)
        cpu = {k: round(_cpu_s(p) - cpu0[k], 1) for k, p in
               (("shuffler", pid), ("client", os.getpid()), ("broker", broker.pid))}
        behind_s = _wait_read(ss, sum(len(r) for r in requests), 120)
    finally:
        client.close()
        shuffler.stop()
    reports = sum(len(r) for r in requests)
    per_request = reports / len(requests)
    total_cpu = sum(cpu.values()) or 1.0
    need = PAPER_FLEET * per_request / 30
    lat = sorted(latencies)
    return {"scenario": name, "stations": stations, "fleet": fleet, "epoch": epoch, "requests": len(requests),
            "reports": reports, "concurrency": concurrency, "wall_s": round(wall, 2),
            "requests_per_s": round(len(requests) / wall), "reports_per_s": round(reports / wall),
            "reports_per_request": round(per_request, 2),
            "request_bytes": round(statistics.fmean(len(frame(r)) for r in requests)),
            "p50_ms": round(lat[len(lat) // 2], 1), "p99_ms": round(lat[int(len(lat) * 0.99)], 1),
            "retries": client.retries, "cpu_s": cpu,
            "shuffler_read_all_after_s": None if behind_s is None else round(behind_s, 1),
            "cpu_share": {k: round(v / total_cpu, 2) for k, v in cpu.items()},
            "load_average": round(load, 1), "fleet_reports_per_s": round(need),
            "fits_real_time": reports / wall >= need, "shuffler_summary": shuffler.summary()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="h1,h2")
    parser.add_argument("--devices", type=int, default=20_000, help="requests (devices) per scenario, at most")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--data-dir", type=Path, default=Path(".ptt-data/bench"),
                        help="where synthetic days and their parse cache are kept between runs")
    args = parser.parse_args()
    stop_children_on_signals("bench_front_door")
    wanted = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        try:
            for name, stations in (("h1", 500), ("h2", 3220)):
                if name in wanted:
                    line = run(name, broker, Path(tmp_name), stations, args.devices, args.concurrency, args.data_dir)
                    print(json.dumps(line), flush=True)
        finally:
            for s in _STARTED:
                s.stop()


if __name__ == "__main__":
    main()
