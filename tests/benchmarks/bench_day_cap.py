"""Benchmark: what a device's day cap costs the hourly flows, on the trip fleet at the papers' scale.

The synthetic 3,220-station day (``ptt synth --stations 3220``, read as bench_trips.py reads it)
is driven by :class:`producers.trips.TripFleet` at the papers' fleet (``default_fleet_size``:
10,047,719 vehicles), every vehicle keeping its identity all day; :class:`DayTally` keeps each
vehicle's passages so far today -- the device's own counter -- and, per cap ``M``, the passages
past its ``M``-th, per station and hour. A passage is named iff the vehicle's count before it is
below ``M`` (a vehicle passes at most one station an epoch, so that is :func:`cap_day`'s order),
and a vehicle passes a station at most once an hour, so an hour's set is the sum of its epochs:

* the **uncapped truth** ``U[h, s]``: every passage of hour ``h`` at station ``s``;
* the **capped truth** ``C[h, s] = U - dropped``: the passages the devices name.

Unary RR's aggregate release of one hourly span report per device is simulated exactly per cell:
the count of reports naming ``s`` is ``Binomial(C, 1 - q) + Binomial(N - C, q)`` (N the fleet),
independently per cell and repetition (a seeded generator), with ``q`` from the planner at the
cap (``estimators.planning.plan``: ``ptt plan unary --span 3600 --release aggregate
--max-passages-day M --day-budget B``) or ``--q``. The headline estimator and its 95% score
bounds (``get_spec("unary").estimators``: ``estimate``, ``score_interval``) give each cell's
estimate; per bin of the uncapped hourly flow the JSON line has the coverage of the bounds
against the capped truth (the estimator is unbiased for what devices name: ~95%) and against the
uncapped one, the relative error against the uncapped truth (median, mean), the bias against it
(the cap's price, and the share the cap dropped there), and the error against the capped truth
beside the variance formula's. A coverage's Monte Carlo error (``*_mc_sd``) is the binomial sd
of a rate over that many cells. The dropped passages are the model's (docs/fleet-model.md).

Run: ``python tests/benchmarks/record.py tests/benchmarks/bench_day_cap.py [--stations 3220]
[--caps 40 [20 ...]] [--reps 20] [--q Q] [--day-budget 1] [--day-dir DIR]`` (one JSON line).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

import numpy as np
import numpy.typing as npt

from estimators.linear import LinearEstimator
from estimators.planning import plan
from estimators.registry import get_spec
from producers.corridors import build_corridors
from producers.trip_stats import DEFAULT_CAPS, DayTally, cap_summary
from producers.trips import TripFleet, default_fleet_size, usable_counts
from schemas.epochs import EPOCH_S
from tests.benchmarks.bench_trips import load, rss_mb

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

BIN_EDGES = (0, 50, 200, 1000, 3000)  # bins of the uncapped hourly flow: [0,50) ... >=3000
HOURS = 24
SPAN_S = 3600
CONFIDENCE = 0.95


def bin_names(edges: tuple[int, ...] = BIN_EDGES) -> list[str]:
    """``[0,50)``, ..., ``>=3000``."""
    return [f"[{lo},{hi})" for lo, hi in zip(edges, edges[1:], strict=False)] + [f">={edges[-1]}"]


def hourly(counts: IntArray, hours: int = HOURS) -> IntArray:
    """``(hours, stations)``: the epochs' counts summed per hour from the grid's first epoch (a
    longer day's last hours in the last, as :class:`DayTally` counts them)."""
    hour = np.minimum(np.arange(counts.shape[0]) * EPOCH_S // 3600, hours - 1)
    out = np.zeros((hours, counts.shape[1]), np.int64)
    np.add.at(out, hour, counts)
    return out


def drive(fleet: TripFleet, tally: DayTally) -> tuple[float, float]:
    """Every epoch of the day: seconds in the fleet's steps, seconds in the tally."""
    model_s = tally_s = 0.0
    while fleet.t < fleet.counts.shape[0]:
        t0 = time.perf_counter()
        ep = fleet.step()
        t1 = time.perf_counter()
        tally.add(ep)
        model_s += t1 - t0
        tally_s += time.perf_counter() - t1
    return model_s, tally_s


def planned(fleet: int, stations: int, cap: int, day_budget: float, expected_yes: float) -> dict[str, Any]:
    """The planner's unary RR for hourly spans at the cap, through the aggregate release."""
    t0 = time.perf_counter()
    p = plan("unary", population=fleet, expected_yes=expected_yes, stations=stations, release="aggregate",
             day_budget=day_budget, span_s=SPAN_S, max_passages_day=cap)
    return {"q": float(p["params"]["q"]), "sd": p["sd"], "central_limit_sd": p["central_limit_sd"],
            "sd_over_central": p["sd"] / p["central_limit_sd"], "epsilon_day_vehicle": p["epsilon_day_vehicle"],
            "plan_s": time.perf_counter() - t0}


def headline(q: float, fleet: int, stations: int, expected_yes: float) -> LinearEstimator:
    spec = get_spec("unary")
    mech = spec.build({"q": q}, stations)
    return spec.estimators(mech, stations=np.array([1]), design=(float(expected_yes), float(fleet)))[spec.headline]


def simulate(capped: IntArray, fleet: int, q: float, est: LinearEstimator, reps: int,
             rng: np.random.Generator) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``reps`` independent releases of every cell: the estimates, their 95% score bounds and the
    variance formula's sd at the capped truth, each ``(reps, hours, stations)``."""
    shape = (reps, *capped.shape)
    named = rng.binomial(capped, 1.0 - q, size=shape) + rng.binomial(fleet - capped, q, size=shape)
    k = reps * capped.shape[0]
    counts = np.stack([fleet - named, named], axis=-1).reshape(k, capped.shape[1], 1, 2)
    e = est.estimate(counts, fleet)
    lo, hi = est.score_interval(e, fleet, CONFIDENCE)
    sd = np.sqrt(est.variance(capped.astype(np.float64), fleet))
    return e.reshape(shape), lo.reshape(shape), hi.reshape(shape), np.broadcast_to(sd, shape)


def rate(hits: npt.NDArray[np.bool_]) -> tuple[float | None, float | None]:
    """A rate over cells and its binomial sd (Monte Carlo error)."""
    n = hits.size
    if not n:
        return None, None
    p = float(hits.mean())
    return round(p, 4), round(float(np.sqrt(p * (1 - p) / n)), 4)


def scored(uncapped: IntArray, capped: IntArray, sims: tuple[FloatArray, FloatArray, FloatArray, FloatArray],
           mask: npt.NDArray[np.bool_]) -> dict[str, Any]:
    """The figures of the cells ``mask`` (``(hours, stations)``) over every repetition."""
    e, lo, hi, sd = (x[:, mask] for x in sims)
    u = np.broadcast_to(uncapped[mask], e.shape).astype(np.float64)
    c = np.broadcast_to(capped[mask], e.shape).astype(np.float64)
    cov_c, cov_c_sd = rate((lo <= c) & (c <= hi))
    cov_u, cov_u_sd = rate((lo <= u) & (u <= hi))
    pos = u > 0
    rel = np.abs(e[pos] - u[pos]) / u[pos]
    total_u = float(uncapped[mask].sum())
    return {
        "cells": int(mask.sum()), "cells_x_reps": int(e.size),
        "uncapped_mean": round(float(uncapped[mask].mean()), 1) if mask.any() else None,
        "dropped_share": round(float((uncapped[mask] - capped[mask]).sum()) / total_u, 5) if total_u else 0.0,
        "coverage_capped": cov_c, "coverage_capped_mc_sd": cov_c_sd,
        "coverage_uncapped": cov_u, "coverage_uncapped_mc_sd": cov_u_sd,
        "rel_err_uncapped_median": round(float(np.median(rel)), 4) if rel.size else None,
        "rel_err_uncapped_mean": round(float(rel.mean()), 4) if rel.size else None,
        "cells_uncapped_zero": int((~pos).sum() // max(e.shape[0], 1)),
        "bias_uncapped": round(float((e - u).mean()), 2) if e.size else None,
        "bias_uncapped_relative": round(float((e - u).sum()) / float(u.sum()), 5) if u.sum() else None,
        "bias_capped": round(float((e - c).mean()), 3) if e.size else None,
        "rmse_capped": round(float(np.sqrt(((e - c) ** 2).mean())), 2) if e.size else None,
        "sd_formula_rms": round(float(np.sqrt((sd**2).mean())), 2) if e.size else None,
    }


def by_bin(uncapped: IntArray, capped: IntArray,
           sims: tuple[FloatArray, FloatArray, FloatArray, FloatArray]) -> dict[str, dict[str, Any]]:
    edges = (*BIN_EDGES, np.iinfo(np.int64).max)
    out = {name: scored(uncapped, capped, sims, (uncapped >= lo) & (uncapped < hi))
           for name, lo, hi in zip(bin_names(), edges, edges[1:], strict=False)}
    out["all"] = scored(uncapped, capped, sims, np.ones(uncapped.shape, bool))
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    caps = sorted({int(m) for m in a.caps}, reverse=True)
    t0 = time.perf_counter()
    day, meta = load(a.stations, a.day_dir)
    load_s = time.perf_counter() - t0
    counts = usable_counts(day.flows, day.has_truth)
    corridors = build_corridors(day.stations, meta)
    n_stations = int(day.stations.size)
    rss0 = rss_mb()
    t0 = time.perf_counter()
    fleet = TripFleet(counts, corridors, a.vehicles, seed=a.seed)
    build_s = time.perf_counter() - t0
    tally = DayTally(fleet.n_vehicles, n_stations, caps, hours=HOURS)
    model_s, tally_s = drive(fleet, tally)
    model_s += build_s
    n = fleet.n_vehicles
    uncapped = hourly(counts)
    dist = tally.summary()
    passage_dist = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in dist.to_json().items()
                    if k != "dropped_share"}
    summary_caps = sorted(set(caps) | set(DEFAULT_CAPS))
    dropped_all = {str(m): round(v, 5) for m, v in cap_summary(tally.counts, summary_caps).dropped_share.items()}
    per_cap: dict[str, Any] = {}
    plan_s = sim_s = 0.0
    for m in caps:
        capped = uncapped - tally.dropped(m).T
        if a.q is None:
            p = planned(n, n_stations, m, a.day_budget, a.expected_yes)
            plan_s += p["plan_s"]
        else:
            p = {"q": a.q}
        t0 = time.perf_counter()
        est = headline(p["q"], n, n_stations, a.expected_yes)
        sims = simulate(capped, n, p["q"], est, a.reps, np.random.default_rng([a.sim_seed, 0xDC, m]))
        bins = by_bin(uncapped, capped, sims)
        sim_s += time.perf_counter() - t0
        del sims
        per_cap[str(m)] = {
            "plan": {k: (round(v, 7) if k == "q" else round(v, 4)) for k, v in p.items()},
            "planned": a.q is None,
            "sd_at_expected_yes": round(float(np.sqrt(est.variance(a.expected_yes, n))[0]), 3),
            "dropped_share": round(float((uncapped - capped).sum()) / max(float(uncapped.sum()), 1.0), 5),
            "by_uncapped_hourly_flow": bins,
        }
    return {
        "stations": n_stations, "epochs": int(counts.shape[0]), "passages": int(counts.sum()),
        "vehicles": n, "default_vehicles": default_fleet_size(int(counts.sum())), "seed": a.seed,
        "hourly_cells": int(uncapped.size), "span_s": SPAN_S, "mechanism": "unary", "release": "aggregate",
        "day_budget": a.day_budget, "expected_yes": a.expected_yes, "reps": a.reps, "sim_seed": a.sim_seed,
        "caps": caps, "per_vehicle": passage_dist, "dropped_share": dropped_all, "per_cap": per_cap,
        "load_s": round(load_s, 1), "model_s": round(model_s, 1), "tally_s": round(tally_s, 1),
        "plan_s": round(plan_s, 1), "simulate_s": round(sim_s, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_model_mb": round(rss0, 1), "exact_fallbacks": fleet.fallbacks,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stations", type=int, default=3220)
    ap.add_argument("--vehicles", type=int, default=None, help="fleet size (default: the papers' ratio)")
    ap.add_argument("--seed", type=int, default=1, help="the trip fleet's seed")
    ap.add_argument("--caps", type=int, nargs="+", default=[40], help="day caps M (passages a device names a day)")
    ap.add_argument("--q", type=float, default=None, help="unary RR's flip probability (default: planned per cap)")
    ap.add_argument("--day-budget", type=float, default=1.0, help="the plan's day budget (epsilon a vehicle a day)")
    ap.add_argument("--expected-yes", type=float, default=2500.0, help="the plan's design hourly flow")
    ap.add_argument("--reps", type=int, default=20, help="independent releases of every hourly cell")
    ap.add_argument("--sim-seed", type=int, default=0, help="the releases' seed")
    ap.add_argument("--day-dir", default=None, help="keep the synthetic day here and read it again next time")
    a = ap.parse_args()
    if a.reps < 1 or min(a.caps) < 1 or (a.q is not None and not 0 < a.q < 0.5):
        ap.error("--reps >= 1, --caps >= 1 and 0 < --q < 0.5")
    print(json.dumps(run(a)))


if __name__ == "__main__":
    main()
