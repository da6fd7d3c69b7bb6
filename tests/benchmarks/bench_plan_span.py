"""Benchmark: the planner per span at the papers' scale (issue 32's bar for the planner).

For each span (30 s, the baseline; 300 s; 3,600 s) ``ptt plan unary --span S --release aggregate
--population 47719 --expected-yes 1800 --stations 3220 --day-budget 2.5`` is planned in this
process (``estimators.planning.plan``, the command's computation), fresh caches each time. One
JSON line per span: the figures (``epsilon_day_vehicle``, ``sd``, ``central_limit_sd``, their
ratio, P) and ``seconds`` with ``ratio_to_30s``: a span report composes each station's PLD
``P x 86,400 / span`` = 2,880 times a day, as the 30-s day does, so a span plan should cost
about what the 30-s plan costs. A last line checks the bar: day <= 2.5, curator within 3% of
138.2, sd <= 1.1 x curator, for every span.

Run: ``PYTHONPATH=. python tests/benchmarks/bench_plan_span.py [--spans 30,300,3600]
[--mechanism unary] [--population 47719] [--stations 3220]`` (not a pytest test).
"""

from __future__ import annotations

import argparse
import json
import time


def _clear_caches() -> None:
    """Every cache a plan fills, so each span pays its own way (the station PLDs, the fits)."""
    from estimators import aggregate, aggregate_multi
    from estimators import fit as fitting

    aggregate.station_pld.cache_clear()
    aggregate_multi.ternary_station_pld.cache_clear()
    fitting._DAYS.clear()  # noqa: SLF001 (a benchmark resets a module cache; no test imports it)


def main() -> int:
    from estimators import planning

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", default="30,300,3600")
    ap.add_argument("--mechanism", default="unary")
    ap.add_argument("--population", type=int, default=47_719)
    ap.add_argument("--expected-yes", type=float, default=1_800)
    ap.add_argument("--stations", type=int, default=3_220)
    ap.add_argument("--day-budget", type=float, default=2.5)
    args = ap.parse_args()
    rows = []
    base: float | None = None
    for span in (int(s) for s in args.spans.split(",")):
        _clear_caches()
        t0 = time.perf_counter()
        r = planning.plan(args.mechanism, args.population, args.expected_yes, args.stations, release="aggregate",
                          day_budget=args.day_budget, span_s=span)
        seconds = time.perf_counter() - t0
        base = seconds if base is None else base
        row = {"span_s": span, "max_passages": r["max_passages"], "params": r["params"],
               "epsilon_day_vehicle": r["epsilon_day_vehicle"], "sd": r["sd"],
               "central_limit_sd": r["central_limit_sd"], "sd_over_curator": r["sd"] / r["central_limit_sd"],
               "seconds": round(seconds, 2), "ratio_to_first": round(seconds / base, 2)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    ok = all(r["epsilon_day_vehicle"] <= args.day_budget and abs(r["central_limit_sd"] / 138.2 - 1) <= 0.03
             and r["sd"] <= 1.1 * r["central_limit_sd"] for r in rows)
    print(json.dumps({"bar_met": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
