"""``ptt subscribe``: tail the estimates topic as a table or as JSON lines."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TextIO

from kafka import KafkaConsumer, TopicPartition

from schemas.estimates import Estimate
from schemas.kafka_io import connect
from schemas.settings import KafkaSettings

__all__ = ["format_row", "subscribe"]

HEADER = f"{'epoch start':<25} {'query':<12} {'estimator':<14} {'station':>8} {'estimate':>10} {'95% bound':>20} " \
         f"{'N':>8} {'eps':>6}"


def format_row(e: Estimate) -> str:
    if e.withheld:
        head = f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8}"
        return f"{head} withheld: {e.withheld}"
    b95 = next((b for b in e.bounds if abs(b.confidence - 0.95) < 1e-9), e.bounds[0] if e.bounds else None)
    bound = f"[{b95.lower:.1f}, {b95.upper:.1f}]" if b95 else ""
    flag = "  no source data" if e.data_quality != "ok" else ""
    return (f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8} "
            f"{e.estimate or 0.0:>10.1f} {bound:>20} {e.participants:>8} "
            f"{'inf' if e.epsilon is None else f'{e.epsilon:.2f}':>6}{flag}")


def _records(settings: KafkaSettings, topic: str, from_beginning: bool, idle_timeout_s: float | None
             ) -> Iterator[bytes]:
    """Connects at once (so an unreachable broker fails before anything is printed)."""
    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       consumer_timeout_ms=int(idle_timeout_s * 1000) if idle_timeout_s else float("inf"))
    return _values(consumer, topic, from_beginning)


def _values(consumer: KafkaConsumer, topic: str, from_beginning: bool) -> Iterator[bytes]:
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        if from_beginning:
            consumer.seek_to_beginning()
        for rec in consumer:
            yield rec.value
    finally:
        consumer.close()


def subscribe(settings: KafkaSettings, topic: str, *, json_lines: bool = False, from_beginning: bool = False,
              query: str | None = None, station: int | None = None, estimator: str | None = None,
              idle_timeout_s: float | None = None, out: TextIO | None = None) -> int:
    """Print estimates as they arrive (to ``out``, standard output by default, read when called:
    not the one that was current at import); returns how many were printed."""
    out = out or sys.stdout
    n = 0
    records = _records(settings, topic, from_beginning, idle_timeout_s)
    if not json_lines:
        print(HEADER, file=out, flush=True)
    for value in records:
        try:
            e = Estimate.model_validate_json(value)
        except ValueError:
            continue
        if (query and e.query_id != query) or (station is not None and e.station != station) or \
                (estimator and e.estimator != estimator):
            continue
        print(value.decode() if json_lines else format_row(e), file=out, flush=True)
        n += 1
    return n
