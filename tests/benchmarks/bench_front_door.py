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
report into its state as it would in a replay (the door runs in a process of its own, started
by the shuffler's). Each line has:

* ``reports_per_s``, ``requests_per_s``: accepted (202: every record acknowledged by the
  broker, acks=all) over the wall time from the first request to the last answer;
* ``reports_per_request``, ``request_bytes`` (mean body size), ``p50_ms``/``p99_ms`` per request;
* ``shuffler_read_all_after_s``: how long after the last answer the shuffler had read (committed)
  every accepted report -- whether its loop keeps up with its door;
* ``cpu_s`` of the shuffler process, its front door's process, the client (this process)
  and the broker over the run, and ``cpu_share``; ``load_average`` when it started (the
  machine is shared);
* ``fleet_reports_per_s``: what the papers' fleet needs -- 47,719 devices x the default
  queries' report records per device and epoch (``reports_per_request``) / 30 s -- and
  ``fits_real_time`` (``reports_per_s`` >= that).

Attack scenarios (each against its own door, its shuffler's clock open for the epoch):

* ``verify``: what checking every report's device id and MAC (the shuffler's own check,
  ``parse_request(..., enrollment)``) costs the door, against the same parse without it, over
  the ``h1`` requests (``--verify-stations``), in one process (CPU time, the best of 7 each):
  ``us_per_report`` each and ``ratio``; and the extra against the door's whole CPU per
  accepted report (``h1``'s ``cpu_s.shuffler`` / reports).
* ``flood``: ``--flood-s`` seconds each of unsigned reports, forged MACs (another secret) and
  64 KiB bodies, ``--concurrency`` keep-alive connections each, then genuine requests: answers
  by (status, reason), requests/s, bytes sent, records written to the device topic, dead-letter
  records and bytes, the shuffler process's CPU and its log's size;
* ``slow``, ``slow_nginx``: 20,000 slowloris connections against the door alone and through
  deploy/nginx/nginx.conf, optionally on a machine made busy (``--load-procs``):
  tests/benchmarks/bench_door_slow.py (run here by ``--only slow``, or there).

Measured on 2 cores shared with other sessions (docs/operations.md, "Benchmarks", has the
numbers and the load).

Run: ``python tests/benchmarks/bench_front_door.py [--only h1,h2,verify,flood,slow,slow_nginx]
[--devices 20000] [--concurrency 64] [--flood-s 10] [--slow 20000] [--slow-procs 4] [--load-procs 0]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kafka import KafkaProducer
from pydantic import SecretStr

from estimators import StationCounts
from producers.devices import DeviceRequests
from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.http_client import DeviceClient
from producers.replay import device_records
from producers.settings import ReplaySettings
from schemas import SourceEpoch, encode_json
from schemas.device_http import FRAMED, frame
from schemas.kafka_io import ensure_topics, publish_query
from schemas.settings import cache_dir
from stream_app.cli.local_broker import LocalBroker, free_port
from stream_app.shuffler.door_policy import Accepted
from stream_app.shuffler.settings import ShufflerSettings
from tests.benchmarks.bench_shuffler import _Shuffler
from tests.benchmarks.common import load_scenario, stop_children_on_signals
from tests.processes import cpu_s, door_healthy, door_pid

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
        er = privatize(q, StationCounts(query_truth_counts(share, day.stations, q)), epoch_rng(rs.seed, q, epoch, 0),
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
    note = rs.enrollment().sign_note(SourceEpoch(epoch=epoch, opens=True))  # the replay's notes are signed
    opener.send(ss.source_topic, key=b"source-epoch", value=encode_json(note),
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
        procs = {"shuffler": pid, "front_door": door_pid(pid) if pid else None, "client": os.getpid(),
                 "broker": broker.pid}
        cpu0 = {k: cpu_s(p) for k, p in procs.items()}
        wall, latencies = _post_timed(client, requests)
        cpu = {k: round(cpu_s(p) - cpu0[k], 1) for k, p in procs.items()}
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


def verify_cost(broker: LocalBroker, stations: int, limit: int, data_dir: Path, h1: dict[str, Any] | None
                ) -> dict[str, Any]:
    """What the MAC check costs the door per report (module docstring, ``verify``)."""
    from stream_app.shuffler.door_policy import DoorLimits, parse_request

    tag = uuid.uuid4().hex[:8]
    rs = ReplaySettings(bootstrap_servers=broker.bootstrap, data_dir=data_dir, truth=False, default_queries=False,
                        reports_topic=f"r-{tag}", queries_topic=f"q-{tag}", truth_topic=f"t-{tag}",
                        synthetic_stations=stations, via_shuffler=True, device_topic=f"dev-{tag}",
                        enrollment_secret=SecretStr(secrets.token_hex(32)))
    _, requests, _, _ = _requests(rs, limit)
    bodies = [frame(r) for r in requests]
    reports = sum(len(r) for r in requests)
    limits, enrollment = DoorLimits(max_body_bytes=1 << 20), rs.enrollment()
    for body in bodies[:2000]:  # keys and keyed states derived once per device, as in a running door
        parse_request(FRAMED, body, limits, enrollment)
    best: dict[str, float] = {}
    for _ in range(7):  # alternating, the best of each: CPU time of this process (a shared machine)
        for name, e in (("unverified", None), ("verified", enrollment)):
            t0 = time.process_time()
            for body in bodies:
                got = parse_request(FRAMED, body, limits, e)
                if not isinstance(got, Accepted):
                    raise RuntimeError(f"a genuine request refused: {got}")
            best[name] = min(best.get(name, float("inf")), time.process_time() - t0)
    us = {k: 1e6 * v / reports for k, v in best.items()}
    extra = us["verified"] - us["unverified"]
    door_us = None if h1 is None else 1e6 * (h1["cpu_s"]["shuffler"] + h1["cpu_s"]["front_door"]) / h1["reports"]
    return {"scenario": "verify", "stations": stations, "requests": len(bodies), "reports": reports,
            "us_per_report": {k: round(v, 2) for k, v in us.items()}, "ratio": round(us["verified"] /
                                                                                 us["unverified"], 2),
            "mac_us_per_report": round(extra, 2),
            "door_and_shuffler_cpu_us_per_accepted_report_h1": None if door_us is None else round(door_us, 1),
            "mac_share_of_that": None if door_us is None else round(extra / door_us, 3),
            "load_average": round(os.getloadavg()[0], 1)}


def _door(broker: LocalBroker, tmp: Path, name: str, **kw: Any) -> tuple[ShufflerSettings, _Shuffler, Any, int]:
    """A door (its shuffler) whose clock opened one epoch of a hand-made query; (settings, the
    process, the query, the epoch)."""
    from schemas import Query

    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    ss = ShufflerSettings(bootstrap_servers=broker.bootstrap, reports_topic=f"r-{tag}", queries_topic=f"q-{tag}",
                          device_topic=f"dev-{tag}", device_partitions=4, shuffler_id=f"s-{tag}",
                          dead_letter_topic=f"d-{tag}", metrics_port=0, http_port=free_port(), min_crowd=1,
                          enrollment_secret=SecretStr(secrets.token_hex(32)), **kw)
    ensure_topics(ss, {ss.source_topic: 1, ss.device_topic: 4, ss.reports_topic: 4, ss.queries_topic: 1,
                       ss.dead_letter_topic: 1})
    t0 = datetime(2026, 11, 18, tzinfo=UTC)
    q = Query(query_id=f"q{name}", analyst_id="a", version=1, mechanism="sp", sensors=(400001, 400002),
              population=60, t_start=t0, t_end=t0 + timedelta(days=1))
    publish_query(ss, q)
    epoch = q.epoch_range()[0] + 1
    opener = KafkaProducer(**ss.client_kwargs(), acks="all")
    note = ss.enrollment().sign_note(SourceEpoch(epoch=epoch, opens=True))  # the shuffler trusts signed notes only
    opener.send(ss.source_topic, key=b"source-epoch", value=encode_json(note), partition=0)
    opener.flush()
    opener.close()
    shuffler = _Shuffler(ss, tmp / f"shuffler-{tag}.log", None)
    _STARTED.append(shuffler)
    shuffler.start()
    deadline = time.time() + 60
    while not door_healthy(ss.http_port):
        if time.time() > deadline:
            raise RuntimeError("the door did not answer")
        time.sleep(0.2)
    return ss, shuffler, q, epoch


def _records(ss: ShufflerSettings, topic: str) -> tuple[int, int]:
    """(records, value bytes) on ``topic`` now."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**ss.client_kwargs(), enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or ())]
        c.assign(parts)
        ends = c.end_offsets(parts)
        c.seek_to_beginning(*parts)
        n = size = 0
        while any(c.position(tp) < ends[tp] for tp in parts):
            for recs in c.poll(timeout_ms=1000).values():
                n += len(recs)
                size += sum(len(r.value or b"") for r in recs)
        return n, size
    finally:
        c.close()


async def _hammer(port: int, bodies: list[bytes], seconds: float, concurrency: int) -> tuple[dict[str, int], int, int]:
    """Post ``bodies`` round-robin for ``seconds`` on ``concurrency`` keep-alive connections:
    answers by "status reason", requests, bytes sent."""
    import aiohttp

    answers: dict[str, int] = {}
    sent = [0, 0]
    end = time.monotonic() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        async def worker(k: int) -> None:
            i = k
            while time.monotonic() < end:
                body = bodies[i % len(bodies)]
                i += concurrency
                try:
                    async with session.post(f"http://127.0.0.1:{port}/v1/reports", data=body,
                                            headers={"Content-Type": "application/octet-stream"}) as r:
                        text = await r.read()
                        reason = json.loads(text).get("reason", "") if text[:1] == b"{" else ""
                        key = f"{r.status} {reason}".strip()
                except (aiohttp.ClientError, OSError) as exc:
                    key = type(exc).__name__
                answers[key] = answers.get(key, 0) + 1
                sent[0] += 1
                sent[1] += len(body)

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return answers, sent[0], sent[1]


def flood(broker: LocalBroker, tmp: Path, seconds: float, concurrency: int) -> dict[str, Any]:
    """Unsigned, forged-MAC and 64 KiB floods through one door (module docstring, ``flood``)."""
    from schemas.device_binary import encode_device
    from schemas.enrollment import Enrollment

    ss, shuffler, q, epoch = _door(broker, tmp, "flood")
    e = ss.enrollment()
    thief = Enrollment(b"not the operator's secret, 32 bytes or more", e.devices)

    def reports(d: int) -> list[bytes]:
        return [encode_device(q.query_id, 1, epoch, r, value=(d + r) % 3) for r in (0, 1)]

    one = thief.seal(reports(1)[0], 1)
    big = frame([one] * ((ss.http_max_body_bytes - 4) // (len(one) + 4)))  # 64 KiB of forged reports
    floods = {"unsigned": [frame(reports(d)) for d in range(5000)],
              "forged_mac": [frame([thief.seal(raw, d) for raw in reports(d)]) for d in range(5000)],
              "64KiB_bodies": [big.ljust(ss.http_max_body_bytes, b"\0"), big]}
    genuine = [frame([e.seal(raw, d) for raw in reports(d)]) for d in range(1000, 1050)]  # the population: 60
    load = os.getloadavg()[0]
    pid = door_pid(shuffler.proc.pid) if shuffler.proc else None  # the door's own process
    out: dict[str, Any] = {"scenario": "flood", "flood_s": seconds, "concurrency": concurrency,
                           "load_average": round(load, 1)}
    total_sent = 0
    try:
        for name, bodies in floods.items():
            cpu0, t0 = cpu_s(pid), time.perf_counter()
            answers, n, size = asyncio.run(_hammer(ss.http_port, bodies, seconds, concurrency))
            wall = time.perf_counter() - t0
            total_sent += size
            out[name] = {"requests": n, "requests_per_s": round(n / wall), "bytes_sent": size, "answers": answers,
                         "door_cpu_s": round(cpu_s(pid) - cpu0, 1)}
        client = DeviceClient(f"http://127.0.0.1:{ss.http_port}", concurrency=16, attempts=3)
        try:
            wall, _ = _post_timed(client, [list(_split(b)) for b in genuine])
        finally:
            client.close()
        written, _ = _records(ss, ss.device_topic)
        letters, letter_bytes = _records(ss, ss.dead_letter_topic)
    finally:
        shuffler.stop()
    out.update({"genuine_requests": len(genuine), "device_topic_records": written,
                "device_topic_records_not_genuine": written - 2 * len(genuine),
                "dead_letters": letters, "dead_letter_bytes": letter_bytes, "bytes_sent_by_floods": total_sent,
                "log_bytes": shuffler.log.stat().st_size, "tracebacks": shuffler.log.read_text().count("Traceback"),
                "door_summary": next((ln for ln in shuffler.log.read_text().splitlines()
                                      if ln.startswith("front door: ") and "accepted" in ln), "")})
    return out


def _split(body: bytes) -> list[bytes]:
    from schemas.device_http import FRAMED as _F
    from schemas.device_http import split_body

    got = split_body(_F, body)
    if isinstance(got, tuple):
        raise ValueError(got)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="h1,h2")
    parser.add_argument("--devices", type=int, default=20_000, help="requests (devices) per scenario, at most")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--flood-s", type=float, default=10.0, help="seconds of each flood")
    parser.add_argument("--verify-stations", type=int, default=500, help="the verify scenario's day (h1's: 500)")
    parser.add_argument("--slow", type=int, default=20_000, help="slowloris connections")
    parser.add_argument("--slow-procs", type=int, default=4, help="processes holding them (a process's fd limit)")
    parser.add_argument("--fresh", type=int, default=40, help="fresh devices under the slow connections")
    parser.add_argument("--load-procs", type=int, default=0, help="CPU-spinning processes beside the slow scenarios")
    parser.add_argument("--data-dir", type=Path, default=cache_dir("bench"),
                        help="where synthetic days and their parse cache are kept between runs")
    args = parser.parse_args()
    stop_children_on_signals("bench_front_door")
    wanted = set(args.only.split(","))
    with tempfile.TemporaryDirectory() as tmp_name, LocalBroker(log_path=Path(tmp_name) / "broker.log") as broker:
        try:
            h1 = None
            for name, stations in (("h1", 500), ("h2", 3220)):
                if name in wanted:
                    line = run(name, broker, Path(tmp_name), stations, args.devices, args.concurrency, args.data_dir)
                    h1 = line if name == "h1" else h1
                    print(json.dumps(line), flush=True)
            if "verify" in wanted:
                print(json.dumps(verify_cost(broker, args.verify_stations, args.devices, args.data_dir, h1)),
                      flush=True)
            if "flood" in wanted:
                print(json.dumps(flood(broker, Path(tmp_name), args.flood_s, args.concurrency)), flush=True)
            for name in ("slow", "slow_nginx"):
                if name in wanted:
                    from tests.benchmarks.bench_door_slow import slow

                    print(json.dumps(slow(broker, Path(tmp_name), args.slow, args.slow_procs, args.fresh,
                                          nginx=name == "slow_nginx", load_procs=args.load_procs)), flush=True)
        finally:
            for s in _STARTED:
                s.stop()


if __name__ == "__main__":
    main()
