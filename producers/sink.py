"""The only module of the producers that talks to Kafka (kafka-python).

acks=all, idempotent producer, retries with back-off; every delivery failure is counted and
surfaced; a broker that cannot be reached is a clear error, not a stack trace.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.partitioner.default import murmur2

from schemas import Query

from .settings import KafkaSettings

__all__ = ["BrokerUnavailable", "QueryReader", "ReportSink", "connect", "ensure_topics", "publish_query",
           "read_queries"]

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The Kafka broker could not be reached (or kept failing) after retries."""


def connect(what: str, settings: KafkaSettings, factory: Any, **kw: Any) -> Any:
    """Create a client, retrying with exponential back-off; :class:`BrokerUnavailable` at the end."""
    delay = 0.5
    attempts = settings.connect_attempts
    for attempt in range(1, attempts + 1):
        try:
            return factory(**settings.client_kwargs(), **kw)
        except KafkaError as exc:
            if attempt == attempts:
                raise BrokerUnavailable(
                    f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({what}, {attempts} attempts): "
                    f"{exc}. Is it running? Set PTT_BOOTSTRAP_SERVERS or --bootstrap-servers."
                ) from exc
            log.warning("broker not reachable (%s), retrying in %.1fs", what, delay)
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
    raise AssertionError("unreachable")


def ensure_topics(settings: KafkaSettings, partitions: dict[str, int] | None = None,
                  compacted: set[str] | None = None) -> None:
    """Create topics with explicit partition counts if they do not exist; ``compacted`` ones
    (default: the queries topic) get ``cleanup.policy=compact``."""
    wanted = partitions or {settings.reports_topic: settings.partitions, settings.queries_topic: 1,
                            settings.truth_topic: 1}
    compact = compacted if compacted is not None else {settings.queries_topic}
    admin = connect("admin", settings, KafkaAdminClient)
    try:
        existing = set(admin.list_topics())
        new = [NewTopic(name, num_partitions=n, replication_factor=1,
                        topic_configs={"cleanup.policy": "compact"} if name in compact else {})
               for name, n in wanted.items() if name not in existing]
        if new:
            try:
                admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


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


def publish_query(settings: KafkaSettings, query: Query) -> None:
    """Publish one version of a query on the compacted queries topic (acks=all)."""
    ensure_topics(settings)
    producer = connect("producer", settings, KafkaProducer, acks="all")
    try:
        producer.send(settings.queries_topic, key=query.record_key.encode(),
                      value=query.model_dump_json().encode()).get(timeout=30)
    finally:
        producer.close(timeout=10)


class QueryReader:
    """Follows the queries topic from its beginning; keeps every valid version."""

    def __init__(self, settings: KafkaSettings) -> None:
        self._consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                                  consumer_timeout_ms=1000)
        parts = self._consumer.partitions_for_topic(settings.queries_topic) or set()
        self._consumer.assign([TopicPartition(settings.queries_topic, p) for p in sorted(parts)])
        self._consumer.seek_to_beginning()
        self.queries: dict[tuple[str, int], Query] = {}
        self.invalid = 0

    def poll(self, timeout_ms: int = 0) -> int:
        """Read what is new; returns how many records were read."""
        n = 0
        for records in self._consumer.poll(timeout_ms=timeout_ms, max_records=10_000).values():
            for rec in records:
                n += 1
                try:
                    q = Query.model_validate_json(rec.value)
                except ValueError as exc:
                    self.invalid += 1
                    log.warning("ignoring an invalid query record at offset %s: %s", rec.offset, exc)
                    continue
                self.queries[(q.query_id, q.version)] = q
        return n

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Poll until every partition's position has reached its high-water mark as reported
        with fetched data (the broker's ListOffsets end offsets are wrong here, BROKER.md)."""
        deadline = time.time() + timeout_s
        parts = self._consumer.assignment()
        while time.time() < deadline:
            self.poll(200)
            marks = {tp: self._consumer.highwater(tp) for tp in parts}
            if all(m is not None and self._consumer.position(tp) >= m for tp, m in marks.items()):
                return
        raise BrokerUnavailable(f"could not read the queries topic to its end within {timeout_s}s")

    def close(self) -> None:
        self._consumer.close()


def read_queries(settings: KafkaSettings) -> list[Query]:
    """Every version of every query on the topic, sorted by (query id, version)."""
    ensure_topics(settings)
    reader = QueryReader(settings)
    try:
        reader.catch_up()
        return [reader.queries[k] for k in sorted(reader.queries)]
    finally:
        reader.close()
