"""The module of the producers that talks to Kafka: kafka-python, and librdkafka
(:mod:`producers.bulk`) for the many one-report records of :meth:`ReportSink.send_many`.

acks=all, idempotent producer, retries with back-off; every delivery failure is counted and
surfaced; a broker that cannot be reached is a clear error, not a stack trace.

What counts is what the broker acknowledged: the sink counts the records (and the reports
inside report records) whose acknowledgement came back, apart from what it handed to the
producer. A broker lost mid-run -- silent for ``broker_loss_timeout_s`` while records wait,
or its topics gone or recreated (a memory-only broker restarted) -- is
:class:`~schemas.kafka_io.BrokerLost` within that bound, not an endless retry.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, NoReturn, Protocol

from confluent_kafka import KafkaException
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.partitioner.default import murmur2

from schemas.connection import producer_options
from schemas.kafka_io import BrokerHealth, BrokerUnavailable, BrokerWatch, broker_lost, connect
from schemas.settings import KafkaSettings

from .bulk import BulkProducer

__all__ = ["DEFAULT_LOSS_TIMEOUT_S", "ReportSink"]

log = logging.getLogger(__name__)
DEFAULT_LOSS_TIMEOUT_S = 30.0  # settings without broker_loss_timeout_s (plain KafkaSettings)


class Stops(Protocol):
    @property
    def requested(self) -> bool: ...


class _Delivered(NamedTuple):
    """Where librdkafka wrote a record (what kafka-python's RecordMetadata says)."""

    topic: str
    partition: int
    offset: int


class ReportSink:
    """Sends records; counts what was sent, acknowledged and failed; knows the partitions.

    ``delivered``/``failed`` count every record (reports, markers, ground truth);
    ``acked_reports``/``acked_batches`` count the reports and report records (``send(...,
    reports=n)``) the broker acknowledged, ``sent_reports``/``sent_batches`` those handed to
    the producer. :meth:`flush` and :meth:`close` raise :class:`~schemas.kafka_io.BrokerLost`
    (and :attr:`lost` says why) once the broker is lost. ``other_topics``: topics besides
    ``topic`` that records will go to (watched from the start)."""

    def __init__(self, settings: KafkaSettings, topic: str, linger_ms: int = 20,
                 loss_timeout_s: float | None = None, other_topics: Iterable[str] = ()) -> None:
        self.topic = topic
        self._settings = settings
        timeout_s = loss_timeout_s if loss_timeout_s is not None else float(
            getattr(settings, "broker_loss_timeout_s", DEFAULT_LOSS_TIMEOUT_S))
        self.loss_timeout_s = timeout_s
        self._producer = connect(
            "producer", settings, KafkaProducer, acks="all", enable_idempotence=True,
            retry_backoff_ms=200, linger_ms=linger_ms, max_request_size=8 * 1024 * 1024,
            batch_size=1024 * 1024, **producer_options(settings, topic),
            # a send blocks (metadata, buffer space) at most as long as a lost broker is waited
            # for; records expire only after the loss would have been noticed
            max_block_ms=int(1000 * timeout_s),
            delivery_timeout_ms=max(120_000, int(1000 * timeout_s) + settings.request_timeout_ms + linger_ms),
        )
        parts = self._producer.partitions_for(topic)
        if not parts:
            raise BrokerUnavailable(f"topic {topic!r} has no partitions (create it first)")
        self.partitions = sorted(parts)
        self.delivered = 0
        self.failed = 0
        self.sent = 0
        self.acked_reports = 0
        self.acked_batches = 0
        self.sent_reports = 0
        self.sent_batches = 0
        self.failure_reasons: Counter[str] = Counter()
        self.acked_ends: dict[tuple[str, int], int] = {}  # (topic, partition) -> the newest acked offset + 1
        self.lost: str | None = None
        self._health = BrokerHealth(timeout_s, time.monotonic())
        self._topics: set[str] = {topic, *other_topics}
        self._watch = BrokerWatch(settings, self._topics, timeout_s)
        self._failed_since_ack = False
        self._last_watch = time.monotonic()
        self._watch_every_s = max(1.0, timeout_s / 3)
        self._check_topics(force=True)  # the topic ids to compare with later (a restart changes them)
        self._bulk: dict[str, BulkProducer] = {}  # send_many's producers, by topic
        self._delivery_timeout_ms = max(120_000, int(1000 * timeout_s) + settings.request_timeout_ms + linger_ms)

    def partition_for(self, key: bytes) -> int:
        """The default partitioner's choice, computed here so per-partition counts are known."""
        return int(self.partitions[(murmur2(key) & 0x7FFFFFFF) % len(self.partitions)])

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None, reports: int | None = None) -> None:
        """Hand one record to the producer; ``reports`` (a report record) is how many reports it holds."""
        if self.lost is not None:
            raise broker_lost(self._settings, self.lost)
        if self.sent == self.delivered + self.failed:  # nothing in flight: a new wait starts now
            self._health.waiting(time.monotonic())
        name = topic or self.topic
        self._topics.add(name)
        try:
            future = self._producer.send(name, value=value, key=key, partition=partition, headers=list(headers))
        except KafkaTimeoutError as exc:  # no metadata or buffer space within the loss timeout
            self._declare(f"the producer waited {self.loss_timeout_s:g}s for the broker ({exc})")
        self.sent += 1
        if reports is not None:
            self.sent_reports += reports
            self.sent_batches += 1
        future.add_callback(self._ok, reports)
        future.add_errback(self._failed)

    def send_many(self, values: Sequence[bytes], keys: bytes = b"", key_size: int = 0,
                  headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None,
                  stop: Stops | None = None, partitions: Sequence[int] | None = None) -> int:
        """Hand many one-report records over at once (the device reports of ``--via-shuffler``):
        ``values[j]`` under the key ``keys[j * key_size:(j + 1) * key_size]`` (none: ``key_size``
        0), through an idempotent librdkafka producer (:mod:`producers.bulk`; ~2.5 CPU-µs a
        record without key or header against kafka-python's ~55), counted and acknowledged like
        :meth:`send` with ``reports=1`` each; ``partitions[j]``, when given, is ``values[j]``'s
        partition (else librdkafka's partitioner). Stops early once ``stop.requested``; returns
        how many were handed over."""
        if self.lost is not None:
            raise broker_lost(self._settings, self.lost)
        name = topic or self.topic
        self._topics.add(name)
        bulk = self._bulk.get(name)
        if bulk is None:
            bulk = self._bulk[name] = BulkProducer(self._settings, name, self._bulk_delivered,
                                                   delivery_timeout_ms=self._delivery_timeout_ms)
        if self.sent == self.delivered + self.failed:  # nothing in flight: a new wait starts now
            self._health.waiting(time.monotonic())

        def full() -> None:  # the local queue is full: a broker silent for the loss timeout is lost
            verdict = self._health.silent(time.monotonic(), "records wait for an acknowledgement")
            if verdict is not None:
                self._declare(verdict)

        n = 0
        hdrs: list[tuple[str, str | bytes | None]] = list(headers)
        try:
            n = bulk.produce(values, keys, key_size, hdrs, lambda: stop is not None and stop.requested, full,
                             partitions)
        except KafkaException as exc:  # a fatal producer error (e.g. its idempotence state is gone)
            self._declare(f"the device producer failed: {exc}")
        finally:
            self.sent += n
            self.sent_reports += n
            self.sent_batches += n
        return n

    def _bulk_delivered(self, err: Any, topic: str, partition: int, offset: int, records: int = 1
                        ) -> None:  # in this thread: ``records`` acknowledged on a partition, its highest offset
        if err is not None:
            self._failed(KafkaException(err))
            return
        self.delivered += records - 1  # _ok counts one
        self.acked_reports += records - 1
        self.acked_batches += records - 1
        self._ok(1, _Delivered(topic, partition, offset))

    def _ok(self, reports: int | None, meta: Any) -> None:  # the producer's I/O thread
        self.delivered += 1
        where = (meta.topic, meta.partition)
        self.acked_ends[where] = max(self.acked_ends.get(where, 0), meta.offset + 1)
        if reports is not None:
            self.acked_reports += reports
            self.acked_batches += 1
        self._failed_since_ack = False
        self._health.waiting(time.monotonic())

    def _failed(self, exc: BaseException) -> None:  # the producer's I/O thread
        self.failed += 1
        self.failure_reasons[type(exc).__name__] += 1
        self._failed_since_ack = True
        # one line per failed record is not for a terminal: the summary counts them (--verbose shows them)
        log.debug("delivery failed: %s", exc)

    def _declare(self, reason: str) -> NoReturn:
        self.lost = self.lost or reason
        raise broker_lost(self._settings, self.lost)

    def _check_topics(self, force: bool = False) -> None:
        """Ask the broker whether the topics in use still exist, unchanged: at most every few
        seconds, at once if records failed since the last acknowledgement, or if ``force``. A
        topic it showed and now does not is asked about again until that is confirmed (gone)
        or contradicted, at most :attr:`~schemas.kafka_io.BrokerHealth.confirm_s` (one answer
        is not a verdict). A broker that does not answer is judged by the acknowledgements
        (:meth:`flush`)."""
        now = time.monotonic()
        if not (force or self._failed_since_ack or now - self._last_watch >= self._watch_every_s):
            return
        self._watch.topics = sorted(self._topics)
        while True:
            self._last_watch = time.monotonic()
            try:
                ids = self._watch.topic_ids()
            except (KafkaError, OSError, BrokerUnavailable):
                return
            verdict = self._health.seen(ids, time.monotonic())
            if verdict is not None:
                self._declare(verdict)
            if not self._health.pending:
                return
            time.sleep(self._health.confirm_s / 4)  # ends: confirmed or contradicted within confirm_s

    def flush(self, timeout_s: float | None = None) -> None:
        """Until every record sent is acknowledged or failed. :class:`~schemas.kafka_io.BrokerLost`
        when nothing was acknowledged for the loss timeout while records waited, or a topic in
        use is gone or was recreated."""
        if self.lost is not None:
            raise broker_lost(self._settings, self.lost)
        step = min(1.0, self.loss_timeout_s / 4)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for bulk in self._bulk.values():
            while bulk.flush(step):
                verdict = self._health.silent(time.monotonic(), "records wait for an acknowledgement")
                if verdict is not None:
                    self._declare(verdict)
                if deadline is not None and time.monotonic() > deadline:
                    raise BrokerUnavailable(f"flush did not finish within {timeout_s:g}s") from None
        while True:
            try:
                self._producer.flush(timeout=step)
                break
            except KafkaTimeoutError:
                verdict = self._health.silent(time.monotonic(), "records wait for an acknowledgement")
                if verdict is not None:
                    self._declare(verdict)
                if deadline is not None and time.monotonic() > deadline:
                    raise BrokerUnavailable(f"flush did not finish within {timeout_s:g}s") from None
            except KafkaError as exc:
                raise BrokerUnavailable(f"flush failed: {exc}") from exc
        self._check_topics()

    def close(self) -> None:
        """Flush (bounded as :meth:`flush`), check once more that the topics survived, close.
        Once the broker is lost, closes at once: what was not acknowledged fails (counted)."""
        try:
            if self.lost is None:
                self.flush()
                self._check_topics(force=True)
        finally:
            try:
                if self.lost is not None:
                    for bulk in self._bulk.values():  # fail what waits (counted)
                        bulk.abandon()
                    sender = getattr(self._producer, "_sender", None)  # kafka-python: fail what is pending
                    if sender is not None:
                        sender.force_close()
                with contextlib.suppress(KafkaError):
                    self._producer.close(timeout=2 if self.lost is not None else 10)
            finally:
                self._watch.close()
