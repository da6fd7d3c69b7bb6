"""The shuffler's input: the device topic's partitions it owns and the source notes, read with
librdkafka (confluent-kafka) in ``read_committed`` mode.

kafka-python parses every record of a fetch in Python: ~19 CPU-µs a record here, the largest
part of the shuffler's time at the papers' fleet (136,161 devices, one record per device per
round). librdkafka parses in C: ~1.3 CPU-µs a record (the same records, one run,
``tests/benchmarks/bench_shuffler.py`` measures the whole path). The transactions stay
kafka-python's (:mod:`.runtime`): the input offsets they commit are this reader's positions,
under the consumer group the reader only *reads* committed offsets from (it never joins the
group and never commits).

A position is the offset of the next record to read: where the reader was assigned or sought,
past every record it returned, and past the control records a transaction leaves
(librdkafka's own position, once it has one). A record below it is never returned again (one a
paused partition's fetch had queued may come again once resumed).

The partitions are fetched a little at a time (``fetch.max.bytes`` 1 MiB, 256 KiB a partition):
a broker that fills a fetch from the first partition it names up to ``fetch.max.bytes`` (Tansu
does; Kafka rotates them) otherwise has the whole backlog of one partition read before the next
(measured: 1.5 of 1.5 million records from partition 0 of four at 64 MiB; a quarter each at
1 MiB, and faster). The runtime pauses a partition that runs ahead all the same (:meth:`Intake.pause_only`).

Two waits removed (``tests/benchmarks/bench_shuffler.py --only day10 --epochs-day 240``, a
backlog of 2.2 M records left when the replay ended): librdkafka postpones the fetch of a
partition whose local queue is full by ``fetch.queue.backoff.ms`` (1 s by default), and a
pause drops that queue -- the resumed partition then gave nothing for up to a second while the
broker held its backlog (79 empty polls, 16 s of the 70 s drain; one with 20 ms); and the ends
(:meth:`Intake.end_offsets`, the end-of-input check) asked on the reader's own connection waited
behind the fetch the broker holds up to ``fetch.wait.max.ms`` (Tansu: ~0.5 s a partition, 1.8 s
for four at the end of every run; ~3 ms on a connection of their own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as CkPartition
from kafka import TopicPartition
from kafka.errors import KafkaError as PyKafkaError

from schemas.connection import librdkafka_options
from schemas.settings import KafkaSettings

__all__ = ["Intake", "Polled", "Rec"]

log = logging.getLogger(__name__)
#: ms before a partition whose local queue is full is considered for a fetch again (librdkafka: 1000)
FETCH_QUEUE_BACKOFF_MS = 20


class Rec(NamedTuple):
    """One input record, as the shuffler needs it (a dead letter names topic, partition, offset)."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


class Polled:
    """One partition's records of a poll, as two columns (``offsets``, ``values``, in offset
    order): a :class:`Rec` is built only where one is asked for (``polled[i]``: a dead letter),
    not for every record read (~0.5 µs a record, a fifth of the reader's Python time).

    >>> p = Polled("t", 3)
    >>> p.offsets += [7, 8]; p.values += [b"a", None]
    >>> len(p), p[1], [r.offset for r in p]
    (2, Rec(topic='t', partition=3, offset=8, value=None), [7, 8])
    """

    __slots__ = ("offsets", "partition", "topic", "values")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.offsets: list[int] = []
        self.values: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> Rec:
        return Rec(self.topic, self.partition, self.offsets[i], self.values[i])

    def __iter__(self) -> Iterator[Rec]:
        return (self[i] for i in range(len(self.offsets)))


class IntakeError(PyKafkaError):  # type: ignore[misc]
    """librdkafka reported a fatal consumer error (the runtime handles it as a Kafka error)."""


class Intake:
    """A librdkafka consumer of assigned partitions; ``group_id``: whose committed offsets it reads."""

    def __init__(self, settings: KafkaSettings, group_id: str, fetch_max_bytes: int = 1024 * 1024) -> None:
        base = {**librdkafka_options(settings), "group.id": group_id, "enable.auto.commit": False,
                "enable.auto.offset.store": False, "log_level": 2, "logger": log}
        self._consumer = Consumer({
            **base, "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "fetch.max.bytes": fetch_max_bytes, "max.partition.fetch.bytes": max(fetch_max_bytes // 4, 64 * 1024),
            "receive.message.max.bytes": max(fetch_max_bytes, 64 * 1024 * 1024) + 1024 * 1024,  # batches come whole
            "queued.max.messages.kbytes": 64 * 1024,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,  # not 1 s (module docstring)
        })
        self._ends = Consumer(base)  # end_offsets: on a connection of its own, never behind a held fetch
        self._pos: dict[tuple[str, int], int] = {}
        self._skip: dict[tuple[str, int], int] = {}  # read elsewhere up to this offset: not returned again
        self._paused: set[tuple[str, int]] = set()

    def partitions_for_topic(self, topic: str, timeout_s: float = 10.0) -> set[int]:
        meta = self._consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return set()
        return set(meta.partitions)

    def committed(self, tp: TopicPartition, timeout_s: float = 30.0) -> int | None:
        """The group's committed offset of ``tp`` (None: none)."""
        got = self._consumer.committed([CkPartition(tp.topic, tp.partition)], timeout=timeout_s)
        off = got[0].offset if got else -1
        return off if off >= 0 else None

    def assign(self, offsets: dict[TopicPartition, int]) -> None:
        """Read these partitions from these offsets (every earlier assignment replaced)."""
        self._consumer.assign([CkPartition(tp.topic, tp.partition, o if o >= 0 else OFFSET_BEGINNING)
                               for tp, o in offsets.items()])
        self._pos = {(tp.topic, tp.partition): max(o, 0) for tp, o in offsets.items()}
        self._skip = {}
        self._paused = set()

    def pause_only(self, tps: Iterable[TopicPartition]) -> None:
        """Fetch nothing of these partitions until a later call leaves them out; fetch every
        other one (what a paused partition had queued is fetched again: never returned twice)."""
        want = {(tp.topic, tp.partition) for tp in tps}
        pause, resume = want - self._paused, self._paused - want
        if pause:
            self._consumer.pause([CkPartition(t, p) for t, p in sorted(pause)])
        if resume:
            self._consumer.resume([CkPartition(t, p) for t, p in sorted(resume)])
        self._paused = want

    def paused(self) -> int:
        """How many partitions are paused now."""
        return len(self._paused)

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        """Records of ``tp`` below ``offset`` were read elsewhere: never returned; the position moves there."""
        k = (tp.topic, tp.partition)
        self._skip[k] = max(self._skip.get(k, 0), offset)
        self._pos[k] = max(self._pos.get(k, 0), offset)

    def poll(self, timeout_s: float, max_records: int) -> dict[TopicPartition, Polled]:
        """Up to ``max_records`` records, per partition in offset order."""
        got = self._consumer.consume(max_records, timeout_s)
        cols: dict[tuple[str, int], tuple[int, Polled]] = {}  # per partition: the first offset not returned yet
        for m in got:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal() or not err.retriable():
                    raise IntakeError(f"librdkafka consumer: {err.str()}")
                log.debug("librdkafka consumer: %s", err.str())
                continue
            k = (m.topic() or "", m.partition() or 0)
            col = cols.get(k)
            if col is None:
                col = cols[k] = (max(self._skip.get(k, -1), self._pos.get(k, -1)), Polled(*k))
            off = m.offset() or 0
            if off >= col[0]:  # else read elsewhere, or returned already
                col[1].offsets.append(off)
                col[1].values.append(m.value())
        out: dict[TopicPartition, Polled] = {}
        for k, (_, polled) in cols.items():
            if polled.offsets:
                self._pos[k] = max(self._pos.get(k, 0), polled.offsets[-1] + 1)
                out[TopicPartition(*k)] = polled
        return out

    def position(self, tp: TopicPartition) -> int:
        """The next offset to read of ``tp`` (past control records once librdkafka knows it)."""
        k = (tp.topic, tp.partition)
        try:
            got = self._consumer.position([CkPartition(tp.topic, tp.partition)])[0].offset
        except KafkaException:
            got = -1
        if got > self._pos.get(k, 0) and got > self._skip.get(k, -1):
            self._pos[k] = got
        return self._pos.get(k, 0)

    def end_offsets(self, tps: Iterable[TopicPartition], timeout_s: float = 10.0) -> dict[TopicPartition, int]:
        """Each partition's end as the broker says now (its high watermark)."""
        out = {}
        for tp in tps:
            try:
                _, high = self._ends.get_watermark_offsets(CkPartition(tp.topic, tp.partition),
                                                           timeout=timeout_s, cached=False)
            except KafkaException as exc:
                raise IntakeError(f"librdkafka consumer: {exc}") from exc
            out[tp] = high
        return out

    def close(self) -> None:
        try:
            self._consumer.close()
        finally:
            self._ends.close()
