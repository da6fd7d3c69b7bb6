"""The replay's source notes the shuffler's policy keeps (pure; :mod:`.policy` owns one), and how
many open slots cover each epoch, so that whether a note is still needed is one look-up.

A note of an epoch (the stations without a source reading, whether the replay stopped in it) is
kept while an open slot covers the epoch -- a 30-s slot its own epoch, a span's slot every epoch
of the span -- since the slot's release carries it; once no open slot covers it, a decided slot
drops it (:meth:`KeptNotes.take`), and the policy's sweep drops the old ones no report named
(:meth:`KeptNotes.sweep`). A slot opening adds one to each epoch it covers and closing takes it
away (the slot's span, as its release reads anyway); the notes nothing covers wait in a heap by
epoch for the sweep. So a note costs O(log n) and a slot O(its span), however many slots are
open -- not a scan of every open slot per kept note.

>>> kept = KeptNotes()
>>> kept.cover(range(10, 13))  # a 3-epoch span's slot opens
>>> for e in (10, 11, 20):
...     kept.add(e, frozenset({2}) if e == 11 else frozenset(), interrupted=False)
>>> kept.covered(11), kept.covered(20)
(True, False)
>>> kept.sweep(before=30), 20 in kept, 10 in kept  # the note of 20 is covered by nothing: dropped
(1, False, True)
>>> kept.uncover(range(10, 13))  # the slot is decided: its notes joined, then dropped
>>> kept.take(range(10, 13)), len(kept)
((frozenset({2}), False), 0)
"""

from __future__ import annotations

import heapq
from collections import Counter

__all__ = ["KeptNotes", "Note"]

Note = tuple[frozenset[int], bool]  # (stations without a source reading, interrupted)


class KeptNotes:
    """The kept notes by epoch, the open slots covering each epoch, and the uncovered notes."""

    def __init__(self) -> None:
        self._notes: dict[int, Note] = {}
        self._cover: Counter[int] = Counter()  # epoch -> open slots covering it (absent: none)
        self._idle: set[int] = set()  # kept notes no open slot covers
        self._heap: list[int] = []  # the idle epochs, oldest first (entries of epochs since covered or dropped: stale)
        self._dropped: list[int] = []  # epochs whose note was dropped, until :meth:`drain_dropped`

    def __contains__(self, epoch: int) -> bool:
        return epoch in self._notes

    def __len__(self) -> int:
        return len(self._notes)

    def get(self, epoch: int) -> Note:
        """The note of ``epoch`` (nothing missing, not interrupted if none is kept)."""
        return self._notes.get(epoch, (frozenset(), False))

    def add(self, epoch: int, missing: frozenset[int], interrupted: bool) -> None:
        """Join one producer's note of ``epoch`` to what is kept of it."""
        had_missing, had_interrupted = self.get(epoch)
        self._notes[epoch] = (had_missing | missing, had_interrupted or interrupted)
        self._idle_if_uncovered(epoch)

    def covered(self, epoch: int) -> bool:
        """Whether an open slot covers ``epoch``."""
        return epoch in self._cover

    def cover(self, epochs: range) -> None:
        """A slot covering ``epochs`` opened."""
        for e in epochs:
            self._cover[e] += 1
            self._idle.discard(e)

    def uncover(self, epochs: range) -> None:
        """A slot covering ``epochs`` closed: the notes it was the last to cover become idle."""
        for e in epochs:
            left = self._cover[e] - 1
            if left > 0:
                self._cover[e] = left
                continue
            del self._cover[e]
            self._idle_if_uncovered(e)

    def first_interrupted(self, epochs: range) -> int | None:
        """The first of ``epochs`` whose kept note says the replay stopped in it."""
        return next((e for e in epochs if self.get(e)[1]), None)

    def take(self, epochs: range) -> Note:
        """The notes of ``epochs`` (a decided slot's) joined; each dropped once no open slot covers it."""
        missing: frozenset[int] = frozenset()
        interrupted = False
        for e in epochs:
            m, i = self.get(e)
            missing, interrupted = missing | m, interrupted or i
        for e in epochs:
            if e not in self._cover:
                self._drop(e)
        return missing, interrupted

    def sweep(self, before: int) -> int:
        """Drop the kept notes of epochs before ``before`` that no open slot covers; how many."""
        dropped = 0
        while self._heap and self._heap[0] < before:
            e = heapq.heappop(self._heap)
            if e in self._idle:
                self._drop(e)
                dropped += 1
        return dropped

    def _idle_if_uncovered(self, epoch: int) -> None:
        if epoch in self._notes and epoch not in self._cover and epoch not in self._idle:
            self._idle.add(epoch)
            heapq.heappush(self._heap, epoch)
            if len(self._heap) > 2 * len(self._idle) + 64:  # mostly stale: rebuilt (amortized O(1))
                self._heap = sorted(self._idle)

    def drain_dropped(self) -> list[int]:
        """The epochs whose kept note was dropped since the last call."""
        out, self._dropped = self._dropped, []
        return out

    def _drop(self, epoch: int) -> None:
        if self._notes.pop(epoch, None) is not None:
            self._dropped.append(epoch)
        self._idle.discard(epoch)
