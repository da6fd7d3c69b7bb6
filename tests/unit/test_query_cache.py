"""QueryCache: an unknown query triggers at most one full catch-up per few seconds."""

from __future__ import annotations

from typing import Any

from stream_app.app import QueryCache
from stream_app.settings import WorkerSettings


class _Reader:
    def __init__(self) -> None:
        self.queries: dict[tuple[str, int], Any] = {}
        self.catch_ups = 0
        self.polls = 0

    def catch_up(self) -> None:
        self.catch_ups += 1

    def poll(self, timeout_ms: int = 0) -> int:
        self.polls += 1
        return 0


def test_unknown_queries_do_not_stall_the_worker() -> None:
    cache = QueryCache(WorkerSettings())
    reader = _Reader()
    cache._reader = reader  # type: ignore[assignment]
    for _ in range(100):  # a flood of records naming an unknown version
        assert cache.get("sp-day", 9) is None
    assert reader.catch_ups == 1 and reader.polls == 99
    reader.queries[("sp-day", 9)] = object()  # it shows up on the topic
    assert cache.get("sp-day", 9) is not None
