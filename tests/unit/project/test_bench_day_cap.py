"""tests/benchmarks/bench_day_cap.py at a tiny size (a 20-station synthetic day, 2 releases of each
hourly cell, q given so the planner does not run): one JSON line whose figures are sane -- every
coverage a rate with its Monte Carlo error, the bins' cells adding up to the day's hourly cells,
the share dropped growing as the cap shrinks, and a cap that drops nothing leaving the capped and
uncapped coverage the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

BINS = ["[0,50)", "[50,200)", "[200,1000)", "[1000,3000)", ">=3000"]


@pytest.mark.slow
def test_the_day_cap_benchmark_prints_sane_figures(tmp_path: Path) -> None:
    # 20 stations make short corridors: the papers' ratio of vehicles is too few to drive them
    proc = subprocess.run(  # noqa: S603 - the repository's own script
        [sys.executable, "tests/benchmarks/bench_day_cap.py", "--stations", "20", "--vehicles", "150000",
         "--reps", "2", "--q", "0.05", "--caps", "40", "5", "2", "--day-dir", str(tmp_path / "day")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, proc.stdout
    line = lines[0]
    assert (line["stations"], line["vehicles"], line["reps"], line["caps"]) == (20, 150_000, 2, [40, 5, 2])
    assert line["hourly_cells"] == 24 * 20
    assert {"mean", "p50", "p90", "p99", "max"} <= set(line["per_vehicle"])
    for key in ("load_s", "model_s", "tally_s", "plan_s", "simulate_s", "peak_rss_mb"):
        assert line[key] >= 0, key
    shares = [line["per_cap"][m]["dropped_share"] for m in ("40", "5", "2")]
    assert shares == sorted(shares) and shares[-1] > 0, shares  # non-decreasing as M decreases
    assert all(line["dropped_share"][m] == line["per_cap"][m]["dropped_share"] for m in ("40", "5", "2"))
    for m, cap in line["per_cap"].items():
        assert cap["plan"]["q"] == 0.05 and not cap["planned"], m
        bins = cap["by_uncapped_hourly_flow"]
        assert list(bins) == [*BINS, "all"]
        assert sum(bins[b]["cells"] for b in BINS) == bins["all"]["cells"] == 24 * 20
        for name, b in bins.items():
            if not b["cells"]:
                continue
            for cov in ("coverage_capped", "coverage_uncapped"):
                assert 0 <= b[cov] <= 1 and 0 <= b[f"{cov}_mc_sd"] <= 0.5, (m, name, cov)
            assert 0 <= b["dropped_share"] <= 1, (m, name)
    none_dropped = line["per_cap"]["40"]["by_uncapped_hourly_flow"]["all"]
    if line["per_cap"]["40"]["dropped_share"] == 0:
        assert none_dropped["coverage_capped"] == none_dropped["coverage_uncapped"]
    tight = line["per_cap"]["2"]["by_uncapped_hourly_flow"][">=3000"]
    assert tight["bias_uncapped"] < 0  # a cap of 2 drops most passages: the estimates fall short of the flow
