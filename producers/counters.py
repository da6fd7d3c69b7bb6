"""One producer's progress, named: what each producer process of a replay shares with the parent
(the progress line, the summary) and with its peers (lockstep: :func:`producers.replay.wait_for_peers`).
The sharing is a flat array of integers -- a ``multiprocessing`` Array across processes, a list
in one -- with one slot per field of :class:`ProducerCounts`, in order. Pure.

>>> slots = [0] * SLOTS
>>> ProducerCounts(epochs_done=3, reports=10, failed=1).write(slots)
>>> ProducerCounts.read(slots).reports, slots[EPOCHS_DONE]
(10, 3)
>>> other = [0] * SLOTS
>>> ProducerCounts(epochs_done=2, reports=5, lost=1).write(other)
>>> total = ProducerCounts.total([slots, other])
>>> total.epochs_done, total.reports, total.failed, total.lost  # epochs: the slowest's; the rest summed
(2, 15, 1, 1)
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from dataclasses import astuple, dataclass, fields

__all__ = ["EPOCHS_DONE", "SLOTS", "ProducerCounts"]


@dataclass(frozen=True)
class ProducerCounts:
    """What one producer has done so far (the broker's acknowledgements and what was handed to
    it), and how it ended."""

    epochs_done: int = 0  # epochs completed: flushed and marked (its peers wait on it)
    reports: int = 0  # reports the broker acknowledged
    records: int = 0  # records the broker acknowledged
    failed: int = 0  # records that could not be delivered
    done: int = 0  # 1 once its loop has ended
    refused: int = 0  # vehicle-epochs its devices refused
    sent_reports: int = 0  # reports handed to the producer
    sent_records: int = 0  # records handed to the producer
    lost: int = 0  # 1 once it lost the broker

    @classmethod
    def read(cls, slots: Sequence[int]) -> ProducerCounts:
        return cls(*(int(v) for v in slots[:SLOTS]))

    def write(self, slots: MutableSequence[int]) -> None:
        """Into ``slots``, the number of epochs done first (what its peers wait on)."""
        for i, v in enumerate(astuple(self)):
            slots[i] = v

    @classmethod
    def total(cls, shared: Sequence[Sequence[int]]) -> ProducerCounts:
        """Every producer's together: the epochs every one has done, the counts summed, lost if
        any one lost the broker."""
        each = [cls.read(s) for s in shared]
        sums = {f.name: sum(getattr(c, f.name) for c in each) for f in fields(cls)}
        return cls(**{**sums, "epochs_done": min(c.epochs_done for c in each),
                      "lost": max(c.lost for c in each), "done": min(c.done for c in each)})


#: the slots of one producer's shared array; ``EPOCHS_DONE``: where its epochs done are
SLOTS = len(fields(ProducerCounts))
EPOCHS_DONE = 0
