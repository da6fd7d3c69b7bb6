"""Benchmark: the consistent (projected) estimate against the unbiased one at 3,220 stations.

A synthetic 3,220-station day (``producers.synthetic.write_synthetic_day``, read back with the
replay's own reader; ``--raw FILE`` reads an existing Station Raw day instead) gives per epoch
the true count of every station. The fleet is the day's peak total flow (the replay's default),
split over the stations as the replay splits it (``producers.fleet.split_fleet``, one
producer). For each chosen epoch and each mechanism of the registry that the demo runs, the
mechanism's exact tally path draws ``--trials`` independent epochs; every estimator of the
mechanism gives the unbiased vector, ``estimators.project_capped_simplex`` the consistent one.
Measured over the stations with a truth:

* ``mse_unbiased``, ``mse_consistent`` and their ratio (per station and epoch);
* ``bias_consistent`` (mean of consistent - truth) and the same for stations whose truth is
  at most 5 (``bias_consistent_small``) or at least 30 (``bias_consistent_busy``), with the MSE
  ratio of each class (``mse_ratio_small``, ``mse_ratio_busy``);
* ``coverage[c]``: how often the published score bounds (the unbiased estimate's, always within
  ``[0, participants]``) hold the truth; ``coverage_recentred[c]``: the same bounds shifted
  to be centred on the consistent value (what the stream app does NOT publish), for contrast;
* ``cap_binds``: the share of epochs where the cap ``sum <= participants`` binds;
* ``project_ms``: the projection's time for one (epoch, estimator) vector of 3,220 stations
  (median of 50 calls, vector by vector as the stream app stacks them: ``k`` rows at once
  with ``--stack``).

Seeds are fixed (``--seed``); one JSON line per (epoch, mechanism, estimator) and one summary
line per estimator over all epochs.

Run: ``PYTHONPATH=. python tests/benchmarks/bench_consistency.py [--stations 3220] [--trials 40]
[--hours 3,8,12.5,17.25] [--raw FILE]`` (not a pytest test: nothing here is collected).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

import numpy as np

import estimators as E
from producers.fleet import split_fleet
from producers.pems import read_station_raw
from producers.pems.model import TrafficDay
from producers.synthetic import write_synthetic_day

CONFIDENCES = (0.95, 0.99)


def load_day(stations: int, raw: str | None, seed: int) -> TrafficDay:
    if raw is not None:
        return read_station_raw(raw)
    with tempfile.TemporaryDirectory() as tmp:
        synthetic = write_synthetic_day(tmp, n_stations=stations, seed=seed)
        return read_station_raw(synthetic.raw_path)


def draw_counts(mechanism: str, mech: E.Mechanism, truth: np.ndarray, n: int, rng: np.random.Generator,
                trials: int) -> np.ndarray:
    """``(trials, V, R, O)`` per-station counts by the mechanism's exact tally path."""
    spec = E.get_spec(mechanism)
    v = truth.size
    if spec.per_sensor:
        ps = E.PerStation(mech, v)
        if mech.n_rounds == 1:
            return np.stack([ps.tally(rng, truth, n) for _ in range(trials)])[:, :, None, :].astype(np.float64)
    full = np.concatenate([[n - int(truth.sum())], truth])
    return np.stack([E.station_counts(mech, mech.tally(rng, full)) for _ in range(trials)]).astype(np.float64)


def project_ms(x: np.ndarray, n: float, stack: int) -> float:
    rows = x[:stack]
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        E.project_capped_simplex(rows, np.full((rows.shape[0], 1), n))
        times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def measure(name: str, est: E.LinearEstimator, v: np.ndarray, truth: np.ndarray, ok: np.ndarray,
            n: int) -> dict[str, Any]:
    x = E.project_capped_simplex(v, float(n))
    t = truth[ok]
    vu, xc = v[:, ok], x[:, ok]
    small, busy = t <= 5, t >= 30
    out: dict[str, Any] = {
        "estimator": name, "stations_with_truth": int(ok.sum()),
        "mse_unbiased": float(np.mean((vu - t) ** 2)), "mse_consistent": float(np.mean((xc - t) ** 2)),
        "bias_unbiased": float(np.mean(vu - t)), "bias_consistent": float(np.mean(xc - t)),
        "bias_consistent_small": float(np.mean(xc[:, small] - t[small])) if small.any() else None,
        "bias_consistent_busy": float(np.mean(xc[:, busy] - t[busy])) if busy.any() else None,
        "mse_ratio_small": (float(np.mean((xc[:, small] - t[small]) ** 2) / np.mean((vu[:, small] - t[small]) ** 2))
                            if small.any() else None),
        "mse_ratio_busy": (float(np.mean((xc[:, busy] - t[busy]) ** 2) / np.mean((vu[:, busy] - t[busy]) ** 2))
                           if busy.any() else None),
        "cap_binds": float(np.mean(np.maximum(v, 0).sum(axis=1) > n)),
        "min_consistent": float(x.min()), "max_sum_over_participants": float((x.sum(axis=1) / n).max()),
        "coverage": {}, "coverage_recentred": {}, "consistent_inside_bounds": {},
    }
    out["mse_ratio"] = out["mse_consistent"] / out["mse_unbiased"]
    for c in CONFIDENCES:
        lo, hi = est.score_interval(v, float(n), c)
        assert lo.min() >= 0.0 and hi.max() <= n  # the published bounds lie in [0, participants]
        lo, hi = lo[:, ok], hi[:, ok]
        out["coverage"][str(c)] = float(np.mean((lo <= t) & (t <= hi)))
        shift = xc - vu
        out["coverage_recentred"][str(c)] = float(np.mean((lo + shift <= t) & (t <= hi + shift)))
        out["consistent_inside_bounds"][str(c)] = float(np.mean((lo <= xc) & (xc <= hi)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--stations", type=int, default=3220)
    ap.add_argument("--raw", default=None, help="an existing Station Raw day instead of the synthetic one")
    ap.add_argument("--trials", type=int, default=40, help="independent epochs drawn per chosen epoch")
    ap.add_argument("--hours", default="3,8,12.5,17.25", help="local hours of the chosen epochs")
    ap.add_argument("--stack", type=int, default=1, help="vectors projected per call in project_ms")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()

    t0 = time.perf_counter()
    day = load_day(args.stations, args.raw, args.seed)
    n = day.peak_total()
    print(json.dumps({"what": "day", "stations": int(day.stations.size), "epochs": int(day.epochs.size),
                      "fleet": n, "load_s": round(time.perf_counter() - t0, 2)}), flush=True)
    per_day = day.epochs.size
    picks = sorted({min(per_day - 1, int(float(h) * 120)) for h in args.hours.split(",")})
    totals: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for i in picks:
        truth = split_fleet(args.seed, int(day.epochs[i]), day.flows[i], n, 1)[0, 1:]
        ok = day.has_truth[i]
        for mechanism in E.default_query_mechanisms():
            spec = E.get_spec(mechanism)
            mech = spec.build({}, truth.size)
            rng = np.random.default_rng([args.seed, i, sum(map(ord, mechanism))])
            counts = draw_counts(mechanism, mech, truth, n, rng, args.trials)
            for name, est in spec.estimators(mech).items():
                v = est.estimate(counts, float(n))
                row = measure(name, est, v, truth, ok, n)
                row.update({"what": "epoch", "mechanism": mechanism, "hour": i / 120, "truth_at_stations":
                            int(truth.sum()), "participants": n, "trials": args.trials,
                            "project_ms": project_ms(v, float(n), args.stack)})
                totals[(mechanism, name)].append(row)
                print(json.dumps(row), flush=True)
    for (mechanism, name), rows in totals.items():
        mse_u = float(np.mean([r["mse_unbiased"] for r in rows]))
        mse_c = float(np.mean([r["mse_consistent"] for r in rows]))
        print(json.dumps({
            "what": "summary", "mechanism": mechanism, "estimator": name, "epochs": len(rows),
            "mse_unbiased": mse_u, "mse_consistent": mse_c, "mse_ratio": mse_c / mse_u,
            "coverage": {c: float(np.mean([r["coverage"][c] for r in rows])) for c in rows[0]["coverage"]},
            "coverage_recentred": {c: float(np.mean([r["coverage_recentred"][c] for r in rows]))
                                   for c in rows[0]["coverage"]},
            "cap_binds": float(np.mean([r["cap_binds"] for r in rows])),
            "project_ms_median": statistics.median(r["project_ms"] for r in rows)}), flush=True)


if __name__ == "__main__":
    main()
