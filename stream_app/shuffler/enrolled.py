"""One report per enrolled device per slot: the shuffler's record of which devices a slot already
took, as keyed digests (:meth:`schemas.enrollment.Enrollment.slot_digest`), apart from the
reports themselves (pure; the runtime persists :meth:`SlotDevices.state` in its state log).

A slot is one (query, version, epoch, round). A digest is 8 bytes of HMAC-SHA256 under a key
derived from the enrollment secret -- which is never written to Kafka -- of the slot and the
device id: the state log holds, per slot, a sorted list of digests, never a device id, never
beside a report and in no order that follows the reports'. Without the secret a digest says
nothing of its device, and one device's digests in two slots are unrelated.

>>> from schemas.enrollment import Enrollment
>>> seen = SlotDevices(Enrollment(b"k" * 32, devices=100))
>>> slot = ("q", 1, 9, 0)
>>> first = seen.take(slot, 7)
>>> len(first), seen.take(slot, 7), len(seen.take(("q", 1, 9, 1), 7))  # the second report: refused
(8, None, 8)
>>> restored = SlotDevices(Enrollment(b"k" * 32, devices=100))
>>> restored.restore(state({slot: [first]}))
>>> restored.take(slot, 7), len(restored.take(slot, 8))
(None, 8)
>>> seen.prune(lambda key: False); len(seen.take(slot, 7))  # its epoch decided: forgotten
8
>>> seen.forget(("q", 1, 9), rounds=2); seen.slots()  # ... or only the epoch decided now
0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from schemas.enrollment import DIGEST_BYTES, Enrollment

__all__ = ["Slot", "SlotDevices", "state"]

Slot = tuple[str, int, int, int]  # (query id, version, epoch, round)


class SlotDevices:
    """The digests of the devices each open slot took."""

    def __init__(self, enrollment: Enrollment) -> None:
        self.enrollment = enrollment
        self._seen: dict[Slot, set[bytes]] = {}

    def digest(self, slot: Slot, device: int) -> bytes:
        return self.enrollment.slot_digest(*slot, device)

    def digests(self, slot: Slot, devices: list[int]) -> list[bytes]:
        return self.enrollment.slot_digests(*slot, devices)

    def took_none(self, slot: Slot, digests: list[bytes]) -> bool:
        """Whether ``digests`` are distinct and ``slot`` took none of them yet."""
        return len(set(digests)) == len(digests) and self._seen.get(slot, set()).isdisjoint(digests)

    def add_all(self, slot: Slot, digests: list[bytes]) -> None:
        self._seen.setdefault(slot, set()).update(digests)

    def took(self, slot: Slot, digest: bytes) -> bool:
        """Whether ``slot`` took the device of ``digest`` already."""
        return digest in self._seen.get(slot, ())

    def add(self, slot: Slot, digest: bytes) -> None:
        self._seen.setdefault(slot, set()).add(digest)

    def take(self, slot: Slot, device: int) -> bytes | None:
        """Record ``device`` in ``slot``: its digest, or None if the slot already took it."""
        digest = self.digest(slot, device)
        if self.took(slot, digest):
            return None
        self.add(slot, digest)
        return digest

    def has(self, slot: Slot, device: int) -> bool:
        return self.took(slot, self.digest(slot, device))

    def restore(self, state: Iterable[list[Any]]) -> None:
        """Add what :meth:`state` wrote (a restart folds every live step record's)."""
        for q, v, e, r, text in state:
            raw = bytes.fromhex(text)
            got = self._seen.setdefault((str(q), int(v), int(e), int(r)), set())
            got.update(raw[i:i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))

    def prune(self, is_open: Callable[[tuple[str, int, int]], bool]) -> None:
        """Forget the slots of decided epochs (a report for them is refused as late anyway): every
        slot looked at (a restart's); :meth:`forget` the epochs a step decided."""
        for slot in [s for s in self._seen if not is_open(s[:3])]:
            del self._seen[slot]

    def forget(self, epoch: tuple[str, int, int], rounds: int) -> None:
        """Forget the ``rounds`` slots of a decided epoch ``(query, version, epoch)``: the cost of
        the epoch, not of every slot held (a backlog holds thousands)."""
        for r in range(rounds):
            self._seen.pop((*epoch, r), None)

    def slots(self) -> int:
        return len(self._seen)


def state(digests: dict[Slot, list[bytes]]) -> list[list[Any]]:
    """One step's new digests as its state record keeps them: ``[query, version, epoch, round,
    hex of the slot's digests, sorted and concatenated]`` per slot (sorted: no order follows the
    reports')."""
    return [[*slot, b"".join(sorted(d)).hex()] for slot, d in sorted(digests.items())]
