"""What one producer sends for one epoch, computed without I/O (the replay's pure part, as
:mod:`stream_app.shuffler.release` is the shuffler's): which queries it answers now
(:func:`epoch_work`: every active 30-s query, and each span query whose span ends whole now)
and, query by query, its devices' privatized reports (:func:`epoch_outputs`). What it changes
is this producer's state in memory (:class:`ProducerShare`): its devices' day ledger, its span
tracker and its summary's counts. The transports (:mod:`producers.replay.transport`) send it.

>>> from datetime import datetime, timedelta, timezone
>>> t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> def query(name, span_s=30):
...     return Query(query_id=name, analyst_id="a", version=1, sensors=(11, 12), mechanism="unary",
...                  population=9, span_s=span_s, t_start=t0, t_end=t0 + timedelta(days=1))
>>> flows, hourly = query("flows"), query("hourly", span_s=90)
>>> ended = SpanDue(hourly, 60, True, None, frozenset({12}))
>>> work = epoch_work(5, 62, t0, [flows, hourly], [ended], {11})
>>> [q.query_id for q in work.answering], work.span_of
(['flows', 'hourly'], {'hourly:v1': (60, frozenset({12}))})
>>> cut = SpanDue(hourly, 57, False, "the replay did not cover the span from its first epoch", frozenset())
>>> [q.query_id for q in epoch_work(5, 59, t0, [flows, hourly], [cut], set()).answering]
['flows']
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

from estimators import DayLedger
from estimators.ledger import ShuffledDayLedger
from estimators.per_station import StationCounts
from schemas import Query

from ..fleet import Device, EpochReports, epoch_rng, fleet_share, privatize, query_truth_counts
from ..pems import TrafficDay
from ..settings import ReplaySettings
from ..spans import SpanDue, SpanTracker, span_reports
from ..stopping import Stops
from ..trip_spans import ProducerTrips
from .plan import ReplayPlan
from .summary import ReplaySummary

__all__ = ["EpochWork", "ProducerShare", "QueryOutput", "counted_span_reports", "epoch_outputs", "epoch_work"]

IntArray = npt.NDArray[np.int64]


@dataclass
class ProducerShare:
    """One producer's share of the fleet through a replay: its index of ``count``, the data's
    stations, what its devices accept, the day ledger that stands for each of them (every device
    of a producer answers the same queries), its span tracker (and the fleet that drives all day,
    ``--fleet-model trips``) and the counts of its summary."""

    index: int
    count: int
    stations: IntArray
    device: Device
    ledger: DayLedger | ShuffledDayLedger | None
    spans: SpanTracker
    trips: ProducerTrips | None
    summary: ReplaySummary

    @classmethod
    def start(cls, plan: ReplayPlan, index: int, count: int, day: TrafficDay) -> ProducerShare:
        s = plan.settings
        device = Device(s.device_epsilon_limit, frozenset(s.device_blacklist), day_caps=s.fleet_model == "trips")
        ledger: DayLedger | ShuffledDayLedger | None = None
        if s.device_daily_budget is not None:  # through the shuffler: its release at its min_crowd
            ledger = (ShuffledDayLedger(s.device_daily_budget, min_crowd=s.shuffler_min_crowd)
                      if s.via_shuffler else DayLedger(s.device_daily_budget))
        trips = (ProducerTrips(day, s.start_epoch, plan.fleet, s.seed, index, count)
                 if s.fleet_model == "trips" else None)
        spans = SpanTracker(s.seed, fleet_share(plan.fleet, index, count), day.stations, index, trips)
        summary = ReplaySummary(fleet_size=plan.fleet, data_quality=day.quality.summary())
        return cls(index, count, day.stations, device, ledger, spans, trips, summary)


@dataclass(frozen=True)
class EpochWork:
    """One epoch of the replay (``i``-th from its first): the queries answered now, the span
    queries among them by record key with their span's first epoch and the stations without a
    reading in some epoch of it (``span_of``), and the data's stations without a reading now
    (``no_data``, PeMS ids)."""

    i: int
    epoch: int
    when: datetime
    no_data: frozenset[int]
    answering: tuple[Query, ...]
    span_of: dict[str, tuple[int, frozenset[int]]]


def epoch_work(i: int, epoch: int, when: datetime, current: Sequence[Query], due: Sequence[SpanDue],
               no_data: Collection[int]) -> EpochWork:
    """What is answered at ``epoch``: every 30-s query of ``current`` (the active ones), and the
    span queries whose span ends whole now (``due``, :meth:`SpanTracker.step`'s)."""
    whole = [d for d in due if d.whole]
    return EpochWork(i, epoch, when, frozenset(no_data),
                     tuple([q for q in current if not q.is_span] + [d.query for d in whole]),
                     {d.query.record_key: (d.start, d.readings_missing) for d in whole})


@dataclass(frozen=True)
class QueryOutput:
    """A query's reports of this producer's devices, and the epoch they carry (a span's first)."""

    query: Query
    epoch: int
    reports: EpochReports


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


def query_output(plan: ReplayPlan, share: ProducerShare, work: EpochWork, q: Query, row: IntArray) -> QueryOutput:
    """``q``'s reports of this producer's devices at ``work``'s epoch (``row``: its vehicles per
    station, :func:`producers.fleet.split_fleet`'s), refusals counted: a span query's one report
    per device for the span, else this epoch's. Pairs are mixed unless the devices go through
    the shuffler (there each device's report is its own)."""
    s = plan.settings
    mix_pairs = not s.via_shuffler
    if q.record_key in work.span_of:  # one report per device for the span: epoch = its first
        start = work.span_of[q.record_key][0]
        er = counted_span_reports(q, share.spans, s, share.index, start, share.device, share.ledger, mix_pairs,
                                  share.summary)
    else:
        start = work.epoch
        tc = StationCounts(query_truth_counts(row, share.stations, q))
        er = privatize(q, tc, epoch_rng(s.seed, q, work.epoch, share.index), s.mode, share.device, share.ledger,
                       work.when.date().isoformat(), mix_pairs=mix_pairs)
    if er.refused:
        share.summary.refused[q.query_id] += er.refused
        share.summary.refusal_reasons[q.query_id] = er.refusal_reason or ""
    return QueryOutput(q, start, er)


def epoch_outputs(plan: ReplayPlan, share: ProducerShare, work: EpochWork, row: IntArray, halt: Stops
                  ) -> Iterator[QueryOutput]:
    """Every answered query's :func:`query_output`, in order, each computed only when asked for
    and only while the epoch is not cut short (``halt``): a query after a stop is neither
    privatized nor charged to the devices' day."""
    for q in work.answering:
        if halt.requested:
            return
        yield query_output(plan, share, work, q, row)
