"""What a replay did (:class:`ReplaySummary`), and the end of a replay that lost its broker
(:class:`ReplayLost`, with what the broker had acknowledged until then)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from schemas.cap_drops import CapDrops
from schemas.kafka_io import BrokerLost

from ..trip_stats import PassageDistribution

__all__ = ["ReplayLost", "ReplaySummary"]


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
