"""The compact binary encoding of one device report (docs/wire.md, "Device reports, binary").

Little-endian, no padding; a JSON device report starts with ``{`` (0x7B), a binary one with
its version byte (1), so one look at the first byte tells them apart:

=========  ==========  ========================================================================
bytes      type        field
=========  ==========  ========================================================================
1          u8          version: 1
1          u8          flags: bit 0 ``pairs`` (0: station-valued, 1: per-sensor pairs); bit 1
                       ``auth``: the authentication trailer below follows; bit 2 ``bitmap``
                       (only with ``pairs``): the pairs as a bitmap; bits 3-7 must be 0
1          u8          L: length of the query id
L          ASCII       query id (the :class:`~schemas.Query` id pattern)
4          u32         query version (>= 1)
4          u32         epoch (absolute epoch index)
1          u8          round (0 or 1)
4          u32         value -- station index 0..V (``pairs`` clear), or
2 + 8n     u16, n x    n, then n (station index >= 1, report) pairs as two u32 each
           (u32, u32)  (``pairs`` set, ``bitmap`` clear; n = 0 still counts the device), or
2 + B      u16, bytes  V (1..65535: the query's stations), then the bitmap in B = ceil(V / 8)
                       bytes: station s (1..V) is bit (s-1) % 8 of byte (s-1) // 8, least
                       significant bit first; a set bit is the pair (s, 1), the padding bits past
                       V are 0 (``pairs`` and ``bitmap`` set: per-sensor reports with outputs
                       {0, 1}, default 0)
4          u32         ``auth`` set only: the enrolled device's id
16         bytes       ``auth`` set only: the MAC, HMAC-SHA256 truncated to 16 bytes, under the
                       device's key (:mod:`schemas.enrollment`), of every byte before it
                       (header with the ``auth`` bit, payload, device id)
=========  ==========  ========================================================================

Nothing follows (a trailing byte is malformed). A bitmap is the smaller payload once a device
holds more than B / 8 pairs: at 3,220 stations and 612 pairs (unary randomized response,
q = 0.19) 405 bytes against 4,898 (:func:`encode_device_bitmaps`). A JSON device report
authenticates with the same MAC: over :func:`auth_message` of its fields, this layout's bytes
before the MAC.

This module knows bytes only -- no pydantic:
:func:`unpack_device` returns the fields or the dead letter's (reason, detail), the same
reasons the JSON path gives (``bad_encoding``: not a device report's framing; ``bad_json_record``
-- the name predates this layout -- a field outside its bounds).

>>> raw = encode_device("sp-day", 1, 9, 1, value=3)
>>> len(raw), raw[0]
(22, 1)
>>> unpack_device(raw)  # doctest: +NORMALIZE_WHITESPACE
DeviceFields(query_id='sp-day', query_version=1, epoch=9, round=1, value=3, pairs=None, device=None, mac=None,
             bitmap_stations=None)
>>> unpack_device(encode_device("q", 2, 9, 0, pairs=((4, 1), (7, 0)))).pairs
((4, 1), (7, 0))
>>> unpack_device(raw[:-1])
('bad_encoding', 'binary device report: 21 bytes, the layout needs 22')
>>> bm = encode_device("u", 1, 9, 0, pairs=((9, 1), (2, 1)), bitmap_stations=10)
>>> bm.hex(" ")[-11:], unpack_device(bm)[5:]
('0a 00 02 01', (((2, 1), (9, 1)), None, None, 10))
"""
from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["AUTH_TRAILER", "BINARY_VERSION", "FLAG_AUTH", "FLAG_BITMAP", "FLAG_PAIRS", "MAC_BYTES", "QUERY_ID",
           "DeviceFields", "auth_message", "device_of", "encode_device", "encode_device_bitmap_rows",
           "encode_device_bitmaps", "encode_device_pairs", "encode_device_values", "strip_auth", "unpack_device"]

BINARY_VERSION = 1
FLAG_PAIRS = 0x01
FLAG_AUTH = 0x02  # a trailer follows: the device id (u32) and a MAC (16 bytes)
FLAG_BITMAP = 0x04  # with FLAG_PAIRS only: the pairs (s, 1) as a bitmap over V stations
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
    bitmap_stations: int | None = None  # a bitmap's V (``bitmap`` set): the stations it covers


def _head(query_id: str, query_version: int, epoch: int, rnd: int, flags: int) -> bytes:
    qid = query_id.encode("ascii")
    if not QUERY_ID.fullmatch(query_id):
        raise ValueError(f"query id {query_id!r} does not match the query id pattern")
    if not (1 <= query_version <= U32_MAX and 0 <= epoch <= U32_MAX and rnd in (0, 1)):
        raise ValueError("query version, epoch or round outside the binary layout's bounds")
    return bytes((BINARY_VERSION, flags, len(qid))) + qid + _FIXED.pack(query_version, epoch, rnd)


def encode_device(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None = None,
                  pairs: Sequence[tuple[int, int]] | None = None, bitmap_stations: int | None = None) -> bytes:
    """One device report in the binary layout (exactly one of ``value`` and ``pairs``), without
    the authentication trailer (a device's key seals it: :meth:`schemas.enrollment.Enrollment.seal`).
    With ``bitmap_stations`` (V), the ``pairs`` -- each (s, 1), 1 <= s <= V -- go as a bitmap
    over V stations (decoded: the same pairs, ascending)."""
    return _encode(query_id, query_version, epoch, rnd, value, pairs, 0, bitmap_stations)


def auth_message(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None,
                 pairs: Sequence[tuple[int, int]] | None, device: int, bitmap_stations: int | None = None) -> bytes:
    """What a device's MAC is computed over: its report in this layout with the ``auth`` bit and
    the device id, up to the MAC -- for a binary report and a JSON one alike (``bitmap_stations``:
    a bitmap report's, as :func:`encode_device`).

    >>> m = auth_message("q", 1, 9, 0, 3, None, 7)
    >>> m[1] == FLAG_AUTH, m[-4:] == (7).to_bytes(4, "little"), m[2:-4] == encode_device("q", 1, 9, 0, value=3)[2:]
    (True, True, True)
    >>> auth_message("q", 1, 9, 0, None, ((3, 1),), 7, bitmap_stations=9)[1:2].hex()
    '07'
    """
    if not 0 <= device <= U32_MAX:
        raise ValueError(f"device id outside 0..{U32_MAX}")
    return _encode(query_id, query_version, epoch, rnd, value, pairs, FLAG_AUTH, bitmap_stations) + _U32.pack(device)


def _encode(query_id: str, query_version: int, epoch: int, rnd: int, value: int | None,
            pairs: Sequence[tuple[int, int]] | None, auth: int, bitmap_stations: int | None = None) -> bytes:
    if (value is None) == (pairs is None):
        raise ValueError("a report carries exactly one of value or pairs")
    if pairs is None:
        if bitmap_stations is not None:
            raise ValueError("a bitmap carries pairs, not a value")
        return _head(query_id, query_version, epoch, rnd, auth) + _U32.pack(value)
    if bitmap_stations is not None:
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        if arr.size and np.any(arr[:, 1] != 1):
            raise ValueError("a bitmap carries pairs (s, 1) only")
        _check_bitmap(bitmap_stations, arr[:, 0])
        return (_head(query_id, query_version, epoch, rnd, FLAG_PAIRS | FLAG_BITMAP | auth)
                + _bitmap_rows(arr[:, 0] - 1, 1, bitmap_stations).tobytes())
    if len(pairs) > MAX_PAIRS:
        raise ValueError(f"{len(pairs)} pairs, at most {MAX_PAIRS}")
    body = np.asarray(pairs, dtype="<u4").reshape(-1, 2).tobytes()
    return _head(query_id, query_version, epoch, rnd, FLAG_PAIRS | auth) + _U16.pack(len(pairs)) + body


def _bitmap_rows(flat: npt.NDArray[np.int64], n_devices: int, n_stations: int) -> npt.NDArray[np.uint8]:
    """The bitmap payloads (u16 V, then the bits) of ``n_devices`` devices, one row each: device
    ``d``'s bit of station ``s`` set for each ``d * V + s - 1`` in ``flat``."""
    bits = np.zeros(n_devices * n_stations, dtype=bool)
    bits[flat] = True
    if int(np.count_nonzero(bits)) != flat.size:
        raise ValueError("a station twice in one device's bitmap")
    out = np.empty((n_devices, 2 + -(-n_stations // 8)), dtype=np.uint8)
    out[:, :2] = np.frombuffer(_U16.pack(n_stations), dtype=np.uint8)
    out[:, 2:] = np.packbits(bits.reshape(n_devices, n_stations), axis=1, bitorder="little")
    return out


def _check_bitmap(n_stations: int, stations: npt.NDArray[np.int64]) -> None:
    if not 1 <= n_stations <= MAX_PAIRS:
        raise ValueError(f"a bitmap covers 1..{MAX_PAIRS} stations, not {n_stations}")
    if stations.size and (int(stations.min()) < 1 or int(stations.max()) > n_stations):
        raise ValueError(f"a bitmap's station indices lie in 1..{n_stations}")


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
    head = np.frombuffer(_head(query_id, query_version, epoch, rnd, 0 if devices is None else FLAG_AUTH),
                         dtype=np.uint8)
    payload = np.asarray(values, dtype="<u4").reshape(-1, 1).view(np.uint8)
    return _records(head, payload, None if devices is None else _device_ids(devices, payload.shape[0]))


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
    ids = _device_ids(devices, counts.size).tobytes()
    return [head + lengths[2 * d:2 * d + 2] + body[a:b] + ids[4 * d:4 * d + 4]
            for d, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True))]


def encode_device_bitmaps(query_id: str, query_version: int, epoch: int, rnd: int, n_stations: int,
                          n_devices: int, owners: npt.NDArray[np.integer], stations: npt.NDArray[np.integer],
                          devices: npt.NDArray[np.integer] | None = None, chunk: int = 4096) -> list[bytes]:
    """Many devices' bitmap reports (V = ``n_stations``) of one (query, version, epoch, round)
    at once, from the sparse pairs (s, 1): device ``d`` (0 <= d < ``n_devices``) has station
    ``stations[j]`` for every ``j`` with ``owners[j] == d`` (in any order; none: an empty
    bitmap, the device still counts). Built ``chunk`` devices at a time (never the whole
    devices x stations bit table). With ``devices`` (one id per device): each record is its
    :func:`auth_message`, the bytes a device's key seals.

    >>> got = encode_device_bitmaps("q", 1, 9, 1, 10, 3, np.array([2, 0, 0]), np.array([3, 9, 1]))
    >>> got == [encode_device("q", 1, 9, 1, pairs=((1, 1), (9, 1)), bitmap_stations=10),
    ...         encode_device("q", 1, 9, 1, pairs=(), bitmap_stations=10),
    ...         encode_device("q", 1, 9, 1, pairs=((3, 1),), bitmap_stations=10)]
    True
    >>> sealed = encode_device_bitmaps("q", 1, 9, 1, 10, 1, np.array([0]), np.array([4]), np.array([7]))
    >>> sealed == [auth_message("q", 1, 9, 1, None, ((4, 1),), 7, bitmap_stations=10)]
    True
    """
    own = np.asarray(owners, dtype=np.int64)
    st = np.asarray(stations, dtype=np.int64)
    if own.shape != st.shape or own.ndim != 1:
        raise ValueError("owners and stations are two 1-d arrays of one length")
    if own.size and (int(own.min()) < 0 or int(own.max()) >= n_devices):
        raise ValueError(f"an owner outside 0..{n_devices - 1}")
    _check_bitmap(n_stations, st)
    head = np.frombuffer(_head(query_id, query_version, epoch, rnd,
                               FLAG_PAIRS | FLAG_BITMAP | (0 if devices is None else FLAG_AUTH)), dtype=np.uint8)
    ids = None if devices is None else _device_ids(devices, n_devices)
    # each pair's bit (device * V + station - 1), grouped by chunk of devices: a stable sort of
    # small chunk numbers (numpy's radix sort for 16-bit keys), not of the owners
    n_chunks = max(1, -(-n_devices // chunk))
    cid = own // chunk
    if n_chunks <= 65_536:
        cid = cid.astype(np.uint16)
    cuts = np.concatenate(([0], np.cumsum(np.bincount(cid, minlength=n_chunks)))).tolist()
    order = np.argsort(cid, kind="stable")
    del cid
    flat = own * n_stations  # in place from here: at the papers' scale these arrays hold ~10^8 pairs
    flat += st
    flat -= 1
    flat = flat[order]
    out: list[bytes] = []
    for c, first in enumerate(range(0, n_devices, chunk)):
        m = min(chunk, n_devices - first)
        out += _records(head, _bitmap_rows(flat[cuts[c]:cuts[c + 1]] - first * n_stations, m, n_stations),
                        None if ids is None else ids[first:first + m])
    return out


def encode_device_bitmap_rows(query_id: str, query_version: int, epoch: int, rnd: int, n_stations: int,
                              rows: npt.NDArray[np.uint8], devices: npt.NDArray[np.integer] | None = None
                              ) -> list[bytes]:
    """Many devices' bitmap reports of one (query, version, epoch, round) from their bitmaps:
    ``rows[d]`` is device ``d``'s ceil(V / 8) bytes, least significant bit first, the padding
    0 (:class:`estimators.BitReports`). With ``devices``: each record is its :func:`auth_message`.

    >>> rows = np.array([[0b0000_0101, 0], [0, 0b10]], dtype=np.uint8)
    >>> got = encode_device_bitmap_rows("q", 1, 9, 1, 10, rows)
    >>> got == [encode_device("q", 1, 9, 1, pairs=((1, 1), (3, 1)), bitmap_stations=10),
    ...         encode_device("q", 1, 9, 1, pairs=((10, 1),), bitmap_stations=10)]
    True
    >>> encode_device_bitmap_rows("q", 1, 9, 1, 9, rows)
    Traceback (most recent call last):
    ValueError: a bit past station 9 is set
    """
    _check_bitmap(n_stations, np.zeros(0, dtype=np.int64))
    nb = -(-n_stations // 8)
    rows = np.asarray(rows, dtype=np.uint8)
    if rows.ndim != 2 or rows.shape[1] != nb:
        raise ValueError(f"bitmap rows of {nb} bytes for {n_stations} stations, not {rows.shape}")
    if n_stations % 8 and rows.size and np.any(rows[:, -1] >> (n_stations % 8)):
        raise ValueError(f"a bit past station {n_stations} is set")
    n = rows.shape[0]
    ids = None if devices is None else _device_ids(devices, n)
    head = np.frombuffer(_head(query_id, query_version, epoch, rnd,
                               FLAG_PAIRS | FLAG_BITMAP | (0 if devices is None else FLAG_AUTH)), dtype=np.uint8)
    payload = np.empty((n, 2 + nb), dtype=np.uint8)
    payload[:, :2] = np.frombuffer(_U16.pack(n_stations), dtype=np.uint8)
    payload[:, 2:] = rows
    return _records(head, payload, ids)


def _device_ids(devices: npt.NDArray[np.integer], n_devices: int) -> npt.NDArray[np.uint8]:
    """One u32 device id per device, little-endian, as an (n, 4) byte table."""
    dev = np.asarray(devices)
    if dev.shape != (n_devices,):
        raise ValueError(f"{dev.size} device ids for {n_devices} devices")
    if np.any(dev < 0) or np.any(dev > U32_MAX):
        raise ValueError(f"device id outside 0..{U32_MAX}")
    return dev.astype("<u4").reshape(-1, 1).view(np.uint8)


def _records(head: npt.NDArray[np.uint8], payload: npt.NDArray[np.uint8],
             ids: npt.NDArray[np.uint8] | None) -> list[bytes]:
    """One record per payload row: the head, the row, then the row's device id (if any)."""
    m, h, nb = payload.shape[0], head.size, payload.shape[1]
    w = h + nb + (0 if ids is None else 4)
    buf = np.empty((m, w), dtype=np.uint8)
    buf[:, :h] = head
    buf[:, h:h + nb] = payload
    if ids is not None:
        buf[:, h + nb:] = ids
    raw = buf.tobytes()
    return [raw[i:i + w] for i in range(0, m * w, w)]


def unpack_device(raw: bytes) -> DeviceFields | tuple[str, str]:
    """The fields of one binary device report, or the dead letter's (reason, detail)."""
    n = len(raw)
    if n < 3:
        return "bad_encoding", f"binary device report: {n} bytes, shorter than its header"
    version, flags, qlen = raw[0], raw[1], raw[2]
    if version != BINARY_VERSION:
        return "bad_encoding", f"binary device report version {version} (this shuffler reads {BINARY_VERSION})"
    if flags & ~(FLAG_PAIRS | FLAG_AUTH | FLAG_BITMAP):
        return "bad_encoding", f"binary device report flags {flags:#04x}: unknown bits set"
    pairs, bitmap = bool(flags & FLAG_PAIRS), bool(flags & FLAG_BITMAP)
    if bitmap and not pairs:
        return "bad_encoding", f"binary device report flags {flags:#04x}: the bitmap bit without the pairs bit"
    at = 3 + qlen + _FIXED.size
    need = at + (_U16.size if pairs else _U32.size)
    if n < need:
        return "bad_encoding", f"binary device report: {n} bytes, the layout needs {need}"
    count = _U16.unpack_from(raw, at)[0] if pairs else 0  # bitmap: V
    if pairs:
        need += -(-count // 8) if bitmap else 8 * count
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
    if bitmap:
        if count == 0:
            return "bad_json_record", "bitmap: covers 0 stations, must be 1..65535"
        packed = np.frombuffer(raw, dtype=np.uint8, count=-(-count // 8), offset=at + 2)
        if count % 8 and int(packed[-1]) >> (count % 8):
            return "bad_json_record", f"bitmap: a bit past station {count} is set (the padding must be 0)"
        ones = (np.flatnonzero(np.unpackbits(packed, bitorder="little")) + 1).tolist()
        return DeviceFields(query_id, query_version, epoch, rnd, None, tuple(zip(ones, [1] * len(ones), strict=True)),
                            device, mac, count)
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
                count = _U16.unpack_from(raw, at)[0]
                keep = min(keep, at + 2 + (-(-count // 8) if raw[1] & FLAG_BITMAP else 8 * count))
        else:
            keep = min(keep, at + 4)
    out = bytearray(raw[:max(keep, 2)] if keep >= 2 else raw[:1])
    if len(out) > 1:
        out[1] &= ~FLAG_AUTH & 0xFF
    return bytes(out)
