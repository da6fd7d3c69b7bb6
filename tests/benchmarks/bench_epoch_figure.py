"""Benchmark: one epoch's aggregate figure at the papers' scale, exact composition against the day's grid.

For each mechanism (ALP, unary, fresh: 2, 2 and 4 PLDs per epoch) at n = 47,719 and V = 3,220,
the epoch's dominating PLDs are built once (cached, timed apart as ``plds_s``), then one epoch's
epsilon at delta 1e-6 is read off

* ``day_grid``: ``shuffle.compose(plds, 1)`` on the grid sized for 2,880 epochs (the old path);
* ``exact``: ``aggregate.epsilon_of(plds, 1, delta)`` (``compose_epoch``: the published path);
* ``converged``: ``shuffle.compose(plds, 1, step=2e-7)`` (the reference the exact path matches);

with the median time of ``--repeat`` calls of each and the ratio of ``exact`` to ``day_grid`` (the
baseline, same run). One JSON line per mechanism. Then ``ptt plan alp --release aggregate
--population 47719 --expected-yes 100 --stations 3220``'s whole computation
(``planning.plan``) is timed once cold (``plan_s``).

Run: ``PYTHONPATH=. python tests/benchmarks/bench_epoch_figure.py [--repeat 5]`` (not collected by pytest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from estimators import aggregate, planning, shuffle
from estimators.registry import get_spec

N, V, DELTA = 47_719, 3_220, 1e-6


def _median_s(fn: Callable[[], float], repeat: int) -> tuple[float, float]:
    times, value = [], 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t)
    return value, statistics.median(times)


def _day_grid(plds: list[shuffle.Pld]) -> float:
    return shuffle.compose(plds, 1).epsilon(DELTA)


def _converged(plds: list[shuffle.Pld]) -> float:
    return shuffle.compose(plds, 1, step=2e-7).epsilon(DELTA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    t = time.perf_counter()
    plan = planning.plan("alp", N, 100, V, release="aggregate")
    plan_s = time.perf_counter() - t
    for name in ("alp", "unary", "fresh"):
        spec = get_spec(name)
        mech = spec.build({}, V)
        t = time.perf_counter()
        plds = spec.aggregate_plds(mech, V, N)
        plds_s = time.perf_counter() - t
        assert plds is not None
        old, old_s = _median_s(partial(_day_grid, plds), args.repeat)
        new, new_s = _median_s(partial(aggregate.epsilon_of, plds, 1, DELTA), args.repeat)
        ref, ref_s = _median_s(partial(_converged, plds), 1)
        print(json.dumps({"mechanism": name, "n": N, "stations": V, "plds": len(plds), "plds_s": round(plds_s, 3),
                          "day_grid": old, "day_grid_s": round(old_s, 4), "exact": new, "exact_s": round(new_s, 4),
                          "converged": ref, "converged_s": round(ref_s, 3),
                          "exact_over_day_grid_time": round(new_s / old_s, 2)}), flush=True)
    print(json.dumps({"plan": "alp aggregate", "plan_s": round(plan_s, 2), "epsilon_shuffled": plan["epsilon_shuffled"],
                      "epsilon_day_shuffled": plan["epsilon_day_shuffled"]}))


if __name__ == "__main__":
    main()
