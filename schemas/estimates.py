"""What the stream app publishes: estimates (one record per query, epoch, station and
estimator) and dead letters (anything it could not process, with the reason).

Subscribers rely on the field names of :class:`Estimate`; new fields may be added.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field

from estimators.registry import all_estimator_names

from .epochs import spans_epochs
from .query import QueryMechanism, one_of

__all__ = ["DeadLetter", "Estimate", "EstimateBound", "ESTIMATE_SCHEMA_PATH", "Rejected", "estimate_json_schema"]

ESTIMATE_SCHEMA_PATH = Path(__file__).with_name("estimate.schema.json")
ESTIMATOR_NAMES = all_estimator_names()  # from the mechanism registry
EstimatorName = Annotated[str, AfterValidator(one_of("estimator", lambda: ESTIMATOR_NAMES)),
                          Field(json_schema_extra={"enum": list(ESTIMATOR_NAMES)})]


class EstimateBound(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    confidence: float = Field(gt=0, lt=1)
    lower: float
    upper: float


class Estimate(BaseModel):
    """One estimate of one station's count in one epoch by one estimator.

    ``estimate`` is unbiased and may be negative; ``bounds`` are score (Wilson-type)
    confidence intervals for the true count, within [0, participants]. ``withheld`` is null,
    or the reason the estimate is not published (then ``estimate`` and ``bounds`` are null/empty).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["estimate"] = "estimate"
    query_id: str
    query_version: int = Field(ge=1)
    mechanism: QueryMechanism
    estimator: EstimatorName
    epoch: int = Field(ge=0, description="absolute epoch index: Unix seconds // epoch length")
    epoch_start: AwareDatetime
    span_s: int = Field(default=30, gt=0, description="seconds the estimate covers from epoch_start: 30 for one "
                                                       "epoch; a span query's span_s (one report per device per "
                                                       "span: the flow of distinct vehicles passing the station in "
                                                       "it); or 300 or 3600 for a rollup of a 30-s query (the sum of "
                                                       "that many seconds' epochs). epoch is the span's first")
    station: int = Field(description="PeMS station id")
    estimate: float | None = Field(description="null when withheld, and in a rollup for a station with an epoch "
                                                "of no source data (data_quality no_source_data): missing epochs "
                                                "summed as 0 would read as a smaller flow")
    sd: float | None = Field(description="standard deviation of the estimate at max(estimate, 0)")
    bounds: tuple[EstimateBound, ...]
    consistent: float | None = Field(
        default=None, description="the estimate made consistent: the estimator's estimates of the epoch's stations "
                                  "projected onto {x >= 0, sum(x) <= P x participants}, P = 1 for a 30-s epoch and the "
                                  "query's passages for a span (never negative; biased; the bounds stay those of the "
                                  "unbiased estimate); null when withheld or no_source_data, and in rollups")
    reports: int = Field(ge=0, description="reports counted in the epoch (all rounds; per-sensor mechanisms: the "
                                          "non-default answers, however their counts travelled)")
    participants: int = Field(ge=0, description="vehicles that answered (N of the estimator)")
    epsilon: float | None = Field(description="per-epoch epsilon of a device's whole report (brute force over "
                                              "its report vector); null when infinite")
    epsilon_shuffled: float | None = Field(
        default=None, description="central epsilon (at the worker's PTT_SHUFFLE_DELTA) of the epoch's release given "
                                  "the smallest shuffle that fed it, rounded down to 2 significant digits: it assumes "
                                  "the shuffler does not collude with the analyst and mixed each report among the n "
                                  "reports of its epoch and round; null when a producer of the epoch attests no "
                                  "shuffle size (the direct path), attests one it cannot have, or it is infinite")
    release: Literal["permuted", "aggregate"] | None = Field(
        default=None, description="what the shuffler released for this epoch, as its markers attest: 'permuted' (the "
                                  "device reports, permuted) or 'aggregate' (only their per-station or per-value "
                                  "counts); epsilon_shuffled is that release's; null when not attested (the direct "
                                  "path). A rollup's is its epochs' ('permuted' if they disagree: the aggregate "
                                  "counts are a function of the permuted reports; null if any epoch's is null)")
    withheld: str | None = None
    data_quality: Literal["ok", "no_source_data"] = Field(
        default="ok", description="no_source_data: the replayed source had no reading for this station in this "
                                  "epoch, or in some epoch of this span or rollup (a gap or a dead detector): there is "
                                  "no ground truth to hold it against. A subscriber reading flows keeps 'ok' rows")
    closed_by: Literal["markers", "watermark", "wall_clock"]
    round_count_mismatch: int = Field(description="round-2 minus round-1 reports (Sampling Privacy; 0 otherwise)")
    late: int = Field(ge=0, description="late records for this epoch seen before publication (kept out)")
    refused: int = Field(ge=0, description="vehicles whose device refused the query")
    missing_batches: int = Field(ge=0, description="batches the producers' markers announce but never arrived")

    @property
    def is_flow(self) -> bool:
        """Whether it covers more than one epoch: a span query's flow or a rollup."""
        return spans_epochs(self.span_s)


class DeadLetter(BaseModel):
    """A record the stream app could not process, and why. The original value is kept
    (base64, truncated to 4 KiB) so it can be inspected; it never contains a vehicle id
    because no valid record does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["dead_letter"] = "dead_letter"
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    value_b64: str
    value_bytes: int


@dataclass(frozen=True)
class Rejected:
    """Why a record is refused (a :data:`DeadLetter` reason and its detail), as stage 1 of the
    worker and the shuffler's checks return it; :meth:`letter` makes the dead letter."""

    reason: str
    detail: str

    def letter(self, topic: str, partition: int, offset: int, value: bytes | None, prefix: int = 4096) -> DeadLetter:
        """The dead letter: the reason, the input's size and at most ``prefix`` bytes of it."""
        raw = value or b""
        return DeadLetter(reason=self.reason, detail=self.detail[:2000], topic=topic, partition=partition,
                          offset=offset, value_b64=base64.b64encode(raw[:prefix]).decode(), value_bytes=len(raw))


def estimate_json_schema() -> dict[str, Any]:
    return Estimate.model_json_schema()


def write_estimate_schema(path: Path = ESTIMATE_SCHEMA_PATH) -> None:
    """Regenerate ``schemas/estimate.schema.json`` after changing :class:`Estimate` (a test
    fails until it is): ``python -c "from schemas.estimates import write_estimate_schema as w; w()"``."""
    path.write_text(json.dumps(estimate_json_schema(), indent=2, sort_keys=True) + "\n")
