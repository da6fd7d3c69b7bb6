"""QueryCache: lookups never block the event loop; reading the queries topic runs in a worker
thread, one catch-up at a time, and a broker problem there is logged, not raised."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from stream_app.settings import WorkerSettings
from stream_app.worker.app import QueryCache


class _Reader:
    def __init__(self) -> None:
        self.queries: dict[tuple[str, int], Any] = {}
        self.catch_ups = 0
        self.threads: set[int] = set()
        self.concurrent = 0
        self.max_concurrent = 0
        self._lock = threading.Lock()
        self.fail = False

    def catch_up(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            self.concurrent += 1
            self.max_concurrent = max(self.max_concurrent, self.concurrent)
        self.threads.add(threading.get_ident())
        self.catch_ups += 1
        with self._lock:
            self.concurrent -= 1
        if self.fail:
            raise RuntimeError("broker gone")


def _cache() -> tuple[QueryCache, _Reader]:
    cache = QueryCache(WorkerSettings())
    reader = _Reader()
    cache._reader = reader  # type: ignore[assignment]
    return cache, reader


def test_known_never_touches_the_topic() -> None:
    cache, reader = _cache()
    for _ in range(100):  # a flood of records naming an unknown version
        assert cache.known("sp-day", 9) is None
    assert reader.catch_ups == 0
    reader.queries[("sp-day", 9)] = object()
    assert cache.known("sp-day", 9) is not None


def test_refresh_runs_off_the_event_loop_one_at_a_time() -> None:
    cache, reader = _cache()

    async def go() -> int:
        loop_thread = threading.get_ident()
        await asyncio.gather(*(cache.refresh() for _ in range(5)))
        return loop_thread

    loop_thread = asyncio.run(go())
    assert reader.catch_ups == 5 and reader.max_concurrent == 1
    assert loop_thread not in reader.threads


def test_ensure_refreshes_only_for_unknown_queries_and_survives_a_broker_error() -> None:
    cache, reader = _cache()
    reader.queries[("a", 1)] = object()
    asyncio.run(cache.ensure({("a", 1)}, patience_s=5))
    assert reader.catch_ups == 0
    reader.fail = True
    asyncio.run(cache.ensure({("a", 1), ("b", 1)}, patience_s=0))  # logged, not raised
    assert reader.catch_ups == 1


def test_ensure_waits_for_a_reader_that_is_catching_up() -> None:
    """Stage 2's records name queries stage 1 knew: a reader that fails or has not reached the
    query yet (a restart under load) is retried until it has, within the patience."""
    cache, reader = _cache()
    reader.fail = True
    real = reader.catch_up

    def slow_catch_up(timeout_s: float = 30.0) -> None:
        if reader.catch_ups == 3:  # the third attempt reads far enough
            reader.fail = False
            reader.queries[("b", 1)] = object()
        real(timeout_s)

    reader.catch_up = slow_catch_up  # type: ignore[method-assign]
    asyncio.run(cache.ensure({("b", 1)}, patience_s=30))
    assert cache.known("b", 1) is not None and reader.catch_ups == 4
    asyncio.run(cache.ensure({("c", 1)}, patience_s=0.2))  # never published: gives up in time
    assert cache.known("c", 1) is None


def test_a_stuck_read_is_abandoned_and_what_it_had_read_is_kept(monkeypatch: Any) -> None:
    """A catch-up stuck in its client (a hang seen once after a restart under load: the worker
    then published nothing) must not hold every later refresh: after REFRESH_TIMEOUT_S the
    refresh gives up, the reader is dropped (a new one is made next time) and the queries it
    had read stay known."""
    import stream_app.worker.app as app_mod

    monkeypatch.setattr(app_mod, "REFRESH_TIMEOUT_S", 0.2)
    cache, reader = _cache()
    reader.queries[("sp-day", 1)] = object()
    release = threading.Event()
    reader.catch_up = lambda timeout_s=30.0: release.wait(5)  # type: ignore[method-assign]

    async def go() -> bool:
        try:
            return await cache.refresh()
        finally:
            release.set()  # let the abandoned thread end, so the loop can close

    assert asyncio.run(go()) is False
    assert cache._reader is None and cache.known("sp-day", 1) is not None
