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

The parts: the set-up, once, in the parent (:mod:`~producers.replay.plan`: the day, the fleet
and what sized it, the topics and queries, as a frozen :class:`~producers.replay.plan.ReplayPlan`
handed to every producer); what one producer sends for an epoch, without I/O
(:mod:`~producers.replay.epoch`); the paths out, one :class:`~producers.replay.transport.Transport`
each (:mod:`~producers.replay.transport`: straight to the reports topic, or through the shuffler
over Kafka or HTTP); a producer's epoch loop (:mod:`~producers.replay.producer`); the parent's
run of one producer or of producer processes (:mod:`~producers.replay.run`); what a replay did
(:mod:`~producers.replay.summary`).
"""

from __future__ import annotations

from schemas import active_queries

from ..counters import EPOCHS_DONE
from ..devices import KIND_HEADER, device_records, send_device_reports
from ..queries import default_queries, planned_flow_params
from .epoch import counted_span_reports
from .plan import (
    TRIP_FLEET_BASIS,
    EmptyData,
    check_broker,
    default_fleet,
    fleet_and_basis,
    fleet_size_for,
    load_day,
)
from .producer import wait_for_peers
from .run import replay
from .summary import ReplayLost, ReplaySummary
from .transport import send_markers, send_round

__all__ = ["EPOCHS_DONE", "KIND_HEADER", "TRIP_FLEET_BASIS", "EmptyData", "ReplayLost", "ReplaySummary",
           "active_queries", "check_broker", "counted_span_reports", "default_fleet", "default_queries",
           "device_records", "fleet_and_basis", "fleet_size_for", "load_day", "planned_flow_params", "replay",
           "send_device_reports", "send_markers", "send_round", "wait_for_peers"]
