"""Pieces the benchmarks share: the raw-broker baseline for the same bytes."""

from __future__ import annotations

import os
import time

from producers.sink import ReportSink
from schemas.kafka_io import ensure_topics
from schemas.settings import KafkaSettings


def raw_produce(settings: KafkaSettings, topic: str, sizes: list[int], partitions: int = 4,
                consume: bool = False) -> float:
    """Seconds to produce records of exactly ``sizes`` bytes (random content) with the
    producers' settings (acks=all, idempotent), and optionally to consume them all back."""
    ensure_topics(settings, {topic: partitions})
    sink = ReportSink(settings, topic)
    payloads = [os.urandom(n) for n in sizes]
    t0 = time.perf_counter()
    for i, value in enumerate(payloads):
        key = f"{i:032x}".encode()
        sink.send(value, key=key, partition=sink.partition_for(key))
    sink.flush()
    if consume:
        consume_all(settings, topic, len(payloads))
    elapsed = time.perf_counter() - t0
    sink.close()
    return elapsed


def consume_all(settings: KafkaSettings, topic: str, n: int) -> None:
    """Consume ``topic`` from the beginning until ``n`` records have arrived."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                      max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
    try:
        c.assign([TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or set())])
        c.seek_to_beginning()
        got = 0
        while got < n:
            got += sum(len(v) for v in c.poll(timeout_ms=100, max_records=100_000).values())
    finally:
        c.close()
