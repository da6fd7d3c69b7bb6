"""The shuffler's decode step: a polled batch of device-topic records in one pass into numpy
columns and per-record reasons (docs/wire.md, "Device reports, binary"), and -- given the
:class:`~schemas.enrollment.Enrollment` -- each report's authentication: its device id in the
``device`` column, or the reason ``unauthenticated`` (no trailer), ``unknown_device`` or
``bad_mac``. The MAC check is one HMAC per record (a Python loop over the authenticated rows).

Binary station-valued reports -- the replay's and a load generator's form -- are read with
array operations over the batch's bytes: no pydantic object is validated per report. Every
other record (JSON, per-sensor pairs, anything malformed) goes through the one-record decoders,
so a reason is always the one :func:`schemas.decode_device_record` gives.

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

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from schemas import DeviceReport, SourceEpoch, WireError, decode_device_record
from schemas.device_binary import AUTH_TRAILER, BINARY_VERSION, FLAG_AUTH, MAC_BYTES, QUERY_ID
from schemas.enrollment import Enrollment

from ..decode import Rejected

__all__ = ["DeviceBatch", "decode_batch"]

IntArray = npt.NDArray[np.int64]
_VALUE_TAIL = 13  # query version, epoch, round, value: the bytes after a station-valued report's query id


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
    pairs: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    notes: dict[int, SourceEpoch] = field(default_factory=dict)

    def report(self, i: int) -> DeviceReport:
        """Row ``i`` as a :class:`DeviceReport` for admission (built from checked columns)."""
        query_id, version = self.keys[int(self.key[i])]
        v = int(self.value[i])
        return DeviceReport.model_construct(query_id=query_id, query_version=version, epoch=int(self.epoch[i]),
                                            round=int(self.round[i]), value=None if v < 0 else v,
                                            pairs=self.pairs.get(i) if v < 0 else None)

    def text(self, i: int) -> str:
        """Row ``i`` as the state log keeps it: the report's JSON without its device id and MAC
        (it decodes to the same report on restore, and names no device)."""
        query_id, version = self.keys[int(self.key[i])]
        v = int(self.value[i])
        payload = f'"value":{v},"pairs":null' if v >= 0 else f'"value":null,"pairs":{json.dumps(self.pairs[i])}'
        return (f'{{"kind":"device_report","query_id":"{query_id}","query_version":{version},'
                f'"epoch":{int(self.epoch[i])},"round":{int(self.round[i])},{payload}}}')


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
    fast: list[int] = []  # rows that look like a station-valued binary report of the right length
    slow: list[int] = []
    for i, raw in enumerate(values):
        if (raw and len(raw) > 3 and raw[0] == BINARY_VERSION and (raw[1] == 0 or raw[1] == FLAG_AUTH)
                and len(raw) == raw[2] + 3 + _VALUE_TAIL + (AUTH_TRAILER if raw[1] else 0)):
            fast.append(i)
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
            for j in np.flatnonzero(ok).tolist():
                _verify(b, fast[j], int(device[j]), chunks[j], enrollment)
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


def _verify(b: DeviceBatch, i: int, device: int, raw: bytes, enrollment: Enrollment) -> None:
    """A fast-path row's authentication: refused unless its trailer's MAC verifies."""
    if device < 0:
        _refuse(b, i, Rejected("unauthenticated", "a device report without a device id and MAC (enrollment is "
                                                  "required)"))
        return
    why = enrollment.check(device, raw[:-MAC_BYTES], raw[-MAC_BYTES:])
    if why is not None:
        _refuse(b, i, Rejected(why.reason, why.detail))


def _refuse(b: DeviceBatch, i: int, why: Rejected) -> None:
    b.reasons[i] = why
    b.key[i] = b.epoch[i] = b.round[i] = b.value[i] = b.device[i] = -1
    b.pairs.pop(i, None)

