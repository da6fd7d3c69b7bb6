"""The one thin Kafka layer that producers, the stream app and the CLI share (kafka-python).

Connection settings (:class:`KafkaSettings`, secrets as ``SecretStr``), connecting with a
bounded retry (:func:`connect`), topic creation with explicit partition counts
(:func:`ensure_topics`), publishing and following queries (:func:`publish_query`,
:class:`QueryReader`) and reading a topic to its end (:func:`read_to_end`). The end is the
high-water mark returned with fetched data: the embedded broker's ListOffsets end offsets
are wrong (see the README's broker notes), so nothing here uses ``end_offsets()``.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from .query import Query
from .settings import KafkaSettings

__all__ = ["BrokerUnavailable", "KafkaSettings", "QueryReader", "assign_all", "at_end", "connect", "ensure_topics",
           "probe", "publish_query", "read_queries", "read_to_end"]

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The Kafka broker could not be reached (or kept failing) after retries."""


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"bad broker address {address!r}: expected host:port; fix --bootstrap-servers "
                         "or PTT_BOOTSTRAP_SERVERS")
    return host.strip("[]"), int(port)


def probe(bootstrap_servers: str, timeout_s: float = 3.0) -> str | None:
    """A plain TCP connect to every bootstrap address: None if one accepts, else why none did.

    Used before kafka-python is asked to connect, which retries a refused bootstrap for its
    whole ``bootstrap_timeout_ms`` per attempt. A timeout (a filtering firewall, a slow
    network) is not a verdict: the caller then lets the client try within its own bounds."""
    reasons: list[str] = []
    refused_everywhere = True
    for address in bootstrap_servers.split(","):
        host, port = _split_address(address)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port} refused the connection")
        except socket.gaierror:
            reasons.append(f"{host} is not a known host")
        except OSError as exc:  # timeout, unreachable network: inconclusive
            refused_everywhere = False
            reasons.append(f"{host}:{port} {exc.strerror or type(exc).__name__}")
    return "; ".join(reasons) if refused_everywhere else None


def connect(what: str, settings: KafkaSettings, factory: Any, **kw: Any) -> Any:
    """Create a client, retrying with exponential back-off; :class:`BrokerUnavailable` at the end.

    Fails at once, without retries, when every bootstrap address refuses a plain TCP connection
    (nothing listens there) or does not resolve."""
    hint = "is the broker running? Start one with `ptt broker`, or set --bootstrap-servers / PTT_BOOTSTRAP_SERVERS"
    why = probe(settings.bootstrap_servers, timeout_s=min(settings.bootstrap_timeout_ms / 1000, 3.0))
    if why is not None:
        raise BrokerUnavailable(f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}); {hint}")
    delay = 0.5
    attempts = settings.connect_attempts
    for attempt in range(1, attempts + 1):
        try:
            return factory(**settings.client_kwargs(), **kw)
        except KafkaError as exc:
            if attempt == attempts:
                raise BrokerUnavailable(
                    f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({what}, {attempts} attempts: "
                    f"{exc}); {hint}"
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
        self._topic = settings.queries_topic
        self._assign()
        self.queries: dict[tuple[str, int], Query] = {}
        self.invalid = 0

    def _assign(self) -> bool:
        """Assign the topic's partitions once the broker's metadata names them (it may not yet,
        right after a start): a reader with nothing assigned would think it is at the end."""
        if self._consumer.assignment():
            return True
        parts = self._consumer.partitions_for_topic(self._topic) or set()
        if not parts:
            return False
        self._consumer.assign([TopicPartition(self._topic, p) for p in sorted(parts)])
        self._consumer.seek_to_beginning()
        return True

    def poll(self, timeout_ms: int = 0) -> int:
        """Read what is new; returns how many records were read."""
        if not self._assign():
            return 0
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
        """Poll until every partition's position has reached its high-water mark."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if not self._assign():
                time.sleep(0.1)
                continue
            self.poll(200)
            if at_end(self._consumer):
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


def at_end(consumer: Any) -> bool:
    """Every assigned partition read up to the high-water mark reported with fetched data."""
    return all((m := consumer.highwater(tp)) is not None and consumer.position(tp) >= m
               for tp in consumer.assignment())


def assign_all(consumer: Any, topic: str, from_beginning: bool = True) -> list[Any]:
    """Assign every partition of ``topic`` (no consumer group); seek to the beginning."""
    parts = consumer.partitions_for_topic(topic) or set()
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    consumer.assign(tps)
    if from_beginning and tps:
        consumer.seek_to_beginning()
    return tps


def read_to_end(settings: KafkaSettings, topic: str, idle_timeout_s: float = 10.0,
                max_bytes: int = 64 * 1024 * 1024) -> Iterator[Any]:
    """Every record of ``topic`` from the beginning to its high-water mark (or until nothing
    arrives for ``idle_timeout_s``). :class:`BrokerUnavailable` if the broker cannot be
    reached; ``LookupError`` if the topic does not exist."""
    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       max_partition_fetch_bytes=min(max_bytes, 16 * 1024 * 1024), fetch_max_bytes=max_bytes)
    try:
        if not assign_all(consumer, topic):
            raise LookupError(f"topic {topic!r} does not exist on {settings.bootstrap_servers}")
        last_data = time.monotonic()
        while time.monotonic() - last_data < idle_timeout_s:
            got = consumer.poll(timeout_ms=300, max_records=50_000)
            for records in got.values():
                yield from records
            if any(got.values()):
                last_data = time.monotonic()
            if at_end(consumer):
                break
    finally:
        consumer.close()
