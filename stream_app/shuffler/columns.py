"""The shuffler's decode step: a polled batch of device-topic records in one pass into numpy
columns and per-record reasons (docs/wire.md, "Device reports, binary"), and -- given the
:class:`~schemas.enrollment.Enrollment` -- each report's authentication: its device id in the
``device`` column, or the reason ``unauthenticated`` (no trailer), ``unknown_device`` or
``bad_mac``. The MAC check is one HMAC per record (a Python loop over the authenticated rows).

Binary reports -- the replay's and a load generator's form: station-valued, bitmaps and pairs
-- are read with array operations over the batch's bytes: no pydantic object is validated per
report. Every other record (JSON, anything malformed) goes through the one-record decoders, so
a reason is always the one :func:`schemas.decode_device_record` gives.

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
    # bitmap reports (``pairs`` as a bitmap, decoded on the fast path): the stations V their
    # bitmap covers (-1: not one) and where in ``raw[i]`` its ceil(V/8) bytes begin
    width: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    at: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    raw: Sequence[bytes | None] = ()
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

    def bits(self, rows: Sequence[int]) -> npt.NDArray[np.uint8]:
        """Bitmap rows ``rows`` (one V) as a (rows, V) 0/1 matrix: column s - 1 is station s."""
        v = int(self.width[rows[0]])
        nb = (v + 7) // 8
        raw = self.raw
        mat = np.frombuffer(b"".join((raw[i] or b"")[self.at[i]:self.at[i] + nb] for i in rows), np.uint8)
        return np.unpackbits(mat.reshape(len(rows), nb), axis=1, bitorder="little")[:, :v]

    def station_counts(self, rows: Sequence[int], chunk: int = 8192) -> IntArray:
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


def decode_batch(values: Sequence[bytes | None], enrollment: Enrollment | None = None) -> DeviceBatch:
    """Decode ``values`` (the records' values, in order) in one pass; with an ``enrollment``,
    check every device report's authentication too (module docstring)."""
    n = len(values)
    b = DeviceBatch(reasons=[None] * n, key=np.full(n, -1, np.int64), epoch=np.full(n, -1, np.int64),
                    round=np.full(n, -1, np.int64), value=np.full(n, -1, np.int64), device=np.full(n, -1, np.int64))
    b.width, b.at, b.raw = np.full(n, -1, np.int64), np.full(n, -1, np.int64), values
    b.npairs, b.pair_at = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    fast: list[int] = []  # rows that look like a station-valued binary report of the right length
    slow: list[int] = []
    maps: list[int] = []  # rows that look like a bitmap report of the right length
    pairs: list[int] = []  # rows that look like a binary pair report of the right length
    for i, raw in enumerate(values):
        if not raw or len(raw) <= 3 or raw[0] != BINARY_VERSION:
            slow.append(i)
        elif (raw[1] == 0 or raw[1] == FLAG_AUTH) and len(raw) == raw[2] + 3 + _VALUE_TAIL + (
                AUTH_TRAILER if raw[1] else 0):
            fast.append(i)
        elif (raw[1] & ~FLAG_AUTH) == _BITMAP and len(raw) >= raw[2] + 3 + _PAYLOAD_HEAD and len(raw) == (
                raw[2] + 3 + _PAYLOAD_HEAD + (_u16(raw, raw[2] + 12) + 7) // 8 + (AUTH_TRAILER if raw[1] & FLAG_AUTH
                                                                                 else 0)):
            maps.append(i)
        elif (raw[1] & ~FLAG_AUTH) == FLAG_PAIRS and len(raw) >= raw[2] + 3 + _PAYLOAD_HEAD and len(raw) == (
                raw[2] + 3 + _PAYLOAD_HEAD + 8 * _u16(raw, raw[2] + 12)
                + (AUTH_TRAILER if raw[1] & FLAG_AUTH else 0)):
            pairs.append(i)
        else:
            slow.append(i)
    ids: dict[bytes, str | None] = {}
    keymap: dict[tuple[str, int], int] = {}
    if fast:
        rows = np.asarray(fast, np.int64)
        chunks = [values[i] or b"" for i in fast]
        lens = np.fromiter((len(c) for c in chunks), np.int64, len(chunks))
        off = np.concatenate(([0], np.cumsum(lens)[:-1]))
        buf = np.frombuffer(b"".join(chunks), np.uint8)
        at = off + 3 + buf[off + 2].astype(np.int64)
        version, epoch, rnd, value = _u32(buf, at), _u32(buf, at + 4), buf[at + 8].astype(np.int64), _u32(buf, at + 9)
        auth = buf[off + 1] == FLAG_AUTH
        device = np.where(auth, _u32(buf, np.where(auth, at + 13, 0)), -1)
        ok = (version >= 1) & (rnd <= 1)
        qids = []
        for c in chunks:
            q = c[3:3 + c[2]]
            if q not in ids:
                s = q.decode("ascii", "replace")
                ids[q] = s if QUERY_ID.fullmatch(s) else None
            qids.append(ids[q])
        for j in np.flatnonzero(ok).tolist():
            qid = qids[j]
            if qid is None:
                ok[j] = False
                continue
            k = (qid, int(version[j]))
            b.key[fast[j]] = keymap.setdefault(k, len(keymap))
        good = rows[ok]
        b.epoch[good], b.round[good], b.value[good], b.device[good] = epoch[ok], rnd[ok], value[ok], device[ok]
        slow.extend(rows[~ok].tolist())  # the exact reason from the one-record decoder
        if enrollment is not None:
            checked = np.flatnonzero(ok).tolist()
            _verify(b, [fast[j] for j in checked], device[checked].tolist(), [chunks[j] for j in checked], enrollment)
    if maps:
        slow.extend(_payloads(b, maps, values, ids, keymap, enrollment, bitmap=True))
    if pairs:
        slow.extend(_payloads(b, pairs, values, ids, keymap, enrollment, bitmap=False))
    for i in slow:
        raw = values[i]
        try:
            rec = decode_device_record(raw)
        except WireError as exc:
            b.reasons[i] = Rejected(exc.reason, exc.detail)
            continue
        if isinstance(rec, SourceEpoch):
            b.notes[i] = rec
            continue
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
    b.keys = list(keymap)
    return b


def _u16(raw: bytes, at: int) -> int:
    return raw[at] | (raw[at + 1] << 8)


def _payloads(b: DeviceBatch, rows: list[int], values: Sequence[bytes | None], ids: dict[bytes, str | None],
              keymap: dict[tuple[str, int], int], enrollment: Enrollment | None, bitmap: bool) -> list[int]:
    """Decode the rows that look like bitmap (``bitmap``) or binary pair reports into ``b``'s
    columns (``value`` -1; ``width`` V and ``at``, or the batch's pair arrays); the rows that
    are not well formed, for the one-record decoder (its exact reason)."""
    slow, took, counts = [], [], []
    heads: dict[bytes, tuple[int, int, int, int, int, int] | None] = {}  # header -> its fields, parsed once
    good: list[int] = []
    cols: list[tuple[int, int, int, int, int, int]] = []  # per good row: key, epoch, round, at, V or n, device
    for i in rows:
        raw = values[i] or b""
        at = 3 + raw[2]
        head = raw[:at + 11]
        if head in heads:
            got = heads[head]
        else:
            got = heads[head] = _header(head, at, ids, keymap, bitmap)
        if got is None:
            slow.append(i)
            continue
        key, epoch, rnd, v, nb, shift = got
        if bitmap and nb and raw[at + 10 + nb] >> shift:  # a padding bit set
            slow.append(i)
            continue
        good.append(i)
        cols.append((key, epoch, rnd, at + 11, v,
                     int.from_bytes(raw[at + 11 + nb:at + 15 + nb], "little") if raw[1] & FLAG_AUTH else -1))
        if not bitmap:
            took.append(i)
            counts.append(v)
    if good:  # the columns in one assignment each
        idx, col = np.asarray(good, np.int64), np.asarray(cols, np.int64)
        b.key[idx], b.epoch[idx], b.round[idx], b.at[idx], b.device[idx] = col[:, 0], col[:, 1], col[:, 2], col[:, 3], \
            col[:, 5]
        if bitmap:
            b.width[idx] = col[:, 4]
    if took:  # every pair of every pair row at once; a row with a station 0 goes to the one-record decoder
        arr = np.frombuffer(b"".join((values[i] or b"")[b.at[i]:b.at[i] + 8 * m] for i, m in zip(took, counts,
                                                                                                   strict=True)),
                            "<u4").reshape(-1, 2).astype(np.int64)
        n = np.asarray(counts, np.int64)
        owner = np.repeat(np.arange(len(took)), n)
        bad = np.bincount(owner[arr[:, 0] < 1], minlength=len(took)) > 0
        starts = np.concatenate(([0], np.cumsum(n)[:-1]))
        rows_ = np.asarray(took, np.int64)
        b.npairs[rows_[~bad]], b.pair_at[rows_[~bad]] = n[~bad], starts[~bad]
        b.pair_station, b.pair_output, b.pair_row = arr[:, 0], arr[:, 1], rows_[owner]
        for j in np.flatnonzero(bad).tolist():
            i = took[j]
            b.key[i] = b.epoch[i] = b.round[i] = b.device[i] = b.at[i] = -1
            slow.append(i)
    if enrollment is not None:
        checked = [i for i in good if b.key[i] >= 0]
        _verify(b, checked, b.device[checked].tolist(), [values[i] or b"" for i in checked], enrollment)
    return slow


def _header(head: bytes, at: int, ids: dict[bytes, str | None], keymap: dict[tuple[str, int], int], bitmap: bool
            ) -> tuple[int, int, int, int, int, int] | None:
    """A bitmap or pair report's header (up to its u16): (key, epoch, round, V or n, payload
    bytes, the padding's shift), or None when a field is out of bounds (the one-record
    decoder gives the reason)."""
    q = head[3:at]
    if q not in ids:
        text = q.decode("ascii", "replace")
        ids[q] = text if QUERY_ID.fullmatch(text) else None
    qid = ids[q]
    version, epoch = int.from_bytes(head[at:at + 4], "little"), int.from_bytes(head[at + 4:at + 8], "little")
    rnd, v = head[at + 8], _u16(head, at + 9)
    if qid is None or version < 1 or rnd > 1 or (bitmap and v < 1):
        return None
    nb = (v + 7) // 8 if bitmap else 8 * v
    return keymap.setdefault((qid, version), len(keymap)), epoch, rnd, v, nb, v - 8 * (nb - 1) if bitmap else 0


def _verify(b: DeviceBatch, rows: list[int], devices: list[int], raws: list[bytes], enrollment: Enrollment) -> None:
    """Fast-path rows' authentication: each refused unless its trailer's MAC verifies."""
    for j, why in enrollment.check_sealed(devices, raws):
        _refuse(b, rows[j], Rejected(why.reason, why.detail))


def _refuse(b: DeviceBatch, i: int, why: Rejected) -> None:
    b.reasons[i] = why
    b.key[i] = b.epoch[i] = b.round[i] = b.value[i] = b.device[i] = b.width[i] = -1
    if b.npairs.size:
        b.npairs[i] = -1
    b.pairs.pop(i, None)

