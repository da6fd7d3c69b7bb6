"""Pieces the benchmarks share: the raw-broker baseline for the same bytes, the signal
handling that lets a benchmark stop its children however it ends, the watch that ends a
benchmark whose worker or shuffler died (instead of measuring on without it), and what kind of
estimate a published row is (an epoch's, a span's or a rollup)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Mapping
from types import FrameType, TracebackType
from typing import Any

from producers.replay import default_fleet, default_queries, load_day
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas.epochs import EPOCH_S
from schemas.kafka_io import ensure_topics
from schemas.settings import KafkaSettings

#: processes a benchmark started besides its workers (``watch``): each an object with ``proc`` and ``log``
_WATCHED: list[tuple[str, Any]] = []
_FAILED: list[str] = []  # the first started process seen dead, as one line


def watch(what: str, started: Any) -> None:
    """Watch a started process (an object with ``proc`` and ``log``, e.g. a shuffler) until
    :func:`unwatch`: if it exits meanwhile the benchmark ends (see :func:`stop_children_on_signals`)."""
    _WATCHED.append((what, started))


def unwatch(started: Any) -> None:
    """The benchmark stops this process itself now: no longer a failure when it exits."""
    _WATCHED[:] = [(w, s) for w, s in _WATCHED if s is not started]


def _described(what: str, started: Any) -> str:
    from stream_app.cli.supervise import how_it_ended, log_tail

    log = getattr(started, "log", None)
    return f"the {what} {how_it_ended(started.proc.returncode)}: {log_tail(log)} (its log: {log})"


def _dead() -> str | None:
    """The first watched process that has exited: every worker started and not yet stopped
    (tests/integration/stream_helpers.py keeps them), and every process given to :func:`watch`."""
    from tests.integration import stream_helpers

    live = list(getattr(stream_helpers, "_LIVE", []))  # WorkerProcess.start adds, stop and kill remove
    for what, started in [("stream-app worker", w) for w in live] + list(_WATCHED):
        proc = getattr(started, "proc", None)
        code = proc.poll() if proc is not None else None
        still_watched = started in live and started in getattr(stream_helpers, "_LIVE", []) or \
            any(s is started for _, s in _WATCHED)
        if code is not None and still_watched:  # not one the benchmark was stopping meanwhile
            return _described(what, started)
    early = getattr(stream_helpers, "EXITED_EARLY", [])  # found dead when the benchmark stopped it
    return _described("stream-app worker", early[0]) if early else None


def _watch_started(interval_s: float = 0.2) -> None:
    """A thread: the first started process seen dead is said, and the benchmark is stopped as by
    SIGTERM (its cleanup stops the rest), exit code 8 -- not measured on in silence. SIGTERM is
    sent again every ``interval_s``: one that lands inside a replay is taken by the replay's own
    handler (it stops the replay cleanly), and the next reaches the benchmark's."""
    def loop() -> None:
        while not threading.Event().wait(interval_s):
            failure = _FAILED[0] if _FAILED else _dead()
            if failure is not None:
                if not _FAILED:
                    _FAILED.append(failure)
                os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=loop, name="watch-started", daemon=True).start()


def stop_children_on_signals(name: str) -> None:
    """SIGTERM (what ``timeout`` and ``kill`` send) and SIGINT (Ctrl-C) raise ``SystemExit``
    (128 + the signal's number) in the main thread, so the benchmark's ``with LocalBroker``
    and ``finally`` blocks stop the broker, workers and shufflers exactly as on the normal path.
    Python's default for SIGTERM ends the process at once and leaves every child running,
    orphaned. A second signal during the cleanup is ignored: the cleanup finishes.

    Every worker the benchmark starts (and every process given to :func:`watch`) is watched
    from here on: one that exits while it should run ends the benchmark the same way, with one
    line naming it and quoting its log, exit code 8 (the command line's for a helper that failed)."""
    from stream_app.cli.errors import EXIT_HELPER

    def stop(signum: int, frame: FrameType | None) -> None:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        if _FAILED:
            print(f"{name}: error: {_FAILED[0]}; stopping the broker and every child process", file=sys.stderr,
                  flush=True)
            raise SystemExit(EXIT_HELPER)
        print(f"{name}: {signal.Signals(signum).name}, stopping the broker and every child process",
              file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    def failed_first(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        """The benchmark met the dead process before the watch did (a scrape of a killed
        worker): the process is the failure to name, not the traceback of what met it."""
        failure = _FAILED[0] if _FAILED else _dead()
        if failure is None:
            previous(kind, exc, tb)
            return
        print(f"{name}: error: {failure}; stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_HELPER)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    previous = sys.excepthook
    sys.excepthook = failed_first
    _watch_started()


def load_scenario(rs: ReplaySettings) -> tuple[Any, float, int, list[Any], dict[str, Any]]:
    """A scenario's day (and its load time in s), its fleet, its default queries and the
    replay settings a worker shares; the topics exist afterwards."""
    from stream_app.settings import WorkerSettings

    t_load = time.perf_counter()
    day = load_day(rs)
    load_s = time.perf_counter() - t_load
    fleet = default_fleet(day, rs)  # a span query's fleet carries its span flows
    queries = default_queries(day, fleet, rs.mechanisms)
    ensure_topics(rs)
    return day, load_s, fleet, queries, {k: v for k, v in rs.model_dump().items() if k in WorkerSettings.model_fields}


def row_kind(row: bytes | Mapping[str, Any], span_queries: Collection[str] = ()) -> str:
    """What a worker's estimate is, from its row (the JSON value) or its frame's header:
    ``"epoch"``, a 30-s query's estimate of one epoch (what a run is measured by); ``"span"``, a
    span query's estimate of one span (``span_s`` > 30; ``span_queries``: the ids of the run's
    span queries, which have no rollups); ``"rollup"``, a 5-minute or hourly sum of a 30-s
    query's epochs (:mod:`stream_app.worker.rollups`). A cheap byte test first: a row without
    ``span_s`` is an epoch's.

    >>> row_kind(b'{"query_id": "alp-day", "span_s": 30}'), row_kind(b'{"query_id": "alp-day"}')
    ('epoch', 'epoch')
    >>> row_kind(b'{"query_id": "alp-day", "span_s": 300}', {"unary-hour"})
    'rollup'
    >>> row_kind({"query_id": "unary-hour", "span_s": 3600}, {"unary-hour"})
    'span'
    """
    if isinstance(row, bytes) and b'"span_s"' not in row:
        return "epoch"
    fields: Mapping[str, Any] = json.loads(row) if isinstance(row, bytes) else row
    if fields.get("span_s", EPOCH_S) == EPOCH_S:
        return "epoch"
    return "span" if fields.get("query_id") in span_queries else "rollup"


def raw_produce(settings: KafkaSettings, topic: str, sizes: list[int], partitions: int = 4,
                consume: bool = False) -> float:
    """Seconds to produce records of exactly ``sizes`` bytes (random content) with the
    producers' settings (acks=all, idempotent), and optionally to consume them all back."""
    ensure_topics(settings, {topic: partitions})
    sink = ReportSink(settings, topic)
    payloads = [os.urandom(n) for n in sizes]
    t0 = time.perf_counter()
    for i, value in enumerate(payloads):
        key = f"{i:032x}".encode()
        sink.send(value, key=key, partition=sink.partition_for(key))
    sink.flush()
    if consume:
        consume_all(settings, topic, len(payloads))
    elapsed = time.perf_counter() - t0
    sink.close()
    return elapsed


def consume_all(settings: KafkaSettings, topic: str, n: int) -> None:
    """Consume ``topic`` from the beginning until ``n`` records have arrived."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                      max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
    try:
        c.assign([TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic) or set())])
        c.seek_to_beginning()
        got = 0
        while got < n:
            got += sum(len(v) for v in c.poll(timeout_ms=100, max_records=100_000).values())
    finally:
        c.close()


# kafka-python's codec numbers in a record batch's attributes (the Kafka protocol's)
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}


def stored_batches(settings: KafkaSettings, topic: str) -> tuple[list[tuple[int, int, int, str]], float]:
    """Every record batch of ``topic`` as the broker serves it in Fetch answers (the bytes it
    stores: a batch is kept and served as produced), one ``(partition, base offset, bytes, codec)``
    each, and the CPU seconds this process spent consuming (decompressing and parsing) the topic.

    The raw fetched bytes are taken where kafka-python's fetcher wraps them
    (``kafka.consumer.fetcher.MemoryRecords``), before any decompression."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.consumer import fetcher
    from kafka.record import MemoryRecords

    seen: dict[tuple[int, int], tuple[int, int, int, str]] = {}
    current = [0]

    class Recording(MemoryRecords):  # type: ignore[misc]
        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            copy = MemoryRecords(data)
            while (b := copy.next_batch()) is not None:
                seen[(current[0], b.base_offset)] = (current[0], b.base_offset, b.size_in_bytes,
                                                     CODEC_NAMES.get(b.compression_type, "?"))

    original = fetcher.MemoryRecords
    fetcher.MemoryRecords = Recording
    cpu = 0.0
    try:
        c = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                          max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
        try:
            for p in sorted(c.partitions_for_topic(topic) or set()):
                tp = TopicPartition(topic, p)
                current[0] = p
                c.assign([tp])
                end = c.end_offsets([tp])[tp]
                c.seek_to_beginning(tp)
                t0 = time.process_time()
                while c.position(tp) < end:
                    c.poll(timeout_ms=200, max_records=100_000)
                cpu += time.process_time() - t0
        finally:
            c.close()
    finally:
        fetcher.MemoryRecords = original
    return sorted(seen.values()), cpu


def compress_cpu_s(values: list[tuple[bytes, bytes]], codec: str, batch_bytes: int = 1 << 20) -> float:
    """CPU seconds to build (and compress) record batches of at most ``batch_bytes`` holding
    ``values`` (key, value), as a producer does (kafka-python's batch builder, message format 2)."""
    from kafka.record import MemoryRecordsBuilder

    t0 = time.process_time()
    builder = MemoryRecordsBuilder(magic=2, compression_type=CODEC_IDS[codec], batch_size=batch_bytes)
    for key, value in values:
        if builder.append(0, key, value, []) is None:
            builder.close()
            builder = MemoryRecordsBuilder(magic=2, compression_type=CODEC_IDS[codec], batch_size=batch_bytes)
            builder.append(0, key, value, [])
    builder.close()
    return time.process_time() - t0
