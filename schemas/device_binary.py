"""The compact binary encoding of one device report (docs/wire.md, "Device reports, binary").

Little-endian, no padding; a JSON device report starts with ``{`` (0x7B), a binary one with
its version byte (1), so one look at the first byte tells them apart:

=========  ==========  ========================================================================
bytes      type        field
=========  ==========  ========================================================================
1          u8          version: 1
1          u8          flags: bit 0 ``pairs`` (0: station-valued, 1: per-sensor pairs); bit 1
                       ``auth``: the authentication trailer below follows; bits 2-7 must be 0
1          u8          L: length of the query id
L          ASCII       query id (the :class:`~schemas.Query` id pattern)
4          u32         query version (>= 1)
4          u32         epoch (absolute epoch index)
1          u8          round (0 or 1)
4          u32         value -- station index 0..V (``pairs`` clear), or
2 + 8n     u16, n x    n, then n (station index >= 1, report) pairs as two u32 each
           (u32, u32)  (``pairs`` set; n = 0 still counts the device)
4          u32         ``auth`` set only: the enrolled device's id
16         bytes       ``auth`` set only: the MAC, HMAC-SHA256 truncated to 16 bytes, under the
                       device's key (:mod:`schemas.enrollment`), of every byte before it
                       (header with the ``auth`` bit, payload, device id)
=========  ==========  ========================================================================

Nothing follows (a trailing byte is malformed). A JSON device report authenticates with the
same MAC: over :func:`auth_message` of its fields, this layout's bytes before the MAC.

This module knows bytes only -- no pydantic:
:func:`unpack_device` returns the fields or the dead letter's (reason, detail), the same
reasons the JSON path gives (``bad_encoding``: not a device report's framing; ``bad_json_record``
-- the name predates this layout -- a field outside its bounds).

>>> raw = encode_device("sp-day", 1, 9, 1, value=3)
>>> len(raw), raw[0]
(22, 1)
>>> unpack_device(raw)
DeviceFields(query_id='sp-day', query_version=1, epoch=9, round=1, value=3, pairs=None, device=None, mac=None)
>>> unpack_device(encode_device("q", 2, 9, 0, pairs=((4, 1), (7, 0)))).pairs
((4, 1), (7, 0))
>>> unpack_device(raw[:-1])
('bad_encoding', 'binary device report: 21 bytes, the layout needs 22')
"""
from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["AUTH_TRAILER", "BINARY_VERSION", "FLAG_AUTH", "FLAG_PAIRS", "MAC_BYTES", "QUERY_ID", "DeviceFields",
           "auth_message", "device_of", "encode_device", "encode_device_pairs", "encode_device_values", "strip_auth",
           "unpack_device"]

BINARY_VERSION = 1
FLAG_PAIRS = 0x01
FLAG_AUTH = 0x02  # a trailer follows: the device id (u32) and a MAC (16 bytes)
QUERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # schemas.wire's query id pattern
_FIXED = struct.Struct("<IIB")  # query version, epoch, round
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")
MAX_PAIRS = 65_535
U32_MAX = 2**32 - 1
MAC_BYTES = 16
AUTH_TRAILER = 4 + MAC_BYTES  # device id, MAC


class DeviceFields(NamedTuple):
    query_id: str
    query_version: int
    epoch: int
    round: int
    value: int | None
    pairs: tuple[tuple[int, int], ...] | None
    device: int | None = None  # the authentication trailer's device id and MAC (``auth`` set)
    mac: bytes | None = None


def _head(query_id: str, query_version: int, epoch: int, rnd: int, flags: int) -> bytes:
    qid = query_id.encode("ascii")
    if not QUERY_ID.fullmatch(query_id):
        raise ValueError(f"query id {query_id!r} does not match the query id pattern")
    if not (1 <= query_version <= U32_MAX and 0 <= epoch <= U32_MAX and rnd in (0, 1)):
        raise ValueError("query version, epoch or round outside the binary layout's bounds")
    return bytes((BINARY_VERSION, flags, len(qid))) + qid + _FIXED.pack(query_version, epoch, rnd)


def encode_device(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None = None,
                  pairs: Sequence[tuple[int, int]] | None = None) -> bytes:
    """One device report in the binary layout (exactly one of ``value`` and ``pairs``), without
    the authentication trailer (a device's key seals it: :meth:`schemas.enrollment.Enrollment.seal`)."""
    return _encode(query_id, query_version, epoch, rnd, value, pairs, 0)


def auth_message(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None,
                 pairs: Sequence[tuple[int, int]] | None, device: int) -> bytes:
    """What a device's MAC is computed over: its report in this layout with the ``auth`` bit and
    the device id, up to the MAC -- for a binary report and a JSON one alike.

    >>> m = auth_message("q", 1, 9, 0, 3, None, 7)
    >>> m[1] == FLAG_AUTH, m[-4:] == (7).to_bytes(4, "little"), m[2:-4] == encode_device("q", 1, 9, 0, value=3)[2:]
    (True, True, True)
    """
    if not 0 <= device <= U32_MAX:
        raise ValueError(f"device id outside 0..{U32_MAX}")
    return _encode(query_id, query_version, epoch, rnd, value, pairs, FLAG_AUTH) + _U32.pack(device)


def _encode(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None,
            pairs: Sequence[tuple[int, int]] | None, auth: int) -> bytes:
    if (value is None) == (pairs is None):
        raise ValueError("a report carries exactly one of value or pairs")
    if pairs is None:
        return _head(query_id, query_version, epoch, rnd, auth) + _U32.pack(value)
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f"{len(pairs)} pairs, at most {MAX_PAIRS}")
    body = np.asarray(pairs, dtype="<u4").reshape(-1, 2).tobytes()
    return _head(query_id, query_version, epoch, rnd, FLAG_PAIRS | auth) + _U16.pack(len(pairs)) + body


def encode_device_values(query_id: str, query_version: int, epoch: int, rnd: int,
                         values: npt.NDArray[np.integer], devices: npt.NDArray[np.integer] | None = None
                         ) -> list[bytes]:
    """Many station-valued devices' reports of one (query, version, epoch, round) at once: one
    array of records, cut into each device's bytes (a load generator's path: no per-report
    encoder call). With ``devices`` (one id per value): each record is its :func:`auth_message`,
    the bytes a device's key seals.

    >>> encode_device_values("q", 1, 9, 0, np.array([3, 0]))[0] == encode_device("q", 1, 9, 0, value=3)
    True
    >>> encode_device_values("q", 1, 9, 0, np.array([3]), np.array([7]))[0] == auth_message("q", 1, 9, 0, 3, None, 7)
    True
    """
    auth = 0 if devices is None else FLAG_AUTH
    head = np.frombuffer(_head(query_id, query_version, epoch, rnd, auth), dtype=np.uint8)
    n, h = len(values), head.size
    w = h + 4 + (4 if auth else 0)
    buf = np.empty((n, w), dtype=np.uint8)
    buf[:, :h] = head
    buf[:, h:h + 4] = np.asarray(values, dtype="<u4").reshape(n, 1).view(np.uint8)
    if devices is not None:
        buf[:, h + 4:] = np.asarray(devices, dtype="<u4").reshape(n, 1).view(np.uint8)
    raw = buf.tobytes()
    return [raw[i:i + w] for i in range(0, n * w, w)]


def encode_device_pairs(query_id: str, query_version: int, epoch: int, rnd: int, bounds: npt.NDArray[np.integer],
                        stations: npt.NDArray[np.integer], outputs: npt.NDArray[np.integer],
                        devices: npt.NDArray[np.integer] | None = None) -> list[bytes]:
    """Many pair-valued devices' reports of one (query, version, epoch, round) at once: device
    ``d``'s pairs are ``(stations[j], outputs[j])`` for ``bounds[d] <= j < bounds[d + 1]`` (none:
    an empty ``pairs``). The head is checked once and every pair encoded in one array (a load
    generator's path). With ``devices`` (one id per device): each record is its
    :func:`auth_message`, the bytes a device's key seals.

    >>> st, out = np.array([4, 9, 2]), np.array([1, 0, 1])
    >>> got = encode_device_pairs("q", 1, 9, 1, np.array([0, 2, 2, 3]), st, out)
    >>> got == [encode_device("q", 1, 9, 1, pairs=((4, 1), (9, 0))), encode_device("q", 1, 9, 1, pairs=()),
    ...         encode_device("q", 1, 9, 1, pairs=((2, 1),))]
    True
    >>> sealed = encode_device_pairs("q", 1, 9, 1, np.array([0, 2, 2]), st[:2], out[:2], np.array([7, 8]))
    >>> sealed == [auth_message("q", 1, 9, 1, None, ((4, 1), (9, 0)), 7), auth_message("q", 1, 9, 1, None, (), 8)]
    True
    """
    counts = np.diff(np.asarray(bounds, dtype=np.int64))
    if counts.size and int(counts.max()) > MAX_PAIRS:
        raise ValueError(f"{int(counts.max())} pairs, at most {MAX_PAIRS}")
    head = _head(query_id, query_version, epoch, rnd, FLAG_PAIRS | (0 if devices is None else FLAG_AUTH))
    body = np.column_stack([np.asarray(stations, dtype="<u4"), np.asarray(outputs, dtype="<u4")]).tobytes()
    lengths = counts.astype("<u2").tobytes()
    starts = (8 * np.asarray(bounds, dtype=np.int64)).tolist()
    if devices is None:
        return [head + lengths[2 * d:2 * d + 2] + body[a:b]
                for d, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True))]
    if np.any(np.asarray(devices) < 0) or np.any(np.asarray(devices) > U32_MAX):
        raise ValueError(f"device id outside 0..{U32_MAX}")
    ids = np.asarray(devices, dtype="<u4").tobytes()
    return [head + lengths[2 * d:2 * d + 2] + body[a:b] + ids[4 * d:4 * d + 4]
            for d, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True))]


def unpack_device(raw: bytes) -> DeviceFields | tuple[str, str]:
    """The fields of one binary device report, or the dead letter's (reason, detail)."""
    n = len(raw)
    if n < 3:
        return "bad_encoding", f"binary device report: {n} bytes, shorter than its header"
    version, flags, qlen = raw[0], raw[1], raw[2]
    if version != BINARY_VERSION:
        return "bad_encoding", f"binary device report version {version} (this shuffler reads {BINARY_VERSION})"
    if flags & ~(FLAG_PAIRS | FLAG_AUTH):
        return "bad_encoding", f"binary device report flags {flags:#04x}: unknown bits set"
    pairs = bool(flags & FLAG_PAIRS)
    at = 3 + qlen + _FIXED.size
    need = at + (_U16.size if pairs else _U32.size)
    if n < need:
        return "bad_encoding", f"binary device report: {n} bytes, the layout needs {need}"
    count = _U16.unpack_from(raw, at)[0] if pairs else 0
    if pairs:
        need += 8 * count
    auth = bool(flags & FLAG_AUTH)
    if auth:
        need += AUTH_TRAILER
    if n != need:
        return "bad_encoding", f"binary device report: {n} bytes, the layout needs {need}"
    try:
        query_id = raw[3:3 + qlen].decode("ascii")
    except UnicodeDecodeError:
        query_id = ""
    if not QUERY_ID.fullmatch(query_id):
        return "bad_json_record", f"query_id: {raw[3:3 + qlen]!r} does not match the query id pattern"
    query_version, epoch, rnd = _FIXED.unpack_from(raw, 3 + qlen)
    if query_version < 1:
        return "bad_json_record", "query_version: must be >= 1"
    if rnd > 1:
        return "bad_json_record", f"round: {rnd}, must be 0 or 1"
    device, mac = (_U32.unpack_from(raw, n - AUTH_TRAILER)[0], raw[n - MAC_BYTES:]) if auth else (None, None)
    if not pairs:
        return DeviceFields(query_id, query_version, epoch, rnd, _U32.unpack_from(raw, at)[0], None, device, mac)
    arr = np.frombuffer(raw, dtype="<u4", count=2 * count, offset=at + 2).reshape(count, 2)
    if count and int(arr[:, 0].min()) < 1:
        return "bad_json_record", "pairs: a station index must be >= 1"
    got = tuple(zip(arr[:, 0].tolist(), arr[:, 1].tolist(), strict=True))
    return DeviceFields(query_id, query_version, epoch, rnd, None, got, device, mac)


def device_of(raw: bytes) -> int | None:
    """The device id a report's authentication names (binary trailer or JSON ``device``),
    unchecked; None if it names none. For placing a report on its device's partition.

    >>> device_of(auth_message("q", 1, 9, 0, 3, None, 7) + bytes(16)), device_of(b'{"device": 8}')
    (7, 8)
    >>> device_of(encode_device("q", 1, 9, 0, value=3)), device_of(b"{"), device_of(b"")
    (None, None, None)
    """
    if raw[:1] == b"{":
        try:
            got = json.loads(raw).get("device")
        except (ValueError, AttributeError):
            return None
        return got if isinstance(got, int) and not isinstance(got, bool) and 0 <= got <= U32_MAX else None
    if len(raw) > 3 + AUTH_TRAILER and raw[0] == BINARY_VERSION and raw[1] & FLAG_AUTH:
        return int(_U32.unpack_from(raw, len(raw) - AUTH_TRAILER)[0])
    return None


def strip_auth(raw: bytes | None) -> bytes:
    """A device-topic record as a dead letter may keep it: without anything of an
    authentication trailer (a device id, a MAC) -- a binary report with the ``auth`` bit is cut
    before its trailer (at most to its payload's end, whatever follows) and the bit cleared; a
    JSON object loses its ``device`` and ``mac`` members, and JSON that does not parse but
    names them is dropped whole. Anything else is returned as it is.

    >>> sealed = auth_message("q", 1, 9, 0, 3, None, 7) + bytes(16)
    >>> strip_auth(sealed) == encode_device("q", 1, 9, 0, value=3), strip_auth(sealed + b"xx")[1]
    (True, 0)
    >>> strip_auth(b'{"epoch": 9, "device": 7, "mac": "00"}'), strip_auth(b'{"device": 7,'), strip_auth(b"\\x01")
    (b'{"epoch": 9}', b'', b'\\x01')
    """
    raw = raw or b""
    if raw[:1] == b"{":
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            if "device" not in obj and "mac" not in obj:
                return raw
            obj.pop("device", None)
            obj.pop("mac", None)
            return json.dumps(obj).encode()
        return b"" if b"device" in raw or b"mac" in raw else raw
    if len(raw) < 2 or raw[0] != BINARY_VERSION or not raw[1] & FLAG_AUTH:
        return raw
    keep = len(raw) - AUTH_TRAILER
    if len(raw) >= 3:  # the payload's end as the layout says, where the header tells it
        at = 3 + raw[2] + _FIXED.size
        if raw[1] & FLAG_PAIRS:
            if len(raw) >= at + 2:
                keep = min(keep, at + 2 + 8 * _U16.unpack_from(raw, at)[0])
        else:
            keep = min(keep, at + 4)
    out = bytearray(raw[:max(keep, 2)] if keep >= 2 else raw[:1])
    if len(out) > 1:
        out[1] &= ~FLAG_AUTH & 0xFF
    return bytes(out)
