"""``ptt subscribe``: tail the estimates topic as a table or as JSON lines, or keep the estimate
frames topic in an Arrow IPC or Parquet file (long form: :func:`stream_app.worker.frames.long_table`)."""

from __future__ import annotations

import math
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    import pyarrow as pa

from schemas.epochs import EPOCH_S, spans_epochs
from schemas.estimates import Estimate, EstimateBound  # noqa: F401 - EstimateBound: the doctest's
from schemas.settings import KafkaSettings

from .report.flows import NOISE_WORD
from .report.summary import sp_caveat
from .subscribe_flows import FlowOrder, Group, QueryBook, group_label, row_noisy, span_keys

__all__ = ["EPS_NOTE", "FLOWS_HEADER", "FLOWS_NOTE", "HEADER", "LOSS_TIMEOUT_S", "NEGATIVE_NOTE", "SUMMARY_HEADER",
           "SUMMARY_KEY", "WIDTH", "EpochGroups", "FlowOrder", "FrameCounts", "LongWriter", "MissingTopic",
           "QueryBook", "flow_kind", "format_flow", "format_row", "format_summary", "keep_frames", "latest_frames",
           "subscribe", "write_frames"]

HEADER = f"{'epoch start':<25} {'query':<12} {'estimator':<14} {'station':>8} {'estimate':>10} {'95% bound':>20} " \
         f"{'N':>8} {'eps':>6} {'eps shuf':>8}"
SUMMARY_HEADER = f"{'epoch start':<25} {'query':<12} {'stns':>4} {'N':>8} {'eps':>6} {'eps shuf':>8}  " \
                 f"{'estimator':<13} {'sum':>12} {'<0':>4} {'gaps':>4} notes"
#: what the eps columns of the default table and of --rows are: per report, never a rollup's own figure
EPS_NOTE = ("eps, eps shuf: a device's local and shuffled epsilon per report -- an epoch's, a span query's span "
            "report's; a rollup shows one of its epochs' (per epoch, not the rollup's: it sums 10 or 120 epochs' "
            "reports)")
#: what the default table's columns mean, under its header (wrapped to :data:`WIDTH`)
SUMMARY_KEY = ("sum: of the station estimates (the vehicles at all of them); <0: stations whose estimate is below 0; "
               f"gaps: stations without source data; {EPS_NOTE}")
WIDTH = 120  # the default table's and the flows view's lines fit a 120-column terminal
NEGATIVE_NOTE = ("estimates are unbiased, so a quiet station's can fall below 0; its bounds are clipped at 0 (no count "
                 "is negative), so such an estimate lies below its own bound")
FLOWS_HEADER = (f"{'span start':<25} {'query':<14} {'kind':<6} {'span':>6} {'station':>7} "
                f"{'flow':>9} {'95% bounds':>21} {'sd':>7}")
#: under the flows view's header (lines within :data:`WIDTH`)
FLOWS_NOTE = textwrap.fill(
    "(vehicles per span, the headline estimator's unless --estimator; the span queries' flows first, then the rollups "
    "of 30-s queries, each held until the span queries' flows of its hour are out; a line before each group says "
    f"what it is and what it is good for; {NOISE_WORD}: an sd of at least half the flow)", WIDTH)
IDLE_S = 2.0  # a (query, epoch) that got no row for this long is printed as it is (marked partial)
#: a subscriber whose broker answered nothing for this long stops (it holds nothing to flush; exit code 7)
LOSS_TIMEOUT_S = 15.0
LOSS_CHECK_S = 2.5  # how often a quiet subscriber asks the broker about its topic
HOLD_S = 1.0  # a complete (query, epoch) waits this long for an older epoch of its query to show up


def _span_mark(e: Estimate, rollup: bool) -> str:
    """How a longer span is marked: ``N-min sum`` (a rollup, stream_app.worker.rollups), or ``N-min
    span`` (a span query's own report, not a sum); nothing for an epoch."""
    if not e.is_flow:
        return ""
    return f"{e.span_s // 60}-min sum" if rollup else f"{e.span_s // 60}-min span"


def format_row(e: Estimate, rollup: bool = True) -> str:
    span = _span_mark(e, rollup)
    span = f"  {span}" if span else ""
    if e.withheld:
        head = f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8}"
        return f"{head} withheld: {e.withheld}{span}"
    b95 = next((b for b in e.bounds if abs(b.confidence - 0.95) < 1e-9), e.bounds[0] if e.bounds else None)
    bound = f"[{b95.lower:.1f}, {b95.upper:.1f}]" if b95 else ""
    flag = ("  no source data" if e.data_quality != "ok" else "") + span
    return (f"{e.epoch_start.isoformat():<25} {e.query_id:<12} {e.estimator:<14} {e.station:>8} "
            f"{'-' if e.estimate is None else f'{e.estimate:.1f}':>10} {bound:>20} {e.participants:>8} "
            f"{'inf' if e.epsilon is None else f'{e.epsilon:.2f}':>6} "
            f"{'-' if e.epsilon_shuffled is None else f'{e.epsilon_shuffled:.3f}':>8}{flag}")  # '-': not attested


def _fit(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters (its last one an ellipsis when cut)."""
    return text if len(text) <= n else text[:n - 1] + "\u2026"


def _span_text(span_s: int) -> str:
    return f"{span_s // 3600} h" if span_s % 3600 == 0 else f"{span_s // 60} min" if span_s % 60 == 0 else f"{span_s} s"


def flow_kind(e: Estimate, shortest: int | None) -> str:
    """``rollup`` when the query publishes a shorter span (``shortest``: the shortest span seen
    of its query; a rollup's epochs come before it), else ``span`` (a span query's own span)."""
    return "rollup" if shortest is not None and shortest < e.span_s else "span"


def format_flow(e: Estimate, kind: str) -> str:
    """One line of the flows view (at most :data:`WIDTH` characters): the span's start, query,
    ``kind`` (:func:`flow_kind`), span, station, then the flow, its 95% bounds and sd, and
    ``NOISE-DOMINATED`` when the sd is at least half the flow
    (:func:`stream_app.subscribe_flows.row_noisy`) -- or why there is none: withheld (its code)
    or no source data (an epoch of the span had no reading: the sum is not a flow). The
    estimator is named on the group's line (:func:`stream_app.subscribe_flows.group_label`).

    >>> from datetime import UTC, datetime
    >>> e = Estimate(query_id="unary-day", query_version=1, mechanism="unary", estimator="unary", epoch=59832960,
    ...              epoch_start=datetime(2026, 11, 18, 8, tzinfo=UTC), span_s=3600, station=400001,
    ...              estimate=1234.5, sd=141.2, bounds=(EstimateBound(confidence=0.95, lower=960.0, upper=1510.3),),
    ...              reports=9, participants=9, epsilon=1.0, closed_by="markers", round_count_mismatch=0, late=0,
    ...              refused=0, missing_batches=0)
    >>> format_flow(e, "rollup")[26:]
    'unary-day      rollup    1 h  400001    1234.5       [960.0, 1510.3]   141.2'
    >>> format_flow(e.model_copy(update={"estimate": 250.0}), "rollup")[-24:]  # sd 141.2 >= 250 / 2
    '   141.2 NOISE-DOMINATED'
    """
    head = (f"{e.epoch_start.isoformat():<25} {_fit(e.query_id, 14):<14} {kind:<6} {_span_text(e.span_s):>6} "
            f"{e.station:>7}")
    if e.withheld:
        from .report.summary import withheld_code

        return _fit(f"{head} withheld: {withheld_code(e.withheld)}", WIDTH)
    if e.data_quality != "ok":
        return f"{head} no source data: not a flow"
    b95 = next((b for b in e.bounds if abs(b.confidence - 0.95) < 1e-9), None)
    bound = f"[{b95.lower:.1f}, {b95.upper:.1f}]" if b95 else "-"
    sd = "-" if e.sd is None else f"{e.sd:.1f}"
    flag = f" {NOISE_WORD}" if row_noisy(e) else ""
    return _fit(f"{head} {e.estimate or 0.0:>9.1f} {bound:>21} {sd:>7}{flag}", WIDTH)


def _eps(e: Estimate) -> str:
    return (f"{'inf' if e.epsilon is None else f'{e.epsilon:.2f}':>6} "
            f"{'-' if e.epsilon_shuffled is None else f'{e.epsilon_shuffled:.3f}':>8}")  # '-': not attested


def format_summary(rows: Sequence[Estimate], expected: int | None = None, rollup: bool = True) -> str:
    """The lines of one closed (query, epoch), each within :data:`WIDTH` columns: per estimator
    the sum of its station estimates (an unbiased estimate of the vehicles at all of them; a
    station without a number, e.g. a rollup's without source data, left out) and, as notes, how
    many are below 0, the stations without source data, ``partial`` when fewer than ``expected``
    rows came, and a longer span marked as a rollup's sum or (``rollup`` false) a span query's span."""
    e = rows[0]
    stations = len({r.station for r in rows})
    head = f"{e.epoch_start.isoformat():<25} {e.query_id + ' v' + str(e.query_version):<12} {stations:>4} " \
           f"{e.participants:>8} {_eps(e)}  "
    notes = []
    if expected is not None and len(rows) < expected:
        notes.append(f"partial {len(rows)}/{expected}")
    if e.is_flow:  # a rollup (stream_app.worker.rollups) or a span query: its own lines
        notes.append(_span_mark(e, rollup))
    if e.withheld:
        return _fit(head + "; ".join([f"withheld: {e.withheld}", *notes]), WIDTH)
    gaps = len({r.station for r in rows if r.data_quality != "ok"})
    lines = []
    for name in dict.fromkeys(r.estimator for r in rows):
        values = [r.estimate for r in rows if r.estimator == name and r.estimate is not None]
        below = sum(v < 0 for v in values)
        lines.append(_fit(f"{head}{name:<13} {math.fsum(values):>12,.1f} {below:>4} {gaps:>4} "
                          f"{'; '.join(notes)}".rstrip(), WIDTH))
    return "\n".join(lines)


@dataclass
class _Group:
    rows: dict[tuple[int, str], Estimate]
    last: float


class EpochGroups:
    """The estimates of each (query, version, epoch, span), gathered until all of them came (or none
    came for ``idle_s``): the rows of an epoch arrive spread over the topic's partitions and
    mixed with other queries' and epochs'. ``expected(e)``: how many rows a group of ``e``
    holds (None: unknown, the group waits for ``idle_s``). A complete group waits ``hold_s``, and
    for the older epochs of its query still open, so each query's epochs come out in order: the
    worker closes epochs on several partitions at once, and a consumer reads its partitions
    unevenly. Pure: the caller gives the time.

    >>> from datetime import UTC, datetime
    >>> def est(station):
    ...     return Estimate(query_id="q", query_version=1, mechanism="rr", estimator="rr", epoch=1,
    ...                     epoch_start=datetime(2026, 11, 18, tzinfo=UTC), station=station, estimate=-2.0,
    ...                     sd=1.0, bounds=(), reports=9, participants=9, epsilon=1.0, closed_by="markers",
    ...                     round_count_mismatch=0, late=0, refused=0, missing_batches=0)
    >>> groups = EpochGroups(lambda e: 2)
    >>> groups.add(est(7), now=0.0), groups.add(est(8), now=0.1)
    ([], [])
    >>> [[r.station for r in g] for g in groups.due(now=1.1)]
    [[7, 8]]
    """

    def __init__(self, expected: Callable[[Estimate], int | None], idle_s: float = IDLE_S,
                 hold_s: float = HOLD_S) -> None:
        self._expected = expected
        self.idle_s = idle_s
        self.hold_s = hold_s
        # keyed (query, version, last epoch covered, span_s): a rollup (span_s > 30) has the epoch of its
        # first epoch, so it is its own group, ordered after the last epoch it sums
        self._groups: dict[tuple[str, int, int, int], _Group] = {}
        self._ready: dict[tuple[str, int, int, int], tuple[float, list[Estimate]]] = {}

    def expected(self, e: Estimate) -> int | None:
        return self._expected(e)

    def add(self, e: Estimate, now: float) -> list[list[Estimate]]:
        """Take one estimate (a repeated one replaces the earlier); the groups it completes."""
        key = (e.query_id, e.query_version, e.epoch + e.span_s // EPOCH_S - 1, e.span_s)
        group = self._groups.setdefault(key, _Group({}, now))
        group.rows[(e.station, e.estimator)] = e
        group.last = now
        want = self._expected(e)
        if want is not None and len(group.rows) >= want:
            self._ready[key] = (now, self._pop(key))
        return self._release(now)

    def due(self, now: float) -> list[list[Estimate]]:
        """The groups that got nothing for ``idle_s`` (and the complete ones they held back),
        oldest epoch first."""
        for k in [k for k, g in self._groups.items() if now - g.last >= self.idle_s]:
            self._ready[k] = (-math.inf, self._pop(k))  # waited long enough already
        return self._release(now)

    def _release(self, now: float) -> list[list[Estimate]]:
        oldest_open: dict[str, int] = {}
        for q, _, epoch, span_s in self._groups:
            if not spans_epochs(span_s):  # an open rollup holds nothing back
                oldest_open[q] = min(epoch, oldest_open.get(q, epoch))
        out = []
        for query in {k[0] for k in self._ready}:  # per query, the ready epochs in order up to the first held
            for k in sorted((k for k in self._ready if k[0] == query), key=lambda k: (k[2], k[3], k)):
                if k[2] >= oldest_open.get(query, math.inf) or now - self._ready[k][0] < self.hold_s:
                    break
                out.append(k)
        return [self._ready.pop(k)[1] for k in sorted(out, key=lambda k: (k[2], k[3], k))]

    def rest(self) -> list[list[Estimate]]:
        """Every group still open (at the end), oldest epoch first."""
        return self.due(math.inf)

    def _pop(self, key: tuple[str, int, int, int]) -> list[Estimate]:
        rows = self._groups.pop(key).rows
        return [rows[k] for k in sorted(rows, key=lambda k: (k[1], k[0]))]  # by estimator, then station


def _query_sizes(settings: KafkaSettings, station: int | None, estimator: str | None, headline: bool = False
                 ) -> tuple[Callable[[Estimate], int | None], Callable[[], None]]:
    """How many estimates one (query, epoch) publishes that pass the filters (``headline``
    without ``estimator``: only the query's headline estimator's), from the queries topic (read
    again when a query version it has not seen appears); and a close function."""
    book = _query_book(settings, station, estimator, headline)
    return book.expected, book.close


def _query_book(settings: KafkaSettings, station: int | None, estimator: str | None, headline: bool = True
                ) -> QueryBook:
    """:func:`_query_sizes`'s, with the query versions read so far (the flows view's span queries)."""
    from schemas.kafka_io import QueryReader

    reader = QueryReader(settings)
    looked: set[tuple[str, int]] = set()

    def expected(e: Estimate) -> int | None:
        key = (e.query_id, e.query_version)
        if key not in reader.queries and key not in looked:
            looked.add(key)
            reader.read_to_end(2.0)
        q = reader.queries.get(key)
        if q is None:
            return None
        stations = 1 if station is not None else q.n_stations
        names = [n for n in q.spec.estimator_names if n == estimator or (
            estimator is None and (not headline or n == q.spec.headline))]
        return stations * len(names)

    return QueryBook(expected, lambda: list(reader.queries.values()), reader.close)


def _shows(q: Any, query: str | None, estimator: str | None) -> bool:
    """Whether the flows view shows rows of query ``q`` (a :class:`schemas.Query`) at these filters."""
    return (query is None or q.query_id == query) and (estimator is None or estimator in q.spec.estimator_names)


def _print_flows(done: Iterable[Group], out: TextIO) -> None:
    for kind, rows in done:
        lines = [group_label(kind, rows, WIDTH), *(format_flow(e, kind) for e in rows)]
        print("\n".join(lines), file=out, flush=True)


def _records(settings: KafkaSettings, topic: str, from_beginning: bool, idle_timeout_s: float | None
             ) -> Iterator[bytes]:
    """Connects at once (so an unreachable broker fails before anything is printed)."""
    from kafka import KafkaConsumer

    from schemas.kafka_io import connect

    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       max_partition_fetch_bytes=16 << 20,  # an estimate frame may exceed the 1 MiB default
                       consumer_timeout_ms=int(idle_timeout_s * 1000) if idle_timeout_s else float("inf"))
    try:
        _assign(consumer, topic, from_beginning)  # a missing topic fails here, before the file is made
    except BaseException:
        consumer.close()
        raise
    return _values(consumer)


def _values(consumer: Any) -> Iterator[bytes]:
    try:
        for rec in consumer:
            yield rec.value
    finally:
        consumer.close()


class MissingTopic(LookupError):
    """The topic to read does not exist on the broker (the message names it and the ones there)."""


def _assign(consumer: Any, topic: str, from_beginning: bool) -> None:
    """Read every partition of ``topic``; :class:`MissingTopic` if the broker has no such topic."""
    from kafka import TopicPartition

    parts = consumer.partitions_for_topic(topic) if topic in consumer.topics() else None
    if not parts:
        there = sorted(t for t in consumer.topics() if not t.startswith("__"))
        shown = ", ".join(there[:8]) + (", ..." if len(there) > 8 else "") if there else "none"
        raise MissingTopic(f"no topic {topic!r} on the broker (its topics: {shown}); a worker creates its topics "
                           "when it starts: start one first, or name another --topic")
    consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
    if from_beginning:
        consumer.seek_to_beginning()


def _polled(settings: KafkaSettings, topic: str, from_beginning: bool, idle_timeout_s: float | None
            ) -> Iterator[bytes | None]:
    """The topic's record values as they come, and ``None`` at least every half second when
    nothing comes (so a caller can act on time); ends after ``idle_timeout_s`` without data.
    Connects and finds the topic at once (an unreachable broker or a missing topic fails before
    anything is printed); a broker silent for :data:`LOSS_TIMEOUT_S` ends it with
    :class:`~schemas.kafka_io.BrokerLost`."""
    from kafka import KafkaConsumer

    from schemas.kafka_io import BrokerWatch, connect

    consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                       max_partition_fetch_bytes=16 << 20)
    try:
        _assign(consumer, topic, from_beginning)
    except BaseException:
        consumer.close()
        raise
    # a quiet consumer never says that its broker went away: it is asked, when nothing comes
    return _polling(consumer, BrokerWatch(settings, {topic}, LOSS_TIMEOUT_S), settings, idle_timeout_s)


def _polling(consumer: Any, watch: Any, settings: KafkaSettings, idle_timeout_s: float | None
             ) -> Iterator[bytes | None]:
    from schemas.kafka_io import BrokerLost

    try:
        quiet_since = checked = time.monotonic()
        while True:
            got = consumer.poll(timeout_ms=500)
            now = time.monotonic()
            if got:
                quiet_since = now
                watch.health.alive(now)
                for records in got.values():
                    for rec in records:
                        yield rec.value
            elif idle_timeout_s is not None and now - quiet_since >= idle_timeout_s:
                return
            elif now - checked >= LOSS_CHECK_S:
                checked = now
                lost = watch.check()
                if lost is not None:
                    raise BrokerLost(f"lost the Kafka broker at {settings.bootstrap_servers} mid-run ({lost}); "
                                     "start it again (`ptt broker`), then subscribe again")
            yield None
    finally:
        watch.close()
        consumer.close()


def subscribe(settings: KafkaSettings, topic: str, *, json_lines: bool = False, rows: bool = False,
              flows: bool = False, from_beginning: bool = False, query: str | None = None,
              station: int | None = None, estimator: str | None = None, idle_timeout_s: float | None = None,
              out: TextIO | None = None) -> int:
    """Print estimates as they arrive (to ``out``, standard output by default, read when called:
    not the one that was current at import): by default one line per closed (query, epoch)
    (:func:`format_summary`), with ``rows`` every estimate (:func:`format_row`, grouped per
    (query, epoch) and ordered), with ``flows`` one line per flow -- a rollup's or a span
    query's row, the headline estimator's unless ``estimator`` -- (:func:`format_flow`, grouped
    per (query, span, epoch), each group after a line saying what it is and what it is good
    for, the span queries' flows first: :mod:`stream_app.subscribe_flows`), with
    ``json_lines`` one JSON estimate per line as it comes. Returns how many estimates were
    printed or summarized."""
    from estimators.registry import REGISTRY

    out = out or sys.stdout
    n = 0
    records = _polled(settings, topic, from_beginning, idle_timeout_s)
    close: Callable[[], None] = lambda: None  # noqa: E731
    shortest: dict[str, int] = {}  # query -> the shortest span seen (flows: a longer one is a rollup)
    order = groups = None
    if flows:
        book = _query_book(settings, station, estimator)
        close, groups = book.close, EpochGroups(book.expected)
        order = FlowOrder(lambda epoch: span_keys(book.queries(), epoch, lambda q: _shows(q, query, estimator)))
        print(f"{FLOWS_HEADER}\n{FLOWS_NOTE}", file=out, flush=True)
    elif not json_lines:
        expected, close = _query_sizes(settings, station, estimator)
        groups = EpochGroups(expected)
        print(HEADER if rows else SUMMARY_HEADER, file=out)
        key = f"({NEGATIVE_NOTE}; {EPS_NOTE if rows else SUMMARY_KEY + '; --rows: every estimate'})"
        print(textwrap.fill(key, WIDTH), file=out, flush=True)

    cautioned: set[str] = set()  # Sampling Privacy's caveat: once, before its first estimate

    def emit(done: list[list[Estimate]]) -> None:
        assert groups is not None  # noqa: S101 - only in the table modes
        if order is not None:  # the flows view: span queries' first, each group labelled; 120 columns, flows only
            return _print_flows(order.add((flow_kind(g[0], shortest.get(g[0].query_id)), g) for g in done), out)
        for g in done:
            rollup = flow_kind(g[0], shortest.get(g[0].query_id)) == "rollup"
            lines = [format_row(e, rollup) for e in g] if rows else [format_summary(g, groups.expected(g[0]), rollup)]
            if g[0].mechanism not in cautioned:
                cautioned.add(g[0].mechanism)
                if (caveat := sp_caveat(g[0].mechanism)) is not None:
                    lines[:0] = textwrap.wrap(f"({caveat})", WIDTH)
            print("\n".join(lines), file=out, flush=True)

    def shown(e: Estimate) -> bool:
        if (query and e.query_id != query) or (station is not None and e.station != station) or \
                (estimator and e.estimator != estimator):
            return False
        if not flows:
            return True
        spec = REGISTRY.get(e.mechanism)
        return e.is_flow and (estimator is not None or spec is None or e.estimator == spec.headline)

    try:
        for value in records:
            if value is None:
                if groups is not None:
                    emit(groups.due(time.monotonic()))
                continue
            try:
                e = Estimate.model_validate_json(value)
            except ValueError:
                continue
            shortest[e.query_id] = min(e.span_s, shortest.get(e.query_id, e.span_s))
            if not shown(e):
                continue
            n += 1
            if groups is None:
                print(value.decode(), file=out, flush=True)
            else:
                emit(groups.add(e, time.monotonic()))
        if groups is not None:
            emit(groups.rest())
            _print_flows(order.rest() if order is not None else (), out)  # the flows still held: at the end
    finally:
        close()
    return n


class LongWriter:
    """Long-form estimate tables into one Arrow IPC file or Parquet file, buffered into row
    groups of about ``group_rows`` rows; :meth:`close` (also on Ctrl-C) leaves a readable file."""

    def __init__(self, path: Path, kind: Literal["arrow", "parquet"], group_rows: int = 1 << 18) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from .worker.frames import LONG_SCHEMA

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
    in long form (:func:`stream_app.worker.frames.long_table`, one row per query, epoch, station and
    estimator); a value that is not a frame is skipped. ``counts`` (returned) is kept up to date
    as it goes, so a caller knows what was written when the iteration is interrupted; the file
    is closed and readable however it ends (also on Ctrl-C)."""
    from .worker.frames import decode_frame, long_table

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
    records = _records(settings, topic, from_beginning, idle_timeout_s)
    try:
        write_frames(records, path, kind, query=query,
                     station=station, estimator=estimator, group_rows=group_rows, counts=counts)
    finally:
        note = f" ({counts.skipped} record(s) that are not estimate frames skipped)" if counts.skipped else ""
        print(f"wrote {counts.rows:,} estimates from {counts.frames:,} frames to {path}{note}", file=out, flush=True)
    return counts.frames, counts.rows
