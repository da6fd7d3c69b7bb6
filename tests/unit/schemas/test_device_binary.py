"""The binary device report layout (schemas/device_binary.py) and its decoding through
schemas.decode_device_record: the JSON path's reasons, and never a crash on any bytes."""
from __future__ import annotations

import numpy as np
import pytest

from schemas import DeviceReport, WireError, decode_device_record, decode_device_report, encode_json
from schemas.device_binary import (
    FLAG_AUTH,
    FLAG_BITMAP,
    FLAG_PAIRS,
    DeviceFields,
    auth_message,
    encode_device,
    encode_device_bitmaps,
    encode_device_pairs,
    encode_device_values,
    unpack_device,
)
from schemas.enrollment import Enrollment
from stream_app.shuffler.metrics import DEAD_LETTER_REASONS

GOOD = [
    DeviceReport(query_id="sp-day", query_version=1, epoch=59_832_000, round=1, value=3),
    DeviceReport(query_id="q", query_version=7, epoch=0, round=0, value=0),
    DeviceReport(query_id="alp.x_1", query_version=2, epoch=9, round=0, pairs=((4, 1), (7, 0))),
    DeviceReport(query_id="rr", query_version=1, epoch=9, round=1, pairs=()),
]


# bitmap reports (pairs (s, 1) over V stations): V a multiple of 8, not one, a single station, empty
BITMAPS = [
    encode_device("unary", 1, 59_832_000, 1, pairs=((3, 1), (16, 1), (1, 1)), bitmap_stations=16),
    encode_device("unary", 2, 9, 0, pairs=((11, 1), (2, 1)), bitmap_stations=11),
    encode_device("u", 1, 9, 0, pairs=((1, 1),), bitmap_stations=1),
    encode_device("u", 1, 9, 1, pairs=(), bitmap_stations=3_220),
]


def _binary(r: DeviceReport) -> bytes:
    return encode_device(r.query_id, r.query_version, r.epoch, r.round, value=r.value, pairs=r.pairs)


@pytest.mark.parametrize("report", GOOD)
def test_binary_decodes_to_the_json_report(report: DeviceReport) -> None:
    raw = _binary(report)
    assert raw[0] == 1 and len(raw) < len(encode_json(report))
    assert decode_device_record(raw) == report == decode_device_report(raw)
    assert decode_device_record(encode_json(report)) == report


def test_array_encoding_equals_one_at_a_time() -> None:
    values = np.array([0, 5, 2**32 - 1, 17])
    got = encode_device_values("sp-day", 3, 9, 1, values)
    assert got == [encode_device("sp-day", 3, 9, 1, value=int(v)) for v in values]


@pytest.mark.parametrize(("raw", "reason"), [
    (b"", "empty"),
    (b"\x01", "bad_encoding"),
    (b"\x02" + _binary(GOOD[0])[1:], "bad_encoding"),  # unknown version
    (b"\x01\x04" + _binary(GOOD[0])[2:], "bad_encoding"),  # unknown flag bit
    (b"\x01" + bytes([FLAG_AUTH]) + _binary(GOOD[0])[2:], "bad_encoding"),  # the auth bit, no trailer
    (b"\x01" + bytes([FLAG_AUTH]) + _binary(GOOD[0])[2:] + bytes(19), "bad_encoding"),  # a trailer cut short
    (_binary(GOOD[0]) + b"\x00", "bad_encoding"),  # trailing byte
    (_binary(GOOD[0])[:-1], "bad_encoding"),
    (_binary(GOOD[2])[:-4], "bad_encoding"),  # pairs cut short
    (encode_device("q", 1, 9, 0, value=1).replace(b"q", b"-"), "bad_json_record"),  # query id pattern
    (encode_device("q", 1, 9, 0, value=1).replace(b"q", b"\xff"), "bad_json_record"),
    (b"\x01\x00\x00" + bytes(13), "bad_json_record"),  # empty query id
    (encode_device("q", 1, 9, 0, value=1)[:4] + bytes(4) + encode_device("q", 1, 9, 0, value=1)[8:],
     "bad_json_record"),  # query version 0
    (encode_device("q", 1, 9, 0, value=1)[:12] + b"\x02" + encode_device("q", 1, 9, 0, value=1)[13:],
     "bad_json_record"),  # round 2
    (encode_device("q", 1, 9, 0, pairs=((0, 1),)), "bad_json_record"),  # station index 0
    (b"\x01\x08" + _binary(GOOD[0])[2:], "bad_encoding"),  # unknown flag bit 3
    (b"\x01" + bytes([FLAG_BITMAP]) + BITMAPS[0][2:], "bad_encoding"),  # bitmap without pairs
    (b"\x01" + bytes([FLAG_BITMAP | FLAG_AUTH]) + BITMAPS[0][2:] + bytes(20), "bad_encoding"),
    (BITMAPS[1][:-1], "bad_encoding"),  # bitmap cut short
    (BITMAPS[1] + b"\x00", "bad_encoding"),  # trailing byte
    (BITMAPS[3][:-403], "bad_encoding"),  # V = 3,220, no bits
    (BITMAPS[1][:-4] + b"\x00\x00", "bad_json_record"),  # V = 0 (and no bits)
    (BITMAPS[1][:-1] + b"\x08", "bad_json_record"),  # padding: the bit of "station 12" of V = 11
    (BITMAPS[1][:-1] + b"\x80", "bad_json_record"),  # padding: the last bit of the last byte
])
def test_malformed_binary_gets_the_json_paths_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(WireError) as got:
        decode_device_record(raw)
    assert got.value.reason == reason, got.value.detail


def test_the_same_report_malformed_as_json_gets_the_same_reason() -> None:
    """Field violations are bad_json_record in both encodings."""
    bad_json = b'{"kind":"device_report","query_id":"q","query_version":0,"epoch":9,"round":0,"value":1}'
    bad_bin = encode_device("q", 1, 9, 0, value=1)[:4] + bytes(4) + encode_device("q", 1, 9, 0, value=1)[8:]
    reasons = []
    for raw in (bad_json, bad_bin):
        with pytest.raises(WireError) as got:
            decode_device_record(raw)
        reasons.append(got.value.reason)
    assert reasons == ["bad_json_record"] * 2


def test_bitmap_round_trip_and_its_bit_order() -> None:
    """A bitmap decodes to its pairs (s, 1), ascending, with its V; station s is bit (s-1) % 8 of
    byte (s-1) // 8, least significant first; sealed, its MAC covers the bitmap's bytes."""
    raw = BITMAPS[1]  # stations 2 and 11 of V = 11
    assert raw[1] == FLAG_PAIRS | FLAG_BITMAP and raw[-4:] == bytes([11, 0, 0b10, 0b100])
    got = decode_device_record(raw)
    assert isinstance(got, DeviceReport) and got.pairs == ((2, 1), (11, 1)) and got.bitmap_stations == 11
    assert got.model_dump() == DeviceReport(query_id="unary", query_version=2, epoch=9, pairs=((2, 1), (11, 1)),
                                            ).model_dump()
    assert decode_device_record(_binary(GOOD[2])).bitmap_stations is None  # type: ignore[union-attr]
    assert [unpack_device(b)[5] for b in BITMAPS] == [((1, 1), (3, 1), (16, 1)), ((2, 1), (11, 1)), ((1, 1),), ()]
    assert [len(b) for b in BITMAPS] == [3 + 5 + 9 + 2 + 2, 3 + 5 + 9 + 2 + 2, 3 + 1 + 9 + 2 + 1, 3 + 1 + 9 + 2 + 403]
    rng = np.random.default_rng(26)
    for v in (1, 7, 8, 9, 3_220, 65_535):
        stations = np.flatnonzero(rng.random(v) < 0.19) + 1
        pairs = tuple((int(s), 1) for s in rng.permutation(stations))
        fields = unpack_device(encode_device("u", 1, 9, 1, pairs=pairs, bitmap_stations=v))
        assert isinstance(fields, DeviceFields) and fields.pairs == tuple(sorted(pairs)) and fields.bitmap_stations == v
    e = Enrollment(b"the device binary test's secret, 32+ bytes", 100)
    sealed = e.seal(BITMAPS[0], 42)
    fields = unpack_device(sealed)
    assert isinstance(fields, DeviceFields) and fields.device == 42 and fields.bitmap_stations == 16
    assert sealed[:-16] == auth_message("unary", 1, 59_832_000, 1, None, ((1, 1), (3, 1), (16, 1)), 42,
                                        bitmap_stations=16)
    report = decode_device_record(sealed)
    assert isinstance(report, DeviceReport) and e.check_report(report, sealed) is None


@pytest.mark.parametrize("bad", [dict(pairs=((2, 0),)), dict(pairs=((12, 1),)), dict(pairs=((0, 1),)),
                                 dict(pairs=((2, 1), (2, 1))), dict(value=3), dict(pairs=(), bitmap_stations=0),
                                 dict(pairs=(), bitmap_stations=65_536)])
def test_a_bitmap_encoder_refuses_what_a_bitmap_cannot_say(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="bitmap"):
        encode_device("u", 1, 9, 0, **{"bitmap_stations": 11, **bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("v", [1, 8, 13, 3_220])
def test_encode_device_bitmaps_is_encode_device_per_device(v: int) -> None:
    """The replay's bulk bitmap encoder gives each device exactly the one-report encoder's
    bytes, from (owner, station) pairs in any order, across chunks of devices (seed 26), with
    and without the devices' ids (then each is its auth_message)."""
    rng = np.random.default_rng(26)
    n = 300
    bits = rng.random((n, v)) < 0.19
    bits[7] = False  # a device with no pair
    owners, stations = np.nonzero(bits)
    p = rng.permutation(owners.size)
    owners, stations = owners[p], stations[p] + 1
    ids = rng.integers(0, 2**32, n, dtype=np.uint64)
    want = [encode_device("u", 3, 9, 1, pairs=tuple((int(s) + 1, 1) for s in np.flatnonzero(bits[d])),
                          bitmap_stations=v) for d in range(n)]
    for chunk in (1, 64, 4096):
        assert encode_device_bitmaps("u", 3, 9, 1, v, n, owners, stations, chunk=chunk) == want
    sealed = encode_device_bitmaps("u", 3, 9, 1, v, n, owners, stations, ids, chunk=64)
    assert sealed == [auth_message("u", 3, 9, 1, None, unpack_device(w)[5], int(i), bitmap_stations=v)  # type: ignore[arg-type]
                      for w, i in zip(want, ids, strict=True)]
    with pytest.raises(ValueError, match="twice"):
        encode_device_bitmaps("u", 3, 9, 1, v, n, np.r_[owners, owners[0]], np.r_[stations, stations[0]])
    with pytest.raises(ValueError, match="owner"):
        encode_device_bitmaps("u", 3, 9, 1, v, n, np.r_[owners, n], np.r_[stations, 1])
    with pytest.raises(ValueError, match="station"):
        encode_device_bitmaps("u", 3, 9, 1, v, n, np.r_[owners, 1], np.r_[stations, v + 1])


def _fuzz_inputs(rng: np.random.Generator, n: int) -> list[bytes]:
    seeds = [_binary(r) for r in GOOD] + [encode_json(r) for r in GOOD] + BITMAPS
    out = []
    for _ in range(n):
        kind = rng.integers(4)
        if kind == 0:  # random bytes, binary-looking first byte half of the time
            raw = bytearray(rng.integers(0, 256, rng.integers(0, 64), dtype=np.uint8).tobytes())
            if raw and rng.random() < 0.5:
                raw[0] = 1
        else:  # a good record mutated: bytes flipped, cut, or extended
            raw = bytearray(seeds[rng.integers(len(seeds))])
            for _ in range(rng.integers(1, 4)):
                op = rng.integers(3)
                if op == 0 and raw:
                    raw[rng.integers(len(raw))] = int(rng.integers(256))
                elif op == 1 and raw:
                    del raw[rng.integers(len(raw)):]
                else:
                    raw += rng.integers(0, 256, rng.integers(1, 9), dtype=np.uint8).tobytes()
        out.append(bytes(raw))
    return out


def test_fuzz_never_a_crash_always_a_reason() -> None:
    """20,000 random and mutated records (fixed seed): each decodes to a report that passes the
    model's own validation, or is refused with a reason the dead-letter metric knows."""
    rng = np.random.default_rng(26)
    refused = accepted = bitmaps = 0
    reasons: set[str] = set()
    for raw in _fuzz_inputs(rng, 20_000):
        try:
            got = decode_device_record(raw)
        except WireError as exc:
            assert exc.reason in DEAD_LETTER_REASONS and exc.detail
            refused += 1
            reasons.add(exc.detail.split(":")[0])
            continue
        if isinstance(got, DeviceReport) and raw[:1] == b"\x01":
            # constructed, yet within the bounds
            assert DeviceReport.model_validate(got.model_dump()).model_dump() == got.model_dump()
            fields = unpack_device(raw)
            assert isinstance(fields, DeviceFields)
            assert fields[:7] + (None,) == tuple(got.model_dump(exclude={"kind"}).values())[:-1] + (None,)
            assert (fields.mac is None) == (got.mac is None) and (got.mac is None or fields.mac.hex() == got.mac)
            assert fields.bitmap_stations == got.bitmap_stations
            if got.bitmap_stations is not None:
                assert all(1 <= s <= got.bitmap_stations and o == 1 for s, o in got.pairs or ())
                bitmaps += 1
        accepted += 1
    assert refused > 10_000 and accepted > 100 and bitmaps > 100  # both sides exercised, bitmaps too
    assert "bitmap" in reasons  # a bitmap's own field errors (V = 0, a padding bit) among the refusals


def test_encode_device_pairs_is_encode_device_per_device() -> None:
    """The replay's array encoder gives each device exactly the one-report encoder's bytes
    (random pair counts, zero included, and values up to the layout's u32 bound; seed 26)."""
    rng = np.random.default_rng(26)
    counts = rng.integers(0, 6, 500)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    st = rng.integers(1, 2**32, bounds[-1], dtype=np.uint64)
    out = rng.integers(0, 2**32, bounds[-1], dtype=np.uint64)
    got = encode_device_pairs("sp-day", 3, 59_832_000, 1, bounds, st, out)
    want = [encode_device("sp-day", 3, 59_832_000, 1,
                          pairs=tuple(zip(st[a:b].tolist(), out[a:b].tolist(), strict=True)))
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    assert got == want
