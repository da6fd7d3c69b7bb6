"""The front door's request policy: every refusal reason, the bytes forwarded unchanged, each
report's authentication with the shuffler's check, the per-device rate and the log's one line
per reason (no network)."""

from __future__ import annotations

import json

import pytest

from schemas import DeviceReport, SourceEpoch, encode_json
from schemas.device_binary import encode_device
from schemas.device_http import FRAMED, NDJSON, frame
from stream_app.shuffler.door_policy import (
    Accepted,
    DeviceRate,
    DoorLimits,
    Refusal,
    RefusalLog,
    TokenBucket,
    parse_request,
)
from tests.devices import enrollment, signed_json

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
    assert parse_request(FRAMED, frame([a0, a1]), LIMITS) == Accepted((a0, a1), 9, 7)
    assert parse_request(FRAMED, frame([a0, a1]), LIMITS, e) == Accepted((a0, a1), 9, 7)
    assert _refused(FRAMED, frame([a0, e.seal(SP1, 8)])).reason == "mixed_devices"
    json_rr = DeviceReport(query_id="rr", query_version=2, epoch=9, round=0, pairs=())
    assert _refused(FRAMED, frame([a0, signed_json(json_rr, 8)])).reason == "mixed_devices"
    assert isinstance(parse_request(FRAMED, frame([a0, signed_json(json_rr, 7)]), LIMITS), Accepted)


E = enrollment()
_AUTH_CASES = {
    "unsigned binary": ([SP0, SP1], 401, "unauthenticated"),
    "unsigned JSON": ([JSON_RR], 401, "unauthenticated"),
    "one of two unsigned": ([E.seal(SP0, 7), SP1], 400, "mixed_devices"),  # None and 7: two devices
    "a flipped MAC bit": ([E.seal(SP0, 7), E.seal(SP1, 7)[:-1] + bytes([E.seal(SP1, 7)[-1] ^ 1])], 403, "bad_mac"),
    "a zero MAC": ([E.seal(SP0, 7)[:-16] + bytes(16)], 403, "bad_mac"),
    "a payload changed after sealing": ([E.seal(SP0, 7)[:-24] + b"\x09" + E.seal(SP0, 7)[-23:]], 403, "bad_mac"),
    "another device's MAC": ([E.seal(SP0, 7)[:-20] + (8).to_bytes(4, "little") + E.seal(SP0, 7)[-16:]], 403,
                             "bad_mac"),
    "not enrolled": ([E.seal(SP0, E.devices)], 403, "unknown_device"),
    "a JSON MAC of another device": ([signed_json(DeviceReport(query_id="rr", query_version=2, epoch=9, round=0,
                                                               pairs=()), 8).replace(b'"device":8', b'"device":7')],
                                     403, "bad_mac"),
}


@pytest.mark.parametrize("case", list(_AUTH_CASES))
def test_with_the_enrollment_every_report_must_verify(case: str) -> None:
    """The door's check is the shuffler's: unsigned is 401, a MAC that does not verify or an id
    not enrolled 403; the same requests pass the framing alone (no enrollment) but for the
    mixed one."""
    records, status, reason = _AUTH_CASES[case]
    got = parse_request(FRAMED, frame(records), LIMITS, E)
    assert isinstance(got, Refusal) and (got.status, got.reason) == (status, reason), got
    if reason != "mixed_devices":
        assert isinstance(parse_request(FRAMED, frame(records), LIMITS), Accepted)


def test_genuine_reports_of_every_form_verify_and_pass_byte_for_byte() -> None:
    sealed = [E.seal(SP0, 5), E.seal(SP1, 5), E.seal(ALP, 5),
              signed_json(DeviceReport(query_id="rr", query_version=2, epoch=9, round=0, pairs=()), 5)]
    assert parse_request(FRAMED, frame(sealed), LIMITS, E) == Accepted(tuple(sealed), 9, 5)
    assert parse_request(NDJSON, sealed[3], LIMITS, E) == Accepted((sealed[3],), 9, 5)


def test_the_device_rate_is_per_device_and_refills() -> None:
    r = DeviceRate(rate_per_s=2.0, burst=8, keep=3)
    assert r.take(1, 8, now=0.0) is None
    assert r.take(1, 1, now=0.0) == pytest.approx(0.5)  # empty: one report in half a second
    assert r.take(2, 8, now=0.0) is None  # another device's own bucket
    assert r.take(1, 4, now=2.0) is None and r.take(1, 1, now=2.0) == pytest.approx(0.5)
    assert r.take(3, 9, now=2.0) == float("inf")  # more than the burst: never
    for d in range(10, 20):  # full buckets are dropped past ``keep``; the others stay
        assert r.take(d, 1, now=100.0 + 10 * d) is None  # each full again 0.5 s later
    assert len(r.buckets) <= 4 and r.take(1, 8, now=300.0) is None
    busy = DeviceRate(rate_per_s=2.0, burst=8, keep=3)
    for d in range(1000):  # none full again: kept, and pruned only when their number doubled
        assert busy.take(d, 8, now=0.0) is None
    assert len(busy.buckets) == 1000 and busy.take(5, 1, now=0.0) == pytest.approx(0.5)


def test_the_refusal_log_is_one_line_per_reason_an_interval() -> None:
    log = RefusalLog(interval_s=10.0)
    lines = []
    for i in range(100_000):  # a flood of one reason over 50 s: a line at once, then one each 10 s
        log.add("bad_mac", now=i / 2000)
        lines += log.due(now=i / 2000)
    lines += log.flush()
    assert [n for _, n in lines][:1] == [1] and len(lines) <= 7 and sum(n for _, n in lines) == 100_000
    assert log.total == {"bad_mac": 100_000}
