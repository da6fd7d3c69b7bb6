"""device_records: a bit-valued round that privatize hands over as bitmaps (the device path)
gives every device exactly the report the sparse pairs gave -- the same bytes when bitmaps are
sent, the same pairs when pairs are smaller. Deterministic (fixed seeds): no false-failure rate.
"""

from __future__ import annotations

import numpy as np
import pytest

from producers.fleet import Device, privatize
from producers.replay import device_records
from schemas.device_binary import DeviceFields, unpack_device
from tests.devices import enrollment
from tests.unit.producers.test_fleet import SEED, make_query, sensors, truth_for


@pytest.mark.parametrize(("mechanism", "params", "v", "layout"), [
    ("unary", {"q": 0.2}, 50, "bitmap"),
    ("fresh", {}, 30, "bitmap"),  # both rounds
    ("unary", {"q": 0.01}, 600, "pairs"),  # ~7 pairs a device: 56 bytes against 75 of bitmap
])
def test_bitmap_rounds_send_what_the_sparse_pairs_sent(mechanism: str, params: dict[str, float], v: int,
                                                       layout: str) -> None:
    q = make_query(mechanism, sensors(v), params)
    tc = truth_for(v, 300, 2)
    sparse = privatize(q, tc, np.random.default_rng(SEED), "per-vehicle", Device())
    bits = privatize(q, tc, np.random.default_rng(SEED), "per-vehicle", Device(), mix_pairs=False)
    assert "bitmap" in bits.rounds[-1] and "station" in sparse.rounds[-1]
    got = device_records(q, 9, bits, enrollment(), first_device=5)
    want = device_records(q, 9, sparse, enrollment(), first_device=5)
    assert len(got) == len(want) == q.n_rounds
    for (gv, g), (wv, w) in zip(got, want, strict=True):
        assert np.array_equal(gv, wv) and len(g) == len(w) == bits.participants

        def fields(records: list[bytes]) -> list[tuple[int | None, tuple[tuple[int, int], ...], int | None]]:
            out = []
            for raw in records:
                f = unpack_device(raw)
                assert isinstance(f, DeviceFields)
                out.append((f.device, tuple(sorted(f.pairs or ())), f.bitmap_stations))
            return out

        assert fields(g) == fields(w)  # every device: its id, its pairs, its layout
    last = [unpack_device(raw) for raw in got[-1][1]]
    assert all(isinstance(f, DeviceFields) and (f.bitmap_stations == v) == (layout == "bitmap") for f in last)
    if layout == "bitmap":
        assert got[-1][1] == want[-1][1]  # byte for byte, MACs included
