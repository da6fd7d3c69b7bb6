"""Benchmark: reading a PeMS Station Raw day at the seed papers' scale (3,220 stations).

Writes a synthetic day (3,220 x 2,880 rows) to a temp dir, parses it cold with
``read_station_raw``, loads it twice through ``load_cached`` (the second load is the cache
hit), and compares the parse with a baseline in the same process: decompressing the file and
splitting its lines (``bytes.split``), the least any reader must do. Prints one JSON line.

Run: ``PYTHONPATH=. python tests/benchmarks/bench_readers.py [--stations N]``
(not a pytest test: nothing here is collected).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from producers.pems import load_cached, read_bytes, read_station_raw
from producers.synthetic import write_synthetic_day


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stations", type=int, default=3220)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sd = write_synthetic_day(Path(tmp) / "day", n_stations=args.stations, seed=2026)
        write_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        lines = read_bytes(sd.raw_path).split(b"\n")
        baseline_s = time.perf_counter() - t0
        del lines

        t0 = time.perf_counter()
        day = read_station_raw(sd.raw_path)
        parse_s = time.perf_counter() - t0

        load_cached(sd.raw_path, Path(tmp) / "cache")  # fills the cache (a second parse)
        t0 = time.perf_counter()
        cached = load_cached(sd.raw_path, Path(tmp) / "cache")
        cached_load_s = time.perf_counter() - t0
        same = bool(np.array_equal(cached.flows, day.flows) and np.array_equal(cached.flags, day.flags))
        rows = day.quality.rows_read
        print(json.dumps({
            "stations": int(day.stations.size), "rows": rows,
            "file_mb": round(sd.raw_path.stat().st_size / 1e6, 1),
            "write_s": round(write_s, 2), "parse_s": round(parse_s, 2), "cached_load_s": round(cached_load_s, 3),
            "rows_per_s": round(rows / parse_s), "baseline_s": round(baseline_s, 2),
            "x_baseline": round(parse_s / baseline_s, 2), "cache_equal": same,
        }))


if __name__ == "__main__":
    main()
