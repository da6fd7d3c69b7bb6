"""Where a running worker is waiting: every asyncio task's await chain and every thread's
stack, as text, and its Faust consumer's partitions (:func:`consumer_state`) (the worker serves
them at ``/debug/tasks``; docs/operations.md).

``Task.get_stack()`` shows only a suspended task's outermost frame; a stalled worker needs
the whole chain -- which coroutine, async generator or future each one is awaiting, down to
the innermost. Code locations only: no local variable is ever shown (they may hold data).

>>> import asyncio
>>> async def inner(ev: asyncio.Event) -> None:
...     await ev.wait()
>>> async def outer(ev: asyncio.Event) -> None:
...     await inner(ev)
>>> async def main() -> list[str]:
...     ev = asyncio.Event()
...     task = asyncio.create_task(outer(ev), name="demo")
...     await asyncio.sleep(0)
...     chain = await_chain(task)
...     ev.set()
...     await task
...     return [line.split(" in ")[-1] for line in chain]
>>> asyncio.run(main())
['outer', 'inner', 'wait', 'awaiting FutureIter']
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any

__all__ = ["await_chain", "consumer_state", "describe", "own_coroutines"]

MAX_DEPTH = 50
PROJECT = str(Path(__file__).resolve().parents[2])  # the packages' root


def _frame_of(obj: Any) -> Any:
    for attr in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(obj, attr, None)
        if frame is not None:
            return frame
    return None


def _awaited(obj: Any) -> Any:
    for attr in ("cr_await", "ag_await", "gi_yieldfrom"):
        inner = getattr(obj, attr, None)
        if inner is not None:
            return inner
    return None


def await_chain(task: asyncio.Task[Any] | Any) -> list[str]:
    """``file:line in function`` for each coroutine a task (or a coroutine or async
    generator) is suspended in, outermost first, then the type of what the innermost awaits
    (a future's iterator, mostly). A chain ends where a wrapper hides the next coroutine
    (``await`` on an object whose ``__await__`` returns another coroutine's): see
    :func:`own_coroutines`."""
    out: list[str] = []
    obj: Any = task.get_coro() if isinstance(task, asyncio.Task) else task
    for _ in range(MAX_DEPTH):
        if obj is None:
            break
        frame = _frame_of(obj)
        if frame is None:  # not a coroutine: a future (its iterator) or another awaitable
            out.append(f"awaiting {type(obj).__name__}")
            break
        out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        obj = _awaited(obj)
    return out


def _ours(obj: Any) -> bool:
    frame = _frame_of(obj)
    name = frame.f_code.co_filename if frame is not None else ""
    return name.startswith(PROJECT) and "site-packages" not in name


def own_coroutines() -> list[Any]:
    """This project's suspended coroutines and async generators that no other one of its
    own awaits: where each of its chains starts (found through the garbage collector, since
    a library's wrapper can hide them from their task's chain)."""
    mine = [o for o in gc.get_objects() if isinstance(o, types.CoroutineType | types.AsyncGeneratorType)
            and _ours(o)]
    inner = {id(_awaited(o)) for o in mine}
    return [o for o in mine if id(o) not in inner]


def describe(head: list[str] | None = None) -> str:
    """``head`` (what the caller adds), every task of the running loop, this project's
    coroutines, and every thread, as text."""
    lines: list[str] = list(head or [])
    for task in sorted(asyncio.all_tasks(), key=lambda t: t.get_name()):
        lines.append(f"TASK {task.get_name()}")
        lines += [f"  {step}" for step in await_chain(task)]
    for coro in own_coroutines():
        lines.append(f"COROUTINE {getattr(coro, '__qualname__', type(coro).__name__)}")
        lines += [f"  {step}" for step in await_chain(coro)]
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():  # noqa: SLF001 - the one way to see other threads
        lines.append(f"THREAD {names.get(ident, ident)}")
        lines += [f"  {f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack(frame)]
    return "\n".join(lines) + "\n"


def consumer_state(app: Any) -> list[str]:
    """Faust's consumer as the fetcher sees it: flow, paused partitions, and per partition
    the offset read, committed and the high-water mark (for ``/debug/tasks``)."""
    c: Any = app.consumer
    lines = [f"CONSUMER flow {'suspended' if c.suspend_flow.is_set() else 'running'}, "
             f"can resume {c.can_resume_flow.is_set()}, paused {sorted(map(tuple, c._paused_partitions))}"]
    for tp in sorted(c.assignment()):
        try:
            high = c.highwater(tp)
        except Exception as exc:  # noqa: BLE001 - a debug page says what it could not read
            high = f"? ({type(exc).__name__})"
        lines.append(f"  {tp.topic}[{tp.partition}] read {c._read_offset.get(tp)} "
                     f"committed {c._committed_offset.get(tp)} highwater {high} {_fetch_state(c, tp)}")
    return lines


def _fetch_state(c: Any, tp: Any) -> str:
    """Whether Faust asks for ``tp`` (its active set) and aiokafka's own view of it: the fetch
    position, paused, awaiting an offset reset -- a partition never read shows which side idles."""
    active = tp in (c._active_partitions or ())
    try:
        from aiokafka import TopicPartition

        assignment = c._thread._consumer._subscription.subscription.assignment
        st = assignment.state_value(TopicPartition(tp.topic, tp.partition))
        fetch = ("position " + (str(st.position) if st.has_valid_position else "none") +
                 f", paused {st.paused}, awaiting reset {st.awaiting_reset}")
    except Exception as exc:  # noqa: BLE001 - a debug page says what it could not read
        fetch = f"fetch state ? ({type(exc).__name__})"
    return f"(faust active {active}; aiokafka {fetch})"
