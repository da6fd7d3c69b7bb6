"""The front door's request policy (pure: no network, no clock of its own): what a ``POST
/v1/reports`` body may hold, how it is cut into device reports, each report's authentication,
the per-device rate, and the log's one line per refusal reason.

A request holds one device's reports of one epoch, each forwarded to the device topic as its
own record, byte for byte (docs/wire.md, "Devices over HTTP"; the bodies:
:mod:`schemas.device_http`).

Each record is checked by the project's one decoder of its encoding (the binary layout's
:func:`~schemas.device_binary.unpack_device`, JSON's :func:`~schemas.decode_device_record`)
and, given the shuffler's :class:`~schemas.enrollment.Enrollment`, by the shuffler's own MAC
check (:meth:`~schemas.enrollment.Enrollment.check_sealed` for the binary layout, as the
shuffler's decode step calls it, :meth:`~schemas.enrollment.Enrollment.check_report` for JSON):
a report without a device id and MAC is refused ``401 unauthenticated``, one of a device that
is not enrolled or whose MAC does not verify ``403 unknown_device`` / ``403 bad_mac``.
Everything that needs the queries or the shuffler's state (unknown query, outside the open
window, a second report of a slot) stays with the shuffler, which dead-letters it.

>>> from schemas.device_binary import encode_device
>>> from schemas.device_http import FRAMED, frame
>>> from schemas.enrollment import Enrollment
>>> e = Enrollment(b"an enrollment secret of 32 bytes!", devices=10)
>>> a, b = encode_device("sp", 1, 9, 0, value=3), encode_device("sp", 1, 9, 1, value=0)
>>> got = parse_request(FRAMED, frame([e.seal(a, 4), e.seal(b, 4)]), DoorLimits(), e)
>>> got.epoch, got.device
(9, 4)
>>> [parse_request(FRAMED, frame(body), DoorLimits(), e).reason
...  for body in ([a, b], [e.seal(a, 4)[:-1] + b"?"], [e.seal(a, 12)])]
['unauthenticated', 'bad_mac', 'unknown_device']
>>> parse_request(FRAMED, frame([a, a]), DoorLimits()).reason  # without an enrollment: the framing only
'mixed_devices'
>>> parse_request(FRAMED, frame([a, encode_device("sp", 1, 10, 1, value=0)]), DoorLimits()).reason
'mixed_epochs'
>>> parse_request("text/plain", b"x", DoorLimits()).status
415
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from schemas import DeviceReport, WireError, decode_device_record
from schemas.device_binary import BINARY_VERSION, DeviceFields, unpack_device
from schemas.device_http import FRAMED, MEDIA_TYPES, NDJSON, split_body
from schemas.enrollment import Enrollment

__all__ = ["Accepted", "DeviceCheck", "DeviceRate", "DoorLimits", "Refusal", "RefusalLog", "TokenBucket",
           "parse_request", "refusal"]

DeviceCheck = Callable[[int], "str | None"]
"""The door's one check of an authenticated device id: None (allowed) or the reason it is
refused (``403``), e.g. ``revoked``. :meth:`~stream_app.shuffler.front_door.FrontDoor.device_allowed`
calls it once per request, after the MACs verified and before the device's rate."""


@dataclass(frozen=True)
class DoorLimits:
    """Per request: its body's bytes and its reports; per enrolled device: a token bucket of
    ``device_reports_per_s`` reports a second, at most ``device_burst`` at once."""

    max_body_bytes: int = 64 * 1024
    max_reports: int = 64
    device_reports_per_s: float = 32.0
    device_burst: int = 1024


@dataclass(frozen=True)
class Refusal:
    """A 4xx/5xx answer: the status and a machine-readable reason, with a detail for a person."""

    status: int
    reason: str
    detail: str

    def body(self) -> bytes:
        return json.dumps({"reason": self.reason, "detail": self.detail}).encode()


@dataclass(frozen=True)
class Accepted:
    """The records to forward, unchanged, the epoch they all belong to and their device (its
    enrolled id; None when parsed without an enrollment and the records carry none)."""

    records: tuple[bytes, ...]
    epoch: int
    device: int | None = None


_STATUS = {"too_large": 413, "unsupported_media_type": 415, "rate_limited": 429, "unauthenticated": 401,
           "unknown_device": 403, "bad_mac": 403, "revoked": 403, "slow_body": 408, "headers_too_large": 431,
           "busy": 503, "too_many_connections": 503, "broker_unavailable": 503}


def refusal(reason: str, detail: str) -> Refusal:
    """The refusal for ``reason`` with its status (401 unauthenticated; 403 unknown_device,
    bad_mac, revoked; 408 slow_body; 413 too large; 415 a body type not spoken; 429 the
    device's rate; 431 headers_too_large; 503 busy, too_many_connections, broker_unavailable; 400 everything else)."""
    return Refusal(_STATUS.get(reason, 400), reason, detail)


def _fields(raw: bytes) -> DeviceFields | DeviceReport | Refusal:
    """One record decoded (its authentication trailer's ``device`` None for an unsigned
    report), or the refusal naming the decoder's reason."""
    if raw[0] == BINARY_VERSION:
        got = unpack_device(raw)
        if not isinstance(got, DeviceFields):
            return refusal("bad_report", f"{got[0]}: {got[1]}")
        return got
    try:
        rec = decode_device_record(raw)
    except WireError as exc:
        return refusal("bad_report", f"{exc.reason}: {exc.detail}")
    if not isinstance(rec, DeviceReport):
        return refusal("bad_report", "a source note is not a device report")
    return rec


def parse_request(content_type: str, body: bytes, limits: DoorLimits, enrollment: Enrollment | None = None
                  ) -> Accepted | Refusal:
    """The records of one request, or why it is refused: the body type, its size, its framing,
    each record (the decoder's reason), one epoch, one device (at most one report per (query,
    version, round), and one device id where records carry one), at most ``max_reports``; with
    an ``enrollment``, every record's device id and MAC (the shuffler's check, module
    docstring) -- the first failure refuses the whole request."""
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
    devices: set[int | None] = set()
    slots: set[tuple[str, int, int]] = set()
    sealed: list[int] = []  # binary records: checked in one call, as the shuffler's decode step does
    for i, raw in enumerate(records):
        got = _fields(raw)
        if isinstance(got, Refusal):
            return Refusal(got.status, got.reason, f"report {i}: {got.detail}")
        if (got.query_id, got.query_version, got.round) in slots:
            return refusal("mixed_devices", f"report {i}: a second report for query {got.query_id} "
                                            f"v{got.query_version} round {got.round} (one device sends one; send "
                                            "each device's reports on their own)")
        slots.add((got.query_id, got.query_version, got.round))
        epochs.add(got.epoch)
        devices.add(got.device)
        if enrollment is None:
            continue
        if isinstance(got, DeviceFields):
            sealed.append(i)
        elif (why := enrollment.check_report(got, raw)) is not None:
            return refusal(why.reason, f"report {i}: {why.detail}")
    if len(epochs) > 1:
        return refusal("mixed_epochs", f"reports of epochs {sorted(epochs)}; one request holds one epoch")
    if len(devices) > 1:
        return refusal("mixed_devices", "reports of several devices; one request holds one device's")
    device = devices.pop()
    if enrollment is not None and sealed:
        ids = [-1 if device is None else device] * len(sealed)
        failed = enrollment.check_sealed(ids, [records[i] for i in sealed])
        if failed:
            j, why = failed[0]
            return refusal(why.reason, f"report {sealed[j]}: {why.detail}")
    return Accepted(tuple(records), epochs.pop(), device)


class TokenBucket:
    """A rate: ``rate_per_s`` tokens a second up to ``burst``; :meth:`take` takes ``n``. Time
    is given, so the policy is testable without a clock.

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

    def take(self, now: float, n: int = 1) -> bool:
        self._fill(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def full(self, now: float) -> bool:
        self._fill(now)
        return self.tokens >= self.burst

    def retry_after(self, now: float, n: int = 1) -> float:
        """Seconds until ``n`` tokens would be there."""
        self._fill(now)
        return max(0.0, (n - self.tokens) / self.rate)


class DeviceRate:
    """The reports each enrolled device may send: one :class:`TokenBucket` per device id (only
    ids whose MACs verified get one, so a forger spends nobody's tokens), ``rate_per_s``
    reports a second up to ``burst``. A device sends one report per slot: the default
    queries' (four report slots an epoch) at one request per 30 s epoch need 0.14 reports a
    second, a replay at 60x real time 8; the default (32/s, burst 1,024: a speed-0 demo of 256
    epochs) leaves room for more queries and the client's retries of whole requests, and bounds
    what a stolen credential writes (the shuffler keeps one report per device and slot).
    Buckets that are full again are dropped once there are ``keep`` of them (a full bucket is a
    new one); if most are not, the next pruning waits until their
    number doubled (amortized O(1) a request).

    >>> r = DeviceRate(rate_per_s=1.0, burst=4, keep=2)
    >>> [r.take(7, 3, now=0.0), r.take(7, 3, now=0.0), r.take(8, 4, now=0.0), r.take(7, 3, now=2.0)]
    [None, 2.0, None, None]
    >>> r.take(9, 5, now=2.0)  # more than the burst at once: never
    inf
    """

    def __init__(self, rate_per_s: float, burst: int, keep: int = 65_536) -> None:
        self.rate, self.burst, self.keep = rate_per_s, burst, keep
        self.buckets: dict[int, TokenBucket] = {}
        self._prune_at = keep

    def take(self, device: int, reports: int, now: float) -> float | None:
        """None: ``reports`` reports of ``device`` may go; else the seconds until they may."""
        if reports > self.burst:
            return float("inf")
        bucket = self.buckets.get(device)
        if bucket is None:
            if len(self.buckets) >= self._prune_at:
                self.buckets = {d: b for d, b in self.buckets.items() if not b.full(now)}
                self._prune_at = max(self.keep, 2 * len(self.buckets))
            bucket = self.buckets[device] = TokenBucket(self.rate, self.burst, now)
        if bucket.take(now, reports):
            return None
        return bucket.retry_after(now, reports)


class RefusalLog:
    """The log's refusals: counted per reason, and at most one line per reason every
    ``interval_s`` -- the count since its last line -- however many arrive (a flood is a
    handful of lines, never one per request or a traceback each). A reason's first is due at
    once.

    >>> log = RefusalLog(interval_s=10.0)
    >>> log.add("bad_mac", now=0.0); log.due(now=0.0)
    [('bad_mac', 1)]
    >>> for t in (1.0, 2.0, 3.0): log.add("bad_mac", now=t)
    >>> log.due(now=5.0), log.due(now=10.0), log.due(now=11.0)
    ([], [('bad_mac', 3)], [])
    >>> log.add("bad_mac", now=12.0); log.due(now=13.0), log.flush(), log.total
    ([], [('bad_mac', 1)], {'bad_mac': 5})
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.total: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def add(self, reason: str, now: float, n: int = 1) -> None:
        self.total[reason] = self.total.get(reason, 0) + n
        self.pending[reason] = self.pending.get(reason, 0) + n
        self.last.setdefault(reason, now - self.interval_s)

    def due(self, now: float) -> list[tuple[str, int]]:
        """The (reason, count since its last line) to log now, each at most once an interval."""
        out = []
        for reason, n in list(self.pending.items()):
            if now - self.last[reason] >= self.interval_s:
                out.append((reason, n))
                del self.pending[reason]
                self.last[reason] = now
        return out

    def flush(self) -> list[tuple[str, int]]:
        """Every pending count (at the end)."""
        out = list(self.pending.items())
        self.pending.clear()
        return out
