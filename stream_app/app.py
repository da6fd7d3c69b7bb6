"""The Faust worker: reports -> per-epoch windows -> estimates, dead letters and metrics.

Topology (one or many workers in one consumer group give the same result):

* **stage 1** (``reports`` topic, keyed by random batch ids): decode and validate each record
  against its query (:mod:`stream_app.decode`), reduce it to a typed stage record carrying
  its count array (:mod:`stream_app.records`) and forward it -- re-keyed by window
  ``(query, version, epoch)`` and tagged with its source partition -- to the internal
  ``partials`` topic. Stateless. Anything bad goes to the dead-letter topic.
* **stage 2** (``partials``), batched: takes many stage records at once and, per stage-2
  partition, reads the touched windows from one changelog-backed table, lets the pure
  :class:`~stream_app.windows.WindowPolicy` add them and decide which epochs close, turns
  closed epochs into estimate arrays (:mod:`stream_app.estimate`), publishes them (batched,
  acknowledged), then writes each touched window once. Offsets are committed only after
  that (Faust acks the batch's events when the loop body returns, and flushes the producer
  before committing).

Faust's windowed tables are not used: they close windows by the wall clock and keep their
expiry schedule in memory. Here every closing decision is made from data in the
changelog-backed table -- window states and each partition's watermark state -- so it
survives a restart.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import faust
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from schemas import GroundTruth, Query, decode_record
from schemas.kafka_io import QueryReader

from .decode import REASONS, Rejected, to_partials
from .estimate import QueryEstimators, epoch_result
from .metrics import StreamMonitor
from .publish import EstimatesSink
from .records import BatchPartial, Partial, Tick, WindowId, decode_partial, encode_partial
from .settings import WorkerSettings
from .windows import Watermarks, WindowPolicy, WindowState

__all__ = ["QueryCache", "create_app", "ensure_stream_topics", "run_worker"]

log = logging.getLogger(__name__)
WM_PREFIX = b"__wm__\x1f"
MISS_TTL_S = 5.0


class QueryCache:
    """Every query version, followed from the queries topic; estimators built once each."""

    def __init__(self, settings: WorkerSettings) -> None:
        self._settings = settings
        self._reader: QueryReader | None = None
        self._estimators: dict[str, QueryEstimators] = {}
        self._misses: dict[tuple[str, int], float] = {}

    @property
    def reader(self) -> QueryReader:
        if self._reader is None:
            self._reader = QueryReader(self._settings)
            self._reader.catch_up()
        return self._reader

    def refresh(self) -> None:
        self.reader.poll(0)

    def get(self, query_id: str, version: int) -> Query | None:
        key = (query_id, version)
        q = self.reader.queries.get(key)
        if q is not None:
            return q
        # Published a moment ago? Read the topic to its end once more -- but at most once per
        # MISS_TTL_S per unknown query: a flood of bad records must not stall the event loop.
        now = time.monotonic()
        if now - self._misses.get(key, -math.inf) < MISS_TTL_S:
            self.reader.poll(0)
            return self.reader.queries.get(key)
        self.reader.catch_up()
        q = self.reader.queries.get(key)
        if q is None:
            self._misses[key] = now
        return q

    def estimators(self, q: Query) -> QueryEstimators:
        qe = self._estimators.get(q.record_key)
        if qe is None:
            qe = self._estimators[q.record_key] = QueryEstimators.build(q)
        return qe

    def shape(self, wid: WindowId) -> tuple[int, int] | None:
        """(rounds, width) of a window's query, None if the query is unknown."""
        q = self.get(wid.query_id, wid.query_version)
        return None if q is None else (q.n_rounds, q.width)


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

    @app.page("/metrics")
    async def metrics_page(self: Any, request: Any) -> Any:
        from aiohttp.web import Response

        return Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}, status=200)


def _credentials(s: WorkerSettings) -> Any:
    if s.security_protocol == "PLAINTEXT":
        return None
    ssl_context = None
    if s.security_protocol in ("SSL", "SASL_SSL"):
        ssl_context = ssl.create_default_context(cafile=str(s.ssl_cafile) if s.ssl_cafile else None)
        if s.ssl_certfile:
            ssl_context.load_cert_chain(str(s.ssl_certfile), str(s.ssl_keyfile) if s.ssl_keyfile else None)
    if s.security_protocol.startswith("SASL"):
        password = s.sasl_plain_password.get_secret_value() if s.sasl_plain_password else ""
        return faust.SASLCredentials(username=s.sasl_plain_username or "", password=password,
                                     mechanism=s.sasl_mechanism or "PLAIN", ssl_context=ssl_context)
    return faust.SSLCredentials(ssl_context)


def create_app(settings: WorkerSettings, registry: CollectorRegistry | None = None) -> faust.App:
    s = settings
    registry = registry or CollectorRegistry()
    s.worker_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        s.app_id,
        broker=[f"kafka://{hp}" for hp in s.bootstrap_servers.split(",")],
        broker_credentials=_credentials(s),
        store=s.store,
        datadir=str(s.worker_dir / "{conf.name}"),
        topic_partitions=s.internal_partitions,
        topic_replication_factor=1,
        # With the embedded broker, changelog recovery is exact only if every record is its own
        # batch (its end offsets are wrong). Only changelog writes (one per touched window per
        # batch), stage records and dead letters go through this producer; estimates have
        # their own batching producer (stream_app.publish).
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
    monitor = StreamMonitor(registry)
    monitor.know_reasons(REASONS)
    _faust_sensors(app, registry)
    queries = QueryCache(s)
    policy = WindowPolicy(n_source_partitions=s.partitions, allowed_lateness_epochs=s.allowed_lateness_epochs,
                          wall_clock_grace_s=s.wall_clock_grace_s, live_horizon_s=s.live_horizon_s)
    sink = EstimatesSink(s, s.estimates_topic)

    reports = app.topic(s.reports_topic, key_serializer="raw", value_serializer="raw", partitions=s.partitions)
    partials = app.topic(s.partials_topic, key_serializer="raw", value_serializer="raw",
                         partitions=s.internal_partitions)
    dead = app.topic(s.dead_letter_topic, key_serializer="raw", value_serializer="raw")
    truth = app.topic(s.truth_topic, key_serializer="raw", value_serializer="raw")
    # changelog topic: "<app id>-windows-changelog" (settings.changelog_topic); binary values
    windows = app.Table("windows", default=None, partitions=s.internal_partitions, key_type=bytes,
                        value_type=bytes)  # bytes: the raw codec both ways

    async def _dead(rej: Rejected, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        monitor.on_dead_letter(rej.reason)
        letter = rej.letter(topic, partition, offset, value)
        await dead.send(key=rej.reason.encode(), value=letter.model_dump_json().encode())

    @app.agent(reports)
    async def stage1(stream: Any) -> Any:
        async for event in stream.events():
            msg = event.message
            try:
                out = to_partials(event.value, msg.partition, queries.get, s.max_producers)
            except Exception as exc:  # never crash on a record; keep it for inspection
                log.exception("stage 1 failed on %s/%s@%s", msg.topic, msg.partition, msg.offset)
                out = Rejected("internal_error", f"{type(exc).__name__}: {exc}")
            if isinstance(out, Rejected):
                await _dead(out, msg.topic, msg.partition, msg.offset, event.value)
                continue
            monitor.on_record("batch" if isinstance(out, BatchPartial) else "marker")
            await partials.send(key=out.window.key, value=encode_partial(out))

    def _load(wid: WindowId) -> WindowState | None:
        raw = windows.data.get(wid.key)
        return None if raw is None else WindowState.decode(raw)

    def _write(part: int, key: bytes, value: bytes) -> None:
        windows.data[key] = value
        windows.send_changelog(part, key, value)

    async def _apply(part: int, items: Sequence[Partial], started: float) -> None:
        """One stage-2 partition's share of a batch: policy, estimates, then state writes."""
        wm_key = WM_PREFIX + str(part).encode()
        wm = Watermarks.decode(windows.data.get(wm_key))
        outcome = policy.apply(wm, _load, queries.shape, items)
        monitor.on_window_updates(outcome.reports, outcome.late, outcome.duplicates, outcome.newest)
        records: list[tuple[bytes, bytes]] = []
        results = []
        for st, reason in outcome.closed:
            q = queries.get(st.wid.query_id, st.wid.query_version)
            if q is None:
                continue
            res = epoch_result(queries.estimators(q), st, reason, s.confidences, s.min_participants)
            results.append(res)
            records.extend(res.render())
        await sink.publish(records)  # acknowledged before the closed windows are written
        if results:
            monitor.on_epochs_published(time.monotonic() - started)
        for res in results:
            monitor.on_epoch_closed(res)
        for wid, st in outcome.touched.items():
            _write(part, wid.key, st.encode())
        if wm.dirty:
            _write(part, wm_key, wm.encode())

    @app.agent(partials)
    async def stage2(stream: Any) -> Any:
        async for events in stream.take_events(s.stage2_batch_records, within=s.stage2_batch_wait_s):
            started = time.monotonic()
            by_part: dict[int, list[Any]] = defaultdict(list)
            for event in events:
                by_part[event.message.partition].append(event)
            for part, evs in by_part.items():
                try:
                    await _apply(part, [decode_partial(e.value) for e in evs], started)
                except Exception:  # find the record(s) at fault one by one; the rest still count
                    log.exception("stage 2 failed on a batch of partition %s; retrying record by record", part)
                    for e in evs:
                        try:
                            await _apply(part, [decode_partial(e.value)], started)
                        except Exception as exc:
                            log.exception("stage 2 failed on partition %s offset %s", part, e.message.offset)
                            await _dead(Rejected("internal_error", f"{type(exc).__name__}: {exc}"),
                                        e.message.topic, part, e.message.offset, e.value)

    @app.agent(truth)
    async def ground_truth(stream: Any) -> Any:
        async for value in stream:
            try:
                t = decode_record(value)
            except ValueError:
                continue
            if isinstance(t, GroundTruth):
                missing = frozenset(t.no_truth)
                monitor.on_truth(t.epoch, t.stations,
                                 [math.nan if s in missing else float(f) for s, f in zip(t.stations, t.flows,
                                                                                         strict=True)])

    @app.timer(interval=s.tick_interval_s)
    async def tick() -> None:
        queries.refresh()
        value = encode_partial(Tick(time.time()))
        for p in range(s.internal_partitions):
            await partials.send(key=b"tick", value=value, partition=p)

    @app.task
    async def start_sink() -> None:
        await sink.start()

    app.metrics_registry = registry  # type: ignore[attr-defined]
    app.estimates_sink = sink  # type: ignore[attr-defined]
    return app


def ensure_stream_topics(s: WorkerSettings) -> None:
    """Create every topic the worker uses, with explicit partition counts, before it starts
    (auto-created topics would get the broker's default and Faust would refuse them)."""
    from schemas.kafka_io import ensure_topics

    ensure_topics(s, {
        s.reports_topic: s.partitions, s.queries_topic: 1, s.truth_topic: 1,
        s.partials_topic: s.internal_partitions, s.changelog_topic: s.internal_partitions,
        s.estimates_topic: s.internal_partitions, s.dead_letter_topic: 1,
        f"{s.app_id}-__assignor-__leader": 1,
    }, compacted={s.queries_topic, s.changelog_topic})


def run_worker(s: WorkerSettings) -> int:
    """Run one worker until SIGTERM/SIGINT (Faust's worker handles both gracefully)."""
    from faust.worker import Worker

    logging.getLogger("kafka").setLevel(logging.WARNING)
    ensure_stream_topics(s)
    app = create_app(s)
    worker = Worker(app, loglevel=s.log_level, quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0
