"""Configuration of the replay: environment variables (``PTT_*``) and flags; flags win.

One frozen settings object per process, read at start-up (never at import).
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from estimators import default_query_mechanisms
from estimators.registry import mechanism_names
from schemas.settings import EnrollmentSettings, KafkaSettings, cache_dir, source_topic

__all__ = ["KafkaSettings", "ReplaySettings", "parse_mechanisms"]


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """Comma-separated default queries, checked (no network involved): registry names of query
    mechanisms, each at 30 s, or ``MECH@SPAN[/P]`` for a span query (one report per device per
    ``SPAN`` seconds naming up to ``P`` stations; per-sensor mechanisms only).

    >>> parse_mechanisms(" sp, unary, unary@3600 ")
    ('sp', 'unary', 'unary@3600')
    >>> parse_mechanisms("sp,nope")
    Traceback (most recent call last):
    ...
    ValueError: unknown query mechanism 'nope'; choose from sp, sp-binary, alp, rr, unary, fresh, krr
    """
    from estimators.fleet import parse_fleet_queries
    from estimators.registry import PlanError

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    known = mechanism_names(queryable_only=True)
    if not names:
        raise ValueError(f"name at least one query mechanism ({', '.join(known)})")
    try:
        queries = parse_fleet_queries(",".join(names))
    except PlanError as exc:
        raise ValueError(str(exc)) from None
    if len({q.label for q in queries}) < len(names) or len(set(names)) < len(names):
        raise ValueError("a query mechanism is named twice")
    return names


class ReplaySettings(EnrollmentSettings):
    """Everything ``ptt replay`` needs."""

    pems_raw: Path | None = Field(default=None, description="a PeMS Station Raw 30 s file (gzip or plain)")
    pems_5min: Path | None = Field(default=None, description="a PeMS Station 5-Minute file")
    meta: Path | None = Field(default=None, description="a PeMS station metadata file")
    day: date | None = Field(default=None, description="replay only this calendar day (YYYY-MM-DD, Pacific time) "
                                                       "of a file holding several days")
    synthetic_stations: int = Field(default=16, ge=1, description="stations of the synthetic default day")
    synthetic_seed: int = 2026
    synthetic_date: date = date(2026, 11, 18)
    weekend: bool | None = Field(default=None, description="weekend traffic shape (default: from the date)")
    data_dir: Path = Field(default_factory=cache_dir, description="where the synthetic day is written and parsed "
                           "days are cached (ptt demo: data/ in its --out)")

    seed: int = Field(default=1, description="seed of the fleet's devices")
    fleet_size: int | None = Field(default=None, ge=1, description="vehicles (default: the day's peak total flow, or "
                                      "for span queries the largest span flow of a station, with room)")
    fleet_model: Literal["spans", "trips"] = Field(
        default="spans", description="how vehicles move: 'spans' (each span query's vehicles placed at random, "
                                     "identities kept through a span) or 'trips' (every vehicle keeps its identity "
                                     "all day and drives trips along corridors, producers/trips.py; the fleet at "
                                     "the papers' ratio of vehicles to passages; needed for a day cap, "
                                     "MECH@SPAN/P/M)")
    expand_to: int | None = Field(default=None, ge=1, description="query expansion: grow the fleet to N vehicles")
    mode: Literal["per-vehicle", "tally"] = "per-vehicle"
    speed: float = Field(default=0.0, ge=0.0, description="1 = real time, k = k x faster, 0 = as fast as possible")
    producers: int = Field(default=1, ge=1, le=64, description="producer processes sharing the fleet")
    batch_size: int = Field(default=20_000, ge=1, description="reports per Kafka record")
    truth: bool = Field(default=True, description="publish ground truth on the evaluation topic")
    device_epsilon_limit: float = Field(default=10.0, gt=0, description="a device refuses a query whose local "
                                        "epsilon per 30-s epoch exceeds this: a 30-s report's epsilon, a span "
                                        "report's divided by the epochs its span covers (an hourly report: by 120)")
    device_daily_budget: float | None = Field(default=None, gt=0, description="a device's daily privacy budget: a "
                                              "query whose next epoch would take the day's composed epsilon over "
                                              "it is refused (default: none)")
    shuffler_min_crowd: int = Field(default=20, ge=1, description="--via-shuffler: the shuffler's --min-crowd, the "
                                    "fewest reports a device's report is released among; the daily budget is then "
                                    "charged through the shuffler's aggregate release at that many")
    device_blacklist: tuple[int, ...] = ()
    max_epochs: int | None = Field(default=None, ge=1, description="stop after this many epochs")
    start_epoch: int = Field(default=0, ge=0, description="skip this many epochs of the day")
    default_queries: bool = Field(default=True, description="publish a query over every station for each of "
                                  "--query-mechanisms if none exist")
    query_mechanisms: str = Field(default=",".join(default_query_mechanisms()),
                                  description="the default queries' mechanisms, comma-separated registry names "
                                              "(e.g. sp,alp,unary; sp is opt-in: it has no whole-day bound), "
                                              "MECH@SPAN[/P[/M]] for a span query (e.g. unary@3600: hourly flows; "
                                              "unary@3600//40: at most 40 passages named a day, --fleet-model "
                                              "trips)")
    flow_day_budget: float = Field(default=1.0, gt=0, description="a default span query's parameters are planned "
                                   "(ptt plan fleet) to cost a vehicle at most this over a whole day through the "
                                   "shuffler's aggregate release")

    day_budget: float | None = Field(default=None, gt=0, description="plan every default query together (ptt plan "
                                     "fleet --day-budget) so that a vehicle's whole day across all of them costs at "
                                     "most this through the shuffler's aggregate release (default: none; a span "
                                     "query alone at --flow-day-budget, the others at their defaults)")

    cap_drops_file: Path | None = Field(default=None, description="write what a day cap (MECH@SPAN//M) dropped per "
                                        "query, span and station to this CSV when the replay ends (a simulation "
                                        "diagnostic, never published)")

    via_shuffler: bool = Field(default=False, description="send every device's report as its own record to the "
                                                         "device topic, for `ptt shuffler` (no batches, no markers)")
    device_topic: str = Field(default="ptt.device-reports", description="the shuffler's input topic (--via-shuffler)")
    device_partitions: int = Field(default=4, ge=1, description="partitions of the device topic when created")
    transport: Literal["kafka", "http"] = Field(
        default="kafka", description="--via-shuffler: how devices send -- 'kafka', each report a record on the device "
                                     "topic (the fast path), or 'http', each device's reports of an epoch in one "
                                     "request to the shuffler's front door (--front-door-url)")
    front_door_url: str = Field(default="http://127.0.0.1:8080", pattern=r"^https?://[^/\s]+/?$",
                                description="--transport http: the shuffler's front door (ptt shuffler --http-port)")
    http_concurrency: int = Field(default=32, ge=1, le=1024,
                                  description="--transport http: requests in flight at once (pooled keep-alive "
                                              "connections)")

    @field_validator("query_mechanisms")
    @classmethod
    def _known_mechanisms(cls, value: str) -> str:
        return ",".join(parse_mechanisms(value))

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The default queries' mechanisms (``query_mechanisms`` split; ``MECH@SPAN[/P]`` for a span)."""
        return tuple(self.query_mechanisms.split(","))

    @property
    def mechanism_spans(self) -> tuple[int, ...]:
        """The spans (seconds) of the default queries that are span queries."""
        from estimators.fleet import parse_fleet_queries
        return tuple(q.span_s for q in parse_fleet_queries(self.query_mechanisms) if q.span_s != 30)

    def _check_day_caps(self) -> None:
        """A day cap needs vehicles that keep their identity all day, and a span query."""
        from estimators.fleet import parse_fleet_queries
        for q in parse_fleet_queries(self.query_mechanisms):
            if q.max_passages_day is None:
                continue
            if q.span_s == 30:
                raise ValueError(f"{q.label}: the replay's devices enforce a day cap on span queries only; give "
                                 f"it a span (e.g. {q.mechanism}@300//{q.max_passages_day})")
            if self.fleet_model != "trips":
                raise ValueError(f"{q.label}: a day cap needs vehicles that keep their identity all day: add "
                                 f"--fleet-model trips")

    @property
    def source_topic(self) -> str:
        """--via-shuffler: where each producer's per-epoch source notes go (the shuffler's clock)."""
        return source_topic(self.device_topic)

    @model_validator(mode="after")
    def _one_source(self) -> ReplaySettings:
        if self.pems_raw is not None and self.pems_5min is not None:
            raise ValueError("give --pems-raw or --pems-5min, not both")
        if self.expand_to is not None and self.fleet_size is not None and self.expand_to < self.fleet_size:
            raise ValueError("--expand-to must be at least --fleet-size")
        if self.transport == "http" and not self.via_shuffler:
            raise ValueError("--transport http sends device reports to the shuffler's front door: it needs "
                             "--via-shuffler")
        self._check_day_caps()
        if self.via_shuffler and self.mode != "per-vehicle":
            raise ValueError("--via-shuffler sends single device reports: it needs --mode per-vehicle")
        return self
