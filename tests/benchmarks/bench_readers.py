"""Benchmark: reading a PeMS Station Raw day at the seed papers' scale (3,220 stations).

Parses a day cold with ``read_station_raw`` (no parse cache), loads it twice through
``load_cached`` (the second load is the cache hit), and measures baselines in the same
process, because the machine may be shared and noisy: decompressing the file with zlib and
dropping the bytes (``gunzip_s``, the least any reader of it must do), the same plus
splitting the lines (``split_s``), and -- with ``--compare-with`` -- another version of the
reader (say the main checkout's ``producers/pems/`` package, or an older ``producers/pems.py``)
on the same file, whose result must be the same. The ratios ``x_gunzip``, ``x_split`` and
``speedup`` are what to read. With ``--repeat N`` every timing is the best of N. Prints one
JSON line.

The day is written to a temp dir (``--stations``) unless ``--raw`` names an existing file.

Run: ``PYTHONPATH=. python tests/benchmarks/bench_readers.py [--stations N | --raw FILE]
[--compare-with OTHER/producers/pems] [--repeat N]`` (not a pytest test: nothing here is
collected).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from producers import pems
from producers.pems import load_cached, read_bytes, read_station_raw
from producers.synthetic import write_synthetic_day


def best(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The shortest of ``repeat`` runs of ``fn`` (seconds) and the last result."""
    times, out = [], None
    for _ in range(repeat):
        out = None  # the previous result is freed before the next run
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def gunzip(path: Path) -> int:
    """Decompress the file (any gzip members, or read it if plain) and drop the bytes."""
    n = 0
    with path.open("rb") as fh:
        data = fh.read(1 << 20)
        if data[:2] != b"\x1f\x8b":
            while data:
                n += len(data)
                data = fh.read(1 << 20)
            return n
        inflate = zlib.decompressobj(wbits=47)
        while data:
            n += len(inflate.decompress(data))
            if inflate.eof and inflate.unused_data:
                data, inflate = inflate.unused_data, zlib.decompressobj(wbits=47)
                continue
            data = fh.read(1 << 20)
    return n


def load_module(path: str) -> ModuleType:
    """A reader module from a file (an old ``producers/pems.py``) or a package directory
    (``producers/pems/``, its submodules loaded from there too)."""
    folder = Path(path)
    if folder.is_dir():
        spec = importlib.util.spec_from_file_location("pems_compared", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
    else:
        spec = importlib.util.spec_from_file_location("pems_compared", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def same_day(a: Any, b: Any) -> bool:
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ("stations", "epochs", "flows", "flags")) \
        and a.quality.to_json() == b.quality.to_json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stations", type=int, default=3220)
    parser.add_argument("--raw", type=Path, help="an existing Station Raw file (not written here)")
    parser.add_argument("--compare-with", help="another producers/pems/ (or an old pems.py), timed on the same file")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_s = None
        if args.raw is None:
            t0 = time.perf_counter()
            raw = write_synthetic_day(Path(tmp) / "day", n_stations=args.stations, seed=2026).raw_path
            write_s = round(time.perf_counter() - t0, 2)
        else:
            raw = args.raw
        read_bytes(raw)  # the file in the page cache for every run alike

        gunzip_s, _ = best(args.repeat, lambda: gunzip(raw))
        split_s, _ = best(args.repeat, lambda: len(read_bytes(raw).split(b"\n")))
        parse_s, day = best(args.repeat, lambda: read_station_raw(raw))
        other: dict[str, Any] = {}
        if args.compare_with:
            old = load_module(args.compare_with)
            old_s, old_day = best(args.repeat, lambda: old.read_station_raw(raw))
            other = {"old_parse_s": round(old_s, 2), "speedup": round(old_s / parse_s, 2),
                     "same_as_old": same_day(day, old_day)}
            del old_day

        load_cached(raw, Path(tmp) / "cache")  # fills the cache (a second parse)
        t0 = time.perf_counter()
        cached = load_cached(raw, Path(tmp) / "cache")
        cached_load_s = time.perf_counter() - t0
        same = bool(np.array_equal(cached.flows, day.flows) and np.array_equal(cached.flags, day.flags))
        rows = day.quality.rows_read
        print(json.dumps({
            "stations": int(day.stations.size), "rows": rows, "file_mb": round(raw.stat().st_size / 1e6, 1),
            "write_s": write_s, "parse_s": round(parse_s, 2), "rows_per_s": round(rows / parse_s),
            "gunzip_s": round(gunzip_s, 2), "x_gunzip": round(parse_s / gunzip_s, 2),
            "split_s": round(split_s, 2), "x_split": round(parse_s / split_s, 2), **other,
            "cached_load_s": round(cached_load_s, 3), "cache_equal": same, "repeat": args.repeat,
            "parse_threads": pems.raw.WORKERS, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
        }))


if __name__ == "__main__":
    main()
