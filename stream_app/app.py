"""The Faust worker: reports -> per-epoch windows -> estimates, dead letters and metrics.

Topology (one or many workers in one consumer group give the same result):

* **stage 1** (``reports`` topic, keyed by random batch ids): decode and validate each record
  against its query (:mod:`stream_app.decode`), reduce a batch to its per-output counts, and
  forward it -- re-keyed by ``(query, version, epoch)`` and tagged with its source partition --
  to the internal ``partials`` topic. Stateless. Anything bad goes to the dead-letter topic.
* **stage 2** (``partials``): one changelog-backed table of windows
  (:mod:`stream_app.windows`); batches add up, batch ids deduplicate (in the same table value
  as the counts, so a replay after a crash never counts twice), markers and the watermark
  decide when an epoch closes; a closed epoch becomes estimate records and metrics.

Faust's windowed tables are not used: they close windows by the wall clock and keep their
expiry schedule in memory (see shared/reference/BROKER.md). Here every closing decision is
made from data in the changelog-backed table, so it survives a restart.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from typing import Any

import faust
from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest

from estimators import crowd_size
from producers.pems import epoch_start
from schemas import GroundTruth, Query, decode_record
from schemas.estimates import Estimate
from schemas.kafka_io import QueryReader

from .decode import REASONS, Rejected, to_partials
from .estimate import QueryEstimators, estimates_for
from .metrics import StreamMetrics
from .settings import WorkerSettings
from .windows import Partial, Watermarks, Window

__all__ = ["QueryCache", "create_app", "ensure_stream_topics", "run_worker"]

log = logging.getLogger(__name__)
EPOCH_S = 30
WM_PREFIX = "__wm__:"
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
        # BROKER.md: with the embedded broker, changelog recovery is exact only if every
        # record is its own batch; group joins take half the session timeout.
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
    metrics = StreamMetrics(registry)
    metrics.know_reasons(REASONS)
    _faust_sensors(app, registry)
    newest: dict[str, int] = {}  # query -> newest epoch seen / closed, for the lag gauge
    closed_upto: dict[str, int] = {}
    queries = QueryCache(s)
    n_source = s.partitions

    reports = app.topic(s.reports_topic, key_serializer="raw", value_serializer="raw", partitions=s.partitions)
    partials = app.topic(s.partials_topic, key_serializer="raw", value_serializer="raw",
                         partitions=s.internal_partitions)
    estimates = app.topic(s.estimates_topic, key_serializer="raw", value_serializer="raw")
    dead = app.topic(s.dead_letter_topic, key_serializer="raw", value_serializer="raw")
    truth = app.topic(s.truth_topic, key_serializer="raw", value_serializer="raw")
    # changelog topic: "<app id>-windows-changelog" (settings.changelog_topic), JSON values
    windows = app.Table("windows", default=None, partitions=s.internal_partitions, key_type=str)

    async def _dead(rej: Rejected, topic: str, partition: int, offset: int, value: bytes | None) -> None:
        metrics.dead_letters.labels(rej.reason).inc()
        letter = rej.letter(topic, partition, offset, value)
        await dead.send(key=rej.reason.encode(), value=letter.model_dump_json().encode())

    @app.agent(reports)
    async def stage1(stream: Any) -> Any:
        async for event in stream.events():
            msg = event.message
            try:
                out = to_partials(event.value, msg.partition, queries.get)
            except Exception as exc:  # never crash on a record; keep it for inspection
                log.exception("stage 1 failed on %s/%s@%s", msg.topic, msg.partition, msg.offset)
                out = Rejected("internal_error", f"{type(exc).__name__}: {exc}")
            if isinstance(out, Rejected):
                await _dead(out, msg.topic, msg.partition, msg.offset, event.value)
                continue
            metrics.records.labels(out.kind).inc()
            await partials.send(key=out.key.encode(), value=out.to_bytes())

    def _close(win: Window, reason: str, wm: Watermarks, key: str) -> list[Estimate]:
        q = queries.get(win.query_id, win.query_version)
        win.close(reason)  # type: ignore[arg-type]
        wm.untrack(key)
        if q is None:
            return []
        qe = queries.estimators(q)
        out = estimates_for(qe, win, reason, epoch_start(win.epoch), s.confidences,  # type: ignore[arg-type]
                            s.min_participants)
        metrics.closed.labels(q.query_id, reason).inc()
        metrics.refused.labels(q.query_id).inc(win.refused())
        if win.missing_batches():
            metrics.missing_batches.labels(q.query_id).inc(win.missing_batches())
        closed_upto[q.query_id] = max(closed_upto.get(q.query_id, win.epoch), win.epoch)
        metrics.last_closed.labels(q.query_id).set(closed_upto[q.query_id])
        for r, n in enumerate(win.reports):
            metrics.epoch_reports.labels(q.query_id, str(r)).set(n)
        if out:
            metrics.epoch_participants.labels(q.query_id).set(out[0].participants)
        metrics.epsilon.labels(q.query_id, q.mechanism).set(q.epsilon)
        if q.mechanism == "alp" and out and out[0].participants:
            crowd = crowd_size(out[0].participants, q.build().params["pisNo"], q.build().params["pi3"])
            metrics.crowd.labels(q.query_id, "mean").set(crowd.mean)
            metrics.crowd.labels(q.query_id, "p01").set(crowd.p01)
        for e in out:
            labels = (e.query_id, e.mechanism, e.estimator, str(e.station))
            if e.withheld is not None:
                metrics.suppressed.labels(e.query_id).inc()
                continue
            metrics.estimate.labels(*labels).set(e.estimate or 0.0)
            for b in e.bounds:
                metrics.lower.labels(*labels, f"{b.confidence:g}").set(b.lower)
                metrics.upper.labels(*labels, f"{b.confidence:g}").set(b.upper)
        return out

    @app.agent(partials)
    async def stage2(stream: Any) -> Any:
        async for event in stream.events():
            part = event.message.partition
            wm_key = f"{WM_PREFIX}{part}"
            try:
                p = Partial.from_bytes(event.value)
                wm_raw = windows.get(wm_key)
                wm = Watermarks.from_dict(wm_raw)
                published: list[Estimate] = []
                if p.kind == "tick":
                    for key in list(wm.open):
                        epoch = wm.open_epochs[key]
                        age = p.now_s - (epoch + 1) * EPOCH_S
                        if s.wall_clock_grace_s < age < s.live_horizon_s:
                            win = Window.from_dict(windows[key])
                            published += _close(win, "wall_clock", wm, key)
                            windows[key] = win.to_dict()
                else:
                    q = queries.get(p.query_id, p.query_version)
                    if q is None:  # stage 1 validated it; only a deleted query gets here
                        continue
                    metrics.know_query(q.query_id)
                    raw = windows.get(p.key)
                    if raw is None and wm.too_old(p.epoch, n_source, s.allowed_lateness_epochs):
                        metrics.late.labels(p.query_id).inc()
                        continue
                    win = (Window.from_dict(raw) if raw is not None else
                           Window.new(p.query_id, p.query_version, p.epoch, q.n_rounds, queries.estimators(q).width))
                    result = win.add(p)
                    if result == "late":
                        metrics.late.labels(p.query_id).inc()
                    elif result == "duplicate":
                        metrics.duplicates.labels(p.query_id).inc()
                    else:
                        if p.kind == "batch":
                            metrics.reports.labels(p.query_id).inc(p.reports)
                        if raw is None:
                            wm.track(p.key, p.epoch)
                    wm.see(p.source_partition, p.epoch)
                    newest[p.query_id] = max(newest.get(p.query_id, p.epoch), p.epoch)
                    metrics.newest_seen.labels(p.query_id).set(newest[p.query_id])
                    if not win.closed and win.markers_complete(n_source):
                        published += _close(win, "markers", wm, p.key)
                    windows[p.key] = win.to_dict()
                    for key in wm.due(n_source, s.allowed_lateness_epochs):
                        other = Window.from_dict(windows[key])
                        published += _close(other, "watermark", wm, key)
                        windows[key] = other.to_dict()
                if wm.to_dict() != wm_raw:  # a changelog write only when the watermark state changed
                    windows[wm_key] = wm.to_dict()
                for e in published:
                    await estimates.send(key=str(e.station).encode(), value=e.model_dump_json().encode())
                    metrics.epoch_lag.labels(e.query_id).set(
                        newest.get(e.query_id, 0) - closed_upto.get(e.query_id, 0))
            except Exception as exc:
                log.exception("stage 2 failed on partition %s offset %s", part, event.message.offset)
                await _dead(Rejected("internal_error", f"{type(exc).__name__}: {exc}"), event.message.topic,
                            part, event.message.offset, event.value)

    @app.agent(truth)
    async def ground_truth(stream: Any) -> Any:
        async for value in stream:
            try:
                t = decode_record(value)
            except ValueError:
                continue
            if isinstance(t, GroundTruth):
                for station, flow in zip(t.stations, t.flows, strict=True):
                    metrics.truth.labels(str(station)).set(flow)
                metrics.truth_epoch.set(t.epoch)

    @app.timer(interval=s.tick_interval_s)
    async def tick() -> None:
        queries.refresh()
        now = time.time()
        for p in range(s.internal_partitions):
            await partials.send(key=b"tick", value=Partial("tick", now_s=now).to_bytes(), partition=p)

    app.metrics_registry = registry  # type: ignore[attr-defined]
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
