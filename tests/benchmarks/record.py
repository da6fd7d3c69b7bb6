"""The benchmark record: run one benchmark script and append what it measured, with the
command, the machine and the date, to ``tests/benchmarks/record.jsonl`` (one JSON object a run).

Every figure the docs used to carry by hand lives there instead: the docs say how to run a
benchmark and what it measures; the record says what it measured, where and when. A run's
object::

    {"bench": "bench_enrollment", "command": "python tests/benchmarks/bench_enrollment.py --records 2000",
     "date": "2026-11-28T20:10:00+00:00", "git": "<commit, +dirty>", "exit_code": 0, "wall_s": 12.3,
     "machine": {"cores": 2, "cpu": "...", "memory_gib": 23.4, "python": "3.11.7",
                 "load_1m_start": 1.2, "load_1m_end": 3.4},
     "figures": [<each JSON line the benchmark printed>], "notes": ["<each other line>"]}

The machine here is shared: read a record's ratios (taken within one run) and CPU seconds
before its wall times, and its load average before comparing two records.

Run: ``python tests/benchmarks/record.py tests/benchmarks/bench_enrollment.py [its arguments]``
(``make bench`` runs every benchmark this way). ``--no-record`` runs without appending.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "benchmarks" / "record.jsonl"


def machine() -> dict[str, Any]:
    """What the figures were measured on (the 1-minute load average says how busy it was)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines()
                       if x.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    return {"cores": os.cpu_count(), "cpu": cpu or platform.processor(), "memory_gib": round(mem_kib / 2**20, 1),
            "python": platform.python_version(), "system": platform.system()}


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def run(argv: list[str], record: Path | None = RECORD) -> int:
    """Run ``python BENCH ARGS...``, echo its output, append the record entry; its exit code."""
    script = Path(argv[0])
    cmd = [sys.executable, str(script), *argv[1:]]
    started = datetime.now(UTC)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    figures: list[Any] = []
    notes: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            text = line.strip()
            if not text:
                continue
            try:
                figures.append(json.loads(text))
            except json.JSONDecodeError:
                notes.append(text)
        code = proc.wait()
    entry = {"bench": script.stem, "command": shlex.join(["python", str(script), *argv[1:]]),
             "date": started.isoformat(timespec="seconds"), "git": git_revision(), "exit_code": code,
             "wall_s": round(time.perf_counter() - t0, 1),
             "machine": {**machine(), "load_1m_start": round(load0, 2), "load_1m_end": round(os.getloadavg()[0], 2)},
             "figures": figures, "notes": notes}
    if record is not None:
        with record.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=False) + "\n")
        print(f"record: appended {script.stem} ({len(figures)} figure line(s)) to {record}",
              file=sys.stderr)
    return code


def main() -> int:
    args = sys.argv[1:]
    record: Path | None = RECORD
    if args[:1] == ["--no-record"]:
        record, args = None, args[1:]
    if not args or not args[0].endswith(".py"):
        print("usage: python tests/benchmarks/record.py [--no-record] tests/benchmarks/bench_X.py [ARGS...]",
              file=sys.stderr)
        return 2
    return run(args, record)


if __name__ == "__main__":
    sys.exit(main())
