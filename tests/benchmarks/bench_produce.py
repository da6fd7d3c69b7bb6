"""Benchmark: how fast one process can hand binary device reports (42 bytes: 22 of report and
the 20-byte authentication trailer, sealed by enrolled devices as the replay does; a fresh
16-byte key each) to the embedded broker, by client. One JSON line per client: records/s (wall, until
every record is acknowledged) and the client process's CPU microseconds per record.

* ``kafka-python`` -- ``KafkaProducer.send`` per record (acks=all, idempotent, linger 20 ms,
  1 MiB batches: the replay's producer settings), with and without a callback per record;
* ``sink`` -- the replay's :class:`producers.sink.ReportSink` (kafka-python plus delivery
  accounting and broker-loss watch);
* ``sink.send_many`` -- the same sink's bulk path for device reports (:mod:`producers.bulk`:
  librdkafka through confluent-kafka, idempotent, acks=all, a delivery callback per record);
* ``aiokafka-batch`` -- aiokafka's ``create_batch``/``send_batch``: records appended to a
  batch the client sends whole (no future per record); not idempotent (aiokafka's
  InitProducerId fails on the embedded broker).

Run: ``python tests/benchmarks/bench_produce.py [--records 200000]``
"""
from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from typing import Any

import numpy as np
from aiokafka import AIOKafkaProducer
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from producers.sink import ReportSink
from schemas.device_binary import encode_device_values
from schemas.enrollment import Enrollment
from schemas.settings import KafkaSettings
from stream_app.cli.local_broker import LocalBroker

PARTITIONS = 4
_ENROLLMENT = Enrollment(secrets.token_bytes(32), 262_144)


def _records(n: int) -> tuple[list[bytes], bytes]:
    devices = np.arange(n) % 262_144
    messages = encode_device_values("sp-day", 1, 59_832_000, 0, np.arange(n) % 500, devices)
    return _ENROLLMENT.seal_messages(messages, devices.tolist()), secrets.token_bytes(16 * n)


def _kafka_python(bootstrap: str, topic: str, n: int, callback: bool) -> dict[str, Any]:
    values, keys = _records(n)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=20,
                      batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    acked = [0]

    def ok(_: Any) -> None:
        acked[0] += 1

    t0, c0 = time.monotonic(), time.process_time()
    for j, v in enumerate(values):
        f = p.send(topic, value=v, key=keys[16 * j:16 * j + 16])
        if callback:
            f.add_callback(ok)
    p.flush()
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    p.close()
    return {"client": "kafka-python" + (" +callback" if callback else ""), "records": n,
            "records_per_s": round(n / wall), "cpu_us_per_record": round(1e6 * cpu / n, 1)}


def _sink_many(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    values, keys = _records(n)
    sink = ReportSink(KafkaSettings(bootstrap_servers=bootstrap), topic)
    t0, c0 = time.monotonic(), time.process_time()
    sink.send_many(values, keys, 16, headers=[("ptt-kind", b"device_report")])
    sink.flush()
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    assert sink.acked_reports == n, (sink.acked_reports, n)
    sink.close()
    return {"client": "sink.send_many (librdkafka, idempotent)", "records": n, "records_per_s": round(n / wall),
            "cpu_us_per_record": round(1e6 * cpu / n, 1)}


def _sink(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    values, keys = _records(n)
    sink = ReportSink(KafkaSettings(bootstrap_servers=bootstrap), topic)
    hdr = [("ptt-kind", b"device_report")]
    t0, c0 = time.monotonic(), time.process_time()
    for j, v in enumerate(values):
        sink.send(v, key=keys[16 * j:16 * j + 16], headers=hdr, reports=1)
    sink.flush()
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    sink.close()
    return {"client": "sink", "records": n, "records_per_s": round(n / wall),
            "cpu_us_per_record": round(1e6 * cpu / n, 1)}


async def _aiokafka(bootstrap: str, topic: str, n: int) -> dict[str, Any]:
    values, keys = _records(n)
    # aiokafka's InitProducerId fails on the embedded broker (UnknownError): not idempotent here
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=20,
                         max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    await p.start()
    t0, c0 = time.monotonic(), time.process_time()
    futures = []
    batches: dict[int, Any] = {}
    rng = np.random.default_rng()
    parts = rng.integers(0, PARTITIONS, n).tolist()
    for j, v in enumerate(values):
        part = parts[j]
        b = batches.get(part)
        if b is None:
            b = batches[part] = p.create_batch()
        if b.append(key=keys[16 * j:16 * j + 16], value=v, timestamp=None) is None:
            b.close()
            futures.append(await p.send_batch(b, topic, partition=part))
            b = batches[part] = p.create_batch()
            b.append(key=keys[16 * j:16 * j + 16], value=v, timestamp=None)
    for part, b in batches.items():
        b.close()
        futures.append(await p.send_batch(b, topic, partition=part))
    await asyncio.gather(*futures)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    await p.stop()
    return {"client": "aiokafka-batch", "records": n, "records_per_s": round(n / wall),
            "cpu_us_per_record": round(1e6 * cpu / n, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    with LocalBroker() as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        names = ["t-kp", "t-kpc", "t-sink", "t-many", "t-aio"]
        admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in names])
        admin.close()
        print(json.dumps(_kafka_python(broker.bootstrap, "t-kp", args.records, False)), flush=True)
        print(json.dumps(_kafka_python(broker.bootstrap, "t-kpc", args.records, True)), flush=True)
        print(json.dumps(_sink(broker.bootstrap, "t-sink", args.records)), flush=True)
        print(json.dumps(_sink_many(broker.bootstrap, "t-many", args.records)), flush=True)
        print(json.dumps(asyncio.run(_aiokafka(broker.bootstrap, "t-aio", args.records))), flush=True)


if __name__ == "__main__":
    main()
