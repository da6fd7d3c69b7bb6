"""The worker's batching producer, for everything that is not a table's changelog.

Only the rare dead letters and ticks go through the worker's Faust producer. Stage records
(stage 1 -> stage 2) and estimates go through :class:`BatchSink`: its own aiokafka producer
that groups records per partition into large record batches, and returns only once the broker
acknowledged all of them. So do the window table's changelog writes, through a sink that sends
every record as its own batch (``one_per_batch``): the embedded broker's end offsets are
wrong, and changelog recovery is exact only that way (docs/operations.md).

Callers use the acknowledgements to order effects: stage 1 acknowledges its input only after
its stage records are acknowledged; stage 2 writes a closed window only after its estimates
are, and returns (so that Faust may commit its input offsets) only after its state writes are
-- so a crash anywhere re-sends (deduplicated by batch id, or identical estimates) rather than
loses anything. Faust's own ``Table.send_changelog`` is not used for that: it puts the write in
a buffer that Faust's commit "flushes" with a 0.1 s timeout per message, so under load offsets
were committed before the state they stand for was written, and a SIGKILL then lost counts.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from kafka.partitioner.default import murmur2

from schemas.connection import aiokafka_options, producer_options
from schemas.settings import KafkaSettings

__all__ = ["BatchSink"]


class BatchSink:
    """Batched, acknowledged sends to one topic; a record without a partition goes where
    Kafka's default partitioner (murmur2 of its key) puts it."""

    def __init__(self, settings: KafkaSettings, topic: str, batch_bytes: int = 1 << 20,
                 one_per_batch: bool = False) -> None:
        self._settings = settings
        self.topic = topic
        self._batch_bytes = batch_bytes
        self._one_per_batch = one_per_batch
        self._producer: AIOKafkaProducer | None = None
        self._partitions: list[int] = []
        self._partition_of: dict[bytes, int] = {}
        self._lock: asyncio.Lock | None = None
        self.sent = 0

    async def start(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._producer is None:
                await self._start()

    async def _start(self) -> None:
        producer = AIOKafkaProducer(acks="all", linger_ms=5, max_batch_size=self._batch_bytes,
                                    max_request_size=8 * self._batch_bytes, **aiokafka_options(self._settings),
                                    **producer_options(self._settings, self.topic))
        await producer.start()
        parts = await producer.partitions_for(self.topic)
        self._partitions = sorted(parts)
        self._producer = producer

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def partition_for(self, key: bytes) -> int:
        """Kafka's default partitioner (murmur2 of the key), cached per key: station ids repeat."""
        p = self._partition_of.get(key)
        if p is None:
            if not self._partitions:
                raise RuntimeError(f"BatchSink({self.topic}).partition_for before start()")
            p = self._partition_of[key] = self._partitions[(murmur2(key) & 0x7FFFFFFF) % len(self._partitions)]
        return p

    async def send(self, records: Sequence[tuple[bytes, bytes]],
                   partitions: Sequence[int | None] | None = None) -> list[asyncio.Future[Any]]:
        """Queue every record (key, value), to ``partitions[i]`` if given and not None; returns
        the futures of their batches (await them with :meth:`wait`)."""
        if not records:
            return []
        await self.start()
        producer = self._producer
        assert producer is not None  # noqa: S101 - started above
        by_part: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
        for i, (key, value) in enumerate(records):
            part = partitions[i] if partitions is not None else None
            by_part[self.partition_for(key) if part is None else part].append((key, value))
        pending: list[asyncio.Future[Any]] = []
        for part, recs in by_part.items():
            batch = producer.create_batch()
            for key, value in recs:
                if self._one_per_batch and batch.record_count():
                    pending.append(await self._submit(batch, part))
                    batch = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    pending.append(await self._submit(batch, part))
                    batch = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
            pending.append(await self._submit(batch, part))
        self.sent += len(records)
        return pending

    async def _submit(self, batch: Any, partition: int) -> asyncio.Future[Any]:
        # A closed batch is sent at once: an open one lingers ``linger_ms`` in the producer,
        # and the next batch for its partition waits for it -- 5 ms per partition per call.
        batch.close()
        assert self._producer is not None  # noqa: S101 - started by send()
        future: asyncio.Future[Any] = await self._producer.send_batch(batch, self.topic, partition=partition)
        return future

    @staticmethod
    async def wait(pending: Sequence[asyncio.Future[Any]]) -> None:
        """Until the broker acknowledged every batch (raises the first delivery error)."""
        if pending:
            await asyncio.gather(*pending)

    async def publish(self, records: Sequence[tuple[bytes, bytes]],
                      partitions: Sequence[int | None] | None = None) -> None:
        """Send every record and wait until the broker acknowledged all of them."""
        await self.wait(await self.send(records, partitions))
