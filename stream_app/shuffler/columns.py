"""The shuffler's decode step: a polled batch of device-topic records in one pass into numpy
columns and per-record reasons (docs/wire.md, "Device reports, binary"), and -- given the
:class:`~schemas.enrollment.Enrollment` -- each report's authentication: its device id in the
``device`` column, or the reason ``unauthenticated`` (no trailer), ``unknown_device`` or
``bad_mac``. The MAC check is one HMAC per record (a Python loop over the authenticated rows).

Binary reports -- the replay's and a load generator's form: station-valued, bitmaps and pairs
-- are read with array operations over the batch's bytes joined into one buffer: each record's
layout from its header and length, its fields gathered at their offsets, its query id and
version found once per distinct header; no Python loop and no pydantic object per report
(0.27 µs a report here, 1.5 with its MAC checked). Every other record (JSON, anything
malformed) goes through the one-record decoder, so a reason is always the one
:func:`schemas.decode_device_record` gives.

>>> from schemas import encode_json, DeviceReport
>>> from schemas.device_binary import encode_device
>>> b = decode_batch([encode_device("q", 1, 9, 0, value=3), b"", b"\\x01\\x00",
...                   encode_json(DeviceReport(query_id="q", query_version=1, epoch=9, value=2))])
>>> [None if r is None else r.reason for r in b.reasons]
[None, 'empty', 'bad_encoding', None]
>>> b.report(0) == DeviceReport(query_id="q", query_version=1, epoch=9, value=3), b.value.tolist()
(True, [3, -1, -1, 2])
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from schemas import DeviceReport, SourceEpoch, WireError, decode_device_record
from schemas.device_binary import AUTH_TRAILER, BINARY_VERSION, FLAG_AUTH, FLAG_PAIRS, QUERY_ID
from schemas.enrollment import Enrollment
from schemas.estimates import Rejected

__all__ = ["DeviceBatch", "decode_batch"]

IntArray = npt.NDArray[np.int64]
_VALUE_TAIL = 13  # query version, epoch, round, value: the bytes after a station-valued report's query id
_BITMAP = 0x05  # flags: pairs, as a bitmap (auth aside)
_PAYLOAD_HEAD = 11  # query version, epoch, round, u16 (V or n): the bytes after a bitmap or pair report's query id
_PAD = 300  # zero bytes after a batch's records: a header field read past a short record stays in the buffer


@dataclass
class DeviceBatch:
    """One polled batch, decoded. Per record ``i``: ``reasons[i]`` (refused at decode) or a
    source note in ``notes`` or a device report in the columns: ``key[i]`` indexes ``keys``
    (query id, version), ``epoch``, ``round``, ``value`` (-1: pairs, then
    ``pairs[i]``), ``device`` (the authenticated device; -1: decoded without an enrollment).
    Rows that are not device reports hold -1."""

    reasons: list[Rejected | None]
    key: IntArray
    epoch: IntArray
    round: IntArray
    value: IntArray
    device: IntArray
    keys: list[tuple[str, int]] = field(default_factory=list)
    # the batch's records joined (and padded), and where each begins in ``buf``
    buf: npt.NDArray[np.uint8] = field(default_factory=lambda: np.zeros(_PAD, np.uint8))
    off: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    # bitmap reports (``pairs`` as a bitmap, decoded on the fast path): the stations V their
    # bitmap covers (-1: not one) and where in its record its ceil(V/8) bytes begin
    width: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    at: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    # binary pair reports decoded on the fast path: row i's pairs are (pair_station, pair_output)
    # [pair_at[i] : pair_at[i] + npairs[i]] (npairs -1: not one); pair_row: each pair's row
    npairs: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_at: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_station: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_output: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    pair_row: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    pairs: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    notes: dict[int, SourceEpoch] = field(default_factory=dict)

    def report(self, i: int) -> DeviceReport:
        """Row ``i`` as a :class:`DeviceReport` for admission (built from checked columns)."""
        query_id, version = self.keys[int(self.key[i])]
        v = int(self.value[i])
        if v < 0 and i not in self.pairs and self.width.size and self.width[i] >= 0:
            self.pairs[i] = tuple((int(s), 1) for s in np.flatnonzero(self.bits([i]).sum(axis=0)) + 1)
        if v < 0 and i not in self.pairs and self.npairs.size and self.npairs[i] >= 0:
            a, m = int(self.pair_at[i]), int(self.npairs[i])
            self.pairs[i] = tuple(zip(self.pair_station[a:a + m].tolist(), self.pair_output[a:a + m].tolist(),
                                      strict=True))
        report = DeviceReport.model_construct(query_id=query_id, query_version=version, epoch=int(self.epoch[i]),
                                              round=int(self.round[i]), value=None if v < 0 else v,
                                              pairs=self.pairs.get(i) if v < 0 else None)
        if self.width.size and self.width[i] >= 0:
            report._bitmap_stations = int(self.width[i])  # the policy checks V against the query's
        return report

    def bits(self, rows: Sequence[int] | IntArray) -> npt.NDArray[np.uint8]:
        """Bitmap rows ``rows`` (one V) as a (rows, V) 0/1 matrix: column s - 1 is station s."""
        r = np.asarray(rows, np.int64)
        v = int(self.width[r[0]])
        mat = self.buf[(self.off[r] + self.at[r])[:, None] + np.arange((v + 7) // 8)]
        return np.unpackbits(mat, axis=1, bitorder="little")[:, :v]

    def station_counts(self, rows: Sequence[int] | IntArray, chunk: int = 8192) -> IntArray:
        """How many of bitmap rows ``rows`` (one V) set each station's bit: counts[s - 1]."""
        total = np.zeros(int(self.width[rows[0]]), np.int64)
        for start in range(0, len(rows), chunk):
            total += self.bits(rows[start:start + chunk]).sum(axis=0, dtype=np.int64)
        return total


def _u32(buf: npt.NDArray[np.uint8], at: IntArray) -> IntArray:
    """The little-endian u32 at each offset ``at`` of ``buf``."""
    got = buf[at[:, None] + np.arange(4)].astype(np.int64)
    out: IntArray = got[:, 0] | (got[:, 1] << 8) | (got[:, 2] << 16) | (got[:, 3] << 24)
    return out


def _u16(buf: npt.NDArray[np.uint8], at: IntArray) -> IntArray:
    out: IntArray = buf[at].astype(np.int64) | (buf[at + 1].astype(np.int64) << 8)
    return out


def decode_batch(values: Sequence[bytes | None], enrollment: Enrollment | None = None) -> DeviceBatch:
    """Decode ``values`` (the records' values, in order) in one pass; with an ``enrollment``,
    check every device report's authentication too (module docstring)."""
    n = len(values)
    raws = [v or b"" for v in values]
    b = DeviceBatch(reasons=[None] * n, key=np.full(n, -1, np.int64), epoch=np.full(n, -1, np.int64),
                    round=np.full(n, -1, np.int64), value=np.full(n, -1, np.int64), device=np.full(n, -1, np.int64))
    b.width, b.at, b.npairs, b.pair_at = (np.full(n, -1, np.int64) for _ in range(4))
    lens = np.fromiter(map(len, raws), np.int64, n)
    b.off = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64) if n else np.zeros(0, np.int64)
    b.buf = np.frombuffer(b"".join(raws) + bytes(_PAD), np.uint8)
    kind, at = _classify(b.buf, b.off, lens)
    keymap: dict[tuple[str, int], int] = {}
    rows = np.flatnonzero(kind != _SLOW)
    fields = _fields(b.buf, at[rows], kind[rows], b.off[rows])
    key = _keys(b.buf, b.off[rows], at[rows] - b.off[rows] - 3, fields.ok, keymap)
    ok = (key >= 0) & _pairs(b, rows, fields, fields.ok & (kind[rows] == _PAIRS))
    b.npairs[rows[~ok]] = -1
    good = rows[ok]
    b.key[good], b.epoch[good], b.round[good], b.device[good] = key[ok], fields.epoch[ok], fields.rnd[ok], \
        fields.device[ok]
    values_ = ok & (kind[rows] == _VALUES)
    b.value[rows[values_]] = fields.value[values_]
    maps = ok & (kind[rows] == _MAPS)
    b.width[rows[maps]], b.at[rows[maps]] = fields.value[maps], (at[rows] - b.off[rows] + _PAYLOAD_HEAD)[maps]
    if enrollment is not None and good.size:
        checked = good.tolist()
        for j, why in enrollment.check_sealed(b.device[good].tolist(), [raws[i] for i in checked]):
            _refuse(b, checked[j], Rejected(why.reason, why.detail))
    for i in np.flatnonzero(kind == _SLOW).tolist() + rows[~ok].tolist():  # the exact reason, one record at a time
        _one(b, i, values[i], keymap, enrollment)
    b.keys = list(keymap)
    return b


_SLOW, _VALUES, _MAPS, _PAIRS = 0, 1, 2, 3  # how a record is decoded: one at a time, or as arrays of its layout


def _classify(buf: npt.NDArray[np.uint8], off: IntArray, lens: IntArray) -> tuple[npt.NDArray[np.int8], IntArray]:
    """Each record's layout by its header and length (``_SLOW``: none of the binary layouts at
    its length), and where its query id ends in ``buf``."""
    head, flags = buf[off], buf[off + 1].astype(np.int64)
    qlen = buf[off + 2].astype(np.int64)
    at = off + 3 + qlen
    body = lens - 3 - qlen - np.where(flags & FLAG_AUTH, AUTH_TRAILER, 0)  # the bytes from ``at`` to the trailer
    binary = (lens > 3) & (head == BINARY_VERSION)
    layout, payload = flags & ~FLAG_AUTH, body - _PAYLOAD_HEAD
    v = _u16(buf, at + 9)
    kind = np.zeros(off.size, np.int8)
    kind[binary & (layout == 0) & (body == _VALUE_TAIL)] = _VALUES
    framed = binary & (payload >= 0)
    kind[framed & (layout == _BITMAP) & (payload == (v + 7) // 8)] = _MAPS
    kind[framed & (layout == FLAG_PAIRS) & (payload == 8 * v)] = _PAIRS
    return kind, at


@dataclass
class _Fields:
    """The fixed fields of the binary rows (in ``rows`` order): ``value`` is V for a bitmap and
    the pair count for pairs; ``ok``: every field in bounds (else the one-record decoder)."""

    ok: npt.NDArray[np.bool_]
    epoch: IntArray
    rnd: IntArray
    value: IntArray
    device: IntArray
    payload: IntArray  # where a bitmap's or pairs' bytes begin in the batch's buffer


def _fields(buf: npt.NDArray[np.uint8], at: IntArray, kind: npt.NDArray[np.int8], off: IntArray) -> _Fields:
    values = kind == _VALUES
    version, epoch, rnd = _u32(buf, at), _u32(buf, at + 4), buf[at + 8].astype(np.int64)
    value = np.where(values, _u32(buf, at + 9), _u16(buf, at + 9))
    nbytes = np.where(values, 4, np.where(kind == _MAPS, (value + 7) // 8, 8 * value))
    payload = at + np.where(values, 9, _PAYLOAD_HEAD)
    auth = (buf[off + 1] & FLAG_AUTH) != 0
    device = np.where(auth, _u32(buf, np.where(auth, payload + nbytes, 0)), -1)
    ok = (version >= 1) & (rnd <= 1)
    maps = kind == _MAPS
    last = buf[np.where(maps, payload + nbytes - 1, 0)].astype(np.int64)  # no padding bit set past V
    ok &= ~maps | ((value >= 1) & ((last >> (value - 8 * (nbytes - 1)).clip(0, 8)) == 0))
    return _Fields(ok, epoch, rnd, value, device, payload)


def _pairs(b: DeviceBatch, rows: IntArray, f: _Fields, pairs: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """The ``pairs`` rows' pairs into ``b``'s pair arrays; False for a pair row with a station 0
    (the one-record decoder's reason), True for every other row."""
    good = np.ones(rows.size, bool)
    sel = np.flatnonzero(pairs)
    if not sel.size:
        return good
    n = f.value[sel]
    starts = np.concatenate(([0], np.cumsum(n)[:-1]))
    owner = np.repeat(np.arange(sel.size), n)
    at = f.payload[sel][owner] + 8 * (np.arange(owner.size) - starts[owner])
    station, output = _u32(b.buf, at), _u32(b.buf, at + 4)
    bad = np.bincount(owner[station < 1], minlength=sel.size) > 0
    good[sel[bad]] = False
    keep = ~bad[owner]
    n_ok = np.where(bad, 0, n)
    b.npairs[rows[sel[~bad]]] = n[~bad]
    b.pair_at[rows[sel[~bad]]] = np.concatenate(([0], np.cumsum(n_ok)[:-1]))[~bad]
    b.pair_station, b.pair_output, b.pair_row = station[keep], output[keep], rows[sel][owner[keep]]
    return good


def _keys(buf: npt.NDArray[np.uint8], off: IntArray, qlen: IntArray, ok: npt.NDArray[np.bool_],
          keymap: dict[tuple[str, int], int]) -> IntArray:
    """Each ``ok`` row's (query id, version) as its index in ``keymap`` (added in order of first
    appearance); -1 where the query id is not one, or the row is not ``ok``."""
    out = np.full(off.size, -1, np.int64)
    found: list[tuple[int, tuple[str, int] | None]] = []  # per distinct header: its first row, (query id, version)
    groups = []
    for length in np.unique(qlen[ok]).tolist():
        sel = np.flatnonzero(ok & (qlen == length))
        mat = np.ascontiguousarray(buf[(off[sel] + 3)[:, None] + np.arange(length + 4)])  # query id, then version
        _, first, inverse = np.unique(mat.view(np.dtype((np.void, length + 4))).ravel(), return_index=True,
                                      return_inverse=True)
        groups.append((sel, inverse.ravel() + len(found)))
        for row in first.tolist():
            raw = mat[row].tobytes()
            text = raw[:length].decode("ascii", "replace")
            found.append((int(sel[row]), (text, int.from_bytes(raw[length:], "little"))
                          if QUERY_ID.fullmatch(text) else None))
    index = np.full(len(found), -1, np.int64)
    for u in sorted(range(len(found)), key=lambda u: found[u][0]):
        pair = found[u][1]
        if pair is not None:
            index[u] = keymap.setdefault(pair, len(keymap))
    for sel, inverse in groups:
        out[sel] = index[inverse]
    return out


def _one(b: DeviceBatch, i: int, raw: bytes | None, keymap: dict[tuple[str, int], int],
         enrollment: Enrollment | None) -> None:
    """Row ``i`` through the one-record decoder: its reason, its note, or its report's columns."""
    try:
        rec = decode_device_record(raw)
    except WireError as exc:
        b.reasons[i] = Rejected(exc.reason, exc.detail)
        return
    if isinstance(rec, SourceEpoch):
        b.notes[i] = rec
        return
    b.key[i] = keymap.setdefault((rec.query_id, rec.query_version), len(keymap))
    b.epoch[i], b.round[i] = rec.epoch, rec.round
    b.device[i] = -1 if rec.device is None else rec.device
    if rec.value is not None:
        b.value[i] = rec.value
    else:
        b.pairs[i] = rec.pairs or ()
    if enrollment is not None:
        why = enrollment.check_report(rec, raw)
        if why is not None:
            _refuse(b, i, Rejected(why.reason, why.detail))


def _refuse(b: DeviceBatch, i: int, why: Rejected) -> None:
    b.reasons[i] = why
    b.key[i] = b.epoch[i] = b.round[i] = b.value[i] = b.device[i] = b.width[i] = -1
    if b.npairs.size:
        b.npairs[i] = -1
    b.pairs.pop(i, None)
