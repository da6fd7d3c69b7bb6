"""Compressed topics through the real broker (Tansu): every producer the project uses compresses
its batches with the configured codec (``PTT_COMPRESSION_TYPE`` / ``PTT_TOPIC_COMPRESSION``,
translated in schemas/connection.py), the broker stores and serves them compressed (the codec
bits of the record batches it serves), and every consumer reads the records back unchanged.

Producers: kafka-python (producers.sink.ReportSink, the replay's idempotent acks=all producer),
aiokafka (stream_app.worker.publish.BatchSink, the worker's estimates/frames/changelog producer) and
Faust's own producer (dead letters, ticks). Consumers: kafka-python and aiokafka (Faust's).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from producers.sink import ReportSink
from schemas.connection import faust_options
from schemas.kafka_io import ensure_topics
from schemas.settings import KafkaSettings
from stream_app.worker.publish import BatchSink
from tests.benchmarks.common import stored_batches

from .kafka_helpers import drain

pytestmark = pytest.mark.integration

# compressible, as estimate rows are: repeated keys, varying numbers
VALUES = [b'{"query_id": "sp-day", "station": %d, "estimate": %d.5, "withheld": null}' % (400000 + i, i)
          for i in range(300)]
KEYS = [b"%d" % (400000 + i) for i in range(300)]


async def _aiokafka_send(s: KafkaSettings, topic: str) -> None:
    sink = BatchSink(s, topic)
    try:
        await sink.publish(list(zip(KEYS, VALUES, strict=True)), [0] * len(VALUES))
    finally:
        await sink.stop()


async def _faust_send(s: KafkaSettings, topic: str) -> None:
    import faust

    app = faust.App(f"codec-{uuid.uuid4().hex[:8]}", **faust_options(s), producer_max_batch_size=1 << 20)
    producer = app.producer
    await producer.start()
    try:
        futures = [await producer.send(topic, k, v, 0, None, None) for k, v in zip(KEYS, VALUES, strict=True)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _aiokafka_read(s: KafkaSettings, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from schemas.connection import aiokafka_options

    consumer = AIOKafkaConsumer(enable_auto_commit=False, **aiokafka_options(s))
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[bytes] = []
        for _ in range(100):  # bounded: 100 fetches of up to 0.2 s
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += [r.value for r in records]
            if len(got) >= len(VALUES):
                break
        return got
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_every_producer_compresses_and_every_consumer_reads_it_back(kafka_settings: KafkaSettings,
                                                                      codec: str) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = {"kafka-python": f"c-kp-{tag}", "aiokafka": f"c-aio-{tag}", "faust": f"c-faust-{tag}"}
    s = kafka_settings.model_copy(update={"compression_type": codec})
    ensure_topics(s, {t: 1 for t in topics.values()})

    sink = ReportSink(s, topics["kafka-python"])
    for k, v in zip(KEYS, VALUES, strict=True):
        sink.send(v, key=k, partition=0)
    sink.flush()
    sink.close()
    asyncio.run(_aiokafka_send(s, topics["aiokafka"]))
    asyncio.run(_faust_send(s, topics["faust"]))

    for client, topic in topics.items():
        batches, _ = stored_batches(s, topic)
        assert batches, (client, "nothing stored")
        assert {b[3] for b in batches} == {codec}, (client, batches[:3])
        assert [r.value for r in drain(s, topic)] == VALUES, client
        assert asyncio.run(_aiokafka_read(s, topic)) == VALUES, client


def test_a_topic_codec_overrides_the_default_for_the_producers_of_one_topic(kafka_settings: KafkaSettings) -> None:
    """``topic_compression`` compresses the named topic only; the others keep ``compression_type``."""
    tag = uuid.uuid4().hex[:8]
    frames, rows = f"c-frames-{tag}", f"c-rows-{tag}"
    s = kafka_settings.model_copy(update={"compression_type": "none", "topic_compression": {frames: "zstd"}})
    ensure_topics(s, {frames: 1, rows: 1})
    asyncio.run(_aiokafka_send(s, frames))
    asyncio.run(_aiokafka_send(s, rows))
    assert {b[3] for b in stored_batches(s, frames)[0]} == {"zstd"}
    assert {b[3] for b in stored_batches(s, rows)[0]} == {"none"}
    assert [r.value for r in drain(s, frames)] == VALUES
