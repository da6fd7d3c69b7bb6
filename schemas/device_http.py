"""The bodies of the shuffler front door's ``POST /v1/reports`` (docs/wire.md, "Devices over
HTTP"): one device's reports of one epoch, each a device-topic record's bytes.

* ``application/octet-stream`` (:data:`FRAMED`): each record behind its little-endian u32
  length; a record is a device report in the binary layout (:mod:`schemas.device_binary`) or
  JSON (``DeviceReport``);
* ``application/x-ndjson`` (:data:`NDJSON`): one JSON ``DeviceReport`` per line (a final
  newline is optional; a blank line is malformed).

>>> split_body(FRAMED, frame([b"\\x01ab", b"{}"]))
[b'\\x01ab', b'{}']
>>> split_body(FRAMED, b"\\x05\\x00\\x00\\x00ab")
('malformed', 'record 0: length 5, 2 bytes left')
>>> split_body(NDJSON, b'{"a":1}\\n{"b":2}\\n')
[b'{"a":1}', b'{"b":2}']
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["FRAMED", "MEDIA_TYPES", "NDJSON", "frame", "split_body"]

FRAMED = "application/octet-stream"
NDJSON = "application/x-ndjson"
MEDIA_TYPES = (FRAMED, NDJSON)
_LEN = struct.Struct("<I")


def frame(records: Sequence[bytes]) -> bytes:
    """The ``application/octet-stream`` body of ``records``: each behind its u32 length."""
    return b"".join(_LEN.pack(len(r)) + r for r in records)


def _split_framed(body: bytes) -> list[bytes] | tuple[str, str]:
    out: list[bytes] = []
    at, n = 0, len(body)
    while at < n:
        if n - at < _LEN.size:
            return "malformed", f"{n - at} trailing bytes where a record's 4-byte length belongs"
        size = _LEN.unpack_from(body, at)[0]
        at += _LEN.size
        if size == 0 or size > n - at:
            return "malformed", f"record {len(out)}: length {size}, {n - at} bytes left"
        out.append(body[at:at + size])
        at += size
    return out


def _split_lines(body: bytes) -> list[bytes] | tuple[str, str]:
    lines = body.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for i, line in enumerate(lines):
        if not line.strip():
            return "malformed", f"line {i} is blank"
    return lines


def split_body(media: str, body: bytes) -> list[bytes] | tuple[str, str]:
    """The records of a body of type ``media`` (one of :data:`MEDIA_TYPES`), or ("malformed", why)."""
    return _split_framed(body) if media == FRAMED else _split_lines(body)
