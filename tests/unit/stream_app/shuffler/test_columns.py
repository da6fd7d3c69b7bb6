"""The shuffler's columnar decode step (stream_app/shuffler/columns.py) against the one-record
decoder it replaces: the same reports, the same reasons, on good and bad records mixed."""
from __future__ import annotations

import json

import numpy as np

from schemas import DeviceReport, SourceEpoch, WireError, decode_device_record, encode_json
from schemas.device_binary import encode_device, encode_device_values
from stream_app.shuffler.columns import decode_batch


def _batch(rng: np.random.Generator, n: int) -> list[bytes | None]:
    good = [*encode_device_values("sp-day", 1, 9, 0, rng.integers(0, 500, 50)),
            *encode_device_values("sp-day", 2, 10, 1, rng.integers(0, 500, 50)),
            encode_device("alp", 1, 9, 0, pairs=((4, 1), (7, 0))), encode_device("alp", 1, 9, 1, pairs=()),
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
        # the state log's text decodes to the same report (what a restart restores)
        assert decode_device_record(got.text(i, raw or b"").encode()) == want
        json.loads(got.text(i, raw or b""))
        kinds["report"] += 1
    assert min(kinds.values()) > 10, kinds  # every kind exercised
