"""The shuffler's columnar decode step (stream_app/shuffler/columns.py) against the one-record
decoder it replaces: the same reports, the same reasons, on good and bad records mixed; and its
authentication check (every report's device id and MAC): never a crash, always a reason."""
from __future__ import annotations

import numpy as np

from schemas import DeviceReport, SourceEpoch, WireError, decode_device_record, encode_json
from schemas.device_binary import encode_device, encode_device_values
from schemas.enrollment import Enrollment
from stream_app.shuffler.columns import decode_batch
from stream_app.shuffler.metrics import DEAD_LETTER_REASONS

E = Enrollment(b"the columns test's enrollment secret!", devices=1000)


def _batch(rng: np.random.Generator, n: int) -> list[bytes | None]:
    good = [*encode_device_values("sp-day", 1, 9, 0, rng.integers(0, 500, 50)),
            *encode_device_values("sp-day", 2, 10, 1, rng.integers(0, 500, 50)),
            encode_device("alp", 1, 9, 0, pairs=((4, 1), (7, 0))), encode_device("alp", 1, 9, 1, pairs=()),
            # bitmaps (the fast path's other form): V 10 and 16 (no padding), none set
            encode_device("un", 1, 9, 0, pairs=((2, 1), (9, 1), (10, 1)), bitmap_stations=10),
            encode_device("un", 1, 9, 1, pairs=((16, 1),), bitmap_stations=16),
            encode_device("un", 1, 9, 0, pairs=(), bitmap_stations=3),
            encode_json(DeviceReport(query_id="sp-day", query_version=1, epoch=9, value=4)),
            encode_json(DeviceReport(query_id="alp", query_version=1, epoch=9, pairs=((2, 3),))),
            encode_json(SourceEpoch(epoch=9, readings_missing=(400001,)))]
    v = encode_device("q", 1, 9, 0, value=1)
    # each field bound broken once on purpose, in the array path's shape (station-valued, right length)
    out: list[bytes | None] = [None, b"", v[:4] + bytes(4) + v[8:], v[:12] + b"\x02" + v[13:],
                               v.replace(b"q", b"-"), v.replace(b"q", b"\xff"), b"\x01\x00\x00" + bytes(13)]
    for _ in range(n):
        raw = bytearray(good[rng.integers(len(good))])
        if rng.random() < 0.5:  # a mutation: one byte changed, or cut, or extended
            op = rng.integers(3)
            if op == 0:
                raw[rng.integers(len(raw))] = int(rng.integers(256))
            elif op == 1:
                del raw[rng.integers(len(raw)):]
            else:
                raw += bytes([int(rng.integers(256))])
        out.append(bytes(raw))
    return out


def test_columns_equal_the_one_record_decoder() -> None:
    rng = np.random.default_rng(7)
    values = _batch(rng, 5_000)
    got = decode_batch(values)
    kinds = {"refused": 0, "report": 0, "note": 0}
    for i, raw in enumerate(values):
        try:
            want = decode_device_record(raw)
        except WireError as exc:
            bad = got.reasons[i]
            assert bad is not None and (bad.reason, bad.detail) == (exc.reason, exc.detail), (i, raw)
            kinds["refused"] += 1
            continue
        assert got.reasons[i] is None, (i, raw, got.reasons[i])
        if isinstance(want, SourceEpoch):
            assert got.notes[i] == want
            kinds["note"] += 1
            continue
        assert got.report(i) == want, (i, raw)
        kinds["report"] += 1
    assert min(kinds.values()) > 10, kinds  # every kind exercised
    assert int((got.width >= 0).sum()) > 50  # bitmaps decoded on the fast path


def _signed(rng: np.random.Generator, n: int) -> tuple[list[bytes | None], list[int | None]]:
    """Sealed and signed reports (binary station-valued, pairs, JSON), mutated half of the
    time; the device each good one was sealed by (None: mutated or unsigned)."""
    devices = rng.integers(0, 1000, 50)
    sealed = E.seal_messages(encode_device_values("sp-day", 1, 9, 0, rng.integers(0, 500, 50), devices),
                             devices.tolist())
    good: list[tuple[bytes, int | None]] = [*zip(sealed, devices.tolist(), strict=True),
            (E.seal(encode_device("alp", 1, 9, 0, pairs=((4, 1), (7, 0))), 3), 3),
            (E.seal(encode_device("alp", 1, 9, 1, pairs=()), 4), 4),
            (E.seal(encode_device("un", 1, 9, 0, pairs=((2, 1), (9, 1)), bitmap_stations=10), 8), 8),
            (E.seal(encode_device("un", 2, 9, 1, pairs=((1, 1),), bitmap_stations=3), 9), 9),
            (encode_json(E.sign_report(DeviceReport(query_id="sp-day", query_version=1, epoch=9, value=4), 5)), 5),
            (encode_json(E.sign_report(DeviceReport(query_id="alp", query_version=1, epoch=9, pairs=((2, 3),)), 6)),
             6),
            (encode_device("sp-day", 1, 9, 0, value=1), None),  # unsigned
            (encode_json(DeviceReport(query_id="alp", query_version=1, epoch=9, pairs=())), None)]
    out: list[bytes | None] = []
    who: list[int | None] = []
    for _ in range(n):
        raw, device = good[rng.integers(len(good))]
        b = bytearray(raw)
        if rng.random() < 0.5:  # one byte changed, or cut, or extended, or the auth bit flipped
            device = None
            op = rng.integers(4)
            if op == 0:
                b[rng.integers(len(b))] ^= int(rng.integers(1, 256))
            elif op == 1:
                del b[rng.integers(len(b)):]
            elif op == 2:
                b += bytes([int(rng.integers(256))])
            elif b[0] == 1:
                b[1] ^= 0x02
        out.append(bytes(b))
        who.append(device)
    return out, who


def test_authentication_never_a_crash_always_a_reason() -> None:
    """5,000 signed records, half mutated, and 2,000 random byte strings with and without the
    auth bit (fixed seed): each good one decodes with its device, each other one gets a reason
    the dead-letter metric knows -- and equals the one-record path's (a row alone)."""
    rng = np.random.default_rng(11)
    values, who = _signed(rng, 5000)
    for _ in range(2000):
        raw = bytearray(rng.integers(0, 256, rng.integers(0, 60), dtype=np.uint8).tobytes())
        if len(raw) > 2 and rng.random() < 0.7:
            raw[0], raw[1] = 1, int(rng.choice([0, 1, 2, 3]))
        values.append(bytes(raw))
        who.append(None)
    got = decode_batch(values, E)
    reasons: set[str] = set()
    for i, (value, device) in enumerate(zip(values, who, strict=True)):
        bad = got.reasons[i]
        if device is not None:
            assert bad is None and int(got.device[i]) == device, (i, value, bad)
        if bad is not None:
            assert bad.reason in DEAD_LETTER_REASONS and bad.detail, bad
            assert int(got.key[i]) == -1 and int(got.device[i]) == -1
            reasons.add(bad.reason)
        elif got.notes.get(i) is None:
            assert int(got.device[i]) >= 0  # nothing reaches admission unauthenticated
        one = decode_batch([value], E).reasons[0]
        assert (one is None) == (bad is None) and (bad is None or one is None or one.reason == bad.reason), (i, value)
    assert {"bad_mac", "unauthenticated", "bad_encoding"} <= reasons, reasons


def test_each_authentication_reason() -> None:
    good = E.seal(encode_device("q", 1, 9, 0, value=2), 7)
    forged = Enrollment(b"another operator's enrollment secret", 1000).seal(encode_device("q", 1, 9, 0, value=2), 7)
    unknown = Enrollment(b"the columns test's enrollment secret!", 2000).seal(encode_device("q", 1, 9, 0, value=2),
                                                                              1500)
    json_bad = encode_json(E.sign_report(DeviceReport(query_id="q", query_version=1, epoch=9, value=2), 7)
                           ).replace(b'"value":2', b'"value":3')
    values: list[bytes | None] = [good, forged, unknown, encode_device("q", 1, 9, 0, value=2), json_bad,
                                  encode_json(DeviceReport(query_id="q", query_version=1, epoch=9, value=2))]
    got = decode_batch(values, E)
    assert [None if r is None else r.reason for r in got.reasons] == [
        None, "bad_mac", "unknown_device", "unauthenticated", "bad_mac", "unauthenticated"]
    assert got.device.tolist() == [7, -1, -1, -1, -1, -1]
    assert "1500" not in got.reasons[2].detail  # type: ignore[union-attr]
