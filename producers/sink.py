"""The only module of the producers that talks to Kafka (kafka-python).

acks=all, idempotent producer, retries with back-off; every delivery failure is counted and
surfaced; a broker that cannot be reached is a clear error, not a stack trace.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.partitioner.default import murmur2

from schemas.kafka_io import BrokerUnavailable, connect
from schemas.settings import KafkaSettings

__all__ = ["ReportSink"]

log = logging.getLogger(__name__)


class ReportSink:
    """Sends records, counts deliveries and failures, knows the partitions."""

    def __init__(self, settings: KafkaSettings, topic: str, linger_ms: int = 20) -> None:
        self.topic = topic
        self._producer = connect(
            "producer", settings, KafkaProducer, acks="all", enable_idempotence=True,
            retry_backoff_ms=200, linger_ms=linger_ms, max_request_size=8 * 1024 * 1024,
            batch_size=1024 * 1024, delivery_timeout_ms=120_000,
        )
        parts = self._producer.partitions_for(topic)
        if not parts:
            raise BrokerUnavailable(f"topic {topic!r} has no partitions (create it first)")
        self.partitions = sorted(parts)
        self.delivered = 0
        self.failed = 0
        self.failure_reasons: Counter[str] = Counter()

    def partition_for(self, key: bytes) -> int:
        """The default partitioner's choice, computed here so per-partition counts are known."""
        return int(self.partitions[(murmur2(key) & 0x7FFFFFFF) % len(self.partitions)])

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None) -> None:
        future = self._producer.send(topic or self.topic, value=value, key=key, partition=partition,
                                     headers=list(headers))
        future.add_callback(self._ok)
        future.add_errback(self._failed)

    def _ok(self, _: Any) -> None:
        self.delivered += 1

    def _failed(self, exc: BaseException) -> None:
        self.failed += 1
        self.failure_reasons[type(exc).__name__] += 1
        log.error("delivery failed: %s", exc)

    def flush(self, timeout_s: float = 120.0) -> None:
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise BrokerUnavailable(f"flush failed: {exc}") from exc

    def close(self) -> None:
        try:
            self._producer.flush(timeout=30)
        finally:
            self._producer.close(timeout=10)
