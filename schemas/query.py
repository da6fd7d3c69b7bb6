"""The analyst's query (Anonymized Local Privacy §IV-B): what is asked, of whom, with which mechanism, when.

Published on the compacted queries topic, one record per (query id, version). Devices audit
it before answering (epsilon limit, sensor blacklist).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cached_property
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from estimators import Mechanism, PerStation
from estimators.registry import MechanismSpec, get_spec, mechanism_names

from .epochs import EPOCH_S, spans_epochs

DAY_S = 86_400

__all__ = ["MECHANISM_NAMES", "Query", "QueryMechanism", "active_queries"]

MECHANISM_NAMES = mechanism_names(queryable_only=True)


def per_sensor_names() -> tuple[str, ...]:
    """The queryable mechanisms that ask about each sensor (the ones a span report can use)."""
    return tuple(n for n in MECHANISM_NAMES if get_spec(n).per_sensor)


def one_of(what: str, names: Callable[[], tuple[str, ...]]) -> Callable[[str], str]:
    """A validator: the value must be one of the registry's ``names`` (read when validating,
    so a newly registered mechanism is accepted)."""

    def check(name: str) -> str:
        allowed = names()
        if name not in allowed:
            raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(allowed)}")
        return name

    return check


QueryMechanism = Annotated[str, AfterValidator(one_of("mechanism", lambda: MECHANISM_NAMES)),
                           Field(json_schema_extra={"enum": list(MECHANISM_NAMES)})]
_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Query(BaseModel):
    """⟨query id, analyst id, monitored sensors, mechanism and its parameters, N rows, epoch
    length, T_start, T_end, version⟩.

    ``sensors`` are PeMS station ids in the order that defines station indices on the wire:
    sensor ``sensors[i]`` is station index ``i + 1``; index 0 means "at none of them".
    ``mechanism``: a name of the mechanism registry (``estimators.registry``): ``sp``
    (Sampling Privacy over the sensors, two rounds), ``alp`` (Anonymized Local Privacy asked
    per sensor), ``rr`` (two-coin randomized response per sensor, the baseline), ``fresh``
    (the two-round fresh-sample variant per sensor), ``sp-binary`` (one sensor), ``krr`` (k-ary
    randomized response over the sensors, one report of V + 1 values). ``params``
    use the math reference's names; missing ones take the papers' evaluation values.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    query_id: str = Field(pattern=_ID)
    analyst_id: str = Field(pattern=_ID)
    version: int = Field(ge=1)
    sensors: tuple[int, ...] = Field(min_length=1, max_length=65_000)
    mechanism: QueryMechanism
    params: dict[str, float] = Field(default_factory=dict)
    population: int = Field(ge=1, description="N rows: how many data owners the query is sized for")
    epoch_length_s: Literal[30] = Field(default=30, description="the one epoch clock: 30 s (fixed)")
    span_s: int = Field(default=EPOCH_S, ge=EPOCH_S, le=DAY_S,
                        description="seconds one report covers: 30 (one epoch, the default) or a longer span "
                                    "(a multiple of 30 that divides a day, e.g. 300 or 3600), aligned on the "
                                    "epoch clock; a device then sends one report per span naming every station "
                                    "it passed in it (per-sensor mechanisms only)")
    max_passages: int | None = Field(default=None, ge=1,
                                     description="the most stations one report may say a vehicle passed (P): "
                                                 "default one per epoch of the span (span_s / 30, at most the "
                                                 "number of sensors); a vehicle that passed more reports a "
                                                 "uniformly random P of them")
    max_passages_day: int | None = Field(default=None, ge=1, le=2 * DAY_S // EPOCH_S,
                                         description="the day cap (M): the most passages a device names for this "
                                                     "query in a (UTC) day; past M its reports name no station but "
                                                     "are still sent and randomized, so two days of a vehicle differ "
                                                     "in at most 2M answers and the day is charged that (null: no "
                                                     "cap, a new station every epoch all day)")
    release: Literal["permuted", "aggregate"] | None = Field(
        default=None, description="the shuffler release this query is served under: a shuffler started with "
                                  "another --release refuses to serve it, and a device charges its ledger for this "
                                  "release; null: any release, so a device charges the weaker one (permuted)")
    t_start: AwareDatetime
    t_end: AwareDatetime

    @model_validator(mode="after")
    def _check(self) -> Query:
        if len(set(self.sensors)) != len(self.sensors):
            raise ValueError("sensors must be unique")
        if any(s <= 0 for s in self.sensors):
            raise ValueError("sensor ids must be positive PeMS station ids")
        if self.t_end <= self.t_start:
            raise ValueError("t_end must be after t_start")
        if self.span_s % EPOCH_S or DAY_S % self.span_s:
            raise ValueError(f"span_s must be a multiple of {EPOCH_S} that divides a day ({DAY_S} s), "
                             f"got {self.span_s}")
        if spans_epochs(self.span_s) and not self.spec.per_sensor:
            raise ValueError(f"{self.mechanism} reports one station per epoch: a span longer than {EPOCH_S} s "
                             f"needs a per-sensor mechanism ({', '.join(per_sensor_names())})")
        if self.max_passages is not None and self.max_passages > self.epochs_per_span:
            raise ValueError(f"max_passages {self.max_passages} is more than the span's {self.epochs_per_span} "
                             f"epoch(s): a vehicle passes at most one station per epoch")
        self.build()  # raises ValueError (PlanError) on unknown or invalid parameters
        return self

    # -- derived ---------------------------------------------------------------------------
    @property
    def n_stations(self) -> int:
        return len(self.sensors)

    @property
    def epochs_per_span(self) -> int:
        """30-s epochs one report covers (1 for the default span)."""
        return self.span_s // EPOCH_S

    @property
    def passages(self) -> int:
        """P: the most stations one report names (``max_passages``, by default one per epoch
        of the span, never more than the sensors nor the day cap ``max_passages_day``)."""
        return min(self.max_passages or self.epochs_per_span, self.n_stations,
                   self.max_passages_day or self.n_stations)

    @property
    def is_span(self) -> bool:
        """Whether one report covers more than one 30-s epoch."""
        return spans_epochs(self.span_s)

    def span_start(self, epoch: int) -> int:
        """The first epoch of the span holding ``epoch`` (spans are aligned on the epoch clock:
        an hour's starts on a UTC hour). A span's reports, windows and rows carry this epoch."""
        return epoch - epoch % self.epochs_per_span

    @property
    def spec(self) -> MechanismSpec:
        return get_spec(self.mechanism)

    @property
    def n_rounds(self) -> int:
        return self.spec.n_rounds

    @property
    def n_outputs(self) -> int:
        return self.build().n_outputs

    @property
    def width(self) -> int:
        """Length of one round's count array (V + 1, or V x outputs per sensor)."""
        return self.spec.width(self.build(), self.n_stations)

    @property
    def record_key(self) -> str:
        """Key on the compacted queries topic: every version is kept."""
        return f"{self.query_id}:v{self.version}"

    def build(self) -> Mechanism:
        """The mechanism a device runs: station-valued for ``sp``, binary per sensor else."""
        return self._mechanism

    @cached_property
    def _mechanism(self) -> Mechanism:
        return self.spec.build(self.params, self.n_stations)

    @property
    def accounting(self) -> tuple[MechanismSpec, Mechanism, int, int, int, int | None]:
        """What every whole-day figure composes for this query (``estimators.vehicle_day``'s
        tuple): its mechanism, stations, span, passages per report and day cap."""
        return self.spec, self.build(), self.n_stations, self.span_s, self.passages, self.max_passages_day

    @cached_property
    def per_station(self) -> tuple[PerStation, ...] | None:
        """Per-sensor mechanisms: the sampler of each round (None for station-valued ones)."""
        return self.spec.per_station(self.build(), self.n_stations) if self.spec.per_sensor else None

    @cached_property
    def default_report(self) -> int | None:
        """The implied report of per-sensor mechanisms (None for station-valued ones)."""
        return self.spec.default_report(self.build())

    @cached_property
    def epsilon(self) -> float:
        """Epsilon of a device's whole report of one epoch (or, for a longer ``span_s``, of one
        span: up to ``passages`` stations; brute-force equivalent): what a device audits and
        every published ``epsilon`` field shows."""
        return self.spec.report_epsilon(self.build(), self.n_stations, self.passages)

    @cached_property
    def epsilon_per_answer(self) -> float:
        """Epsilon of one answer (one sensor's report in one round)."""
        return self.spec.answer_epsilon(self.build())

    def epoch_range(self) -> tuple[int, int]:
        """``[first, end)`` epochs of the query's window (T_start .. T_end)."""
        return self._epoch_range

    @cached_property
    def _epoch_range(self) -> tuple[int, int]:  # asked once per record by stage 1
        return int(self.t_start.timestamp()) // EPOCH_S, -(-int(self.t_end.timestamp()) // EPOCH_S)

    def station_index(self) -> dict[int, int]:
        """PeMS station id -> station index on the wire (1-based)."""
        return {s: i + 1 for i, s in enumerate(self.sensors)}


def active_queries(queries: Iterable[Query], when: datetime) -> list[Query]:
    """Per query id, the newest version whose T_start has passed, if ``when`` is before its T_end."""
    newest: dict[str, Query] = {}
    for q in queries:
        if q.t_start <= when and (q.query_id not in newest or q.version > newest[q.query_id].version):
            newest[q.query_id] = q
    return [q for _, q in sorted(newest.items()) if when < q.t_end]
