"""The worker's estimate outputs (``PTT_ESTIMATE_OUTPUT``): which topics it creates and watches.
The topic creation itself is captured (no broker); tests/integration/test_frames.py runs a
worker with both outputs against the real one."""

from __future__ import annotations

from typing import Any

import pytest

import schemas.kafka_io
from stream_app.settings import WorkerSettings
from stream_app.worker.app import ensure_stream_topics, watched_topics


@pytest.mark.parametrize("output,rows,frames", [("rows", True, False), ("frames", False, True), ("both", True, True)])
def test_the_frames_topic_exists_and_is_watched_only_when_frames_are_on(
        monkeypatch: pytest.MonkeyPatch, output: str, rows: bool, frames: bool) -> None:
    created: dict[str, int] = {}

    def capture(settings: Any, topics: dict[str, int], **_: Any) -> dict[str, str]:
        created.update(topics)
        return {}

    monkeypatch.setattr(schemas.kafka_io, "ensure_topics", capture)
    s = WorkerSettings(estimate_output=output, frames_topic="f-topic", internal_partitions=3)  # type: ignore[arg-type]
    assert (s.rows_on, s.frames_on) == (rows, frames)
    ensure_stream_topics(s)
    assert ("f-topic" in created) == frames and created.get("f-topic", 3) == 3
    assert ("f-topic" in watched_topics(s)) == frames
    assert s.estimates_topic in created  # the rows topic is always there (dashboards, deploy's ACLs)
