"""Reading topics back in tests (kafka-python, real broker)."""

from __future__ import annotations

import subprocess
import time
from collections import defaultdict
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from schemas import DecodedBatch, EndOfEpoch, EndOfEpochSet, GroundTruth, SingleReport, decode_record
from schemas.kafka_io import at_end
from schemas.settings import KafkaSettings


def drain(settings: KafkaSettings, topic: str, quiet_polls: int = 3, timeout_s: float = 60.0) -> list[Any]:
    """Every record of ``topic``, read from the beginning up to the high-water mark the broker
    returns with fetched data (:func:`schemas.kafka_io.at_end`; its ``end_offsets()`` are wrong,
    BROKER.md) -- or, should that mark not be reached (records of a transaction still open),
    until ``quiet_polls`` polls in a row bring nothing. A test waits for what it expects with
    :func:`~tests.integration.stream_helpers.wait_for`; this only reads what is there."""
    consumer = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                             max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        consumer.seek_to_beginning()
        out: list[Any] = []
        quiet = 0
        deadline = time.time() + timeout_s
        while quiet < quiet_polls and time.time() < deadline:
            got = consumer.poll(timeout_ms=300, max_records=50_000)
            n = sum(len(v) for v in got.values())
            for records in got.values():
                out.extend(records)
            if at_end(consumer):
                break
            quiet = quiet + 1 if n == 0 else 0
        return out
    finally:
        consumer.close()


class Decoded:
    """The reports topic, decoded and grouped."""

    def __init__(self, records: list[Any]) -> None:
        self.batches: dict[tuple[str, int, int, int], list[tuple[int, DecodedBatch]]] = defaultdict(list)
        self.markers: dict[tuple[str, int, int, int], list[EndOfEpoch]] = defaultdict(list)
        self.other: list[SingleReport | GroundTruth] = []
        self.keys: list[bytes | None] = []
        for rec in records:
            item = decode_record(rec.value)
            if isinstance(item, DecodedBatch):
                h = item.header
                self.batches[(h.query_id, h.query_version, h.epoch, h.round)].append((rec.partition, item))
                self.keys.append(rec.key)
            elif isinstance(item, EndOfEpoch | EndOfEpochSet):  # the replay sends sets
                for m in item.markers if isinstance(item, EndOfEpochSet) else (item,):
                    assert m.partition == rec.partition, (m, rec.partition)
                    self.markers[(m.query_id, m.query_version, m.epoch, m.round)].append(m)
            else:
                self.other.append(item)


def wait_for_marker(s: KafkaSettings, topic: str, proc: subprocess.Popen[str], timeout_s: float = 90.0,
                    producers: int = 1) -> None:
    """Until end-of-epoch markers of ``producers`` distinct producer processes are on ``topic``
    (a replay in ``proc`` is under way, and that many of its producers are in their loop: a
    producer of a multi-process replay may still be starting after another's first epoch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            markers = Decoded(drain(s, topic, quiet_polls=1, timeout_s=5)).markers.values()
        except Exception:  # noqa: BLE001, S112 - the topic may not exist yet
            continue
        if len({m.producer_index for ms in markers for m in ms}) >= producers:
            return
    raise AssertionError(f"no end-of-epoch markers of {producers} producer(s) within {timeout_s}s")
