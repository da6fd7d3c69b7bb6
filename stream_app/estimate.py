"""From a closed window to estimate records: the statistics core applied to the counts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from estimators import LinearEstimator, alp_estimators, rr_estimator, sp_difference, station_counts
from schemas import Query
from schemas.estimates import Estimate, EstimateBound

from .windows import CloseReason, Window

__all__ = ["QueryEstimators", "estimates_for"]


@dataclass(frozen=True)
class QueryEstimators:
    """The estimators of one query version, built once (station-valued views are large)."""

    query: Query
    estimators: dict[str, LinearEstimator]

    @classmethod
    def build(cls, query: Query) -> QueryEstimators:
        mech = query.build()
        if query.mechanism == "sp":
            ests = {"sp_difference": sp_difference(mech)}
        elif query.mechanism == "alp":
            ests = alp_estimators(mech)  # GLS weights at the design point Yes = 0
        else:
            ests = {"rr": rr_estimator(mech)}
        return cls(query, ests)

    @property
    def width(self) -> int:
        """Length of a round's count array: V + 1 (station-valued) or V x outputs."""
        mech = self.query.build()
        return mech.n_outputs if self.query.mechanism == "sp" else self.query.n_stations * mech.n_outputs


def _per_station_counts(qe: QueryEstimators, w: Window, n: int) -> np.ndarray:
    """``(V, 1, O)`` counts of a per-sensor mechanism; the default report of per-vehicle
    (sparse) batches is implied: ``N_sparse - (non-default reports)`` per station."""
    q = qe.query
    if q.default_report is None:
        raise ValueError(f"{q.mechanism} is not asked per sensor")
    o_n = q.build().n_outputs
    counts = np.asarray(w.counts[0], dtype=np.int64).reshape(q.n_stations, o_n)
    sparse = np.asarray(w.sparse[0], dtype=np.int64).reshape(q.n_stations, o_n)
    n_sparse = n - w.full_vehicles[0]
    d = q.default_report
    nondefault = sparse.sum(axis=1) - sparse[:, d]
    counts[:, d] += n_sparse - nondefault
    return counts[:, None, :]


def estimates_for(qe: QueryEstimators, w: Window, closed_by: CloseReason, epoch_start: datetime,
                  confidences: Sequence[float], min_participants: int) -> list[Estimate]:
    """Every station's estimate by every estimator of the query, for a closed window."""
    q = qe.query
    participants, missing_producers = w.participants()
    reports = int(sum(w.reports))
    withheld: str | None = None
    if q.mechanism == "sp":  # one report per vehicle per round: N is at least any round's reports
        n = max(participants or 0, *w.reports)
        counts = station_counts(q.build(), np.asarray(w.counts, dtype=np.int64))
    else:
        n = participants or 0
        counts = None
        if participants is None:
            withheld = "participants unknown: no end-of-epoch marker arrived"
        elif missing_producers:
            withheld = f"participants unknown: no marker from producer(s) {missing_producers}"
    if withheld is None and w.interrupted():
        withheld = "epoch interrupted: a producer stopped in the middle of it"
    if withheld is None and n < min_participants:
        withheld = f"fewer than {min_participants} participating vehicles ({n})"
    if withheld is None and counts is None:
        counts = _per_station_counts(qe, w, n)
    common = {
        "query_id": q.query_id, "query_version": q.version, "mechanism": q.mechanism, "epoch": w.epoch,
        "epoch_start": epoch_start, "reports": reports, "participants": n,
        "epsilon": q.epsilon if math.isfinite(q.epsilon) else None,
        "withheld": withheld, "closed_by": closed_by,
        "round_count_mismatch": (w.reports[1] - w.reports[0]) if q.n_rounds == 2 else 0,
        "late": w.late, "refused": w.refused(), "missing_batches": w.missing_batches(),
    }
    out: list[Estimate] = []
    for name, est in qe.estimators.items():
        if withheld is not None or counts is None:
            out.extend(Estimate(estimator=name, station=s, estimate=None, sd=None, bounds=(), **common)
                       for s in q.sensors)
            continue
        values = est.estimate(counts, n)
        sd = np.sqrt(np.maximum(est.variance(np.maximum(values, 0.0), n), 0.0))
        bounds = [(c, *est.score_interval(values, n, c)) for c in confidences]
        for i, s in enumerate(q.sensors):
            out.append(Estimate(
                estimator=name, station=s, estimate=float(values[i]), sd=float(sd[i]),
                bounds=tuple(EstimateBound(confidence=c, lower=float(lo[i]), upper=float(hi[i]))
                             for c, lo, hi in bounds),
                **common))
    return out
