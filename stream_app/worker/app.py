"""The Faust worker: reports -> per-epoch windows -> estimates, dead letters and metrics.

Topology (one or many workers in one consumer group give the same result):

* **stage 1** (``reports`` topic, keyed by random batch ids): decode and validate each record
  against its query (:mod:`stream_app.worker.decode`), reduce it to a typed stage record carrying
  its count array (:mod:`stream_app.worker.records`) and forward it -- re-keyed by window
  ``(query, version, epoch)`` and tagged with its source partition -- to the internal
  ``partials`` topic. Stateless. Anything bad goes to the dead-letter topic.
* **stage 2** (``partials``), batched: takes many stage records at once and, per stage-2
  partition, reads the touched windows from one changelog-backed table, lets the pure
  :class:`~stream_app.worker.windows.WindowPolicy` add them and decide which epochs close, turns
  closed epochs into estimate arrays (:mod:`stream_app.worker.estimate`), publishes them as rows,
  frames (:mod:`stream_app.worker.frames`) or both (``PTT_ESTIMATE_OUTPUT``; batched,
  acknowledged), then writes each touched window once. Offsets are committed only after
  that (Faust acks the batch's events when the loop body returns, and flushes the producer
  before committing).
* **rollups** (:mod:`stream_app.worker.rollups`): stage 2 sends each decided epoch's summary back to
  ``partials`` keyed by query and hour; that key's partition adds it to the rollups in the
  same table and publishes the 5-minute and hourly rollups it completes.

A lost broker (silent for ``broker_loss_timeout_s``, or its topics gone) stops the worker with
one line and exit code 7 (:mod:`stream_app.guard`, :func:`run_worker`); publishes that fail
meanwhile are retried, never dead-lettered as if a record were at fault.

Faust's windowed tables are not used: they close windows by the wall clock and keep their
expiry schedule in memory. Here every closing decision is made from data in the
changelog-backed table -- window states and each partition's watermark state -- so it
survives a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, NoReturn

import faust
from aiokafka.errors import KafkaError as AioKafkaError
from faust.exceptions import ProducerSendError
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from schemas import GroundTruth, Query, decode_record
from schemas.connection import client_logs, faust_options
from schemas.kafka_io import BrokerLost, QueryReader, broker_lost

from ..guard import BrokerGuard, stop_grace_s
from ..settings import WorkerSettings
from .day_metric import VehicleDay
from .decode import REASONS, GraceBudget, Rejected, UnknownQueryWait, stage1_pass
from .estimate import QueryEstimators, ShuffledEpsilon
from .faust_recovery import install as install_recovery_fix
from .gaps import GapFinder
from .introspect import consumer_state, describe
from .metrics import StationArrays, StreamMonitor
from .publish import BatchSink
from .records import BatchPartial, EpochSummary, Tick, WindowId, bundle, decode_partial, encode_partial, split_bundle
from .rollups import RollupId, RollupOutcome, RollupPolicy, RollupState, rolls_up, route_key, summary_of, version_window
from .stage2 import OutputSettings, by_partition, epoch_outputs, publish_chunks, rollup_outputs, shuffled_needs
from .windows import Watermarks, WindowPolicy, WindowState

__all__ = ["INSTANCE_HEADER", "QueryCache", "create_app", "ensure_stream_topics", "run_worker"]

log = logging.getLogger(__name__)
BROKER_ERRORS = (AioKafkaError, ProducerSendError)  # a publish failed: the broker's fault, not a record's
WM_PREFIX = b"__wm__\x1f"
INSTANCE_HEADER = "X-PTT-Instance"  # /metrics' answer: PTT_INSTANCE_TOKEN (the demo knows its own worker by it)
QUERY_PATIENCE_S = 120.0  # longest wait for the queries topic to be readable before giving up on a query
PUBLISH_CHUNK = 40_000  # estimate records in flight before their acknowledgements are awaited
WAIT_SAID_S = 10.0  # a wait for the queries topic this long is logged
REFRESH_TIMEOUT_S = 20.0  # longest one read of the queries topic may take before a new reader is made


class QueryCache:
    """Every query version, followed from the queries topic; estimators built once each.

    Lookups never block the event loop: :meth:`known` reads what has been loaded, and
    :meth:`refresh` reads the topic to its end in a worker thread (one at a time, bounded).
    """

    def __init__(self, settings: WorkerSettings) -> None:
        self._settings = settings
        self._reader: QueryReader | None = None
        self._kept: dict[tuple[str, int], Query] = {}  # what a reader dropped after a stuck read had read
        self._estimators: dict[str, QueryEstimators] = {}
        self._lock: asyncio.Lock | None = None

    def _catch_up(self) -> None:
        if self._reader is None:
            self._reader = QueryReader(self._settings)
        self._reader.catch_up(timeout_s=10.0)

    async def refresh(self) -> bool:
        """Read the queries topic to its end, off the event loop; False if that failed."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            try:
                # bounded: a catch-up stuck in its client must not hold every later one (stage 1
                # and stage 2 wait on them); a stuck reader is dropped and a new one made next time
                await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, self._catch_up),
                                       REFRESH_TIMEOUT_S)
                return True
            except TimeoutError:
                log.warning("reading the queries topic took over %.0fs; trying again with a new reader",
                            REFRESH_TIMEOUT_S)
                if self._reader is not None:  # keep what it had read (its thread may still be writing)
                    with contextlib.suppress(RuntimeError):
                        self._kept.update(dict(self._reader.queries))
                self._reader = None
                return False
            except Exception as exc:  # the broker is slow or gone: keep what is known, say why
                log.warning("could not read the queries topic to its end: %s", exc)
                return False

    async def ensure(self, keys: set[tuple[str, int]], patience_s: float) -> None:
        """Refresh until every one of ``keys`` is known, for at most ``patience_s``.

        Stage 2 calls it: stage 1 forwarded these records because it knew their queries, so
        the queries are on the topic; a reader that has not caught up yet (a restart under
        load) must be waited for, not taken to mean the query does not exist."""
        started = time.monotonic()
        said = False
        while any(self.known(*k) is None for k in keys):
            ok = await self.refresh()
            waited = time.monotonic() - started
            if waited >= patience_s or all(self.known(*k) is not None for k in keys):
                return
            if waited >= WAIT_SAID_S and not said:  # never a silent stall
                said = True
                log.warning("stage 2 has waited %.0fs for query version(s) %s to be readable on the queries topic "
                            "(at most %.0fs)", waited, sorted(k for k in keys if self.known(*k) is None)[:5],
                            patience_s)
            await asyncio.sleep(0.2 if ok else 0.5)

    def known(self, query_id: str, version: int) -> Query | None:
        q = None if self._reader is None else self._reader.queries.get((query_id, version))
        return q if q is not None else self._kept.get((query_id, version))

    def every_version(self) -> list[Query]:
        """Every query version read so far (what ``ptt analyst list`` reads); [] while a stuck
        read's thread is still writing them."""
        got = dict(self._kept)
        with contextlib.suppress(RuntimeError):  # changed size during the copy: the next tick
            got.update(dict(self._reader.queries) if self._reader is not None else {})
            return list(got.values())
        return []

    def estimators(self, q: Query) -> QueryEstimators:
        qe = self._estimators.get(q.record_key)
        if qe is None:
            qe = self._estimators[q.record_key] = QueryEstimators.build(q)
        return qe

    def shape(self, wid: WindowId) -> tuple[int, int, int] | None:
        """(rounds, width, epochs per span) of a window's query, None if the query is unknown."""
        q = self.known(wid.query_id, wid.query_version)
        return None if q is None else (q.n_rounds, q.width, q.epochs_per_span)


class _MillisecondsToSeconds:
    """Faust observes event runtimes in milliseconds; Prometheus wants base units."""

    def __init__(self, hist: Histogram) -> None:
        self._hist = hist

    def observe(self, ms: float) -> None:
        self._hist.observe(ms / 1000.0)


def _faust_sensors(app: faust.App, registry: CollectorRegistry) -> None:
    """Faust's own operational metrics in our registry, served with ours on /metrics.

    As ``faust.sensors.prometheus.setup_prometheus_sensors``, except that the runtime
    histogram is in seconds (``faust_events_runtime_ms`` fails ``promtool check metrics``).
    """
    fm = FaustMetrics.create(registry, "faust")
    registry.unregister(fm.events_runtime_latency)
    runtime = Histogram("faust_events_runtime_seconds", "Event processing time", registry=registry,
                        buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0))
    adapter: Any = _MillisecondsToSeconds(runtime)
    app.monitor = PrometheusMonitor(metrics=fm._replace(events_runtime_latency=adapter))


def _metrics_page(app: faust.App, registry: CollectorRegistry, arrays: StationArrays, instance: str = "") -> None:
    """``/metrics``: the whole registry, the per-station families written from their arrays
    (:meth:`StationArrays.expose`); ``?name[]=...`` only the named series; ``instance``, if any, as a header."""
    headers = {"Content-Type": CONTENT_TYPE_LATEST, **({INSTANCE_HEADER: instance} if instance else {})}

    @app.page("/metrics")
    async def metrics_page(self: Any, request: Any) -> Any:
        from aiohttp.web import Response

        names = request.query.getall("name[]", [])  # as prometheus_client's own handler
        body = generate_latest(registry.restricted_registry(names)) if names else arrays.expose(registry)
        return Response(body=body, headers=headers, status=200)


class _App(faust.App):
    """Faust's app, with closers run once it has stopped (``on_shutdown`` runs after its agents,
    consumer and producer have stopped): the worker's own producers (:class:`BatchSink`), which
    aiokafka otherwise reports as ``Unclosed AIOKafkaProducer`` errors when the process ends."""

    closers: list[Callable[[], Awaitable[None]]]

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        for close in getattr(self, "closers", ()):
            with contextlib.suppress(Exception):  # a broker gone meanwhile: nothing left to flush to
                await close()


def _faust_app(s: WorkerSettings) -> faust.App:
    s.worker_dir.mkdir(parents=True, exist_ok=True)
    return _App(
        s.app_id,
        **faust_options(s),
        store=s.store,
        datadir=str(s.worker_dir / "{conf.name}"),
        topic_partitions=s.internal_partitions,
        topic_replication_factor=1,
        # Every record its own batch: the embedded broker's end offsets are wrong. Only dead
        # letters and ticks go through Faust's producer; stage records, estimates and the
        # window table's changelog have their own acknowledged producers (stream_app.worker.publish).
        producer_max_batch_size=1,
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
        consumer_auto_offset_reset="earliest",
        table_standby_replicas=0,
        web_host=s.web_host,
        web_port=s.web_port,
        web_bind=s.web_host,
        web_transport="tcp://",
    )


class StreamWorker:
    """The worker's runtime: what each Faust callback does, as read -> call the pure parts
    (:mod:`stream_app.worker.decode`, :class:`~stream_app.worker.windows.WindowPolicy`,
    :mod:`stream_app.worker.stage2`) -> write -> emit. Effects are ordered so that a crash loses and
    duplicates nothing (docs/operations.md, "A crash loses and duplicates nothing")."""

    def __init__(self, s: WorkerSettings, app: faust.App, registry: CollectorRegistry) -> None:
        self.s = s
        self.monitor = StreamMonitor(registry)
        self.monitor.know_reasons(REASONS)
        self.queries = QueryCache(s)
        self.day = VehicleDay(self.monitor)  # ptt_vehicle_day_epsilon, computed off the event loop
        self.policy = WindowPolicy(n_source_partitions=s.partitions, allowed_lateness_epochs=s.allowed_lateness_epochs,
                                   wall_clock_grace_s=s.wall_clock_grace_s, live_horizon_s=s.live_horizon_s,
                                   horizon_epochs=s.horizon_epochs, watermark_idle_s=s.watermark_idle_s,
                                   stall_close_s=s.stall_close_s)
        self.rollup_policy = RollupPolicy()
        self.output = OutputSettings(s.confidences, s.min_participants, s.partitions, ShuffledEpsilon(s.shuffle_delta))
        self.sink = BatchSink(s, s.estimates_topic)
        self.frames = BatchSink(s, s.frames_topic) if s.frames_on else None  # PTT_ESTIMATE_OUTPUT
        self.state = BatchSink(s, s.changelog_topic, one_per_batch=True)  # changelog: one record per batch
        self.forward = BatchSink(s, s.partials_topic)
        self.guard = BrokerGuard(s, watched_topics(s))
        self.grace_budget = GraceBudget(s.unknown_query_grace_s)
        self.gap_finder = GapFinder(s.horizon_epochs)  # epochs a source partition skipped (stream_app.worker.gaps)
        raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
        self.reports = app.topic(s.reports_topic, partitions=s.partitions, **raw)
        self.partials = app.topic(s.partials_topic, partitions=s.internal_partitions, **raw)
        self.dead = app.topic(s.dead_letter_topic, **raw)
        self.truth = app.topic(s.truth_topic, **raw)
        # changelog topic "<app id>-windows-changelog" (settings.changelog_topic); bytes both ways
        self.windows = app.Table("windows", default=None, partitions=s.internal_partitions, key_type=bytes,
                                 value_type=bytes)

    async def start(self) -> None:
        if self.s.fault_start_delay_s:  # fault injection: a slow start (tests/integration/test_crash.py)
            await asyncio.sleep(self.s.fault_start_delay_s)
        await self.queries.refresh()
        for sink in (self.sink if self.s.rows_on else None, self.frames):
            if sink is not None:
                await sink.start()
        await self.forward.start()
        await self.state.start()

    async def close(self) -> None:
        """Stop every producer of this worker (once Faust has stopped: nothing publishes any more)
        and the day figure's computation."""
        await self.day.close()
        for sink in (self.sink, self.frames, self.forward, self.state):
            if sink is not None:
                await sink.stop()

    async def publishing(self, what: str, attempt: Callable[[], Awaitable[None]]) -> None:
        """Run ``attempt`` until it succeeds; broker errors are retried (a re-send is harmless:
        stage records are deduplicated by batch id, estimates are identical; a retried stage-2
        batch may count its metrics and send its dead letters twice). Failing past the loss
        timeout makes the broker lost: the guard stops the worker, which cancels this."""
        since: float | None = None
        while True:
            try:
                await attempt()
                return
            except BROKER_ERRORS as exc:
                since = since if since is not None else time.monotonic()
                if self.guard.failing(what, since, f"{type(exc).__name__}: {exc}") is None:
                    log.warning("%s failed (%s: %s); retrying", what, type(exc).__name__, exc)
                await asyncio.sleep(min(1.0, self.guard.interval_s))

    async def dead_letter(self, rej: Rejected, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        self.monitor.on_dead_letter(rej.reason)
        letter = rej.letter(topic, partition, offset, value)
        await self.dead.send(key=rej.reason.encode(), value=letter.model_dump_json().encode())

    # -- stage 1 -----------------------------------------------------------------------------
    async def stage1(self, events: Sequence[Any]) -> None:
        """Decode a batch and forward its stage records -- one bundle per stage-2 partition --
        acknowledged before the batch's input offsets can be committed."""
        out = await self.decide(events)
        await self.publishing("publishing stage records", partial(self.forward.start))
        bundles = bundle((self.forward.partition_for(key), key, value) for key, value in out)
        await self.publishing("publishing stage records", partial(
            self.forward.publish, [(key, value) for _, key, value in bundles], [p for p, _, _ in bundles]))

    async def decide(self, events: Sequence[Any]) -> list[tuple[bytes, bytes]]:
        """Decide a batch in order (:func:`~stream_app.worker.decode.stage1_pass`); records naming a
        query not known yet wait (bounded, off the event loop) for the queries topic to catch
        up -- and the later records of their source partition wait with them."""
        out: list[tuple[bytes, bytes]] = []
        records = [(e.value, e.message.partition) for e in events]
        pending = list(range(len(events)))
        started = time.monotonic()
        grace = self.grace_budget.available(started)  # bounded per minute, not only per batch
        wait = UnknownQueryWait(started, grace, QUERY_PATIENCE_S)
        first = True
        while pending:
            step = stage1_pass([records[i] for i in pending], self.queries.known, wait.may_wait(time.monotonic()),
                               self.s.max_producers)
            for j, results in step.done:
                await self.emit_stage1(events[pending[j]], results, out)
            pending = [pending[j] for j in step.waiting]
            if pending:
                if not first:
                    await asyncio.sleep(wait.pause_s(time.monotonic()))
                if await self.queries.refresh() and not wait.caught_up:
                    wait = replace(wait, caught_up=True)
                first = False
        if not first:  # some record waited for its query
            waited = time.monotonic() - started
            self.grace_budget.spend(time.monotonic(), min(grace, waited))
            if waited >= WAIT_SAID_S:
                log.warning("stage 1 held %d record(s) %.0fs for their queries to be readable", len(events), waited)
        return out

    async def emit_stage1(self, event: Any, results: Sequence[Any], out: list[tuple[bytes, bytes]]) -> None:
        msg = event.message
        for res in results:  # a marker set: one result per marker
            if isinstance(res, Rejected):
                await self.dead_letter(res, msg.topic, msg.partition, msg.offset, event.value)
            else:
                self.monitor.on_record("batch" if isinstance(res, BatchPartial) else "marker")
                out.append((res.window.key, encode_partial(res)))
        seen = [(r.query_id, r.query_version, r.epoch) for r in results if not isinstance(r, Rejected)]
        gaps = self.gap_finder.gaps(msg.partition, seen, self.queries.known)
        out += [(g.window.key, encode_partial(g)) for g in gaps]

    # -- stage 2 -----------------------------------------------------------------------------
    async def stage2(self, events: Sequence[Any]) -> None:
        started = time.monotonic()
        plan = by_partition(((e.message.partition, e.value) for e in events), split_bundle)
        for part, entries in plan:
            pairs = [(events[i], raw) for i, raw in entries]
            try:
                await self.publishing("publishing estimates", partial(self.apply, part, pairs, started))
            except Exception:  # find the record(s) at fault one by one; the rest still count
                log.exception("stage 2 failed on a batch of partition %s; retrying record by record", part)
                for e, raw in pairs:
                    try:
                        await self.publishing("publishing estimates", partial(self.apply, part, [(e, raw)], started))
                    except Exception as exc:
                        log.exception("stage 2 failed on partition %s offset %s", part, e.message.offset)
                        await self.dead_letter(Rejected("internal_error", f"{type(exc).__name__}: {exc}"),
                                               e.message.topic, part, e.message.offset, raw)

    def load(self, wid: WindowId) -> WindowState | None:
        raw = self.windows.data.get(wid.key)
        return None if raw is None else WindowState.decode(raw)

    async def apply(self, part: int, entries: Sequence[tuple[Any, bytes]], started: float) -> None:
        """One stage-2 partition's share of a batch -- (event, stage record) pairs, several per
        event when it is a bundle: the policy, the closed epochs' estimates (acknowledged), then
        the state writes (acknowledged)."""
        wm_key = WM_PREFIX + str(part).encode()
        wm = Watermarks.decode(self.windows.data.get(wm_key))
        decoded = [decode_partial(raw) for _, raw in entries]
        await self.queries.ensure({(i.query_id, i.query_version) for i in decoded if not isinstance(i, Tick)},
                                  QUERY_PATIENCE_S)
        at = [j for j, i in enumerate(decoded) if not isinstance(i, EpochSummary)]  # the window policy's items
        items = [i for i in decoded if not isinstance(i, EpochSummary)]
        outcome = self.policy.apply(wm, self.load, self.queries.shape, items)
        for index, reason, detail in outcome.rejected:
            e, raw = entries[at[index]]
            await self.dead_letter(Rejected(reason, detail), e.message.topic, part, e.message.offset, raw)
        self.monitor.on_window_updates(outcome.reports, outcome.late, outcome.duplicates, outcome.newest)
        need = shuffled_needs(outcome, self.queries.known, self.output)
        if need and self.output.shuffled is not None:  # a bound may take ~1 s a call: never on the event loop
            await asyncio.get_running_loop().run_in_executor(None, self.output.shuffled.warm, need)
        results = epoch_outputs(outcome, self.queries.known, self.queries.estimators, self.output)
        summaries: list[EpochSummary] = []
        for rows, frames, done in publish_chunks(results, PUBLISH_CHUNK, self.s.rows_on, self.s.frames_on):
            await self.send_estimates(rows, frames)
            for res in done:
                self.monitor.on_epoch_closed(res)
                self.day.on_epoch_closed(res)
                self.monitor.on_epochs_published(time.monotonic() - started)
                if rolls_up(res.query):  # 30-s queries only: a span query's estimate is its flow
                    summaries.append(summary_of(res))
        rolled = await self.roll(summaries, [i for i in decoded if isinstance(i, EpochSummary)])
        writes = [(wid.key, st.encode()) for wid, st in outcome.touched.items()]
        writes += [(rid.key, st.encode()) for rid, st in rolled.touched.items()]
        if wm.dirty:
            writes.append((wm_key, wm.encode()))
        await self.write(part, writes)

    async def roll(self, decided: list[EpochSummary], arrived: list[EpochSummary]) -> RollupOutcome:
        """Send the summaries of the epochs this batch decided to their rollups (keyed by their
        hour), acknowledged before the windows' states are written: a crash in between sends
        them again, and a rollup ignores a repeat. Then add the summaries that ``arrived`` to
        this partition's rollups and publish the rollups they decide (acknowledged)."""
        forward = [(route_key(x), encode_partial(x)) for x in decided]
        if forward:  # partition_for needs a started producer: stage 2 of a restart may come first
            await self.forward.start()
        await self.forward.publish(forward, [self.forward.partition_for(k) for k, _ in forward])
        rolled = self.rollup_policy.apply(self.load_rollup, arrived, partial(version_window, self.queries.known))
        results = rollup_outputs(rolled, self.queries.known, self.queries.estimators, self.output)
        for rows, frames, done in publish_chunks(results, PUBLISH_CHUNK, self.s.rows_on, self.s.frames_on):
            await self.send_estimates(rows, frames)
            for res in done:
                self.monitor.on_rollup(res)
        return rolled

    async def send_estimates(self, rows: list[tuple[bytes, bytes]], frames: list[tuple[bytes, bytes]]) -> None:
        """Publish rows and frames alike, acknowledged (before any state write)."""
        pending = await self.sink.send(rows)
        if self.frames is not None:
            pending += await self.frames.send(frames)
        await self.sink.wait(pending)

    def load_rollup(self, rid: RollupId) -> RollupState | None:
        return None if (raw := self.windows.data.get(rid.key)) is None else RollupState.decode(raw)

    async def write(self, part: int, writes: list[tuple[bytes, bytes]]) -> None:
        """Write window states: to the changelog, acknowledged, then to the local store. The
        caller returns -- and Faust may commit its input offsets -- only after this."""
        if self.s.fault_state_write_delay_s:  # fault injection: a slow changelog (tests/integration/test_crash.py)
            await asyncio.sleep(self.s.fault_state_write_delay_s)
        await self.state.publish(writes, [part] * len(writes))
        for key, value in writes:
            self.windows.data[key] = value

    # -- ground truth and the clock ------------------------------------------------------------
    def ground_truth(self, value: bytes) -> None:
        try:
            t = decode_record(value)
        except ValueError:
            return
        if isinstance(t, GroundTruth):
            missing = frozenset(t.no_truth)
            flows = [math.nan if station in missing else float(flow)
                     for station, flow in zip(t.stations, t.flows, strict=True)]
            self.monitor.on_truth(t.epoch, t.stations, flows)

    async def tick(self) -> None:
        await self.queries.refresh()
        self.day.follow(self.queries.every_version())
        value = encode_partial(Tick(time.time()))
        try:
            for p in range(self.s.internal_partitions):
                await self.partials.send(key=b"tick", value=value, partition=p)
        except BROKER_ERRORS as exc:  # the next tick tries again; a lost broker is the guard's verdict
            log.warning("could not send the wall-clock tick (%s: %s)", type(exc).__name__, exc)


def create_app(settings: WorkerSettings, registry: CollectorRegistry | None = None) -> faust.App:
    """The Faust app: each callback hands its input to :class:`StreamWorker`."""
    s = settings
    install_recovery_fix()  # Faust's end of recovery drops fetched records otherwise (faust_recovery.py)
    registry = registry or CollectorRegistry()
    app = _faust_app(s)
    _faust_sensors(app, registry)
    w = StreamWorker(s, app, registry)
    _metrics_page(app, registry, w.monitor.arrays, s.instance_token)

    @app.agent(w.reports)
    async def stage1(stream: Any) -> Any:
        async for events in stream.take_events(s.batch_records, within=s.stage1_batch_wait_s):
            await w.stage1(events)

    @app.agent(w.partials)
    async def stage2(stream: Any) -> Any:
        async for events in stream.take_events(s.batch_records, within=s.stage2_batch_wait_s):
            await w.stage2(events)

    @app.agent(w.truth)
    async def ground_truth(stream: Any) -> Any:
        async for value in stream:
            w.ground_truth(value)

    app.timer(interval=s.tick_interval_s)(w.tick)
    app.task(w.start)
    app.closers = [w.close]  # type: ignore[attr-defined]
    _ready_page(app)
    _debug_page(app)
    app.metrics_registry = registry  # type: ignore[attr-defined]
    app.estimates_sink = w.sink  # type: ignore[attr-defined]
    app.broker_guard = w.guard  # type: ignore[attr-defined]
    return app


def _debug_page(app: faust.App) -> None:
    @app.page("/debug/tasks")
    async def tasks_page(self: Any, request: Any) -> Any:
        """Where this worker waits: every task's await chain, every thread's stack (code
        locations only; :mod:`stream_app.worker.introspect`)."""
        from aiohttp.web import Response

        return Response(text=describe(consumer_state(app)))


def _ready_page(app: faust.App) -> None:
    @app.page("/ready")
    async def ready_page(self: Any, request: Any) -> Any:
        """200 once this worker has partitions and its tables are recovered, else 503."""
        from aiohttp.web import Response

        recovered = app.tables.recovery.completed.is_set()  # type: ignore[attr-defined]
        ok = recovered and not app.rebalancing and bool(app.consumer.assignment())
        return Response(text="ready\n" if ok else "not ready\n", status=200 if ok else 503)


def watched_topics(s: WorkerSettings) -> list[str]:
    """The topics whose loss (gone, or recreated by a restarted broker) means the broker is lost."""
    return sorted({s.reports_topic, s.queries_topic, s.truth_topic, s.partials_topic, s.changelog_topic,
                   s.estimates_topic, s.dead_letter_topic, *([s.frames_topic] if s.frames_on else [])})


def ensure_stream_topics(s: WorkerSettings) -> dict[str, str]:
    """Create every topic the worker uses, with explicit partition counts, before it starts
    (auto-created topics would get the broker's default and Faust would refuse them). Returns
    their ids once the broker shows them all (the guard's baseline)."""
    from schemas.kafka_io import ensure_topics

    return ensure_topics(s, {
        s.reports_topic: s.partitions, s.queries_topic: 1, s.truth_topic: 1,
        s.partials_topic: s.internal_partitions, s.changelog_topic: s.internal_partitions,
        s.estimates_topic: s.internal_partitions, s.dead_letter_topic: 1,
        f"{s.app_id}-__assignor-__leader": 1,
        **({s.frames_topic: s.internal_partitions} if s.frames_on else {}),
    }, compacted={s.queries_topic, s.changelog_topic})


def _stop_on_loss(s: WorkerSettings, guard: BrokerGuard, exit_lost: Callable[[BrokerLost], NoReturn],
                  reason: str) -> None:
    """The guard's verdict: ask Faust to stop (its own graceful path, SIGTERM), and report the
    loss through ``exit_lost`` at once if Faust has not started, else after the stop grace."""

    def deadline_exit() -> None:
        if guard.settle():
            exit_lost(broker_lost(s, guard.lost or "unknown"))

    # What the stop logs (connection errors, cancelled tasks) is noise next to the one line.
    logging.disable(logging.CRITICAL)
    timer = threading.Timer(stop_grace_s(s.broker_loss_timeout_s), deadline_exit)
    timer.daemon = True
    timer.start()
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # Faust has not started yet
        deadline_exit()
    else:
        os.kill(os.getpid(), signal.SIGTERM)


def run_worker(s: WorkerSettings, exit_lost: Callable[[BrokerLost], NoReturn]) -> int:
    """Run one worker until SIGTERM/SIGINT (Faust's worker handles both gracefully), or until
    its broker is lost: then :class:`~schemas.kafka_io.BrokerLost` once the worker has stopped
    -- or, if stopping takes longer than :func:`~stream_app.guard.stop_grace_s` (Faust flushes
    its producer first, which does not end while the broker is gone), ``exit_lost(lost)``
    straight from the guard's deadline: it must end the process (the command line's is the
    one-line error and exit code 7, ``stream_app/cli/worker.py``)."""
    from .faust_worker import QuickStopWorker

    client_logs(logging.WARNING)
    topic_ids = ensure_stream_topics(s)
    app = create_app(s)
    guard: BrokerGuard = app.broker_guard  # type: ignore[attr-defined]
    guard.know(topic_ids)  # the baseline: the topics as they are once ensured, never before they exist
    worker = QuickStopWorker(app, loglevel=s.log_level, quiet=True, redirect_stdouts=False)

    guard.start(partial(_stop_on_loss, s, guard, exit_lost))
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if guard.lost is None:
            raise
    finally:
        guard.stop()
    if guard.lost is not None:
        if not guard.settle():  # the deadline is reporting it and ending the process
            threading.Event().wait()
        raise broker_lost(s, guard.lost)
    return 0
