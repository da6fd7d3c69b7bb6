"""One producer of a replay (a process of its own, or the parent when there is one): its epoch
loop -- paced, in lockstep with its peers (:func:`wait_for_peers`), stopped at the one stop
epoch of all (:class:`~producers.stopping.StopPlan`) -- what it computes for an epoch
(:mod:`producers.replay.epoch`) sent through its transport (:mod:`producers.replay.transport`),
and its counts shared with the parent (:class:`~producers.counters.ProducerCounts`)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import GroundTruth, active_queries, encode_json
from schemas.connection import client_logs
from schemas.kafka_io import BrokerLost, BrokerUnavailable, QueryReader, broker_lost

from ..counters import EPOCHS_DONE, ProducerCounts
from ..devices import KIND_HEADER
from ..fleet import split_fleet
from ..pems import TrafficDay, epoch_start
from ..sink import ReportSink
from ..spans import SpanDue
from ..stopping import Halt, StopFlag, StopPlan, pause_until
from ..trip_stats import DEFAULT_CAPS, cap_summary
from .epoch import EpochWork, ProducerShare, epoch_outputs, epoch_work
from .plan import ReplayPlan, load_day
from .summary import ReplayLost, ReplaySummary
from .transport import Transport, open_transport

__all__ = ["REASON_BYTES", "child", "producer_loop", "wait_for_peers"]

log = logging.getLogger("producers.replay")

IntArray = npt.NDArray[np.int64]

REASON_BYTES = 400  # a producer process's loss reason, shared with the parent


def wait_for_peers(peers: list[Any], i: int, stop: StopFlag, plan: StopPlan | None = None) -> None:
    """Lockstep: start epoch i only once every producer has finished epoch i - 2, so producers
    never drift apart by more than one epoch -- less than the stream app's allowed lateness,
    whose watermark would otherwise close an epoch before a slower producer's data arrives."""
    while (peers and min(c[EPOCHS_DONE] for c in peers) < i - 1 and not stop.wait(0.002)
           and not (plan is not None and plan.requested)):
        pass


def _share(counters: Any, summary: ReplaySummary, sink: ReportSink, **ended: int) -> None:
    """This producer's totals into its shared counters (the parent reads them); ``ended``: how
    it ended (``done``, ``lost``), kept as they were if not given."""
    replace(ProducerCounts.read(counters), epochs_done=summary.epochs, reports=sink.acked_reports,
            records=sink.acked_batches, sent_reports=sink.sent_reports, sent_records=sink.sent_batches,
            failed=sink.failed, refused=sum(summary.refused.values()), **ended).write(counters)


@dataclass
class _Epochs:
    """One producer's way through the replayed epochs."""

    plan: ReplayPlan
    share: ProducerShare
    transport: Transport
    reader: QueryReader
    day: TrafficDay
    t0: float
    counters: Any | None
    stop: StopFlag
    peers: list[Any]
    stops: StopPlan

    def cut(self, i: int) -> bool:
        """Is epoch ``i`` the stop epoch, to be cut short (:class:`StopPlan`)?"""
        if self.stop.requested:
            self.stops.request()
        return self.stops.cuts(i)

    def run(self) -> int | None:
        """Every epoch in turn, until the end or the stop epoch; the last epoch marked, if any."""
        s, day = self.plan.settings, self.day
        epochs, flows = day.epochs[s.start_epoch:], day.flows[s.start_epoch:]
        truth_rows = day.has_truth[s.start_epoch:]  # missing readings and dead detectors: no truth
        if s.max_epochs is not None:
            epochs, flows = epochs[: s.max_epochs], flows[: s.max_epochs]
        if epochs.size:
            self.transport.opening(int(epochs[0]))
        marked: int | None = None
        for i, (epoch, flow_row) in enumerate(zip(epochs, flows, strict=True)):
            begun = self._begin(i)
            if begun == StopPlan.STOP:
                break
            interrupted = self._epoch(i, int(epoch), flow_row, truth_rows[i], begun, last=i == epochs.size - 1)
            marked = int(epoch)
            if interrupted:
                break
            self.share.summary.epochs += 1
            if self.counters is not None:
                _share(self.counters, self.share.summary, self.transport.sink)
        return marked

    def _begin(self, i: int) -> int:
        """Paced, in lockstep: may epoch ``i`` begin (:meth:`StopPlan.begin`)?"""
        speed = self.plan.settings.speed
        if speed > 0:  # a stop ends the wait; what follows the stop is not paced
            pause_until(self.t0 + i * 30.0 / speed, self.stop, self.stops)
        if not (self.stop.requested or self.stops.requested):
            wait_for_peers(self.peers, i, self.stop, self.stops)
        if self.stop.requested:
            self.stops.request()
        return self.stops.begin(self.share.index, i)

    def _epoch(self, i: int, epoch: int, flow_row: IntArray, has_truth: np.ndarray, begun: int, last: bool) -> bool:
        """Epoch ``epoch``, run (its reports sent) or not (the stop epoch, not begun before the
        stop), then marked: interrupted with exactly what was sent of it, if it is the stop
        epoch (returned)."""
        share, when = self.share, epoch_start(epoch)
        self.reader.poll(0)
        current = active_queries(self.reader.queries.values(), when)
        no_truth = self.day.stations[~has_truth]  # cells without a reading: no truth, no data
        no_data = {int(s) for s in no_truth}
        split = (split_fleet(self.plan.settings.seed, epoch, flow_row, self.plan.fleet, share.count)
                 if begun == StopPlan.RUN else None)
        row = None if split is None else split[share.index]
        # span queries: their vehicles placed for this epoch; the spans ending now
        work = epoch_work(i, epoch, when, current, self._skipped(share.spans.step(epoch, current, row, no_data)),
                          no_data)
        self.transport.begin(work)
        if row is not None:
            self._send(work, row, flow_row, no_truth)
        interrupted = begun == StopPlan.EMPTY or self.cut(i)
        self.transport.mark(work, interrupted, last)
        return interrupted

    def _skipped(self, due: Sequence[SpanDue]) -> Sequence[SpanDue]:
        """The spans ending now that were not covered whole: counted, and logged (once, by producer 0)."""
        summary = self.share.summary
        for d in due:
            if not d.whole:
                summary.spans_skipped[d.query.query_id] += 1
                summary.span_skip_reasons[d.query.query_id] = d.reason or ""
                if self.share.index == 0:
                    log.warning("%s: the %d-s span from epoch %d is not reported: %s", d.query.query_id,
                                d.query.span_s, d.start, d.reason)
        return due

    def _send(self, work: EpochWork, row: IntArray, flow_row: IntArray, no_truth: IntArray) -> None:
        """A run epoch's ground truth (``--truth``, producer 0) and every answered query's reports."""
        s = self.plan.settings
        if s.truth and self.share.index == 0:
            truth = GroundTruth(epoch=work.epoch, epoch_start=work.when,
                                stations=tuple(int(x) for x in self.day.stations),
                                flows=tuple(int(f) for f in flow_row), no_truth=tuple(int(x) for x in no_truth))
            self.transport.sink.send(encode_json(truth), key=str(work.epoch).encode(), topic=s.truth_topic,
                                     headers=[(KIND_HEADER, b"ground_truth")])
        halt = Halt(self.cut, work.i)
        for out in epoch_outputs(self.plan, self.share, work, row, halt):
            self.transport.send(out, halt)
        self.transport.end(halt)


def _sum_up(summary: ReplaySummary, sink: ReportSink) -> None:
    """What the sink counted (the broker's acknowledgements, what was handed over) into ``summary``."""
    summary.reports, summary.records = sink.acked_reports, sink.acked_batches
    summary.reports_sent, summary.records_sent = sink.sent_reports, sink.sent_batches
    summary.delivery_failures = sink.failed
    summary.failure_reasons = Counter(sink.failure_reasons)


def _run_producer(plan: ReplayPlan, index: int, count: int, t0: float, counters: Any | None, stop: StopFlag,
                  day: TrafficDay, peers: list[Any], stops: StopPlan) -> ReplaySummary:
    transport = open_transport(plan, index, count)
    reader = QueryReader(plan.settings)
    reader.catch_up()
    share = ProducerShare.start(plan, index, count, day)
    summary = share.summary
    lost: BrokerLost | None = None
    try:
        transport.finish(_Epochs(plan, share, transport, reader, day, t0, counters, stop, peers, stops).run(),
                         share.spans)
    except BrokerLost as exc:  # the epoch in progress is left unmarked: the broker is gone
        lost = exc
    finally:
        summary.interrupted = stop.requested or stops.requested
        try:
            transport.close()
        except BrokerLost as exc:
            lost = lost or exc
        finally:
            reader.close()
            _sum_up(summary, transport.sink)
            if counters is not None:
                _share(counters, summary, transport.sink, lost=int(lost is not None), done=1)
    if share.trips is not None and count == 1 and share.trips.fleet.t:  # the whole fleet's day, from the trips
        caps = {q.max_passages_day for q in reader.queries.values() if q.max_passages_day is not None}
        summary.vehicle_day = cap_summary(share.trips.passages, sorted(caps | set(DEFAULT_CAPS)))
    if lost is not None:
        raise ReplayLost(str(lost), summary) from None
    return summary


def producer_loop(plan: ReplayPlan, index: int, count: int, t0: float, counters: Any | None = None,
                  day: TrafficDay | None = None, peers: list[Any] | None = None,
                  stops: StopPlan | None = None) -> ReplaySummary:
    """One producer's share of the replay; :class:`ReplayLost` if the broker is lost."""
    with StopFlag() as stop:
        return _run_producer(plan, index, count, t0, counters, stop, day or load_day(plan.settings), peers or [],
                             stops or StopPlan.local(count))


def child(plan: ReplayPlan, index: int, count: int, t0: float, counters: Any, peers: list[Any],
          reason: Any = None, kafka_log_level: int = logging.WARNING, stops: StopPlan | None = None) -> None:
    """A producer process's body: its loss reason (if it lost the broker) into ``reason``."""
    logging.basicConfig(level=logging.WARNING)
    client_logs(kafka_log_level)  # as quiet as the parent's
    why = None
    try:
        producer_loop(plan, index, count, t0, counters, peers=peers, stops=stops)
    except ReplayLost as exc:  # counted (its counters say lost); the parent reports it
        why = str(exc)
    except BrokerUnavailable as exc:  # lost before its loop (connecting, reading the queries): the same loss
        replace(ProducerCounts.read(counters), lost=1).write(counters)
        why = str(broker_lost(plan.settings, f"no answer from the broker: {str(exc).split(';')[0]}"))
    if why is not None and reason is not None:
        reason.value = why.encode()[:REASON_BYTES - 1]
