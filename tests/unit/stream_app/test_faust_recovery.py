"""The fix for Faust's end of recovery (:mod:`stream_app.faust_recovery`) is installed by
every app, refuses a Faust it was not written against, and keeps upstream's steps in the
fixed order: seek, clear the queues, and only then resume the stream partitions."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.tables.recovery import Recovery

from stream_app import faust_recovery
from stream_app.app import create_app
from stream_app.settings import WorkerSettings


def test_every_app_gets_the_fix() -> None:
    create_app(WorkerSettings(bootstrap_servers="127.0.0.1:1"))
    assert Recovery.on_recovery_completed is faust_recovery.on_recovery_completed


def test_a_different_faust_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Recovery, "on_recovery_completed", faust_recovery._UPSTREAM)  # noqa: SLF001
    monkeypatch.setattr(faust_recovery, "UPSTREAM_SHA256", "0" * 16)
    with pytest.raises(RuntimeError, match="re-check"):
        faust_recovery.install()


class Calls:
    """Records what the recovery end calls, in order."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def step(self, name: str, result: Any = None) -> Any:
        def call(*_: Any, **__: Any) -> Any:
            self.order.append(name)
            return result
        return call


def test_the_stream_partitions_resume_only_after_the_seek_and_the_clear() -> None:
    calls = Calls()

    async def perform_seek() -> None:
        calls.order.append("seek")

    async def noop(*_: Any, **__: Any) -> None:
        return None

    async def wait(coro: Any, timeout: float | None = None) -> None:
        await coro

    stream, changelog = ("reports", 0), ("ptt-windows-changelog", 0)
    consumer = SimpleNamespace(assignment=lambda: {stream, changelog}, perform_seek=perform_seek,
                               resume_partitions=lambda tps: calls.order.append(f"resume {sorted(tps)}"),
                               resume_flow=calls.step("resume_flow"))
    app = SimpleNamespace(consumer=consumer, consumer_generation_id=3,
                          on_rebalance_complete=SimpleNamespace(send=noop),
                          flow_control=SimpleNamespace(resume=calls.step("clear queues")),
                          _fetcher=SimpleNamespace(maybe_start=noop), conf=SimpleNamespace(broker_request_timeout=1),
                          assignor=SimpleNamespace(assigned_standbys=lambda: set()),
                          on_rebalance_end=calls.step("rebalance end"))
    recovery = SimpleNamespace(app=app, log=SimpleNamespace(info=calls.step("log"), warning=calls.step("warn")),
                               _set_recovery_ended=calls.step("ended"), tables=SimpleNamespace(
                                   values=lambda: [], on_actives_ready=calls.step("actives"),
                                   on_standbys_ready=calls.step("standbys")),
                               actives_for_table={}, standbys_for_table={}, _wait=wait,
                               completed=SimpleNamespace(set=calls.step("completed")),
                               _is_changelog_tp=lambda tp: tp == changelog)
    asyncio.run(faust_recovery.on_recovery_completed(recovery, generation_id=3))
    order = [c for c in calls.order if c != "log"]
    assert order.index("seek") < order.index("clear queues") < order.index(f"resume {[stream]}")
    assert order.index(f"resume {[stream]}") < order.index("resume_flow")
