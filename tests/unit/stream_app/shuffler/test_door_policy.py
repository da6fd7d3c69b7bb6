"""The front door's request policy: every refusal reason, the bytes forwarded unchanged, and
the per-connection token bucket (no network)."""

from __future__ import annotations

import json

import pytest

from schemas import DeviceReport, SourceEpoch, encode_json
from schemas.device_binary import encode_device
from schemas.device_http import FRAMED, NDJSON, frame
from stream_app.shuffler.door_policy import Accepted, DoorLimits, Refusal, TokenBucket, parse_request

LIMITS = DoorLimits(max_body_bytes=4096, max_reports=4)
SP0, SP1 = encode_device("sp", 1, 9, 0, value=3), encode_device("sp", 1, 9, 1, value=0)
ALP = encode_device("alp", 1, 9, 0, pairs=((2, 1), (5, 1)))
JSON_RR = encode_json(DeviceReport(query_id="rr", query_version=2, epoch=9, round=0, pairs=()))


def _refused(content_type: str, body: bytes, limits: DoorLimits = LIMITS) -> Refusal:
    got = parse_request(content_type, body, limits)
    assert isinstance(got, Refusal), got
    json.loads(got.body())  # the answer's body is JSON
    return got


def test_one_devices_reports_are_accepted_byte_for_byte_in_either_body() -> None:
    got = parse_request(FRAMED, frame([SP0, SP1, ALP, JSON_RR]), LIMITS)
    assert got == Accepted((SP0, SP1, ALP, JSON_RR), 9)
    line = b'{"kind": "device_report", "query_id": "sp", "query_version": 1, "epoch": 9, "round": 0, "value": 3}'
    got = parse_request(f"{NDJSON}; charset=utf-8", line + b"\n" + JSON_RR, LIMITS)
    assert got == Accepted((line, JSON_RR), 9)  # the exact bytes of each line, spaces kept
    assert parse_request(NDJSON, line, LIMITS) == Accepted((line,), 9)  # no final newline


@pytest.mark.parametrize(("content_type", "body", "status", "reason"), [
    ("text/plain", frame([SP0]), 415, "unsupported_media_type"),
    ("", frame([SP0]), 415, "unsupported_media_type"),
    (FRAMED, b"", 400, "empty"),
    (NDJSON, b"", 400, "empty"),
    (FRAMED, frame([SP0]) + b"\x01\x00", 400, "malformed"),  # a cut length
    (FRAMED, frame([SP0])[:-1], 400, "malformed"),  # a length past the end
    (FRAMED, b"\x00\x00\x00\x00", 400, "malformed"),  # an empty record
    (NDJSON, JSON_RR + b"\n\n" + JSON_RR, 400, "malformed"),  # a blank line
    (FRAMED, frame([SP0, SP1, ALP, JSON_RR, encode_device("x", 1, 9, 0, value=1)]), 400, "too_many_reports"),
    (FRAMED, frame([SP0, encode_device("sp", 1, 10, 1, value=0)]), 400, "mixed_epochs"),
    (FRAMED, frame([SP0, encode_device("sp", 1, 9, 0, value=1)]), 400, "mixed_devices"),  # one slot twice
    (FRAMED, frame([SP0, SP1[:-1]]), 400, "bad_report"),  # a binary report cut short
    (FRAMED, frame([SP0, b"{not json"]), 400, "bad_report"),
    (NDJSON, b'{"kind": "device_report", "query_id": "sp", "epoch": 9}', 400, "bad_report"),  # no version
    (FRAMED, frame([encode_json(SourceEpoch(epoch=9))]), 400, "bad_report"),  # a note is not for devices
    (FRAMED, b"\x10" + b"\x00" * 5000, 413, "too_large"),
])
def test_each_bad_request_is_refused_with_its_reason(content_type: str, body: bytes, status: int, reason: str) -> None:
    got = _refused(content_type, body)
    assert (got.status, got.reason) == (status, reason), got


def test_a_bad_report_names_its_place_and_the_decoders_reason() -> None:
    got = _refused(FRAMED, frame([SP0, SP1[:-1]]))
    assert got.detail.startswith("report 1: bad_encoding:"), got
    got = _refused(FRAMED, frame([encode_device("sp", 1, 9, 0, value=3)[:3] + b"\xff" + SP0[4:]]))
    assert "report 0: " in got.detail


def test_the_size_limit_is_the_setting() -> None:
    body = frame([SP0, SP1, ALP, JSON_RR])
    assert isinstance(parse_request(FRAMED, body, DoorLimits(max_body_bytes=len(body))), Accepted)
    assert _refused(FRAMED, body, DoorLimits(max_body_bytes=len(body) - 1)).reason == "too_large"


def test_the_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    b = TokenBucket(rate_per_s=10.0, burst=3, now=100.0)
    assert [b.take(100.0) for _ in range(4)] == [True, True, True, False]
    assert b.retry_after(100.0) == pytest.approx(0.1)
    assert b.take(100.15) and not b.take(100.15)
    assert [b.take(200.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst
    assert not b.take(50.0)  # a clock that goes back gives nothing


def test_sealed_reports_of_two_devices_are_one_request_too_many() -> None:
    """Once reports are signed, the door reads each one's enrolled device id: two devices'
    reports in one request are refused ``mixed_devices`` (binary and JSON alike); one device's
    sealed reports pass byte for byte."""
    from tests.devices import enrollment, signed_json

    e = enrollment()
    a0, a1 = e.seal(SP0, 7), e.seal(SP1, 7)
    assert parse_request(FRAMED, frame([a0, a1]), LIMITS) == Accepted((a0, a1), 9)
    assert _refused(FRAMED, frame([a0, e.seal(SP1, 8)])).reason == "mixed_devices"
    json_rr = DeviceReport(query_id="rr", query_version=2, epoch=9, round=0, pairs=())
    assert _refused(FRAMED, frame([a0, signed_json(json_rr, 8)])).reason == "mixed_devices"
    assert isinstance(parse_request(FRAMED, frame([a0, signed_json(json_rr, 7)]), LIMITS), Accepted)
