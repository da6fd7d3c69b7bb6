"""The front door's request policy (pure: no network, no clock of its own): what a ``POST
/v1/reports`` body may hold, how it is cut into device reports, and the per-connection rate.

A request holds one device's reports of one epoch, each forwarded to the device topic as its
own record, byte for byte (docs/wire.md, "Devices over HTTP"; the bodies:
:mod:`schemas.device_http`).

Each record is checked by the project's one decoder of its encoding (the binary layout's
:func:`~schemas.device_binary.unpack_device`, JSON's :func:`~schemas.decode_device_record`);
everything that needs the queries or the shuffler's state (unknown query, outside the open
window, the device's MAC) stays with the shuffler, which dead-letters it.

>>> from schemas.device_binary import encode_device
>>> from schemas.device_http import FRAMED, frame
>>> a, b = encode_device("sp", 1, 9, 0, value=3), encode_device("sp", 1, 9, 1, value=0)
>>> got = parse_request(FRAMED, frame([a, b]), DoorLimits())
>>> got.records == (a, b), got.epoch
(True, 9)
>>> parse_request(FRAMED, frame([a, a]), DoorLimits()).reason
'mixed_devices'
>>> parse_request(FRAMED, frame([a, encode_device("sp", 1, 10, 1, value=0)]), DoorLimits()).reason
'mixed_epochs'
>>> parse_request("text/plain", b"x", DoorLimits()).status
415
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from schemas import DeviceReport, WireError, decode_device_record
from schemas.device_binary import BINARY_VERSION, DeviceFields, unpack_device
from schemas.device_http import FRAMED, MEDIA_TYPES, NDJSON, split_body

__all__ = ["Accepted", "DoorLimits", "Refusal", "TokenBucket", "parse_request", "refusal"]



@dataclass(frozen=True)
class DoorLimits:
    """Per request: its body's bytes and its reports; per connection: a token bucket of
    ``rate_per_s`` requests a second, at most ``burst`` at once."""

    max_body_bytes: int = 64 * 1024
    max_reports: int = 64
    rate_per_s: float = 50.0
    burst: int = 100


@dataclass(frozen=True)
class Refusal:
    """A 4xx answer: the status and a machine-readable reason, with a detail for a person."""

    status: int
    reason: str
    detail: str

    def body(self) -> bytes:
        return json.dumps({"reason": self.reason, "detail": self.detail}).encode()


@dataclass(frozen=True)
class Accepted:
    """The records to forward, unchanged, and the epoch they all belong to."""

    records: tuple[bytes, ...]
    epoch: int


def refusal(reason: str, detail: str) -> Refusal:
    """The refusal for ``reason`` with its status (413 too large, 415 a body type not spoken,
    429 rate, 400 everything else)."""
    status = {"too_large": 413, "unsupported_media_type": 415, "rate_limited": 429}.get(reason, 400)
    return Refusal(status, reason, detail)


def _fields(raw: bytes) -> tuple[str, int, int, int, object] | Refusal:
    """(query id, version, epoch, round, device) of one record -- ``device`` is the enrolled
    device id of its authentication (None for an unsigned report, which the shuffler
    dead-letters ``unauthenticated``) -- or the refusal naming the decoder's reason."""
    if raw[0] == BINARY_VERSION:
        got = unpack_device(raw)
        if not isinstance(got, DeviceFields):
            return refusal("bad_report", f"{got[0]}: {got[1]}")
        return got.query_id, got.query_version, got.epoch, got.round, got.device
    try:
        rec = decode_device_record(raw)
    except WireError as exc:
        return refusal("bad_report", f"{exc.reason}: {exc.detail}")
    if not isinstance(rec, DeviceReport):
        return refusal("bad_report", "a source note is not a device report")
    return rec.query_id, rec.query_version, rec.epoch, rec.round, rec.device


def parse_request(content_type: str, body: bytes, limits: DoorLimits) -> Accepted | Refusal:
    """The records of one request, or why it is refused: the body type, its size, its framing,
    each record (the decoder's reason), one epoch, one device (at most one report per (query,
    version, round), and one device id where records carry one), at most ``max_reports``."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in MEDIA_TYPES:
        return refusal("unsupported_media_type", f"Content-Type {media or 'none'!r}; send {FRAMED} or {NDJSON}")
    if len(body) > limits.max_body_bytes:
        return refusal("too_large", f"{len(body)} bytes, at most {limits.max_body_bytes}")
    records = split_body(media, body)
    if isinstance(records, tuple):
        return refusal(*records)
    if not records:
        return refusal("empty", "no device report in the request")
    if len(records) > limits.max_reports:
        return refusal("too_many_reports", f"{len(records)} reports, at most {limits.max_reports}")
    epochs: set[int] = set()
    devices: set[object] = set()
    slots: set[tuple[str, int, int]] = set()
    for i, raw in enumerate(records):
        got = _fields(raw)
        if isinstance(got, Refusal):
            return Refusal(got.status, got.reason, f"report {i}: {got.detail}")
        qid, version, epoch, rnd, device = got
        if (qid, version, rnd) in slots:
            return refusal("mixed_devices", f"report {i}: a second report for query {qid} v{version} round {rnd} "
                                            "(one device sends one; send each device's reports on their own)")
        slots.add((qid, version, rnd))
        epochs.add(epoch)
        devices.add(device)
    if len(epochs) > 1:
        return refusal("mixed_epochs", f"reports of epochs {sorted(epochs)}; one request holds one epoch")
    if len(devices) > 1:
        return refusal("mixed_devices", "reports of several devices; one request holds one device's")
    return Accepted(tuple(records), epochs.pop())


class TokenBucket:
    """A connection's request rate: ``rate_per_s`` tokens a second up to ``burst``; a request
    takes one. Time is given, so the policy is testable without a clock.

    >>> b = TokenBucket(rate_per_s=1.0, burst=2, now=0.0)
    >>> [b.take(0.0), b.take(0.0), b.take(0.0), b.take(1.0)]
    [True, True, False, True]
    >>> b.retry_after(1.0)
    1.0
    """

    def __init__(self, rate_per_s: float, burst: int, now: float) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = now

    def _fill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)

    def take(self, now: float) -> bool:
        self._fill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def retry_after(self, now: float) -> float:
        """Seconds until the next request would be taken."""
        self._fill(now)
        return max(0.0, (1.0 - self.tokens) / self.rate)
