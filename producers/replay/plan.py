"""The replay's set-up, done once in the parent before any producer starts: the day to replay
(:func:`load_day`), the fleet and what sized it (:func:`fleet_and_basis`), checked against the
enrolled devices when the devices go through the shuffler, the topics, and the queries on the
queries topic (the day's defaults published when there are none). :func:`build_plan` gives them
as a frozen :class:`ReplayPlan`, which every producer process is handed as it is."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from kafka import KafkaAdminClient

from schemas import Query
from schemas.enrollment import EnrollmentError
from schemas.epochs import EPOCH_S
from schemas.kafka_io import QueryReader, connect, ensure_topics, publish_query
from schemas.settings import cache_dir

from ..corridors import build_corridors
from ..fleet import FleetTooSmall
from ..pems import TrafficDay, load_cached, read_metadata
from ..queries import default_queries
from ..settings import ReplaySettings
from ..spans import fleet_need
from ..synthetic import write_synthetic_day
from ..trips import default_fleet_size, trip_fleet_need

__all__ = ["TRIP_FLEET_BASIS", "EmptyData", "ReplayPlan", "build_plan", "check_broker", "default_fleet",
           "fleet_and_basis", "fleet_size_for", "load_day"]


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


def check_broker(settings: ReplaySettings) -> None:
    """The broker answers, or :class:`BrokerUnavailable` (exit 3): at once when nothing listens
    there (:func:`schemas.kafka_io.connect`). Checked before the day is read -- a large PeMS file
    is parsed for many seconds, a large synthetic day generated for minutes."""
    connect("admin", settings, KafkaAdminClient).close()


@dataclass(frozen=True)
class ReplayPlan:
    """What every producer of one replay starts from, decided once in the parent: the settings
    (their ``fleet_size`` the fleet), the fleet and what sized it (``basis``, the replay's fleet
    line), the queries on the queries topic at the start by record key (the defaults this replay
    published among them) and the epochs to replay. It is pickled to every producer process, so
    it holds no :class:`~schemas.Query` (whose cached mechanism does not pickle): each producer
    follows the queries topic itself, for these and what comes later, and reads its devices'
    enrollment keys from the settings (derived from the secret, never handed between processes)."""

    settings: ReplaySettings
    fleet: int
    basis: str
    queries: tuple[str, ...]
    epochs: int


def _sizing(day: TrafficDay, settings: ReplaySettings) -> Callable[[Iterable[int]], tuple[int, str]]:
    """:func:`fleet_and_basis` for a set of span lengths, computed once per distinct set (the
    defaults' spans and the topic's are mostly the same), each fleet checked against the enrolled
    devices when they go through the shuffler (every vehicle stands in for one)."""
    sized: dict[frozenset[int], tuple[int, str]] = {}
    trips = settings.fleet_model == "trips"  # its fleet does not depend on the spans

    def size(spans: Iterable[int]) -> tuple[int, str]:
        key = frozenset() if trips else frozenset(int(s) for s in spans if s > EPOCH_S)
        if key not in sized:
            sized[key] = fleet_and_basis(day, settings, key)
            fleet = sized[key][0]
            enrolled = settings.enrollment().devices if settings.via_shuffler else fleet
            if fleet > enrolled:
                raise EnrollmentError(f"a fleet of {fleet:,} vehicles but {enrolled:,} enrolled devices; give "
                                      f"--enrolled-devices {fleet} (the shuffler's too)")
        return sized[key]

    return size


def _queries_at_start(settings: ReplaySettings, day: TrafficDay, fleet: int) -> tuple[Query, ...]:
    """The queries on the topic now; none, and ``settings.default_queries``: the day's defaults
    for ``fleet``, published."""
    reader = QueryReader(settings)
    try:
        reader.catch_up()
        have = list(reader.queries.values())
    finally:
        reader.close()
    if not have and settings.default_queries:
        for q in default_queries(day, fleet, settings.mechanisms, settings.flow_day_budget,
                                 settings.day_budget, cache_dir("plans")):
            publish_query(settings, q)
            have.append(q)
    return tuple(have)


def build_plan(settings: ReplaySettings) -> tuple[ReplayPlan, TrafficDay]:
    """The replay's plan and its day: the broker checked before the day is read, the fleet
    sized (for the default queries' spans, or none) and checked against the enrolled devices
    before any topic is created, then sized again for the topic's queries (a vehicle passes a
    station at most once a span: the fleet holds the largest span flow, one for all producers)."""
    check_broker(settings)  # before the day: no parsing or generating for a broker that is not there
    day = load_day(settings)
    size = _sizing(day, settings)
    fleet, _ = size(settings.mechanism_spans if settings.default_queries else ())  # before any topic is created
    ensure_topics(settings)
    if settings.via_shuffler:
        ensure_topics(settings, {settings.device_topic: settings.device_partitions, settings.source_topic: 1})
    queries = _queries_at_start(settings, day, fleet)
    fleet, basis = size({q.span_s for q in queries})  # the topic's queries may need more than the defaults
    total = day.epochs.size - settings.start_epoch
    if settings.max_epochs is not None:
        total = min(total, settings.max_epochs)
    keys = tuple(q.record_key for q in queries)
    return ReplayPlan(settings.model_copy(update={"fleet_size": fleet}), fleet, basis, keys, total), day
