"""The shuffler's catch-up of the source notes (``Shuffler._catch_up_notes``, asked by the
admission when a report lies outside the open window) holds its deadline within a poll: a
backlog of notes that each take long cannot hold the step -- and every release behind it --
for minutes. No broker: the notes reader and the main consumer are stand-ins, the clock is a
counter that each note moves by 1.05 s (what one note cost in the issue's day).

Checked: the notes taken stop at the first one met past ``CATCH_UP_S`` (fails if the deadline is
checked only between polls: a poll of 1,000 notes is taken whole, ~1,050 s); the main consumer
skips exactly the notes taken, so it reads the rest itself (none lost, none twice); without a
deadline in the way every note is taken and the consumer moves to the reader's position."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition

from stream_app.shuffler import runtime
from stream_app.shuffler.admission import Step
from stream_app.shuffler.runtime import CATCH_UP_S, Shuffler

TP = TopicPartition("notes", 0)


@dataclass
class _Reader:
    """The notes reader: ``end`` notes at offsets 0.. (``gap``: offsets past the last note, as a
    transaction's commit marker leaves)."""

    end: int
    gap: int = 0
    pos: int = 0

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos = offset

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {TP: self.end + self.gap}

    def position(self, tp: TopicPartition) -> int:
        return self.pos

    def poll(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        got = [SimpleNamespace(offset=o) for o in range(self.pos, min(self.pos + max_records, self.end))]
        self.pos = min(self.pos + max_records, self.end) if got else self.end + self.gap
        return {TP: got} if got else {}


@dataclass
class _Consumer:
    at: int = 0
    skipped: list[int] = field(default_factory=list)

    def position(self, tp: TopicPartition) -> int:
        return self.at

    def skip_to(self, tp: TopicPartition, offset: int) -> None:
        self.skipped.append(offset)


def _shuffler(reader: _Reader, consumer: _Consumer, note_s: float, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A shuffler with the stand-ins; the offsets of the notes it takes (each ``note_s`` long)."""
    now = [100.0]
    monkeypatch.setattr(runtime, "time", SimpleNamespace(monotonic=lambda: now[0]))
    taken: list[int] = []

    def take(rec: Any, step: Step) -> None:
        taken.append(rec.offset)
        now[0] += note_s

    shuffler = Shuffler.__new__(Shuffler)
    shuffler._consumer = consumer  # type: ignore[assignment]
    shuffler._notes_reader = reader
    shuffler._notes_tp = TP
    shuffler._take_note = take  # type: ignore[method-assign]
    shuffler._catch_up_notes(Step())
    return taken


def test_the_deadline_holds_within_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer(at=20)
    taken = _shuffler(_Reader(end=3_000), consumer, 1.05, monkeypatch)
    assert taken == list(range(20, 20 + len(taken))) and 1 <= len(taken) <= CATCH_UP_S / 1.05 + 1
    assert consumer.skipped == [20 + len(taken)]  # the first note not taken is the consumer's to read


def test_without_a_deadline_in_the_way_every_note_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer(at=5)
    taken = _shuffler(_Reader(end=2_500, gap=1), consumer, 0.0001, monkeypatch)
    assert taken == list(range(5, 2_500))
    assert consumer.skipped == [2_501]  # past the commit marker too
