"""The front door's request bodies: framing round trips and every framing error."""

from __future__ import annotations

import random

from schemas.device_http import FRAMED, NDJSON, frame, split_body


def test_framing_round_trips_any_records() -> None:
    rng = random.Random(7)  # noqa: S311 - test data, not secrets
    for _ in range(200):
        records = [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(0, 8))]
        assert split_body(FRAMED, frame(records)) == records


def test_every_cut_of_a_framed_body_is_malformed_or_fewer_records() -> None:
    records = [b"\x01abc", b"{}", b"x" * 40]
    body = frame(records)
    for cut in range(len(body)):
        got = split_body(FRAMED, body[:cut])
        boundaries = {0, 8, 14, 58}  # where a whole record ends
        if cut in boundaries:
            assert isinstance(got, list) and got == records[:len(got)]
        else:
            assert isinstance(got, tuple) and got[0] == "malformed", (cut, got)


def test_ndjson_lines_are_kept_exactly() -> None:
    assert split_body(NDJSON, b'{"a": 1}\r\n{"b":2}') == [b'{"a": 1}\r', b'{"b":2}']
    assert split_body(NDJSON, b"{}\n \n{}") == ("malformed", "line 1 is blank")
