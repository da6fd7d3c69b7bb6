"""device_records: a bit-valued round that privatize hands over as bitmaps (the device path)
gives every device exactly the report the sparse pairs gave -- the same bytes when bitmaps are
sent, the same pairs when pairs are smaller. Deterministic (fixed seeds): no false-failure rate.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from estimators import Bitmaps, Pairs, StationCounts, StationSets
from producers.devices import DeviceRequests
from producers.fleet import Device, privatize
from producers.replay import device_records
from schemas import Query
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
    sparse = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device())
    bits = privatize(q, StationCounts(tc), np.random.default_rng(SEED), "per-vehicle", Device(), mix_pairs=False)
    # the mechanism chooses: bitmaps, or pairs when it expects few ones (PerStation.sparse_bits)
    assert isinstance(bits.rounds[-1], Bitmaps) == (layout == "bitmap") and isinstance(sparse.rounds[-1], Pairs)
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


def test_a_span_report_is_one_record_per_device_with_the_spans_first_epoch() -> None:
    """A span query's report on the device paths (Kafka records and the HTTP path's requests):
    every device of the producer once, its set truth's stations in its bitmap, the epoch the
    span's first."""
    t0 = datetime(2026, 11, 18, tzinfo=UTC)
    q = Query(query_id="flows", analyst_id="a", version=1, sensors=sensors(40), mechanism="unary",
              params={"q": 1e-9}, population=100, span_s=300, t_start=t0, t_end=t0 + timedelta(days=1))
    n = 25
    sets = StationSets(n, np.repeat(np.arange(n), 3), np.tile(np.array([2, 17, 39]), n))
    er = privatize(q, sets, np.random.default_rng(SEED), "per-vehicle", Device(1e3), mix_pairs=False)
    got = device_records(q, 1_000_000, er, enrollment(), first_device=7)
    assert len(got) == 1
    vehicles, records = got[0]
    fields = [unpack_device(raw) for raw in records]
    assert all(isinstance(f, DeviceFields) and f.epoch == 1_000_000 and f.query_id == "flows" for f in fields)
    assert sorted(f.device or 0 for f in fields if isinstance(f, DeviceFields)) == list(range(7, 7 + n))
    for f in fields:  # q ~ 0: each device's report is its whole set, a bitmap over the 40 stations
        assert isinstance(f, DeviceFields) and f.bitmap_stations == 40
        assert sorted(s for s, o in f.pairs or () if o == 1) == [2, 17, 39]
    requests = DeviceRequests()
    requests.add(got)
    assert len(requests.devices) == n and all(len(d) == 1 for d in requests.devices)
