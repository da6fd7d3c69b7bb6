"""``ptt subscribe``: tail the estimates topic as a table or as JSON lines, or keep the estimate
frames topic in an Arrow IPC or Parquet file (long form: :func:`stream_app.frames.long_table`)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TextIO

from kafka import KafkaConsumer, TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

from schemas.estimates import Estimate
from schemas.kafka_io import connect
from schemas.settings import KafkaSettings

__all__ = ["FrameCounts", "LongWriter", "format_row", "keep_frames", "latest_frames", "subscribe", "write_frames"]

HEADER = f"{'epoch start':<25} {'query':<12} {'estimator':<14} {'station':>8} {'estimate':>10} {'95% bound':>20} " \
         f"{'N':>8} {'eps':>6} {'eps shuf':>8}"


def format_row(e: Estimate) -> str:
    span = "" if e.span_s == 30 else f"  sum over {e.span_s // 60} min"  # a rollup (stream_app.rollups)
    if e.withheld:
        head = f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8}"
        return f"{head} withheld: {e.withheld}{span}"
    b95 = next((b for b in e.bounds if abs(b.confidence - 0.95) < 1e-9), e.bounds[0] if e.bounds else None)
    bound = f"[{b95.lower:.1f}, {b95.upper:.1f}]" if b95 else ""
    flag = ("  no source data" if e.data_quality != "ok" else "") + span
    return (f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8} "
            f"{e.estimate or 0.0:>10.1f} {bound:>20} {e.participants:>8} "
            f"{'inf' if e.epsilon is None else f'{e.epsilon:.2f}':>6} "
            f"{'-' if e.epsilon_shuffled is None else f'{e.epsilon_shuffled:.3f}':>8}{flag}")  # '-': not attested


def _records(settings: KafkaSettings, topic: str, from_beginning: bool, idle_timeout_s: float | None
             ) -> Iterator[bytes]:
    """Connects at once (so an unreachable broker fails before anything is printed)."""
    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       max_partition_fetch_bytes=16 << 20,  # an estimate frame may exceed the 1 MiB default
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


class LongWriter:
    """Long-form estimate tables into one Arrow IPC file or Parquet file, buffered into row
    groups of about ``group_rows`` rows; :meth:`close` (also on Ctrl-C) leaves a readable file."""

    def __init__(self, path: Path, kind: Literal["arrow", "parquet"], group_rows: int = 1 << 18) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .frames import LONG_SCHEMA

        self._writer = (pq.ParquetWriter(str(path), LONG_SCHEMA) if kind == "parquet"
                        else pa.ipc.new_file(str(path), LONG_SCHEMA))
        self._group_rows = group_rows
        self._buffer: list[pa.Table] = []
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        self._buffer.append(table)
        self.rows += table.num_rows
        if sum(t.num_rows for t in self._buffer) >= self._group_rows:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._buffer:
            self._writer.write_table(pa.concat_tables(self._buffer).combine_chunks())
            self._buffer = []

    def close(self) -> None:
        self._flush()
        self._writer.close()


def _filtered(table: pa.Table, query: str | None, station: int | None, estimator: str | None) -> pa.Table:
    import pyarrow.compute as pc

    for column, value in (("query_id", query), ("station", station), ("estimator", estimator)):
        if value is not None:
            table = table.filter(pc.equal(table.column(column), value))
    return table


@dataclass
class FrameCounts:
    """What :func:`write_frames` did so far: frames kept, long rows written, records skipped."""

    frames: int = 0
    rows: int = 0
    skipped: int = 0


def write_frames(values: Iterable[bytes], path: Path, kind: Literal["arrow", "parquet"], *,
                 query: str | None = None, station: int | None = None, estimator: str | None = None,
                 group_rows: int = 1 << 18, counts: FrameCounts | None = None) -> FrameCounts:
    """Write the estimate frames among ``values`` (record values of a frames topic) to ``path``
    in long form (:func:`stream_app.frames.long_table`, one row per query, epoch, station and
    estimator); a value that is not a frame is skipped. ``counts`` (returned) is kept up to date
    as it goes, so a caller knows what was written when the iteration is interrupted; the file
    is closed and readable however it ends (also on Ctrl-C)."""
    from .frames import decode_frame, long_table

    counts = counts if counts is not None else FrameCounts()
    writer = LongWriter(path, kind, group_rows)
    try:
        for value in values:
            try:
                table = long_table(decode_frame(value))
            except ValueError:
                counts.skipped += 1
                continue
            writer.write(_filtered(table, query, station, estimator))
            counts.frames += 1
    finally:
        writer.close()
        counts.rows = writer.rows
    return counts


def latest_frames(values: Iterable[tuple[bytes | None, bytes]]) -> list[bytes]:
    """The latest frame value per key, in the order the keys first came: what a subscriber that
    deduplicates keeps when a restarted worker re-publishes a window's frame (docs/wire.md,
    "Estimate frames")."""
    latest: dict[bytes | None, bytes] = {}
    for key, value in values:
        latest[key] = value
    return list(latest.values())


def keep_frames(settings: KafkaSettings, topic: str, path: Path, kind: Literal["arrow", "parquet"], *,
                from_beginning: bool = False, query: str | None = None, station: int | None = None,
                estimator: str | None = None, idle_timeout_s: float | None = None,
                out: TextIO | None = None, group_rows: int = 1 << 18) -> tuple[int, int]:
    """Write every estimate frame that arrives to ``path`` in long form (one row per query,
    epoch, station and estimator), until idle or Ctrl-C; says what it wrote on ``out``.
    Returns (frames kept, rows written); a record that is not a frame is skipped."""
    out = out or sys.stdout
    counts = FrameCounts()
    try:
        write_frames(_records(settings, topic, from_beginning, idle_timeout_s), path, kind, query=query,
                     station=station, estimator=estimator, group_rows=group_rows, counts=counts)
    finally:
        note = f" ({counts.skipped} record(s) that are not estimate frames skipped)" if counts.skipped else ""
        print(f"wrote {counts.rows:,} estimates from {counts.frames:,} frames to {path}{note}", file=out, flush=True)
    return counts.frames, counts.rows
