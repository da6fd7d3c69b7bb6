"""One report per enrolled device per slot (stream_app/shuffler/enrolled.py): the keyed digests a
slot keeps, what its state records hold (no device id), a restart's restore and the pruning."""
from __future__ import annotations

import json

from schemas.enrollment import Enrollment
from stream_app.shuffler.enrolled import SlotDevices, state

E = Enrollment(b"the enrolled test's enrollment secret", devices=100_000)


def test_one_per_device_per_slot() -> None:
    seen = SlotDevices(E)
    slots = [("q", 1, 9, 0), ("q", 1, 9, 1), ("q", 2, 9, 0), ("q", 1, 10, 0), ("r", 1, 9, 0)]
    for slot in slots:
        assert all(seen.take(slot, d) is not None for d in range(1000))
        assert all(seen.take(slot, d) is None for d in range(1000))  # every second report refused
        assert seen.has(slot, 999) and not seen.has(slot, 1000)
    assert seen.slots() == len(slots)


def test_state_holds_no_device_id() -> None:
    """A slot's state is its digests, sorted: no device id, no arrival order, and one device's
    digests in two slots, or under two secrets, are unrelated."""
    seen = SlotDevices(E)
    slot, other = ("q", 1, 9, 0), ("q", 1, 9, 1)
    order = [70_001, 31_337, 65_536, 12_345]
    digests = {slot: [seen.take(slot, d) or b"" for d in order]}
    text = json.dumps(state(digests))
    for d in order:
        assert str(d) not in text and d.to_bytes(4, "little").hex() not in text
    assert state(digests) == state({slot: digests[slot][::-1]})  # arrival order is gone
    assert E.slot_digest(*slot, 3) != E.slot_digest(*other, 3)
    assert Enrollment(b"another operator's enrollment secret", 100_000).slot_digest(*slot, 3) != E.slot_digest(*slot, 3)


def test_restore_and_prune() -> None:
    seen = SlotDevices(E)
    per_step = [{("q", 1, 9, 0): [seen.take(("q", 1, 9, 0), d) or b"" for d in range(s * 10, s * 10 + 10)]}
                for s in range(3)]
    restored = SlotDevices(E)
    for step in per_step:  # a restart folds every live step record's digests
        restored.restore(state(step))
    assert all(restored.take(("q", 1, 9, 0), d) is None for d in range(30))
    assert restored.take(("q", 1, 9, 0), 30) is not None
    restored.take(("q", 1, 10, 0), 1)
    restored.prune(lambda key: key[2] == 10)  # epoch 9 decided
    assert restored.slots() == 1 and restored.take(("q", 1, 9, 0), 1) is not None
