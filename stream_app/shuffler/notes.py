"""How far a replay's source note may move the shuffler's trusted clock, and which notes were
refused (pure: the policy, :mod:`.policy`, asks it; docs/wire.md, "How far a note may move the
clock"). A note's MAC is checked before (:meth:`schemas.enrollment.Enrollment.check_note`): this
is what a note that verifies is still held to.

The epoch a note finishes (``epoch``; ``epoch - 1`` when it ``opens``) may be at most ``lead``
epochs past the newest *vouched* epoch -- the clock itself, or the newest epoch of an admitted
device report (authenticated and inside the open window, so at most ``ahead_epochs`` past the
clock: stolen credentials cannot vouch further) -- plus, with ``pace`` (a paced replay's speed,
data seconds per host second), the epochs the host's clock has passed at that pace since that
epoch was vouched for; with the wall clock (live devices), at most ``lateness`` past the host's
current epoch. Beyond: ``note_from_future``. Unpaced (speed 0), notes one epoch after the other
always pass however fast they come, and a note far ahead of the newest genuine note and device
report never does; the first note (no clock, nothing admitted) is the anchor.

>>> b = NoteBound(lead=2, pace=0.0, lateness=1)
>>> b.refusal(SourceEpoch(epoch=500), clock=-1, now=0.0) is None  # the first: the anchor
True
>>> b.refusal(SourceEpoch(epoch=11), clock=9, now=0.0), b.refusal(SourceEpoch(epoch=50), clock=9, now=0.0).reason
(None, 'note_from_future')
>>> b.vouch(11, clock=9, now=1.0)  # an admitted device report of epoch 11
>>> b.refusal(SourceEpoch(epoch=13), 9, 1.0) is None, b.refusal(SourceEpoch(epoch=14), 9, 1.0).reason
(True, 'note_from_future')
"""

from __future__ import annotations

from collections import Counter

from schemas import SourceEpoch
from schemas.epochs import EPOCH_S
from schemas.estimates import Rejected

__all__ = ["REFUSED_KEPT", "NoteBound"]

REFUSED_KEPT = 240  # epochs of refused notes kept (the oldest dropped first)


class NoteBound:
    """The note bound (module docstring) and the notes refused, per epoch (for ``notes_refused``)."""

    def __init__(self, lead: int, pace: float, lateness: int) -> None:
        self.lead = lead
        self.pace = pace
        self.lateness = lateness
        self.vouched = -1  # the newest epoch of an admitted device report
        self._base = (-1, 0.0)  # (the newest vouched epoch, clock or report, the host time it was first seen)
        self._refused: Counter[int] = Counter()  # note epoch -> notes of it refused

    def vouch(self, epoch: int, clock: int, now: float) -> None:
        """An admitted device report names ``epoch`` (-1: none; the clock is ``clock`` now)."""
        self.vouched = max(self.vouched, epoch)
        base = max(clock, self.vouched)
        if base > self._base[0]:
            self._base = (base, now)

    def bound(self, clock: int, now: float) -> int | None:
        """The newest epoch a note may finish at host time ``now`` (None: the anchor, anything)."""
        self.vouch(-1, clock, now)
        base, since = self._base
        if base < 0:
            return None
        return base + self.lead + (int(max(now - since, 0.0) * self.pace / EPOCH_S) if self.pace else 0)

    def refusal(self, note: SourceEpoch, clock: int, now: float, wall_epoch: int | None = None) -> Rejected | None:
        """Why ``note`` (its MAC verified) may not move the clock (``wall_epoch``: the host's
        current epoch, with the wall clock); None: it may."""
        done = note.epoch - 1 if note.opens else note.epoch
        if wall_epoch is not None and note.epoch > wall_epoch + self.lateness:
            return Rejected("note_from_future", f"a source note of epoch {note.epoch}, more than {self.lateness} "
                                                f"past the host's epoch {wall_epoch}")
        bound = self.bound(clock, now)
        if bound is not None and done > bound:
            return Rejected("note_from_future",
                            f"a source note that finishes epoch {done}, past {bound}: the newest epoch vouched for "
                            f"(clock {clock}, device reports {self.vouched}) + {self.lead}"
                            + (f" + the host's time at pace {self.pace:g}" if self.pace else ""))
        return None

    def refused(self, epoch: int) -> None:
        """A note of ``epoch`` was refused (untrusted or from the future)."""
        self._refused[epoch] += 1
        while len(self._refused) > REFUSED_KEPT:
            del self._refused[min(self._refused)]

    def refused_near(self, epoch: int, ahead: int) -> int:
        """Notes refused that could have opened ``epoch``'s window: of it or the ``ahead`` before."""
        return sum(self._refused.get(e, 0) for e in range(epoch - ahead, epoch + 1))
