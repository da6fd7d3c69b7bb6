"""Measurement: coverage of the rollups' bounds (5-minute and hourly sums) by truth bin, on a
replayed day, through the worker's own pure parts.

Each epoch of the day goes the replay's way (the fleet's seeded split, each query's truth
counts, the devices' exact-tally path) into a window state with its markers, is closed and
estimated by the worker's ``epoch_results``, summarized (``summary_of``) and added to the
rollups by ``RollupPolicy``; each decided rollup is estimated by ``rollup_result`` and its
bounds are held against the true sum of its epochs. Cells without truth in any of their epochs
(``no_source_data``) are not scored. The Kafka path adds nothing to these numbers: the demo's
integration test holds that the published rollups are the sums of the published epochs.

Run: ``python tests/benchmarks/bench_rollups.py [--stations 16] [--hours 24] [--pems-raw FILE --meta FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from estimators import StationCounts
from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.replay import default_queries, fleet_size_for, load_day
from producers.settings import ReplaySettings
from schemas.settings import cache_dir
from stream_app.worker.estimate import EpochResult, QueryEstimators, epoch_results
from stream_app.worker.records import BatchPartial, MarkerPartial, WindowId
from stream_app.worker.rollups import RollupPolicy, RollupState, rollup_result, summary_of
from stream_app.worker.windows import WindowState

CONF = (0.95, 0.99)
BINS = (0, 1, 10, 50, 200, 1000, 10**9)  # truth bins [lo, hi)


def epoch_window(q: Any, epoch: int, rounds: list[np.ndarray], n: int, missing: tuple[int, ...]) -> WindowState:
    """One producer's epoch of ``q`` as the worker's window: a tally batch and a marker per round."""
    w = WindowState.new(WindowId(q.query_id, q.version, epoch), q.n_rounds, q.width)
    for r, counts in enumerate(rounds):
        w.add(BatchPartial(q.query_id, q.version, epoch, r, 0, "p0", f"{epoch:016x}{r:016x}", n, True,
                           np.asarray(counts, dtype=np.int64)))
        w.add(MarkerPartial(q.query_id, q.version, epoch, r, 0, "p0", 0, 1, n, 1, n, 0, False, missing))
    w.close("markers")
    return w


def bin_of(total: float) -> str:
    for lo, hi in zip(BINS, BINS[1:], strict=False):
        if lo <= total < hi:
            return f"[{lo},{hi})" if hi < 10**9 else f">={lo}"
    return "?"


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = ReplaySettings(synthetic_stations=args.stations, data_dir=args.data_dir, pems_raw=args.pems_raw,
                              meta=args.meta, day=args.day, mode="tally")
    day = load_day(settings)
    fleet = fleet_size_for(day, settings)
    queries = default_queries(day, fleet)
    qes = {q.query_id: QueryEstimators.build(q) for q in queries}
    first = args.start_hour * 120
    last = min(day.epochs.size, first + args.hours * 120)
    truth = day.flows[first:last].astype(np.float64)
    has = day.has_truth[first:last]
    policy = RollupPolicy()
    states: dict[bytes, RollupState] = {}
    decided: list[tuple[str, RollupState]] = []
    epochs: dict[str, list[EpochResult]] = defaultdict(list)
    started = time.perf_counter()
    for i in range(first, last):
        e = int(day.epochs[i])
        row = split_fleet(settings.seed, e, day.flows[i], fleet, 1)[0]
        missing = tuple(int(j) + 1 for j in np.flatnonzero(~day.has_truth[i]))  # query order = day order
        for q in queries:
            tc = query_truth_counts(row, day.stations, q)
            er = privatize(q, StationCounts(tc), epoch_rng(settings.seed, q, e, 0), "tally", Device())
            w = epoch_window(q, e, [rd.arrays()["counts"] for rd in er.rounds], er.participants, missing)
            (res,) = epoch_results(qes[q.query_id], [(w, "markers")], CONF, 1)
            epochs[q.query_id].append(res)
            out = policy.apply(lambda rid: states.get(rid.key), [summary_of(res)])
            states.update({rid.key: st for rid, st in out.touched.items()})
            decided += [(q.query_id, st) for st in out.decided]
    elapsed = time.perf_counter() - started
    # coverage by (query, estimator, span, truth bin, level)
    hits: dict[tuple[str, str, int, str, float], list[int]] = defaultdict(lambda: [0, 0])
    sd_summary: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for qid, st in decided:
        res = rollup_result(qes[qid], st, CONF)
        if res.withheld is not None:
            continue
        a, b = st.rid.start - int(day.epochs[first]), st.rid.start - int(day.epochs[first]) + st.rid.span
        tot = truth[a:b].sum(axis=0)
        ok = has[a:b].all(axis=0)
        for name, v in res.values.items():
            sd_summary[(qid, name, res.span_s)].append(float(np.median(v.sd)))
            for j, c in enumerate(CONF):
                inside = (v.lower[j] <= tot) & (tot <= v.upper[j])
                for s in np.flatnonzero(ok):
                    for b in (bin_of(float(tot[s])), "all"):
                        h = hits[(qid, name, res.span_s, b, c)]
                        h[0] += int(inside[s])
                        h[1] += 1
    for qid, results in epochs.items():  # the epochs themselves, for comparison
        for k, res in enumerate(results):
            if res.withheld is not None:
                continue
            for name, v in res.values.items():
                sd_summary[(qid, name, 30)].append(float(np.median(v.sd)))
                for j, c in enumerate(CONF):
                    inside = (v.lower[j] <= truth[k]) & (truth[k] <= v.upper[j])
                    for s in np.flatnonzero(has[k]):
                        for b in (bin_of(float(truth[k][s])), "all"):
                            h = hits[(qid, name, 30, b, c)]
                            h[0] += int(inside[s])
                            h[1] += 1
    rows = [{"query": q, "estimator": n, "span_s": sp, "truth_bin": b, "confidence": c, "cells": t,
             "coverage": round(h / t, 4)} for (q, n, sp, b, c), (h, t) in sorted(hits.items())]
    sds = [{"query": q, "estimator": n, "span_s": sp, "median_sd": round(float(np.median(v)), 2)}
           for (q, n, sp), v in sorted(sd_summary.items())]
    return {"source": str(args.pems_raw or f"synthetic {args.stations} stations"), "epochs": last - first,
            "stations": int(day.stations.size), "fleet": fleet, "seconds": round(elapsed, 1),
            "peak_epoch_truth": float(truth.max()) if truth.size else 0.0, "coverage": rows, "sd": sds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--stations", type=int, default=16)
    p.add_argument("--hours", type=int, default=24)
    p.add_argument("--start-hour", type=int, default=0)
    p.add_argument("--pems-raw", type=Path, default=None)
    p.add_argument("--meta", type=Path, default=None)
    p.add_argument("--day", default=None)
    p.add_argument("--data-dir", type=Path, default=cache_dir("bench"),
                   help="where synthetic days and their parse cache are kept between runs")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = p.parse_args()
    out = run(args)
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    print(f"{out['source']}: {out['epochs']} epochs, {out['stations']} stations, fleet {out['fleet']}, "
          f"peak epoch truth {out['peak_epoch_truth']:.0f}, {out['seconds']} s")
    for r in out["sd"]:
        print(f"  sd  {r['query']:10} {r['estimator']:15} span {r['span_s']:>5} s  median sd {r['median_sd']}")
    table: dict[tuple[str, str, int], dict[str, dict[float, tuple[float, int]]]] = defaultdict(dict)
    for r in out["coverage"]:
        cell = table[(r["query"], r["estimator"], r["span_s"])].setdefault(r["truth_bin"], {})
        cell[r["confidence"]] = (r["coverage"], r["cells"])
    print("coverage 95% / 99% (cells) by truth bin")
    for (q, n, sp), bins in sorted(table.items()):
        parts = [f"{b} {100 * v[0.95][0]:.1f}/{100 * v[0.99][0]:.1f} ({v[0.95][1]})" for b, v in
                 sorted(bins.items(), key=lambda kv: -1 if kv[0] == "all" else int(kv[0].strip("[>=").split(",")[0]))]
        print(f"  {q:8} {n:14} {sp:>5} s  " + "  ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
