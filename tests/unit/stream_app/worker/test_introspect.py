"""``/debug/tasks`` (:mod:`stream_app.worker.introspect`) finds a coroutine that a library's wrapper
hides from its task's await chain -- Faust's agents are awaited through such a wrapper, which
is where a stalled worker's agents would otherwise be invisible."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from stream_app.worker.introspect import await_chain, describe


class Hiding:
    """Awaits a coroutine through ``__await__`` (as Faust's ``AwaitableActor`` does)."""

    def __init__(self, coro: Any) -> None:
        self.coro = coro

    def __await__(self) -> Generator[Any, None, Any]:
        return self.coro.__await__()  # type: ignore[no-any-return]


async def parked_agent(ev: asyncio.Event) -> None:
    await ev.wait()


async def runner(ev: asyncio.Event) -> None:
    await Hiding(parked_agent(ev))


def test_a_hidden_coroutine_is_still_described() -> None:
    async def main() -> tuple[list[str], str]:
        ev = asyncio.Event()
        task = asyncio.create_task(runner(ev), name="agent-like")
        await asyncio.sleep(0)
        chain, text = await_chain(task), describe()
        ev.set()
        await task
        return chain, text

    chain, text = asyncio.run(main())
    assert not any("parked_agent" in step for step in chain)  # the task's chain stops at the wrapper
    block = text.split("COROUTINE parked_agent", 1)[1].split("\n")
    assert "in parked_agent" in block[1] and "in wait" in block[2]  # found, with where it waits
    assert "TASK agent-like" in text and "THREAD MainThread" in text
