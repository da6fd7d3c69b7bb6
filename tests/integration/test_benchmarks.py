"""A benchmark stops every process it started however it ends: sent SIGTERM (what ``timeout``
and ``kill`` send) or SIGINT (Ctrl-C) while its embedded broker and worker run, it exits and
no child survives, checked by pid (tests/benchmarks/common.py, ``stop_children_on_signals``).
A tiny configuration of bench_scale.py: its P1 scenario at 10 stations, 3 epochs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.paths import ROOT
from tests.processes import children

pytestmark = pytest.mark.integration


def _descendants(pid: int) -> dict[int, str]:
    """Every live descendant of ``pid``: its pid and command line."""
    found: dict[int, str] = {}
    todo = list(children(pid))
    while todo:
        p = todo.pop()
        if p in found:
            continue
        try:
            found[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        todo += children(p)
    return found


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None: gone, or a zombie): tells a survivor from a
    new process that reused its pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@contextmanager
def _bench_scale(tmp_path: Path, epochs: int) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[int, str],
                                                                dict[int, str | None]]]:
    """bench_scale.py's p1-10 scenario running in the background: (the process, its log, its
    descendants seen so far, their start times once recorded). However the test ends, the
    benchmark is killed and so is every recorded descendant still alive (not a reused pid)."""
    log = tmp_path / "bench.log"
    with log.open("wb") as fh:
        bench = subprocess.Popen(  # noqa: S603 - the repository's own script
            [sys.executable, "tests/benchmarks/bench_scale.py", "--only", "p1-10", "--epochs-p1", str(epochs),
             "--data-dir", str(tmp_path / "data")], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    seen: dict[int, str] = {}
    started: dict[int, str | None] = {}
    try:
        yield bench, log, seen, started
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        for p in _left(started):
            os.kill(p, signal.SIGKILL)


def _left(started: dict[int, str | None]) -> list[int]:
    """The recorded descendants still alive (the same start time: not a reused pid)."""
    return [p for p, t in started.items() if t is not None and _start_time(p) == t]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signalled_benchmark_leaves_no_child(sig: signal.Signals, tmp_path: Path) -> None:
    with _bench_scale(tmp_path, 3) as (bench, log, seen, started):
        def broker_and_worker() -> bool:
            assert bench.poll() is None, f"the benchmark ended first ({bench.returncode}):\n{log.read_text()[-3000:]}"
            seen.update(_descendants(bench.pid))
            return (any("tansu" in c for c in seen.values())
                    and any("stream_app.cli worker" in c for c in seen.values()))

        _wait(broker_and_worker, 180, "the benchmark's broker and worker")
        started.update({p: _start_time(p) for p in seen})
        bench.send_signal(sig)
        bench.wait(timeout=60)
        assert bench.returncode == 128 + sig, log.read_text()[-3000:]
        assert f"{sig.name}, stopping the broker and every child process" in log.read_text()
        _wait(lambda: not _left(started), 10, f"the benchmark's children to be gone: {seen}")


def test_the_front_door_benchmark_prints_its_line(tmp_path: Path) -> None:
    """bench_front_door.py at a tiny size (500 stations, 300 devices): one JSON line with every
    request accepted (one report per round of each default query: the records of one device and
    epoch), read by its shuffler, and the papers' fleet's need stated."""
    from estimators.registry import default_query_mechanisms, get_spec

    per_device = sum(get_spec(m).n_rounds for m in default_query_mechanisms())
    proc = subprocess.run(  # noqa: S603 - the repository's own script
        [sys.executable, "tests/benchmarks/bench_front_door.py", "--only", "h1", "--devices", "300",
         "--data-dir", str(tmp_path / "data")], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(lines) == 1, proc.stdout
    line = lines[0]
    assert (line["scenario"], line["stations"], line["requests"], line["reports"]) == ("h1", 500, 300, 300 * per_device)
    assert line["reports_per_s"] > 0 and line["retries"] == 0
    assert line["fleet_reports_per_s"] == round(47_719 * per_device / 30)
    assert f"{300 * per_device:,} device reports read" in line["shuffler_summary"], line


def _serving(pid: int) -> bool:
    """The worker ``pid`` is ready (/ready answers 200; its port read from its environment): the
    benchmark is past its workers' start and about to replay, or replaying."""
    import urllib.request

    try:
        env = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
        with urllib.request.urlopen(f"http://127.0.0.1:{int(env[b'PTT_WEB_PORT'])}/ready", timeout=2) as r:  # noqa: S310
            return bool(r.status == 200)
    except (OSError, KeyError, ValueError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_a_benchmark_whose_worker_dies_stops_within_seconds_saying_so(tmp_path: Path) -> None:
    """The worker a benchmark started is killed mid-run: the benchmark ends within 10 s with
    exit code 8, one line naming the worker and its log, and no child left (it measured on
    without it, or waited for epochs that never closed, before)."""
    with _bench_scale(tmp_path, 30) as (bench, log, seen, started):
        def worker_up() -> bool:
            assert bench.poll() is None, f"the benchmark ended first ({bench.returncode}):\n{log.read_text()[-3000:]}"
            seen.update(_descendants(bench.pid))
            workers = [p for p, c in seen.items() if "stream_app.cli worker" in c]
            return bool(workers) and _serving(workers[0])

        _wait(worker_up, 180, "the benchmark's worker ready")
        started.update({p: _start_time(p) for p in seen})
        (worker,) = [p for p, c in seen.items() if "stream_app.cli worker" in c]
        os.kill(worker, signal.SIGKILL)
        t0 = time.monotonic()
        bench.wait(timeout=60)
        assert time.monotonic() - t0 <= 10.0, log.read_text()[-3000:]
        text = log.read_text()
        assert bench.returncode == 8, text[-3000:]
        assert "bench_scale: error: the stream-app worker was killed by signal 9 (SIGKILL)" in text, text[-3000:]
        _wait(lambda: not _left(started), 10, f"the benchmark's children to be gone: {seen}")
