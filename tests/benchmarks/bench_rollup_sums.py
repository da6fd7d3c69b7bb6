"""Measurement: what the rollups' exact sums (``stream_app.worker.rollups.fixed_sum``: the same sum
whatever order the epochs arrive in) cost at the papers' 3,220 stations, against the data's own
time and against float sums in the same run.

One query's hour of epoch summaries (120, two estimators' estimates and variances per station)
goes through ``RollupPolicy`` (its 5-minute and hourly rollups), each touched state encoded and
decoded between epochs as the changelog does; the baseline adds the same arrays as floats.

Run: ``python tests/benchmarks/bench_rollup_sums.py [--stations 3220] [--epochs 120]``
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from schemas import Query
from stream_app.worker.estimate import EpochResult, StationEstimates
from stream_app.worker.records import EpochSummary
from stream_app.worker.rollups import RollupPolicy, RollupState, summary_of


def summaries(stations: int, epochs: int) -> list[EpochSummary]:
    t0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
    q = Query(query_id="bench", analyst_id="a", version=1, sensors=tuple(range(1, stations + 1)), mechanism="alp",
              population=47_719, t_start=t0, t_end=t0 + timedelta(hours=2))
    rng = np.random.default_rng(1)
    e0 = int(t0.timestamp()) // 30
    out = []
    for i in range(epochs):
        res = EpochResult(query=q, epoch=e0 + i, closed_by="markers", confidences=(0.95,), participants=40_000,
                          reports=40_000, round_reports=[40_000], late=0, refused=0, missing_batches=0, withheld=None)
        for name in q.spec.estimator_names:
            est = rng.normal(15, 141, stations)
            res.values[name] = StationEstimates(est, np.full(stations, 141.0), est[None] - 1, est[None] + 1)
        out.append(summary_of(res))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--stations", type=int, default=3220)
    p.add_argument("--epochs", type=int, default=120)
    a = p.parse_args()
    items = summaries(a.stations, a.epochs)
    store: dict[bytes, bytes] = {}
    policy = RollupPolicy()
    t = time.perf_counter()
    for s in items:
        out = policy.apply(lambda rid: RollupState.decode(store[rid.key]) if rid.key in store else None, [s])
        store.update({rid.key: st.encode() for rid, st in out.touched.items()})
    exact_s = time.perf_counter() - t
    t = time.perf_counter()
    sums: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for s in items:  # the float baseline: the same additions and a float64 state write per epoch
        for span in (10, 120):
            k = (span, s.epoch - s.epoch % span)
            if k in sums:
                sums[k] = (sums[k][0] + s.estimate, sums[k][1] + s.variance)
            else:
                sums[k] = (s.estimate.copy(), s.variance.copy())
            _ = sums[k][0].tobytes() + sums[k][1].tobytes()
    float_s = time.perf_counter() - t
    data_s = 30.0 * a.epochs
    print(json.dumps({"stations": a.stations, "epochs": a.epochs, "exact_s": round(exact_s, 3),
                      "float_s": round(float_s, 3), "exact_over_float": round(exact_s / float_s, 1),
                      "exact_over_data_time": round(exact_s / data_s, 5),
                      "per_epoch_ms": round(1000 * exact_s / a.epochs, 1)}))


if __name__ == "__main__":
    main()
