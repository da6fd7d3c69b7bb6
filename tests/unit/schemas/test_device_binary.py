"""The binary device report layout (schemas/device_binary.py) and its decoding through
schemas.decode_device_record: the JSON path's reasons, and never a crash on any bytes."""
from __future__ import annotations

import numpy as np
import pytest

from schemas import DeviceReport, WireError, decode_device_record, decode_device_report, encode_json
from schemas.device_binary import (
    FLAG_AUTH,
    DeviceFields,
    encode_device,
    encode_device_pairs,
    encode_device_values,
    unpack_device,
)
from stream_app.shuffler.metrics import DEAD_LETTER_REASONS

GOOD = [
    DeviceReport(query_id="sp-day", query_version=1, epoch=59_832_000, round=1, value=3),
    DeviceReport(query_id="q", query_version=7, epoch=0, round=0, value=0),
    DeviceReport(query_id="alp.x_1", query_version=2, epoch=9, round=0, pairs=((4, 1), (7, 0))),
    DeviceReport(query_id="rr", query_version=1, epoch=9, round=1, pairs=()),
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


def _fuzz_inputs(rng: np.random.Generator, n: int) -> list[bytes]:
    seeds = [_binary(r) for r in GOOD] + [encode_json(r) for r in GOOD]
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
    refused = accepted = 0
    for raw in _fuzz_inputs(rng, 20_000):
        try:
            got = decode_device_record(raw)
        except WireError as exc:
            assert exc.reason in DEAD_LETTER_REASONS and exc.detail
            refused += 1
            continue
        if isinstance(got, DeviceReport) and raw[:1] == b"\x01":
            assert DeviceReport.model_validate(got.model_dump()) == got  # constructed, yet within the bounds
            fields = unpack_device(raw)
            assert isinstance(fields, DeviceFields)
            assert fields._replace(mac=None) == tuple(got.model_dump(exclude={"kind"}).values())[:-1] + (None,)
            assert (fields.mac is None) == (got.mac is None) and (got.mac is None or fields.mac.hex() == got.mac)
        accepted += 1
    assert refused > 10_000 and accepted > 100  # both sides exercised


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
