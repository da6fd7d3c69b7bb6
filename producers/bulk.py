"""Many small records at once: the replay's device reports (``--via-shuffler``) through
librdkafka (confluent-kafka), one record per report.

kafka-python's ``KafkaProducer.send`` costs ~55 CPU-µs a record in Python (a future, the
partitioner, the record-batch builder); librdkafka builds and sends the batches in C: ~6 CPU-µs
a record here, delivery callback included (``tests/benchmarks/bench_produce.py``). The
producer is idempotent with ``acks=all``, as the kafka-python sink's (a retried batch is not
written twice: a device report is counted once), and every delivery is reported to the owner's
callback -- the :class:`~producers.sink.ReportSink` that counts what the broker acknowledged.

Delivery callbacks run in the calling thread, inside :meth:`BulkProducer.produce`,
:meth:`BulkProducer.serve` and :meth:`BulkProducer.flush`. librdkafka's report of each record
only adds it to its partition's tally (one record costs ~1 µs there instead of ~10 through the
owner's bookkeeping); the owner hears the tallies once each poll is done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from schemas.connection import librdkafka_options
from schemas.settings import KafkaSettings

__all__ = ["BulkProducer", "Delivery"]

# (error or None, topic, partition, offset, records); the owner's bookkeeping: once per failed
# record, and once per partition for the records acknowledged since the last call (offset: the
# highest of them)
Delivery = Callable[[KafkaError | None, str, int, int, int], None]
_SERVE_EVERY = 20_000  # records between two polls for delivery reports (bounds the queue of reports)
log = logging.getLogger(__name__)


class BulkProducer:
    """An idempotent librdkafka producer for ``topic`` that reports each delivery to ``delivered``."""

    def __init__(self, settings: KafkaSettings, topic: str, delivered: Delivery, linger_ms: int = 20,
                 delivery_timeout_ms: int = 120_000) -> None:
        self.topic = topic
        self._delivered = delivered
        config: dict[str, Any] = {
            **librdkafka_options(settings, topic),
            "enable.idempotence": True, "acks": "all", "linger.ms": linger_ms,
            "batch.size": 1024 * 1024, "message.max.bytes": 8 * 1024 * 1024,
            "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1024 * 1024,
            "message.timeout.ms": delivery_timeout_ms,
            "partitioner": "murmur2_random",  # kafka-python's (and Java's) choice for a keyed record
            "log_level": 2,  # librdkafka's own lines (connection refused, ...): errors only, via logging
            "logger": log,
        }
        self._producer = Producer(config)
        self.pending = 0  # records handed over whose delivery report has not come back
        self._acked: dict[int, list[int]] = {}  # partition -> [records acknowledged, highest offset]

    def _report(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.pending -= 1
            self._delivered(err, msg.topic() or self.topic, msg.partition() or 0, msg.offset() or 0, 1)
            return
        tally = self._acked.get(msg.partition() or 0)
        offset = msg.offset() or 0
        if tally is None:
            self._acked[msg.partition() or 0] = [1, offset]
        else:
            tally[0] += 1
            if offset > tally[1]:
                tally[1] = offset

    def _poll(self, timeout_s: float) -> None:
        """librdkafka's delivery reports, then the tallies to the owner."""
        self._producer.poll(timeout_s)
        self._publish()

    def _publish(self) -> None:
        acked, self._acked = self._acked, {}
        for partition, (n, offset) in acked.items():
            self.pending -= n
            self._delivered(None, self.topic, partition, offset, n)

    def produce(self, values: Sequence[bytes], keys: bytes, key_size: int,
                headers: list[tuple[str, str | bytes | None]], stopped: Callable[[], bool],
                full: Callable[[], None], partitions: Sequence[int] | None = None) -> int:
        """Hand ``values[j]`` with key ``keys[j * key_size:(j + 1) * key_size]`` (none: ``key_size``
        0) over (on ``partitions[j]`` when given), in order, until ``stopped()``; returns how many
        were handed over. A full queue calls ``full()`` (which may raise, e.g. the broker is
        lost) between waits for deliveries. A record's key costs librdkafka ~0.65 CPU-µs and a
        header ~0.6 here, of ~2.5 a record."""
        produce, report, topic = self._producer.produce, self._report, self.topic
        hdrs = headers or None
        done = 0
        for j, value in enumerate(values):
            if j % _SERVE_EVERY == 0:
                if stopped():
                    break
                self._poll(0)
            key = keys[j * key_size:(j + 1) * key_size] if key_size else None
            while True:
                try:
                    if partitions is None:
                        produce(topic, value, key, on_delivery=report, headers=hdrs)
                    else:
                        produce(topic, value, key, partitions[j], on_delivery=report, headers=hdrs)
                    break
                except BufferError:  # the local queue is full: wait for deliveries
                    full()
                    self._poll(0.1)
            done += 1
            self.pending += 1
        return done

    def serve(self, timeout_s: float = 0.0) -> None:
        """Deliver the delivery reports that are in."""
        self._poll(timeout_s)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every delivery report; returns how many records still wait."""
        self._producer.flush(timeout_s)
        self._publish()
        return self.pending

    def abandon(self) -> None:
        """Fail what waits (the broker is lost): its delivery reports come back as failures."""
        try:
            self._producer.purge()
            self._producer.flush(0)
        except KafkaException as exc:
            log.debug("purging the device producer: %s", exc)
        self._publish()
