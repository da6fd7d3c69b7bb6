"""Benchmark: vehicles that keep their identity through a span (``producers.spans.SpanFleet``)
at the papers' scale, against the data's own time.

A synthetic day of 3,220 stations (~130,000 vehicles at stations per epoch at its peak, like
the PeMS District 7 day of the papers) is read; the fleet is ``max(peak total,
span_fleet_need)``. For the span (hourly by default) holding the day's busiest epoch, one
producer places its vehicles epoch by epoch (``SpanFleet.step``; the split of the epoch,
``split_fleet``, timed apart as today's cost), then reads the span's passages
(``SpanFleet.passages``), maps them onto a query over every station and caps them. What to
read: the step's seconds per epoch against the epoch's 30 s (``x real time``: how many times
faster than the data's own time; the replay's whole budget per epoch is 30 s at --speed 1),
and the span end's seconds against the span's length. The conflicts repaired per epoch are
reported as well (how hard the placement works). Baseline in the same run: one epoch of a
30-s unary query on the per-vehicle path (every vehicle's bitmap over every station), what the
replay pays every epoch today; the span's own per-vehicle bitmaps are timed beside it.

Run: ``python tests/benchmarks/bench_span_fleet.py [--stations 3220] [--span 3600] [--producers 1]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta

import numpy as np

import estimators as E
from producers.fleet import fleet_share, split_fleet
from producers.pems import read_station_raw
from producers.spans import SpanFleet, cap_passages, span_fleet_need, span_flows
from producers.synthetic import write_synthetic_day
from schemas import Query


def run(stations: int, span_s: int, producers: int, seed: int = 2026) -> dict[str, float | int | str]:
    with tempfile.TemporaryDirectory() as tmp:
        sd = write_synthetic_day(tmp, n_stations=stations, seed=seed)
        day = read_station_raw(sd.raw_path)
    per = span_s // 30
    totals = day.flows.sum(axis=1)
    busiest = int(day.epochs[int(np.argmax(totals))])
    start = busiest - busiest % per
    rows = np.flatnonzero((day.epochs >= start) & (day.epochs < start + per))
    need = span_fleet_need(day.epochs, day.flows, span_s, producers)
    fleet = max(day.peak_total(), need)
    _, f, _ = span_flows(day.epochs[rows], day.flows[rows], span_s)
    sf = SpanFleet(seed, span_s, fleet_share(fleet, 0, producers), day.stations.size, 0, day.stations)
    split_s = step_s = 0.0
    worst = 0.0
    for i in rows:
        t0 = time.perf_counter()
        row = split_fleet(seed, int(day.epochs[i]), day.flows[i], fleet, producers)[0]
        t1 = time.perf_counter()
        sf.step(int(day.epochs[i]), row)
        t2 = time.perf_counter()
        split_s += t1 - t0
        step_s += t2 - t1
        worst = max(worst, t2 - t1)
    assert sf.complete
    t0 = time.perf_counter()
    sets = sf.passages()
    t1 = time.perf_counter()
    q = Query(query_id="bench", analyst_id="bench", version=1, sensors=tuple(int(s) for s in day.stations),
              mechanism="unary", population=fleet, span_s=span_s,
              t_start=datetime(2026, 1, 1, tzinfo=UTC), t_end=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=1))
    qs = sf.query_sets(sets, day.stations, q)
    capped, dropped = cap_passages(qs, max(1, per // 6), np.random.default_rng(seed))  # a cap of 1/6 of the span
    t2 = time.perf_counter()
    if producers == 1:
        assert np.array_equal(sets.yes_counts(day.stations.size), f[0])  # the span's truth, exactly
    # baseline, same process: what a 30-s unary query costs EVERY epoch today on the per-vehicle
    # path (each vehicle's bitmap over every station), at the busiest epoch of the span
    last = int(rows[np.argmax(day.flows[rows].sum(axis=1))])
    tc = np.concatenate([[fleet - int(day.flows[last].sum())], day.flows[last]])
    truths = np.repeat(np.arange(tc.size), tc)
    ps = E.PerStation(E.symmetric_unary(0.2), day.stations.size)
    t3 = time.perf_counter()
    ps.sample_bits(np.random.default_rng(seed), truths)
    base_s = time.perf_counter() - t3
    t3 = time.perf_counter()
    ps.sample_bits_sets(np.random.default_rng(seed), qs)  # the span's own per-vehicle report (uncapped)
    span_bits_s = time.perf_counter() - t3
    n_epochs = rows.size
    return {
        "stations": int(day.stations.size), "span_s": span_s, "producers": producers, "fleet": fleet,
        "peak_total": day.peak_total(), "largest_span_flow": int(f.max()), "passages": int(sets.station.size),
        "repairs_per_epoch": sf.repairs / n_epochs,
        "step_s_per_epoch": step_s / n_epochs, "step_worst_s": worst, "split_s_per_epoch": split_s / n_epochs,
        "x_real_time_step": 30.0 / (step_s / n_epochs),
        "x_real_time_split_and_step": 30.0 * n_epochs / (step_s + split_s),
        "span_end_passages_s": t1 - t0, "span_end_map_and_cap_s": t2 - t1, "cap_dropped": dropped,
        "x_real_time_span_end": span_s / (t2 - t0),
        "span_end_share_of_an_epoch": (t2 - t0) / 30.0,
        "baseline_30s_unary_epoch_bits_s": base_s, "span_report_bits_s": span_bits_s,
        "span_end_vs_baseline": (t2 - t0) / base_s, "step_vs_baseline": (step_s / n_epochs) / base_s,
        "load_average_1min": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stations", type=int, default=3220)
    ap.add_argument("--span", type=int, default=3600)
    ap.add_argument("--producers", type=int, default=1)
    a = ap.parse_args()
    print(json.dumps(run(a.stations, a.span, a.producers), indent=2))


if __name__ == "__main__":
    main()
