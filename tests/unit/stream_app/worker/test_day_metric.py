"""The vehicle's whole-day epsilon on the worker's ``/metrics`` (stream_app/worker/day_metric.py): the
gauge is :func:`stream_app.day_figure.vehicle_day`'s figure -- the banner's, ``ptt analyst
list``'s and the report's -- of the running queries (the newest version of each) for the
release their newest published epochs took; it is recomputed when either changes, has no
series while it is not current, and is computed off the event loop (a child process, killed
when the worker stops). Broken implementations (the wrong release, a stale query set) fail the
same check. (The demo end to end, /metrics against the banner: tests/integration/test_demo_day_figure.py.)"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from schemas.query import Query
from stream_app.day_figure import crowd, newest, unbounded, vehicle_day
from stream_app.worker import day_metric
from stream_app.worker.day_metric import STATES, Compute, DayFigure, VehicleDay, figure, in_child
from stream_app.worker.metrics import StreamMonitor

T0, T1 = datetime(2026, 11, 18, 6, tzinfo=UTC), datetime(2026, 11, 18, 10, tzinfo=UTC)


def _query(qid: str, mechanism: str, version: int = 1, population: int = 247) -> Query:
    return Query(query_id=qid, analyst_id="a", version=version, sensors=(1, 2, 3, 4), mechanism=mechanism,
                 population=population, t_start=T0, t_end=T1)


def _epoch(q: Query, epoch: int, release: str | None, **kw: Any) -> Any:
    """What VehicleDay reads of an EpochResult."""
    return SimpleNamespace(query=q, epoch=epoch, release=release, retracted=kw.get("retracted", False),
                           withheld=kw.get("withheld"))


async def in_thread(queries: Sequence[Query], release: str) -> DayFigure:
    return await asyncio.to_thread(figure, queries, release)


def _state(reg: CollectorRegistry) -> str:
    (on,) = [s for s in STATES if reg.get_sample_value("ptt_vehicle_day_epsilon_state", {"state": s}) == 1]
    return on


def _series(reg: CollectorRegistry, name: str) -> dict[str, float]:
    (family,) = [f for f in reg.collect() if f.name == name]
    return {next(iter(s.labels.values())): s.value for s in family.samples}


async def _until(reg: CollectorRegistry, day: VehicleDay, queries: list[Query], timeout_s: float = 120) -> str:
    """Follow ``queries`` (as the worker's tick does) until the figure is no longer being computed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        day.follow(queries)
        if _state(reg) != "computing":
            return _state(reg)
        await asyncio.sleep(0.02)
    raise TimeoutError("the figure was still computing")


def assert_shows(reg: CollectorRegistry, queries: list[Query], release: str) -> None:
    """/metrics gives day_figure.vehicle_day's figure of ``queries`` for ``release``, its n and its queries."""
    line, epsilon = vehicle_day(queries, release)
    assert _state(reg) == "ready"
    assert _series(reg, "ptt_vehicle_day_epsilon") == {release: pytest.approx(epsilon, rel=1e-12)}
    n = crowd(newest(queries))
    assert _series(reg, "ptt_vehicle_day_shuffle_size") == ({} if release == "local" else {release: n})
    assert release == "local" or f"among n={n:,}" in line
    assert _series(reg, "ptt_vehicle_day_query_version") == {
        q.query_id: q.version for q in newest(queries) if not unbounded(q)}


async def _scenario(compute: Compute) -> None:
    reg = CollectorRegistry()
    day = VehicleDay(StreamMonitor(reg), compute)
    alp, rr = _query("alp-day", "alp"), _query("rr-day", "rr")
    assert await _until(reg, day, []) == "no_queries" and _series(reg, "ptt_vehicle_day_epsilon") == {}
    assert await _until(reg, day, [alp, rr]) == "no_epochs"  # the release is not known yet
    day.on_epoch_closed(_epoch(alp, 10, "aggregate"))
    day.on_epoch_closed(_epoch(rr, 10, "aggregate"))
    day.on_epoch_closed(_epoch(rr, 11, None, withheld="no_reports"))  # released nothing: not the path
    day.on_epoch_closed(_epoch(rr, 9, None))  # older than the newest: not the path now
    await _until(reg, day, [alp, rr])
    assert_shows(reg, [alp, rr], "aggregate")
    shown = _series(reg, "ptt_vehicle_day_epsilon")
    rr2 = _query("rr-day", "rr", version=2, population=180)  # a new version: another n and another figure
    day.follow([alp, rr, rr2])
    assert _state(reg) == "computing" and _series(reg, "ptt_vehicle_day_epsilon") == {}  # no stale number
    await _until(reg, day, [alp, rr, rr2])
    assert_shows(reg, [alp, rr, rr2], "aggregate")
    assert _series(reg, "ptt_vehicle_day_epsilon") != shown
    day.on_epoch_closed(_epoch(alp, 12, None))  # alp's newest epoch went direct: only the local figure holds
    await _until(reg, day, [alp, rr, rr2])
    assert_shows(reg, [alp, rr, rr2], "local")
    await day.close()


def test_the_gauge_is_day_figures_for_the_running_queries_and_release() -> None:
    asyncio.run(_scenario(in_thread))


def _wrong_release() -> Compute:
    async def compute(queries: Sequence[Query], release: str) -> DayFigure:
        return await in_thread(queries, "local" if release != "local" else "aggregate")
    return compute


def _stale() -> Compute:
    first: list[Sequence[Query]] = []

    async def compute(queries: Sequence[Query], release: str) -> DayFigure:
        first.append(queries)
        return await in_thread(first[0], release)
    return compute


@pytest.mark.parametrize("broken", [_wrong_release, _stale], ids=["wrong-release", "stale-queries"])
def test_a_broken_figure_fails_the_same_check(broken: Any) -> None:
    with pytest.raises(AssertionError):
        asyncio.run(_scenario(broken()))


def test_no_bound_and_failure_show_no_number(monkeypatch: pytest.MonkeyPatch) -> None:
    async def go() -> None:
        reg = CollectorRegistry()
        day = VehicleDay(StreamMonitor(reg), in_thread)
        sp = _query("sp-day", "sp")
        day.on_epoch_closed(_epoch(sp, 1, "aggregate"))
        assert await _until(reg, day, [sp]) == "no_bound"
        assert _series(reg, "ptt_vehicle_day_epsilon") == {} and _series(reg, "ptt_vehicle_day_query_version") == {}
        calls: list[str] = []

        async def failing(queries: Sequence[Query], release: str) -> DayFigure:
            calls.append(release)
            raise ValueError("no accounting")

        monkeypatch.setattr(day_metric, "RETRY_S", 0.3)
        day = VehicleDay(StreamMonitor(reg := CollectorRegistry()), failing)
        day.on_epoch_closed(_epoch(sp, 1, None))
        for tries in (1, 2):
            day.follow([sp])
            assert _state(reg) == "computing"
            await asyncio.sleep(0.1)
            day.follow([sp])  # within RETRY_S: not tried again
            assert _state(reg) == "failed" and _series(reg, "ptt_vehicle_day_epsilon") == {} and len(calls) == tries
            await asyncio.sleep(0.4)  # RETRY_S passed: the next read of the queries tries again
        await day.close()

    asyncio.run(go())


def _children() -> list[int]:
    """This process's children that compute a day figure."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"stream_app.worker.day_metric" in (
                    proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


@pytest.mark.slow  # child processes
def test_the_child_process_gives_the_same_figure_and_the_loop_runs_meanwhile() -> None:
    queries = [_query("alp-day", "alp"), _query("unary-day", "unary"), _query("sp-day", "sp")]

    async def go() -> tuple[DayFigure, float]:
        gaps: list[float] = []
        job = asyncio.ensure_future(in_child(queries, "aggregate"))
        last = time.monotonic()
        while not job.done():
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()
        return await job, max(gaps)

    got, gap = asyncio.run(go())
    assert got == figure(queries, "aggregate")
    assert gap < 2.0  # the loop turned all along (a thread would hold the GIL against it)


@pytest.mark.slow  # a child process
def test_closing_kills_the_computation() -> None:
    async def go() -> None:
        reg = CollectorRegistry()
        day = VehicleDay(StreamMonitor(reg))
        q = _query("unary-day", "unary", population=120_000)  # many seconds of accounting
        day.on_epoch_closed(_epoch(q, 1, "aggregate"))
        day.follow([q])
        deadline = time.monotonic() + 60
        while not _children() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _children(), "no child process computing"
        await day.close()
        assert _children() == [] and _state(reg) == "computing"

    asyncio.run(go())
