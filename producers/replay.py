"""Replay a PeMS traffic day as privatized vehicle reports into Kafka.

Per epoch and producer process: split the fleet over the stations (seeded, identical in every
process), run each vehicle's device for every active query (newest version whose T_start has
passed, switching only at epoch boundaries), send the reports in columnar batches keyed by
random batch ids, then to every partition one record with its end-of-epoch markers (one per
(query, round)).

A query with a longer span (``Query.span_s``: 300 s, an hour, ...) is answered once per span:
its vehicles keep their identity through the span (:class:`producers.spans.SpanTracker`), and
at the span's last epoch each device privatizes the set of stations it passed and sends ONE
report whose epoch is the span's first (``Query.span_start``), on every path (batches or
tallies with their markers, or --via-shuffler device reports over Kafka or HTTP); its markers
are sent with it, never before. Only whole spans are reported: a span that began before the
replay's first epoch (or the query's start) is not sent, counted in the summary
(``spans_skipped``) and logged with the reason. A span the replay stops in -- a stop, or the
end of the replayed epochs -- is marked interrupted with nothing sent (its markers carry the
span's first epoch and zero reports), as a stop epoch is.

The summary counts what the broker acknowledged (reports inside acknowledged records), next to
what was handed to the producer. A broker lost mid-run ends the replay within
``broker_loss_timeout_s`` with :class:`ReplayLost`, which carries that summary.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from kafka import KafkaAdminClient

from estimators import DayLedger
from estimators.ledger import ShuffledDayLedger
from estimators.registry import Layout
from schemas import (
    MAX_MARKERS_PER_SET,
    EndOfEpoch,
    EndOfEpochSet,
    GroundTruth,
    Query,
    active_queries,
    encode_batch,
    encode_json,
    new_batch_id,
)
from schemas.cap_drops import CapDrops, cap_drop_lines
from schemas.connection import client_logs
from schemas.enrollment import EnrollmentError
from schemas.kafka_io import (
    BrokerLost,
    BrokerUnavailable,
    QueryReader,
    broker_lost,
    connect,
    ensure_topics,
    publish_query,
)
from schemas.settings import cache_dir

from .corridors import build_corridors
from .counters import EPOCHS_DONE, SLOTS, ProducerCounts
from .devices import KIND_HEADER, DeviceRequests, device_records, send_device_reports, send_source_epoch
from .fleet import (
    Device,
    EpochReports,
    FleetTooSmall,
    epoch_rng,
    fleet_share,
    privatize,
    query_truth_counts,
    split_fleet,
)
from .http_client import DeviceClient
from .pems import TrafficDay, epoch_start, load_cached, read_metadata
from .progress import Progress, what_limits
from .queries import default_queries, planned_flow_params
from .settings import ReplaySettings
from .sink import ReportSink
from .spans import SpanTracker, fleet_need, span_reports
from .stopping import Halt, StopFlag, StopPlan, Stops, children_ignore_stop_signals, pause_until
from .synthetic import write_synthetic_day
from .trip_spans import ProducerTrips
from .trip_stats import DEFAULT_CAPS, PassageDistribution, cap_summary
from .trips import default_fleet_size, trip_fleet_need

__all__ = ["EPOCHS_DONE", "TRIP_FLEET_BASIS", "EmptyData", "ReplayLost", "ReplaySummary", "active_queries",
           "check_broker", "counted_span_reports", "default_fleet", "default_queries", "device_records",
           "fleet_and_basis", "fleet_size_for", "load_day", "planned_flow_params", "replay", "send_device_reports",
           "send_markers", "send_round", "wait_for_peers"]

log = logging.getLogger(__name__)


class EmptyData(ValueError):
    """The input holds no usable readings (for the selected day)."""


def load_day(settings: ReplaySettings) -> TrafficDay:
    """The traffic day to replay: a real PeMS file, or the synthetic default (cached)."""
    cache = settings.data_dir / "cache"  # parsed days, keyed by the file's path, size and mtime
    if settings.pems_raw is not None:
        day = load_cached(settings.pems_raw, cache, day=settings.day)
        meta_path = settings.meta
    elif settings.pems_5min is not None:
        day = load_cached(settings.pems_5min, cache, five_minute=True, day=settings.day)
        meta_path = settings.meta
    else:
        folder = settings.data_dir / (f"synthetic-{settings.synthetic_stations}-{settings.synthetic_seed}-"
                                      f"{settings.synthetic_date:%Y%m%d}-{settings.weekend}")
        raw = folder / f"d07_text_station_raw_{settings.synthetic_date:%Y_%m_%d}.txt.gz"
        meta = folder / f"d07_text_meta_{settings.synthetic_date:%Y_%m_%d}.txt"
        if not (raw.exists() and meta.exists()):
            write_synthetic_day(folder, settings.synthetic_stations, settings.synthetic_seed,
                                settings.synthetic_date, settings.weekend)
        day = load_cached(raw, cache, day=settings.day)
        meta_path = settings.meta or meta
    if meta_path is not None:
        meta_map, _ = read_metadata(meta_path)
        day.attach_metadata(meta_map)
    if day.epochs.size == 0:
        raise EmptyData(f"no usable rows in the data ({day.quality.summary()})")
    return day


#: what sizes a fleet that drives trips all day (``--fleet-model trips``), whatever the queries
TRIP_FLEET_BASIS = "the papers' vehicles per passage or the peak hour's trips, if more; vehicles drive trips all day"


def fleet_size_for(day: TrafficDay, settings: ReplaySettings, spans: Iterable[int] = ()) -> int:
    """Fleet size: at least the day's peak total flow, and for span queries (``spans``: their
    ``span_s``) the largest span flow of a station with room (:func:`producers.spans.fleet_need`);
    grown by query expansion (:func:`fleet_and_basis`, without the why)."""
    return fleet_and_basis(day, settings, spans)[0]


def fleet_and_basis(day: TrafficDay, settings: ReplaySettings, spans: Iterable[int] = ()) -> tuple[int, str]:
    """:func:`fleet_size_for`, and what sized it (the replay's fleet line says it)."""
    trips = settings.fleet_model == "trips"
    need, why = fleet_need(day.epochs, day.flows, settings.producers, () if trips else spans)
    if trips and settings.fleet_size is None:  # the papers' vehicles per passage,
        counts = np.where(day.has_truth, day.flows, 0)  # or what the peak hour's trips need, if more
        need = max(need, default_fleet_size(int(counts.sum())),
                   trip_fleet_need(counts, build_corridors(day.stations, day.meta)))
    size = settings.fleet_size if settings.fleet_size is not None else need
    if size < need:
        raise FleetTooSmall(f"--fleet-size {size} is smaller than {why}")
    return max(size, settings.expand_to or 0), TRIP_FLEET_BASIS if trips else why


def default_fleet(day: TrafficDay, settings: ReplaySettings) -> int:
    """The fleet for the day's default queries (``settings.mechanisms``): :func:`fleet_size_for`
    with the spans of its span queries (a vehicle passes a station once a span)."""
    return fleet_size_for(day, settings, settings.mechanism_spans)


@dataclass
class ReplaySummary:
    """What a replay did. ``reports``/``records``: the reports and report records the broker
    acknowledged; ``reports_sent``/``records_sent``: those handed to the producer (more only
    when deliveries failed or the broker was lost). ``epochs``: epochs completed (flushed and
    marked). ``fleet_basis``: why the fleet has the size it has (:func:`producers.spans.fleet_need`). Span
    queries (this producer's, with one producer the whole replay's): ``spans_sent`` span reports
    sent, ``spans_skipped`` spans not covered whole (``span_skip_reasons``), ``passages_dropped``
    passages over the query's caps (``max_passages``, ``max_passages_day``), the caps' bias;
    ``day_cap_drops``: the day cap's drops per query, span (its first epoch) and station id,
    where it dropped any (one producer: a simulation diagnostic; ``--cap-drops-file``).
    ``vehicle_day`` (``--fleet-model trips``, one producer): the passages per vehicle of the
    replayed day and the share of them a day cap would drop."""

    epochs: int = 0
    reports: int = 0
    records: int = 0
    reports_sent: int = 0
    records_sent: int = 0
    delivery_failures: int = 0
    failure_reasons: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    refusal_reasons: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False
    fleet_size: int = 0
    fleet_basis: str = ""
    data_quality: str = ""
    elapsed_s: float = 0.0
    spans_sent: Counter[str] = field(default_factory=Counter)
    spans_skipped: Counter[str] = field(default_factory=Counter)
    span_skip_reasons: dict[str, str] = field(default_factory=dict)
    passages_dropped: Counter[str] = field(default_factory=Counter)
    day_cap_drops: CapDrops = field(default_factory=dict)
    vehicle_day: PassageDistribution | None = None


class ReplayLost(BrokerLost):
    """The broker was lost mid-replay; ``summary`` holds what it had acknowledged until then."""

    def __init__(self, message: str, summary: ReplaySummary) -> None:
        super().__init__(message)
        self.summary = summary


_REASON_BYTES = 400  # a producer process's loss reason, shared with the parent


def _producer_loop(settings: ReplaySettings, index: int, count: int, t0: float,
                   counters: Any | None = None, day: TrafficDay | None = None,
                   peers: list[Any] | None = None, plan: StopPlan | None = None) -> ReplaySummary:
    """One producer's share of the replay; :class:`ReplayLost` if the broker is lost."""
    with StopFlag() as stop:
        return _run_epochs(settings, index, count, t0, counters, stop, day or load_day(settings), peers or [],
                           plan or StopPlan.local(count))


def wait_for_peers(peers: list[Any], i: int, stop: StopFlag, plan: StopPlan | None = None) -> None:
    """Lockstep: start epoch i only once every producer has finished epoch i - 2, so producers
    never drift apart by more than one epoch -- less than the stream app's allowed lateness,
    whose watermark would otherwise close an epoch before a slower producer's data arrives."""
    while (peers and min(c[EPOCHS_DONE] for c in peers) < i - 1 and not stop.wait(0.002)
           and not (plan is not None and plan.requested)):
        pass


def counted_span_reports(q: Query, spans: SpanTracker, settings: ReplaySettings, index: int, start: int,
                         device: Device, ledger: DayLedger | ShuffledDayLedger | None, mix_pairs: bool,
                         summary: ReplaySummary) -> EpochReports:
    """The producer's reports for ``q``'s span from epoch ``start`` (:func:`producers.spans.span_reports`),
    with what they sent and what the caps dropped (per station too) counted in ``summary``."""
    er, dropped = span_reports(q, spans, settings.seed, index, start, settings.mode, device, ledger,
                               mix_pairs=mix_pairs)
    summary.passages_dropped[q.query_id] += dropped
    if dropped and spans.station_drops is not None and spans.station_drops.any():
        at = np.flatnonzero(spans.station_drops)
        summary.day_cap_drops.setdefault(q.query_id, {})[start] = dict(
            zip((q.sensors[i] for i in at.tolist()), spans.station_drops[at].tolist(), strict=True))
    summary.spans_sent[q.query_id] += not er.refused
    return er


def _run_epochs(settings: ReplaySettings, index: int, count: int, t0: float, counters: Any | None,
                stop: StopFlag, day: TrafficDay, peers: list[Any], plan: StopPlan) -> ReplaySummary:
    fleet = fleet_size_for(day, settings)
    device = Device(settings.device_epsilon_limit, frozenset(settings.device_blacklist),
                    day_caps=settings.fleet_model == "trips")
    # --via-shuffler: this producer's vehicles are the enrolled devices first_device .. + its share
    enrollment = settings.enrollment() if settings.via_shuffler else None
    first_device = sum(fleet_share(fleet, k, count) for k in range(index))
    # every device of this producer answers the same queries: one ledger stands for each of them
    ledger: DayLedger | ShuffledDayLedger | None = None
    if settings.device_daily_budget is not None:  # through the shuffler: its release at its min_crowd
        ledger = (ShuffledDayLedger(settings.device_daily_budget, min_crowd=settings.shuffler_min_crowd)
                  if settings.via_shuffler else DayLedger(settings.device_daily_budget))
    producer_id = f"p{index}-{uuid.uuid4().hex[:8]}"
    client = (DeviceClient(settings.front_door_url, concurrency=settings.http_concurrency)
              if settings.via_shuffler and settings.transport == "http" else None)
    try:
        if client is not None:
            client.check()
        sink = ReportSink(settings, settings.device_topic if settings.via_shuffler else settings.reports_topic,
                          other_topics=([settings.truth_topic] if settings.truth else [])
                          + ([settings.source_topic] if settings.via_shuffler else []))
    except BaseException:
        if client is not None:
            client.close()
        raise
    reader = QueryReader(settings)
    reader.catch_up()
    summary = ReplaySummary(fleet_size=fleet, data_quality=day.quality.summary())
    trips = (ProducerTrips(day, settings.start_epoch, fleet, settings.seed, index, count)
             if settings.fleet_model == "trips" else None)
    spans = SpanTracker(settings.seed, fleet_share(fleet, index, count), day.stations, index, trips)
    epochs = day.epochs[settings.start_epoch:]
    flows = day.flows[settings.start_epoch:]
    truth_rows = day.has_truth[settings.start_epoch:]  # missing readings and dead detectors: no truth
    if settings.max_epochs is not None:
        epochs, flows = epochs[: settings.max_epochs], flows[: settings.max_epochs]
    lost: BrokerLost | None = None
    marked: int | None = None  # the last epoch marked

    def cut(i: int) -> bool:  # the stop epoch, to be cut short (StopPlan)
        if stop.requested:
            plan.request()
        return plan.cuts(i)

    try:
        if settings.via_shuffler and epochs.size:  # the shuffler's clock opens the first epoch
            send_source_epoch(sink, settings, int(epochs[0]), set(), False, index, count, opens=True)
        for i, (epoch_np, flow_row) in enumerate(zip(epochs, flows, strict=True)):
            if settings.speed > 0:  # a stop ends the wait; what follows the stop is not paced
                pause_until(t0 + i * 30.0 / settings.speed, stop, plan)
            if not (stop.requested or plan.requested):
                wait_for_peers(peers, i, stop, plan)
            if stop.requested:
                plan.request()
            begun = plan.begin(index, i)
            if begun == StopPlan.STOP:
                break
            epoch = int(epoch_np)
            when = epoch_start(epoch)
            reader.poll(0)
            current = active_queries(reader.queries.values(), when)
            no_truth = day.stations[~truth_rows[i]]  # cells without a reading: no truth, no data
            no_data = {int(s) for s in no_truth}
            split = split_fleet(settings.seed, epoch, flow_row, fleet, count) if begun == StopPlan.RUN else None
            # span queries: their vehicles placed for this epoch; the spans ending now
            due = spans.step(epoch, current, None if split is None else split[index], no_data)
            for d in due:
                if not d.whole:
                    summary.spans_skipped[d.query.query_id] += 1
                    summary.span_skip_reasons[d.query.query_id] = d.reason or ""
                    if index == 0:
                        log.warning("%s: the %d-s span from epoch %d is not reported: %s", d.query.query_id,
                                    d.query.span_s, d.start, d.reason)
            # what is answered now: every 30-s query, and the span queries whose span ends whole now
            answering = [q for q in current if not q.is_span] + [d.query for d in due if d.whole]
            span_of: dict[str, tuple[int, frozenset[int]]] = {d.query.record_key: (d.start, d.readings_missing)
                                                              for d in due if d.whole}
            # every (query, round) is marked, also one cut before anything of it was sent
            sent: dict[tuple[str, int], dict[int, list[int]]] = {
                (q.record_key, r): {p: [0, 0] for p in sink.partitions} for q in answering for r in range(q.n_rounds)}
            by_key: dict[str, Query] = {q.record_key: q for q in answering}
            participants: dict[str, tuple[int, int]] = {}
            if split is not None:
                if settings.truth and index == 0:
                    truth = GroundTruth(epoch=epoch, epoch_start=when,
                                        stations=tuple(int(s) for s in day.stations),
                                        flows=tuple(int(f) for f in flow_row),
                                        no_truth=tuple(int(s) for s in no_truth))
                    sink.send(encode_json(truth), key=str(epoch).encode(), topic=settings.truth_topic,
                              headers=[(KIND_HEADER, b"ground_truth")])
                halt = Halt(cut, i)
                devices = DeviceRequests()
                for q in answering:
                    if halt.requested:
                        break
                    if q.record_key in span_of:  # one report per device for the span: epoch = its first
                        report_epoch = span_of[q.record_key][0]
                        er = counted_span_reports(q, spans, settings, index, report_epoch, device, ledger,
                                                  enrollment is None, summary)
                    else:
                        report_epoch = epoch
                        tc = query_truth_counts(split[index], day.stations, q)
                        er = privatize(q, tc, epoch_rng(settings.seed, q, epoch, index), settings.mode, device,
                                       ledger, when.date().isoformat(), mix_pairs=enrollment is None)
                    participants[q.query_id] = (er.participants, er.refused)
                    if er.refused:
                        summary.refused[q.query_id] += er.refused
                        summary.refusal_reasons[q.query_id] = er.refusal_reason or ""
                    if enrollment is not None and client is not None:  # --via-shuffler --transport http
                        devices.add(device_records(q, report_epoch, er, enrollment, first_device))
                        continue
                    if enrollment is not None:  # --via-shuffler over Kafka
                        send_device_reports(sink, q, report_epoch, er, halt, enrollment, first_device)
                        continue
                    for r in range(q.n_rounds):
                        if er.participants:
                            send_round(sink, settings, producer_id, q, report_epoch, r, er.layout, er.rounds[r],
                                       er.reports[r], sent[(q.record_key, r)], halt)
                if client is not None:
                    devices.send(client, sink, settings.device_topic, halt)
                sink.flush()
            # the stop epoch is marked interrupted with exactly what was sent of it
            interrupted = begun == StopPlan.EMPTY or cut(i)
            if settings.via_shuffler:  # the shuffler writes the markers of what it releases, with this
                send_source_epoch(sink, settings, epoch, no_data, interrupted, index, count,
                                  ends=interrupted or i == epochs.size - 1)
            else:
                send_markers(sink, producer_id, index, count, epoch, sent, by_key, participants, settings.mode,
                             interrupted, no_data, spans=span_of)
            marked = epoch
            if interrupted:
                break
            summary.epochs += 1
            if counters is not None:
                _share(counters, summary, sink)
        if marked is not None and not settings.via_shuffler:  # the span the replay stops or ends in
            open_spans = spans.open_spans(marked)
            send_markers(sink, producer_id, index, count, marked,
                         {(q.record_key, r): {p: [0, 0] for p in sink.partitions}
                          for q, _, _ in open_spans for r in range(q.n_rounds)},
                         {q.record_key: q for q, _, _ in open_spans}, {}, settings.mode, True,
                         spans={q.record_key: (start, gaps) for q, start, gaps in open_spans})
    except BrokerLost as exc:  # the epoch in progress is left unmarked: the broker is gone
        lost = exc
    finally:
        summary.interrupted = stop.requested or plan.requested
        try:
            sink.close()
        except BrokerLost as exc:
            lost = lost or exc
        finally:
            reader.close()
            if client is not None:
                client.close()
            summary.reports, summary.records = sink.acked_reports, sink.acked_batches
            summary.reports_sent, summary.records_sent = sink.sent_reports, sink.sent_batches
            summary.delivery_failures = sink.failed
            summary.failure_reasons = Counter(sink.failure_reasons)
            if counters is not None:
                _share(counters, summary, sink, lost=int(lost is not None), done=1)
    if trips is not None and count == 1 and trips.fleet.t:  # the whole fleet's day, read from the trips
        caps = {q.max_passages_day for q in reader.queries.values() if q.max_passages_day is not None}
        summary.vehicle_day = cap_summary(trips.passages, sorted(caps | set(DEFAULT_CAPS)))
    if lost is not None:
        raise ReplayLost(str(lost), summary) from None
    return summary


def _share(counters: Any, summary: ReplaySummary, sink: ReportSink, **ended: int) -> None:
    """This producer's totals into its shared counters (the parent reads them); ``ended``: how
    it ended (``done``, ``lost``), kept as they were if not given."""
    replace(ProducerCounts.read(counters), epochs_done=summary.epochs, reports=sink.acked_reports,
            records=sink.acked_batches, sent_reports=sink.sent_reports, sent_records=sink.sent_batches,
            failed=sink.failed, refused=sum(summary.refused.values()), **ended).write(counters)


def send_round(sink: ReportSink, settings: ReplaySettings, producer_id: str, q: Query, epoch: int, r: int,
                layout: Layout, arrays: dict[str, np.ndarray], reports: int, per_part: dict[int, list[int]],
                stop: Stops) -> None:
    base = {"query_id": q.query_id, "query_version": q.version, "epoch": epoch, "round": r,
            "producer_id": producer_id, "n_stations": q.n_stations, "n_outputs": q.build().n_outputs}
    if layout == "counts":  # a tally: one record (the wire's kind "tally" carries layout "counts")
        chunks = [(reports, arrays)]
        kind = "tally"
    else:  # per-vehicle reports, cut into batches of at most batch_size
        first = next(iter(arrays.values()))
        size = settings.batch_size
        chunks = [(min(size, first.size - s), {k: v[s:s + size] for k, v in arrays.items()})
                  for s in range(0, first.size, size)]
        kind = "reports"
    for n, chunk in chunks:
        if stop.requested:
            return
        batch_id = new_batch_id()
        key = batch_id.encode()
        partition = sink.partition_for(key)
        value = encode_batch({**base, "kind": kind, "layout": layout, "batch_id": batch_id, "reports": n}, chunk)
        sink.send(value, key=key, partition=partition, headers=[(KIND_HEADER, kind.encode())], reports=n)
        per_part[partition][0] += n
        per_part[partition][1] += 1


def send_markers(sink: ReportSink, producer_id: str, index: int, count: int, epoch: int,
                 sent: dict[tuple[str, int], dict[int, list[int]]], by_key: dict[str, Query],
                 participants: dict[str, tuple[int, int]], mode: Any, interrupted: bool,
                 no_data: set[int] | frozenset[int] = frozenset(),
                 spans: dict[str, tuple[int, frozenset[int]]] | None = None) -> None:
    """Every (query, round)'s end-of-epoch markers of ``epoch``, one record per partition.

    ``spans``: the span queries (by record key) marked now -- their markers carry the span's
    first epoch and the stations without a reading in any epoch of it (PeMS ids), not this
    epoch's."""
    by_set: dict[tuple[int, int, bool], list[EndOfEpoch]] = {}  # a set shares partition, epoch, interrupted
    spans = spans or {}
    for (key, r), per_part in sent.items():
        q = by_key[key]
        mark_epoch, missing = spans.get(key, (epoch, no_data))
        gaps = tuple(i + 1 for i, s in enumerate(q.sensors) if s in missing)
        total_reports = sum(v[0] for v in per_part.values())
        total_batches = sum(v[1] for v in per_part.values())
        got, refused = participants.get(q.query_id, (0, 0))
        for p, (n_rep, n_bat) in per_part.items():
            by_set.setdefault((p, mark_epoch, interrupted), []).append(EndOfEpoch(
                producer_id=producer_id, producer_index=index, producer_count=count, query_id=q.query_id,
                query_version=q.version, epoch=mark_epoch, round=r, partition=p, reports_to_partition=n_rep,
                batches_to_partition=n_bat, reports_total=total_reports, batches_total=total_batches,
                participants=got, refused=refused, mode=mode, interrupted=interrupted, readings_missing=gaps))
    # one record per partition for every (query, round) of an epoch: the worker's cost is per record
    for (p, _, _), markers in by_set.items():
        for start in range(0, len(markers), MAX_MARKERS_PER_SET):
            marker_set = EndOfEpochSet(markers=tuple(markers[start:start + MAX_MARKERS_PER_SET]))
            sink.send(encode_json(marker_set), key=f"eoe-{producer_id}".encode(), partition=p,
                      headers=[(KIND_HEADER, b"end_of_epoch")])
    sink.flush()


def _child(settings: ReplaySettings, index: int, count: int, t0: float, counters: Any, peers: list[Any],
           reason: Any = None, kafka_log_level: int = logging.WARNING, plan: StopPlan | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    client_logs(kafka_log_level)  # as quiet as the parent's
    why = None
    try:
        _producer_loop(settings, index, count, t0, counters, peers=peers, plan=plan)
    except ReplayLost as exc:  # counted (its counters say lost); the parent reports it
        why = str(exc)
    except BrokerUnavailable as exc:  # lost before its loop (connecting, reading the queries): the same loss
        replace(ProducerCounts.read(counters), lost=1).write(counters)
        why = str(broker_lost(settings, f"no answer from the broker: {str(exc).split(';')[0]}"))
    if why is not None and reason is not None:
        reason.value = why.encode()[:_REASON_BYTES - 1]


def _check_enrolled(settings: ReplaySettings, fleet: int) -> None:
    """--via-shuffler: the fleet stands in for enrolled devices; every vehicle needs one."""
    if settings.via_shuffler:
        enrolled = settings.enrollment().devices
        if fleet > enrolled:
            raise EnrollmentError(f"a fleet of {fleet:,} vehicles but {enrolled:,} enrolled devices; give "
                                  f"--enrolled-devices {fleet} (the shuffler's too)")


def check_broker(settings: ReplaySettings) -> None:
    """The broker answers, or :class:`BrokerUnavailable` (exit 3): at once when nothing listens
    there (:func:`schemas.kafka_io.connect`). Checked before the day is read -- a large PeMS file
    is parsed for many seconds, a large synthetic day generated for minutes."""
    connect("admin", settings, KafkaAdminClient).close()


def replay(settings: ReplaySettings, progress: bool = True) -> ReplaySummary:
    """Replay the day with ``settings.producers`` producer processes; returns the totals (and
    writes what a day cap dropped to ``settings.cap_drops_file``, if given)."""
    summary = _replay(settings, progress)
    if settings.cap_drops_file is not None:
        settings.cap_drops_file.write_text("\n".join(cap_drop_lines(summary.day_cap_drops)) + "\n")
    return summary


def _replay(settings: ReplaySettings, progress: bool) -> ReplaySummary:
    started = time.time()
    check_broker(settings)  # before the day: no parsing or generating for a broker that is not there
    day = load_day(settings)
    fleet = default_fleet(day, settings) if settings.default_queries else fleet_size_for(day, settings)
    _check_enrolled(settings, fleet)  # before any topic is created
    ensure_topics(settings)
    if settings.via_shuffler:
        ensure_topics(settings, {settings.device_topic: settings.device_partitions, settings.source_topic: 1})
    reader = QueryReader(settings)
    try:
        reader.catch_up()
        have = dict(reader.queries)
    finally:
        reader.close()
    if not have and settings.default_queries:
        for q in default_queries(day, fleet, settings.mechanisms, settings.flow_day_budget,
                                   settings.day_budget, cache_dir("plans")):
            publish_query(settings, q)
            have[(q.query_id, q.version)] = q
    # a vehicle passes a station at most once a span: the fleet holds the largest span flow (one for all producers)
    spans = {q.span_s for q in have.values()}
    fleet, basis = fleet_and_basis(day, settings, spans)
    _check_enrolled(settings, fleet)  # the topic's queries may need more than the defaults did
    settings = settings.model_copy(update={"fleet_size": fleet})
    total = day.epochs.size - settings.start_epoch
    if settings.max_epochs is not None:
        total = min(total, settings.max_epochs)
    bar = Progress(total, progress, speed=settings.speed, limit=what_limits(settings))
    t0 = time.time()
    if settings.producers == 1:
        counters = [0] * SLOTS

        class _Tick(list[int]):
            def __setitem__(self, i: Any, v: Any) -> None:
                super().__setitem__(i, v)
                if i == SLOTS - 1:  # a whole ProducerCounts written
                    c = ProducerCounts.read(self)
                    bar.update(c.epochs_done, c.reports, c.failed)

        try:
            summary = _producer_loop(settings, 0, 1, t0, _Tick(counters), day)
        except ReplayLost as exc:
            exc.summary.elapsed_s = time.time() - started
            exc.summary.fleet_basis = basis
            raise
        finally:
            bar.close()
        summary.elapsed_s = time.time() - started
        summary.fleet_basis = basis
        return summary
    ctx = mp.get_context("spawn")
    shared = [ctx.Array("q", SLOTS, lock=False) for _ in range(settings.producers)]
    reasons = [ctx.Array("c", _REASON_BYTES, lock=False) for _ in range(settings.producers)]
    plan_state = ctx.Array("q", 1 + settings.producers, lock=False)
    plan_state[0] = -1
    plan = StopPlan(plan_state, ctx.Lock())
    kafka_level = logging.getLogger("kafka").getEffectiveLevel()
    procs = [ctx.Process(target=_child, args=(settings, k, settings.producers, t0, shared[k], shared, reasons[k],
                                              kafka_level, plan), daemon=False)
             for k in range(settings.producers)]
    summary = ReplaySummary(fleet_size=fleet, data_quality=day.quality.summary(), fleet_basis=basis)
    with StopFlag() as stop:
        with children_ignore_stop_signals():
            for p in procs:
                p.start()
        try:
            while any(p.is_alive() for p in procs):
                now = ProducerCounts.total(shared)
                bar.update(now.epochs_done, now.reports, now.failed)
                failed = any(p.exitcode not in (0, None) for p in procs) or bool(now.lost)
                # Ctrl-C (here or in a producer), or a producer died or lost the broker: its peers
                # would wait for it. One stop epoch for all (StopPlan); SIGTERM wakes them to it
                if stop.wait(0.2) or plan.requested or failed:
                    summary.interrupted = not failed
                    plan.request()
                    for p in procs:  # graceful: children treat SIGTERM like the first Ctrl-C
                        if p.is_alive():
                            p.terminate()
                    for p in procs:  # a child's last flush waits at most the loss timeout
                        p.join(timeout=60 + settings.broker_loss_timeout_s)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
            bar.close()
    end = ProducerCounts.total(shared)
    summary.epochs, summary.reports, summary.records = end.epochs_done, end.reports, end.records
    summary.reports_sent, summary.records_sent = end.sent_reports, end.sent_records
    summary.delivery_failures = end.failed
    if end.refused:
        summary.refused["all queries"] = end.refused
    summary.elapsed_s = time.time() - started
    if end.lost:
        why = next((r.value.decode(errors="replace") for r, c in zip(reasons, shared, strict=True)
                    if ProducerCounts.read(c).lost and r.value), "")
        summary.interrupted = False
        raise ReplayLost(why or str(broker_lost(settings, "a producer process lost it")), summary)
    if any(p.exitcode not in (0, None) for p in procs) and not summary.interrupted:
        raise RuntimeError(f"producer processes failed: exit codes {[p.exitcode for p in procs]}")
    return summary
