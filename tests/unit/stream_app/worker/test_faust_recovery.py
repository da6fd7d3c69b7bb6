"""The fix for Faust's end of recovery (:mod:`stream_app.worker.faust_recovery`) is installed by
every app, refuses a Faust it was not written against, and never clears the agents' queues
once the stream partitions are resumed (upstream did, dropping records just fetched)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.tables.recovery import Recovery
from faust.types import TP

from stream_app.settings import WorkerSettings
from stream_app.worker import faust_recovery
from stream_app.worker.app import create_app


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


def _run_end_of_recovery(fn: Any, flow_active: bool, committed: dict[Any, int] | None = None) -> list[str]:
    calls = Calls()

    async def perform_seek() -> None:
        calls.order.append("seek")

    async def noop(*_: Any, **__: Any) -> None:
        return None

    async def wait(coro: Any, timeout: float | None = None) -> None:
        await coro

    async def seek_to_beginning(*tps: Any) -> None:
        calls.order.append(f"to beginning {sorted((tp.topic, tp.partition) for tp in tps)}")

    stream, changelog = TP("reports", 0), TP("ptt-windows-changelog", 0)
    consumer = SimpleNamespace(assignment=lambda: {stream, changelog}, perform_seek=perform_seek,
                               _committed_offset=dict(committed or {}),
                               _thread=SimpleNamespace(seek_to_beginning=seek_to_beginning),
                               resume_partitions=lambda tps: calls.order.append(f"resume {sorted(tps)}"),
                               resume_flow=calls.step("resume_flow"))
    flow = SimpleNamespace(resume=calls.step("clear queues"), is_active=lambda: flow_active)
    app = SimpleNamespace(consumer=consumer, consumer_generation_id=3,
                          on_rebalance_complete=SimpleNamespace(send=noop), flow_control=flow,
                          _fetcher=SimpleNamespace(maybe_start=noop), conf=SimpleNamespace(broker_request_timeout=1),
                          assignor=SimpleNamespace(assigned_standbys=lambda: set()),
                          on_rebalance_end=calls.step("rebalance end"))
    recovery = SimpleNamespace(app=app, log=SimpleNamespace(info=calls.step("log"), warning=calls.step("warn"),
                                                            dev=calls.step("log")),
                               _set_recovery_ended=calls.step("ended"), tables=SimpleNamespace(
                                   values=lambda: [], on_actives_ready=calls.step("actives"),
                                   on_standbys_ready=calls.step("standbys")),
                               actives_for_table={}, standbys_for_table={}, _wait=wait,
                               completed=SimpleNamespace(set=calls.step("completed")),
                               _is_changelog_tp=lambda tp: tp == changelog)
    asyncio.run(fn(recovery, generation_id=3))
    return [c for c in calls.order if c != "log"]


def test_no_queue_is_cleared_once_the_stream_partitions_are_resumed() -> None:
    order = _run_end_of_recovery(faust_recovery.on_recovery_completed, flow_active=True)
    assert "clear queues" not in order  # flow control runs since recovery began: nothing to resume
    assert order.index("resume [TP(topic='reports', partition=0)]") < order.index("seek") < order.index("resume_flow")


def test_suspended_flow_is_still_resumed() -> None:
    order = _run_end_of_recovery(faust_recovery.on_recovery_completed, flow_active=False)
    assert order.index("seek") < order.index("clear queues") < order.index("resume_flow")


def test_upstream_clears_the_queues_after_resuming_the_stream_partitions() -> None:
    """What the fix removes (this fails once Faust no longer does it: then drop the fix)."""
    order = _run_end_of_recovery(faust_recovery._UPSTREAM, flow_active=True)  # noqa: SLF001
    assert order.index("resume [TP(topic='reports', partition=0)]") < order.index("clear queues")


def test_a_stream_partition_without_a_committed_offset_goes_back_to_its_beginning() -> None:
    """Records fetched for it before the stream flowed were dropped with aiokafka's position
    past them; the committed seek re-delivers only partitions that have a committed offset."""
    order = _run_end_of_recovery(faust_recovery.on_recovery_completed, flow_active=True)
    assert order.index("seek") < order.index("to beginning [('reports', 0)]") < order.index("resume_flow")
    committed = _run_end_of_recovery(faust_recovery.on_recovery_completed, flow_active=True,
                                     committed={TP("reports", 0): 5})
    assert not any(c.startswith("to beginning") for c in committed)  # the changelog is never sought here
