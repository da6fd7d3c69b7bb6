"""Benchmark: the trip fleet (``producers.trips.TripFleet``) driving a whole day at the papers'
scale, and what a per-day cap on a device's named passages would drop on it.

A synthetic day of 3,220 stations (``ptt synth --stations 3220``: 170,222,059 passages) is
written and read with the PeMS reader (not timed with the model), its metadata made into
corridors (``producers.corridors``), and a fleet of 10,047,719 vehicles (the papers' ratio,
``default_fleet_size``) drives every epoch of it; a consumer keeps each vehicle's passages of
the day (``DayTally``, the device's own counter) and the trips' lengths (``TripLengths``).

What to read: ``model_s`` (the fleet's steps alone) and ``x_real_time`` (86,400 s of data over
that wall time; ``x_real_time_with_tally`` with the consumers), ``peak_rss_mb`` (the process:
the day's grid and its reading too; ``model_rss_mb`` the growth while the fleet was built and
drove), the passages-per-vehicle distribution, and ``dropped_share`` -- the share of the day's
passages a per-day cap of M would drop (each vehicle names its first M). Those shares are
properties of the model's assumptions (trip lengths, activity weights, rests:
docs/fleet-model.md), not of real drivers; the flags vary them.

Run: ``python tests/benchmarks/record.py tests/benchmarks/bench_trips.py [--stations 3220]
[--vehicles N] [--ramps attached|alone|in_chain] [--max-wait 1] [--sigma 1.0] [--trip-miles 10]
[--day-dir DIR]`` (one JSON line of figures).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from producers.corridors import Ramps, build_corridors
from producers.pems import StationMeta, TrafficDay, read_metadata, read_station_raw
from producers.synthetic import write_synthetic_day
from producers.trip_stats import DEFAULT_CAPS, DayTally, TripLengths
from producers.trips import TripFleet, default_fleet_size, usable_counts


def rss_mb() -> float:
    """The process's resident memory now (VmRSS)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drive(fleet: TripFleet, tally: DayTally, lengths: TripLengths) -> tuple[float, float]:
    """Every epoch of the day: seconds in the fleet's steps, seconds in the consumers."""
    model_s = consumers_s = 0.0
    while fleet.t < fleet.counts.shape[0]:
        t0 = time.perf_counter()
        ep = fleet.step()
        t1 = time.perf_counter()
        tally.add(ep)
        lengths.add(ep)
        model_s += t1 - t0
        consumers_s += time.perf_counter() - t1
    return model_s, consumers_s


def trip_figures(hist: np.ndarray[Any, np.dtype[np.int64]]) -> dict[str, float | int]:
    lengths = np.arange(hist.size)
    cum = np.cumsum(hist) / hist.sum()
    return {"trips": int(hist.sum()), "trip_passages_mean": round(float((hist * lengths).sum() / hist.sum()), 3),
            "trip_passages_p50": int(np.searchsorted(cum, 0.5)), "trip_passages_p90": int(np.searchsorted(cum, 0.9)),
            "trip_passages_max": int(np.flatnonzero(hist).max())}


def load(stations: int, day_dir: str | None) -> tuple[TrafficDay, dict[int, StationMeta]]:
    """The synthetic day (``ptt synth``'s defaults: seed, date, glitches), written to a temporary
    folder, or to ``day_dir`` once and read from there again."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(day_dir or tmp)
        raw, meta = sorted(folder.glob("*_station_raw_*")), sorted(folder.glob("*_meta_*"))
        if not (raw and meta):
            sd = write_synthetic_day(folder, n_stations=stations)
            raw, meta = [sd.raw_path], [sd.meta_path]
        day = read_station_raw(raw[0])
        if day.stations.size != stations:
            raise SystemExit(f"{folder} holds a day of {day.stations.size} stations, not {stations}")
        return day, read_metadata(meta[0])[0]


def run(stations: int, vehicles: int | None, seed: int, ramps: Ramps, max_wait: int, sigma: float,
        trip_miles: float, day_dir: str | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    day, meta = load(stations, day_dir)
    load_s = time.perf_counter() - t0
    counts = usable_counts(day.flows, day.has_truth)
    corridors = build_corridors(day.stations, meta, ramps=ramps)
    rss0 = rss_mb()
    t0 = time.perf_counter()
    fleet = TripFleet(counts, corridors, vehicles, seed=seed, max_wait_epochs=max_wait, activity_sigma=sigma,
                      mean_trip_miles=trip_miles)
    build_s = time.perf_counter() - t0
    tally = DayTally(fleet.n_vehicles, day.stations.size, DEFAULT_CAPS)
    lengths = TripLengths(fleet.n_vehicles)
    model_s, consumers_s = drive(fleet, tally, lengths)
    model_s += build_s
    model_rss = rss_mb() - rss0
    dist = tally.summary()
    hour_passages = np.add.reduceat(counts.sum(axis=1), np.arange(0, counts.shape[0], 120))[:24]
    by_hour = {m: (tally.dropped(m).sum(axis=0) / np.maximum(hour_passages, 1)).round(4).tolist() for m in (20, 40)}
    span_s = counts.shape[0] * 30
    return {
        "stations": int(day.stations.size), "epochs": int(counts.shape[0]), "passages": int(counts.sum()),
        "vehicles": fleet.n_vehicles, "default_vehicles": default_fleet_size(int(counts.sum())),
        "corridors": corridors.n_corridors, "longest_corridor": int(corridors.lengths().max()),
        "ramps": ramps, "max_wait_epochs": max_wait, "activity_sigma": sigma, "mean_trip_miles": trip_miles,
        "load_s": round(load_s, 1),
        "model_s": round(model_s, 1), "build_s": round(build_s, 2), "consumers_s": round(consumers_s, 1),
        "x_real_time": round(span_s / model_s, 1), "x_real_time_with_tally": round(span_s / (model_s + consumers_s), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_model_mb": round(rss0, 1), "model_rss_mb": round(model_rss, 1), "exact_fallbacks": fleet.fallbacks,
        **trip_figures(lengths.histogram()),
        "per_vehicle": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in dist.to_json().items()
                        if k != "dropped_share"},
        "dropped_share": {m: round(v, 5) for m, v in dist.to_json()["dropped_share"].items()},
        "dropped_share_by_hour": {str(m): v for m, v in by_hour.items()},
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stations", type=int, default=3220)
    ap.add_argument("--vehicles", type=int, default=None, help="fleet size (default: the papers' ratio)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ramps", choices=["attached", "alone", "in_chain"], default="attached",
                    help="how ramp detectors join the corridors (producers.corridors)")
    ap.add_argument("--max-wait", type=int, default=1, help="epochs a vehicle may wait at a full station")
    ap.add_argument("--sigma", type=float, default=1.0, help="the activity weights' lognormal sigma")
    ap.add_argument("--trip-miles", type=float, default=10.0, help="mean trip length in miles (the exit hazard)")
    ap.add_argument("--day-dir", default=None, help="keep the synthetic day here and read it again next time")
    a = ap.parse_args()
    print(json.dumps(run(a.stations, a.vehicles, a.seed, a.ramps, a.max_wait, a.sigma, a.trip_miles, a.day_dir)))


if __name__ == "__main__":
    main()
