"""Benchmark: per-vehicle sampling + tallying throughput against ``np.bincount``.

For each mechanism, one epoch of N vehicles is privatized per vehicle (path 1) and tallied
per round; the baseline is ``np.bincount`` over the same number of already-made reports,
timed in the same process, interleaved, median of several repeats. The ratio
(sample + tally time) / (bincount time) is what to read: absolute seconds on a shared
machine mean little. Target: <= 5x. The exact-tally path (path 2) is reported as well.

Run: ``python tests/benchmarks/bench_sampling.py [--vehicles N] [--stations V] [--repeats K]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

import estimators as E


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_pair(work: Callable[[], object], base: Callable[[], object], repeats: int) -> tuple[float, float]:
    w, b = [], []
    for _ in range(repeats):  # interleaved so both see the same machine load
        w.append(_time(work))
        b.append(_time(base))
    return statistics.median(w), statistics.median(b)


def _tally_rounds(m: E.Mechanism, reports: np.ndarray) -> np.ndarray:
    """Per-round counts ``(R, O)`` of per-vehicle reports ``(R, n)`` (what stage 1's
    ``accumulate`` does to a round's values)."""
    return np.stack([np.bincount(row, minlength=m.n_outputs) for row in reports])


def run(vehicles: int, stations: int, repeats: int, alp_vehicles: int,
        seed: int = 0) -> list[dict[str, float | str | int]]:
    rng = np.random.default_rng(seed)
    truths = rng.integers(0, stations + 1, size=vehicles)
    truth_counts = np.bincount(truths, minlength=stations + 1)
    rows: list[dict[str, float | str | int]] = []

    for mech in (E.sampling_privacy(stations, 0.45), E.kary_rr(stations + 1, 3.0)):
        reports = mech.sample(rng, truths)
        flat = reports.ravel().copy()

        def work(m: E.Mechanism = mech) -> object:
            return _tally_rounds(m, m.sample(rng, truths))

        def base(f: np.ndarray = flat, k: int = mech.n_outputs) -> object:
            return np.bincount(f, minlength=k)

        t_work, t_base = _median_pair(work, base, repeats)
        t_tally = statistics.median(_time(lambda m=mech: m.tally(rng, truth_counts)) for _ in range(repeats))
        rows.append({"mechanism": mech.name, "path": "per-vehicle", "reports": int(flat.size),
                     "reports_per_s": flat.size / t_work, "ratio_to_bincount": t_work / t_base,
                     "exact_tally_s": t_tally})

    # ALP: every vehicle answers every station; with the paper's fleet (47,719 vehicles,
    # pisNo = 0.05) that is ~7.7M non-⊥ (station, bit) reports per epoch.
    spec = E.get_spec("alp")
    alp = spec.build({}, stations)
    (ps,) = spec.per_station(alp, stations)
    vehicles = alp_vehicles
    truths = rng.integers(0, stations + 1, size=vehicles)
    truth_counts = np.bincount(truths, minlength=stations + 1)
    sample = ps.sample_sparse(rng, truths)
    flat = (sample.station * 3 + sample.output).copy()

    def work_alp() -> object:  # the device's pairs, then the stream app's accumulate and complete
        pairs = ps.sample_sparse(rng, truths)
        summed = spec.accumulate(alp, stations, E.Pairs(pairs.station, pairs.output))
        return spec.complete(alp, stations, summed[None, :], vehicles)

    def base_alp() -> object:
        return np.bincount(flat, minlength=(stations + 1) * 3)

    t_work, t_base = _median_pair(work_alp, base_alp, repeats)
    yes = truth_counts[1:]
    t_tally = statistics.median(_time(lambda: ps.tally(rng, yes, vehicles)) for _ in range(repeats))
    rows.append({"mechanism": "alp (sparse non-⊥ pairs)", "path": "per-vehicle", "reports": int(flat.size),
                 "reports_per_s": flat.size / t_work, "ratio_to_bincount": t_work / t_base,
                 "exact_tally_s": t_tally})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vehicles", type=int, default=2_000_000)
    parser.add_argument("--stations", type=int, default=3220)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--alp-vehicles", type=int, default=47_719)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.vehicles, args.stations, args.repeats, args.alp_vehicles)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.vehicles:,} vehicles (ALP: {args.alp_vehicles:,}), {args.stations:,} stations, "
          f"median of {args.repeats}")
    print(f"{'mechanism':<28}{'reports':>12}{'reports/s':>14}{'x bincount':>12}{'exact tally':>14}")
    for r in rows:
        print(f"{r['mechanism']!s:<28}{r['reports']:>12,}{r['reports_per_s']:>14,.0f}"
              f"{r['ratio_to_bincount']:>11.2f}x{r['exact_tally_s']:>13.4f}s")


if __name__ == "__main__":
    main()
