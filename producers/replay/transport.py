"""How one producer's reports leave it: a :class:`Transport` per path, chosen once
(:func:`open_transport`) -- straight to the reports topic (:class:`Direct`: columnar batches or
tallies, then this producer's end-of-epoch markers), or each device's report alone to the
shuffler (``--via-shuffler``: :class:`DeviceKafka` to the device topic, :class:`DeviceHttp`
through the front door, ``--transport http``), each epoch closed by its signed source note.

An epoch goes through a transport as :meth:`~Transport.begin`, one :meth:`~Transport.send` per
answered query (:func:`producers.replay.epoch.epoch_outputs`), :meth:`~Transport.end` once what
was sent is handed over (not for an epoch that was not run), then :meth:`~Transport.mark`; the
replay's first epoch is announced with :meth:`~Transport.opening`, its last followed by
:meth:`~Transport.finish`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Protocol

from estimators.reports import Round
from schemas import MAX_MARKERS_PER_SET, EndOfEpoch, EndOfEpochSet, Query, encode_batch, encode_json, new_batch_id
from schemas.enrollment import Enrollment

from ..devices import KIND_HEADER, DeviceRequests, device_records, send_device_reports, send_source_epoch
from ..fleet import fleet_share
from ..http_client import DeviceClient
from ..settings import ReplaySettings
from ..sink import ReportSink
from ..spans import SpanTracker
from ..stopping import Stops
from .epoch import EpochWork, QueryOutput
from .plan import ReplayPlan

__all__ = ["KIND_HEADER", "DeviceHttp", "DeviceKafka", "Direct", "Transport", "open_transport", "send_markers",
           "send_round"]

Sent = dict[tuple[str, int], dict[int, list[int]]]  # per (record key, round), per partition: [reports, batches]


class Transport(Protocol):
    """One path out of a producer (the module docstring says in what order it is called)."""

    sink: ReportSink  # every path's acknowledgements are counted here

    def opening(self, first_epoch: int) -> None: ...  # before the replay's first epoch
    def begin(self, work: EpochWork) -> None: ...
    def send(self, out: QueryOutput, halt: Stops) -> None: ...
    def end(self, halt: Stops) -> None: ...  # the epoch's reports handed over and flushed
    def mark(self, work: EpochWork, interrupted: bool, last: bool) -> None: ...
    def finish(self, marked: int | None, spans: SpanTracker) -> None: ...  # after the last epoch marked
    def close(self) -> None: ...


def send_round(sink: ReportSink, settings: ReplaySettings, producer_id: str, q: Query, epoch: int, r: int,
               rnd: Round, per_part: dict[int, list[int]], stop: Stops) -> None:
    """Round ``r`` of ``q`` as batches of at most ``settings.batch_size`` reports (a tally: one
    record), each under a fresh batch id; what went to each partition counted in ``per_part``."""
    base = {"query_id": q.query_id, "query_version": q.version, "epoch": epoch, "round": r,
            "producer_id": producer_id, "n_stations": q.n_stations, "n_outputs": q.build().n_outputs,
            "kind": rnd.kind, "layout": rnd.layout}
    for chunk in rnd.chunks(settings.batch_size):
        if stop.requested:
            return
        batch_id = new_batch_id()
        key = batch_id.encode()
        partition = sink.partition_for(key)
        n = chunk.n_reports
        value = encode_batch({**base, "batch_id": batch_id, "reports": n}, chunk.arrays())
        sink.send(value, key=key, partition=partition, headers=[(KIND_HEADER, rnd.kind.encode())], reports=n)
        per_part[partition][0] += n
        per_part[partition][1] += 1


def send_markers(sink: ReportSink, producer_id: str, index: int, count: int, epoch: int,
                 sent: Sent, by_key: dict[str, Query],
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


class Direct:
    """No shuffler: the reports straight to the reports topic (:func:`send_round`), and this
    producer's markers of every (query, round) answered (:func:`send_markers`), also of one cut
    before anything of it was sent, and at the end of the span queries' spans it stops in."""

    def __init__(self, settings: ReplaySettings, index: int, count: int, sink: ReportSink) -> None:
        self.settings, self.index, self.count, self.sink = settings, index, count, sink
        self.producer_id = f"p{index}-{uuid.uuid4().hex[:8]}"
        self.sent: Sent = {}
        self.by_key: dict[str, Query] = {}
        self.participants: dict[str, tuple[int, int]] = {}

    def _unsent(self, queries: Iterable[Query]) -> Sent:
        """Every (query, round) of ``queries``, nothing sent yet to any partition."""
        return {(q.record_key, r): {p: [0, 0] for p in self.sink.partitions}
                for q in queries for r in range(q.n_rounds)}

    def opening(self, first_epoch: int) -> None:
        pass

    def begin(self, work: EpochWork) -> None:
        self.sent = self._unsent(work.answering)
        self.by_key = {q.record_key: q for q in work.answering}
        self.participants = {}

    def send(self, out: QueryOutput, halt: Stops) -> None:
        q, er = out.query, out.reports
        self.participants[q.query_id] = (er.participants, er.refused)
        for r, rnd in enumerate(er.rounds if er.participants else []):  # no participants: nothing sent
            send_round(self.sink, self.settings, self.producer_id, q, out.epoch, r, rnd, self.sent[(q.record_key, r)],
                       halt)

    def end(self, halt: Stops) -> None:
        self.sink.flush()

    def mark(self, work: EpochWork, interrupted: bool, last: bool) -> None:
        send_markers(self.sink, self.producer_id, self.index, self.count, work.epoch, self.sent, self.by_key,
                     self.participants, self.settings.mode, interrupted, work.no_data, spans=work.span_of)

    def finish(self, marked: int | None, spans: SpanTracker) -> None:
        """The span the replay stops or ends in: marked interrupted, nothing sent."""
        if marked is None:
            return
        open_spans = spans.open_spans(marked)
        send_markers(self.sink, self.producer_id, self.index, self.count, marked,
                     self._unsent(q for q, _, _ in open_spans), {q.record_key: q for q, _, _ in open_spans}, {},
                     self.settings.mode, True, spans={q.record_key: (start, gaps) for q, start, gaps in open_spans})

    def close(self) -> None:
        self.sink.close()


class _ThroughShuffler:
    """--via-shuffler: this producer's vehicles are the enrolled devices ``first_device`` .. +
    its share; each epoch ends with its source note (the shuffler writes the markers of what it
    releases, with it)."""

    def __init__(self, settings: ReplaySettings, index: int, count: int, sink: ReportSink, enrollment: Enrollment,
                 first_device: int) -> None:
        self.settings, self.index, self.count, self.sink = settings, index, count, sink
        self.enrollment, self.first_device = enrollment, first_device

    def opening(self, first_epoch: int) -> None:  # the shuffler's clock opens the first epoch
        send_source_epoch(self.sink, self.settings, first_epoch, set(), False, self.index, self.count, opens=True)

    def begin(self, work: EpochWork) -> None:
        pass

    def end(self, halt: Stops) -> None:
        self.sink.flush()

    def mark(self, work: EpochWork, interrupted: bool, last: bool) -> None:
        send_source_epoch(self.sink, self.settings, work.epoch, work.no_data, interrupted, self.index, self.count,
                          ends=interrupted or last)

    def finish(self, marked: int | None, spans: SpanTracker) -> None:
        pass

    def close(self) -> None:
        self.sink.close()


class DeviceKafka(_ThroughShuffler):
    """Every device report as its own record to the device topic (librdkafka)."""

    def send(self, out: QueryOutput, halt: Stops) -> None:
        send_device_reports(self.sink, out.query, out.epoch, out.reports, halt, self.enrollment, self.first_device)


class DeviceHttp(_ThroughShuffler):
    """Every device's reports of the epoch as one request to the shuffler's front door."""

    def __init__(self, settings: ReplaySettings, index: int, count: int, sink: ReportSink, enrollment: Enrollment,
                 first_device: int, client: DeviceClient) -> None:
        super().__init__(settings, index, count, sink, enrollment, first_device)
        self.client = client
        self.requests = DeviceRequests()

    def begin(self, work: EpochWork) -> None:
        self.requests = DeviceRequests()

    def send(self, out: QueryOutput, halt: Stops) -> None:
        self.requests.add(device_records(out.query, out.epoch, out.reports, self.enrollment, self.first_device))

    def end(self, halt: Stops) -> None:
        self.requests.send(self.client, self.sink, self.settings.device_topic, halt)
        self.sink.flush()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.client.close()


def open_transport(plan: ReplayPlan, index: int, count: int) -> Transport:
    """Producer ``index``'s path out, its front door checked (``--transport http``) and its sink
    connected: to the device topic through the shuffler, else to the reports topic (and the
    truth topic, ``--truth``)."""
    s = plan.settings
    enrollment = s.enrollment() if s.via_shuffler else None
    first_device = sum(fleet_share(plan.fleet, k, count) for k in range(index))
    client = (DeviceClient(s.front_door_url, concurrency=s.http_concurrency)
              if s.via_shuffler and s.transport == "http" else None)
    try:
        if client is not None:
            client.check()
        others = ([s.truth_topic] if s.truth else []) + ([s.source_topic] if s.via_shuffler else [])
        sink = ReportSink(s, s.device_topic if s.via_shuffler else s.reports_topic, other_topics=others)
    except BaseException:
        if client is not None:
            client.close()
        raise
    if enrollment is None:
        return Direct(s, index, count, sink)
    if client is None:
        return DeviceKafka(s, index, count, sink, enrollment, first_device)
    return DeviceHttp(s, index, count, sink, enrollment, first_device, client)
