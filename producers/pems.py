"""Readers for Caltrans PeMS Station Raw (30 s), Station 5-Minute and station metadata files.

Real files are messy (``shared/reference/PEMS_FORMAT.md``): timestamps off the :00/:30 marks,
empty lanes and rows, stuck detectors, impossible spikes, dead detectors, missing rows, files
spanning more than one day, stations missing from metadata. Readers never crash on a bad row:
they skip or flag it and count why in a :class:`QualityReport`.

Ground truth per station and epoch = flow summed over the usable lanes, **only where**
:attr:`TrafficDay.has_truth`: every cell of the (epochs x stations) grid also carries a
bitmask in :attr:`TrafficDay.flags` (``CELL_*``). Missing is not zero: a cell without a
reading is ``CELL_MISSING`` (its flow is 0 only because the simulation needs a number).

Files are read by content, not by name: gzip, bz2, xz, zip (one member) or plain text.
The Station Raw reader is vectorized (numpy over the decompressed bytes) with an exact
per-row fallback to the row logic for any line the fast path cannot handle, so every skip
reason is counted as before. :func:`load_cached` keeps a parsed day as npz + JSON.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import json
import lzma
import math
import os
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S, PACIFIC, epoch_of, epoch_start  # the one epoch clock

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CELL_DEAD",
    "CELL_MISSING",
    "CELL_OUT_OF_RANGE_LANE",
    "CELL_SPIKE_LANE",
    "CELL_STUCK_LANE",
    "DEFAULT_DEAD_RUN_EPOCHS",
    "EPOCH_S",
    "PACIFIC",
    "QualityReport",
    "StationMeta",
    "TrafficDay",
    "day_epochs",
    "days_in",
    "epoch_of",
    "epoch_start",
    "load_cached",
    "read_bytes",
    "read_metadata",
    "read_station_5min",
    "read_station_raw",
]

MAX_LANES = 8
DEFAULT_SPIKE_PER_LANE = 40  # vehicles per lane per 30 s; ~4,800 veh/h/lane is not physical
DEFAULT_DEAD_RUN_EPOCHS = 120  # one hour of 0/0 on every lane while the rest of the file has traffic
MAX_SPAN_EPOCHS = 31 * 2880  # a grid longer than a month is a garbage timestamp, not a file

CELL_MISSING = 1  # no usable reading at all (no row, an empty row, a skipped row)
CELL_DEAD = 2  # dead detector: 0/0 on every lane for >= dead_run_epochs while others have traffic
CELL_STUCK_LANE = 4  # some lane was stuck (flow 0, occupancy >= .99, speed 0) and left out
CELL_SPIKE_LANE = 8  # some lane had an impossible flow and was left out
CELL_OUT_OF_RANGE_LANE = 16  # some lane had a negative flow or occupancy outside 0..1, left out
NO_TRUTH = CELL_MISSING | CELL_DEAD

CACHE_FORMAT_VERSION = 1


def day_epochs(day: date) -> tuple[int, int]:
    """``[first, stop)`` epochs of a local (Pacific) calendar day: 2,880 epochs, or 2,760 /
    3,000 on the spring / autumn DST days.

    >>> a, b = day_epochs(date(2012, 11, 4)); b - a
    3000
    """
    nxt = day + timedelta(days=1)
    first = epoch_of(datetime(day.year, day.month, day.day, tzinfo=PACIFIC))
    return first, epoch_of(datetime(nxt.year, nxt.month, nxt.day, tzinfo=PACIFIC))


def _local_days(epochs: npt.NDArray[np.int64]) -> list[date]:
    """The distinct local calendar days of absolute epochs (vectorized: one boundary per day)."""
    if epochs.size == 0:
        return []
    lo, hi = int(epochs.min()), int(epochs.max())
    d0 = epoch_start(lo).date()
    d1 = epoch_start(hi).date()
    days = [d0 + timedelta(days=k) for k in range((d1 - d0).days + 1)]
    bounds = np.array([day_epochs(d)[0] for d in days], dtype=np.int64)
    idx = np.unique(np.searchsorted(bounds, epochs, side="right") - 1)
    return [days[int(i)] for i in idx]


@dataclass
class QualityReport:
    """What a reader did with a file: rows read, used, skipped (and why), lanes flagged, and
    what the cell grid holds (missing cells, dead cells and stations, cells with left-out lanes)."""

    source: str
    rows_read: int = 0
    rows_used: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    lanes_flagged: Counter[str] = field(default_factory=Counter)
    stations_without_metadata: int = 0
    missing_cells: int = 0
    dead_cells: int = 0
    dead_stations: int = 0
    stuck_lane_cells: int = 0
    spike_lane_cells: int = 0
    days_in_file: list[str] = field(default_factory=list)  # ISO dates holding used rows
    day_selected: str | None = None

    @property
    def rows_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        parts = [f"{self.source}: {self.rows_read} rows read, {self.rows_used} used, {self.rows_skipped} skipped"]
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())))
        if self.lanes_flagged:
            parts.append("lanes flagged: " + ", ".join(f"{k}={v}" for k, v in sorted(self.lanes_flagged.items())))
        if self.missing_cells or self.dead_cells or self.stuck_lane_cells or self.spike_lane_cells:
            parts.append(f"cells without truth: {self.missing_cells} missing, {self.dead_cells} dead "
                         f"({self.dead_stations} stations dead all file); cells with lanes left out: "
                         f"{self.stuck_lane_cells} stuck, {self.spike_lane_cells} spike")
        if self.day_selected is not None and self.rows_used == 0:
            held = ", ".join(self.days_in_file) or "no usable rows at all"
            parts.append(f"no rows on {self.day_selected}; the file holds {held}")
        elif len(self.days_in_file) > 1:
            parts.append("the file holds " + ", ".join(self.days_in_file)
                         + (f" (read {self.day_selected})" if self.day_selected else ""))
        if self.stations_without_metadata:
            parts.append(f"{self.stations_without_metadata} stations not in the metadata (replayed anyway)")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "rows_read": self.rows_read, "rows_used": self.rows_used,
                "skipped": dict(self.skipped), "lanes_flagged": dict(self.lanes_flagged),
                "stations_without_metadata": self.stations_without_metadata,
                "missing_cells": self.missing_cells, "dead_cells": self.dead_cells,
                "dead_stations": self.dead_stations, "stuck_lane_cells": self.stuck_lane_cells,
                "spike_lane_cells": self.spike_lane_cells, "days_in_file": list(self.days_in_file),
                "day_selected": self.day_selected}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QualityReport:
        return cls(**{**d, "skipped": Counter(d["skipped"]), "lanes_flagged": Counter(d["lanes_flagged"])})


@dataclass(frozen=True)
class StationMeta:
    station: int
    freeway: str = ""
    direction: str = ""
    district: str = ""
    lane_type: str = ""
    lanes: int | None = None
    name: str = ""
    latitude: float | None = None
    longitude: float | None = None


@dataclass
class TrafficDay:
    """Per-station flows per epoch on a full grid: ``flows[i, j]`` = vehicles at
    ``stations[j]`` in epoch ``epochs[i]`` (absolute epoch indices, consecutive).

    ``flows`` is ground truth **only where** :attr:`has_truth`; a ``CELL_MISSING`` or
    ``CELL_DEAD`` cell holds 0 because the simulation needs a number, not because 0
    vehicles passed. ``flags[i, j]`` is the ``CELL_*`` bitmask of that cell.
    """

    stations: npt.NDArray[np.int64]
    epochs: npt.NDArray[np.int64]
    flows: npt.NDArray[np.int64]
    flags: npt.NDArray[np.uint8]
    quality: QualityReport
    meta: dict[int, StationMeta] = field(default_factory=dict)

    @property
    def has_truth(self) -> npt.NDArray[np.bool_]:
        """True where ``flows`` is a real count: neither missing nor a dead detector."""
        out: npt.NDArray[np.bool_] = (self.flags & NO_TRUTH) == 0
        return out

    def peak_total(self) -> int:
        """The largest number of vehicles at monitored stations in any one epoch."""
        return int(self.flows.sum(axis=1).max()) if self.flows.size else 0

    def attach_metadata(self, meta: dict[int, StationMeta]) -> None:
        self.meta = meta
        self.quality.stations_without_metadata = int(sum(1 for s in self.stations if int(s) not in meta))


def days_in(day: TrafficDay) -> list[date]:
    """The local calendar days the source file holds used rows for (all of them, also when a
    reader was asked for one ``day``): tell the user which days to ask for."""
    return [date.fromisoformat(s) for s in day.quality.days_in_file]


# ---------------------------------------------------------------------------------------
# Bytes: compression by content
# ---------------------------------------------------------------------------------------
def _sniff(head: bytes) -> str:
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:4] == b"PK\x03\x04":
        return "zip"
    return "plain"


def read_bytes(path: str | Path) -> bytes:
    """The (decompressed) bytes of a file, the compression told by content: gzip (1f8b),
    bz2 (``BZh``), xz (fd377a585a00), zip (``PK\\x03\\x04``, exactly one data member) or plain.

    A compressed file that cannot be read raises a one-line ``ValueError`` naming the file
    and the format.
    """
    p = Path(path)
    with p.open("rb") as fh:
        head = fh.read(6)
    fmt = _sniff(head)
    if fmt == "plain":
        return p.read_bytes()
    try:
        if fmt == "gzip":
            return gzip.decompress(p.read_bytes())
        if fmt == "bz2":
            return bz2.decompress(p.read_bytes())
        if fmt == "xz":
            return lzma.decompress(p.read_bytes())
        with zipfile.ZipFile(p) as zf:
            members = [i for i in zf.infolist() if not i.is_dir()]
            if len(members) != 1:
                names = ", ".join(i.filename for i in members[:5]) or "none"
                raise ValueError(f"{p}: a zip file must hold exactly one data member, it holds "
                                 f"{len(members)} ({names})")
            return zf.read(members[0])
    except ValueError as exc:
        if str(exc).startswith(str(p)):
            raise
        raise ValueError(_one_line(f"{p}: unreadable {fmt} file ({type(exc).__name__}: {exc})")) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, NotImplementedError,
            RuntimeError) as exc:
        raise ValueError(_one_line(f"{p}: unreadable {fmt} file ({type(exc).__name__}: {exc})")) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _text_io(path: str | Path) -> io.StringIO:
    return io.StringIO(read_bytes(path).decode("utf-8", errors="replace"), newline="")


# ---------------------------------------------------------------------------------------
# Timestamps
# ---------------------------------------------------------------------------------------
@lru_cache(maxsize=1 << 16)
def _parse_ts(text: str) -> datetime:
    """Parse ``MM/DD/YYYY HH:MM:SS`` (Pacific). Cached: a file repeats each stamp per station."""
    t = text.strip()
    if len(t) != 19 or t[2] != "/" or t[5] != "/" or t[10] != " ":
        raise ValueError(f"bad timestamp {text!r}")
    return datetime(int(t[6:10]), int(t[0:2]), int(t[3:5]), int(t[11:13]), int(t[14:16]), int(t[17:19]),
                    tzinfo=PACIFIC)


@lru_cache(maxsize=1 << 16)
def _stamp_epochs(text: str) -> tuple[int, int]:
    """(epoch, epoch of the same text in the repeated autumn hour); equal unless ambiguous."""
    ts = _parse_ts(text)
    return epoch_of(ts), epoch_of(ts.replace(fold=1))


@lru_cache(maxsize=1 << 14)
def _hour_offsets(day_hour: int) -> tuple[int, int]:
    """UTC offsets in seconds (fold 0, fold 1) of a local hour given as days since 1970 * 24 + hour."""
    d = date(1970, 1, 1) + timedelta(days=day_hour // 24)
    ts = datetime(d.year, d.month, d.day, day_hour % 24, tzinfo=PACIFIC)
    local = day_hour * 3600
    return local - int(ts.timestamp()), local - int(ts.replace(fold=1).timestamp())


def _vector_stamps(m: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                                         npt.NDArray[np.bool_]]:
    """Epochs (fold 0 and fold 1) of ``MM/DD/YYYY HH:MM:SS`` stamps given as an (n, 19) byte
    matrix, and which stamps are valid. Exactly what :func:`_parse_ts` + :func:`epoch_of` give."""
    d = (m - 48).astype(np.int64)
    digit_cols = [0, 1, 3, 4, 6, 7, 8, 9, 11, 12, 14, 15, 17, 18]
    ok = np.all((m[:, digit_cols] >= 48) & (m[:, digit_cols] <= 57), axis=1)
    ok &= (m[:, 2] == 47) & (m[:, 5] == 47) & (m[:, 10] == 32) & (m[:, 13] == 58) & (m[:, 16] == 58)
    month = d[:, 0] * 10 + d[:, 1]
    mday = d[:, 3] * 10 + d[:, 4]
    year = d[:, 6] * 1000 + d[:, 7] * 100 + d[:, 8] * 10 + d[:, 9]
    hour, minute, sec = d[:, 11] * 10 + d[:, 12], d[:, 14] * 10 + d[:, 15], d[:, 17] * 10 + d[:, 18]
    ok &= (month >= 1) & (month <= 12) & (year >= 1) & (hour < 24) & (minute < 60) & (sec < 60) & (mday >= 1)
    month = np.where(ok, month, 1)
    year = np.where(ok, year, 1970)
    first = ((year - 1970) * 12 + month - 1).astype("datetime64[M]")
    month_days = ((first + 1).astype("datetime64[D]") - first.astype("datetime64[D]")).astype(np.int64)
    ok &= mday <= month_days
    days = first.astype("datetime64[D]").astype(np.int64) + np.where(ok, mday, 1) - 1
    day_hour = np.where(ok, days * 24 + hour, 0)
    off0 = np.zeros(m.shape[0], np.int64)
    off1 = np.zeros(m.shape[0], np.int64)
    if ok.any():
        keys, inverse = np.unique(day_hour[ok], return_inverse=True)
        table = np.array([_hour_offsets(int(k)) for k in keys], dtype=np.int64).reshape(-1, 2)
        off0[ok], off1[ok] = table[inverse, 0], table[inverse, 1]
    local = days * 86400 + hour * 3600 + minute * 60 + sec
    return (local - off0) // EPOCH_S, (local - off1) // EPOCH_S, ok


# ---------------------------------------------------------------------------------------
# Station Raw: rows -> per-row records
# ---------------------------------------------------------------------------------------
@dataclass
class _Rows:
    """Per usable (not skipped) row: file order, epochs (fold 0/1), station, truth, cell flag
    bits, lane flag counts, and whether every present lane read exactly 0/0."""

    order: npt.NDArray[np.int64]
    ep0: npt.NDArray[np.int64]
    ep1: npt.NDArray[np.int64]
    station: npt.NDArray[np.int64]
    total: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]
    n_stuck: npt.NDArray[np.int64]
    n_spike: npt.NDArray[np.int64]
    n_oor: npt.NDArray[np.int64]
    zero: npt.NDArray[np.bool_]

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        names = list(_Rows.__dataclass_fields__)
        if not parts:
            return _Rows(*(np.zeros(0, np.uint8 if n == "bits" else bool if n == "zero" else np.int64)
                           for n in names))
        return _Rows(*(np.concatenate([getattr(p, n) for p in parts]) for n in names))


_FAST_BYTES = np.zeros(256, dtype=bool)
_FAST_BYTES[list(b"0123456789,./:")] = True
_POW10 = 10.0 ** np.arange(32)
_CHUNK_LINES = 1 << 17


def _decimals(win: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
              ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Parse plain decimals (``12``, ``.0278``, ``3.``) at ``starts`` of ``win`` (a padded byte
    buffer): (values, ok, has a dot). ``ok`` is False where the text is anything else (sign,
    exponent, letters, two dots, no digit, more than 15 characters) -- those rows go to the
    exact row logic. An exact integer over an exact power of ten is correctly rounded, so the
    values equal ``float(text)``."""
    n = starts.size
    val = np.zeros(n)
    frac = np.zeros(n, np.int64)
    ndot = np.zeros(n, np.int64)
    anydigit = np.zeros(n, bool)
    bad = lengths > 15
    for k in range(int(min(int(lengths.max(initial=0)), 15))):
        b = win[starts + k]
        valid = k < lengths
        d = b - np.uint8(48)
        isd = (d <= 9) & valid
        isdot = (b == 46) & valid
        bad |= valid & ~isd & ~isdot
        val = np.where(isd, val * 10.0 + d, val)
        frac += isd & (ndot > 0)
        ndot += isdot
        anydigit |= isd
    ok = ~bad & (ndot <= 1) & anydigit
    return val / _POW10[np.minimum(frac, 31)], ok, ndot > 0


def _fast_chunk(win: npt.NDArray[np.uint8], s: npt.NDArray[np.int64], e: npt.NDArray[np.int64],
                line0: int, spike_per_lane: int, skipped: Counter[str]
                ) -> tuple[_Rows, npt.NDArray[np.int64]]:
    """Vectorized parse of lines ``[s, e)``; returns the usable rows and the indices (into
    ``s``) of the lines left to the row logic. Empty rows are counted in ``skipped``."""
    lo, hi = int(s[0]), int(e[-1])
    seg = win[lo:hi + 1]
    # per line: bytes outside the fast alphabet (the stamp's one space excepted) and commas
    bad_pos = np.flatnonzero(~_FAST_BYTES[seg])
    comma = np.flatnonzero(seg == 44)
    sl, el = s - lo, e - lo
    first_comma = np.searchsorted(comma, sl)
    n_bad = (np.searchsorted(bad_pos, el) - np.searchsorted(bad_pos, sl)
             - (win[np.minimum(s + 10, win.size - 1)] == 32))
    line_ok = (n_bad == 0) & (np.searchsorted(comma, el) - first_comma == 25) & ((e - s) >= 19 + 25)
    cand = np.flatnonzero(line_ok)
    c = comma[first_comma[cand][:, None] + np.arange(25)].astype(np.int64) + lo
    sc, ec = s[cand], e[cand]
    ok = c[:, 0] == sc + 19
    stamps = np.lib.stride_tricks.as_strided(win, shape=(win.size - 19, 19), strides=(1, 1), writeable=False)
    ep0, ep1, ts_ok = _vector_stamps(stamps[np.where(ok, sc, 0)])
    ok &= ts_ok
    st_start = c[:, 0] + 1
    station_f, st_ok, st_dot = _decimals(win, st_start, c[:, 1] - st_start)
    ok &= st_ok & ~st_dot  # a "31.5" id is a bad_station_id (row logic)
    parsed = []
    for kind in range(3):  # flow, occupancy, speed
        starts = c[:, 1 + kind:24 + kind:3] + 1
        ends = np.empty_like(starts)
        ends[:, : 8 if kind < 2 else 7] = c[:, 2 + kind::3]
        if kind == 2:
            ends[:, 7] = ec
        lengths = ends - starts
        nonempty = lengths > 0
        v, vok, _ = _decimals(win, starts[nonempty], lengths[nonempty])
        block = np.full(starts.shape, np.nan)
        block[nonempty] = v
        bad = np.zeros(starts.shape, bool)
        bad[nonempty] = ~vok
        parsed.append((block, bad, nonempty))
    (flow, bad_f, present), (occ, bad_o, occ_has), (speed, bad_s, _) = parsed
    # occupancy / speed of an absent lane (empty flow) are never read
    ok &= ~np.any(bad_f | ((bad_o | bad_s) & present), axis=1)
    with np.errstate(invalid="ignore"):
        oor = present & ((flow < 0) | (occ_has & ((occ < 0) | (occ > 1))))
        stuck = present & ~oor & (flow == 0) & occ_has & (occ >= 0.99) & (speed == 0)
        spike = present & ~oor & ~stuck & (flow > spike_per_lane)
        use = present & ~oor & ~stuck & ~spike
        zero_lane = (flow == 0) & (occ == 0)
    total = np.rint(np.where(use, flow, 0.0)).sum(axis=1).astype(np.int64)
    empty = ok & ~present.any(axis=1)
    if empty.any():
        skipped["empty_row"] += int(empty.sum())
    keep = ok & ~empty
    slow = np.concatenate([np.flatnonzero(~line_ok), cand[~ok]])
    bits = ((stuck.any(axis=1) * CELL_STUCK_LANE) | (spike.any(axis=1) * CELL_SPIKE_LANE)
            | (oor.any(axis=1) * CELL_OUT_OF_RANGE_LANE)).astype(np.uint8)
    rows = _Rows(order=(cand[keep] + line0) << 16, ep0=ep0[keep], ep1=ep1[keep],
                 station=station_f[keep].astype(np.int64), total=total[keep], bits=bits[keep],
                 n_stuck=stuck.sum(axis=1)[keep], n_spike=spike.sum(axis=1)[keep], n_oor=oor.sum(axis=1)[keep],
                 zero=(~np.any(present & ~zero_lane, axis=1))[keep])
    return rows, np.sort(slow)


def _raw_row(row: list[str], spike_per_lane: int) -> str | tuple[int, int, int, int, int, int, int, int, bool]:
    """The row logic: a skip reason, or (epoch, fold-1 epoch, station, truth, cell bits,
    stuck lanes, spike lanes, out-of-range lanes, every present lane 0/0)."""
    n_fields = len(row)
    if n_fields == 0 or not "".join(row).strip():
        return "blank_line"
    if n_fields < 2 or n_fields > 2 + 3 * MAX_LANES:
        return "bad_field_count"
    try:
        ep0, ep1 = _stamp_epochs(row[0])
    except ValueError:
        return "bad_timestamp"
    try:
        station = int(row[1])
    except ValueError:
        return "bad_station_id"
    total = present = n_stuck = n_spike = n_oor = 0
    zero = True
    for k in range(2, n_fields, 3):
        flow_text = row[k].strip()
        if not flow_text:
            continue
        occ_text = row[k + 1].strip() if k + 1 < n_fields else ""
        speed_text = row[k + 2].strip() if k + 2 < n_fields else ""
        try:
            flow = float(flow_text)
            occ = float(occ_text) if occ_text else None
            speed = float(speed_text) if speed_text else None
        except ValueError:
            return "bad_number"
        if not all(math.isfinite(v) for v in (flow, occ, speed) if v is not None):
            return "bad_number"  # float() also takes "nan", "inf", "1e400"
        present += 1
        zero = zero and flow == 0 and occ == 0
        if flow < 0 or (occ is not None and not 0 <= occ <= 1):
            n_oor += 1
        elif flow == 0 and occ is not None and occ >= 0.99 and speed == 0:
            n_stuck += 1
        elif flow > spike_per_lane:
            n_spike += 1
        else:
            total += int(round(flow))
    if present == 0:
        return "empty_row"
    bits = ((CELL_STUCK_LANE if n_stuck else 0) | (CELL_SPIKE_LANE if n_spike else 0)
            | (CELL_OUT_OF_RANGE_LANE if n_oor else 0))
    return ep0, ep1, station, total, bits, n_stuck, n_spike, n_oor, zero


def _slow_lines(data: bytes, s: npt.NDArray[np.int64], e: npt.NDArray[np.int64], lines: npt.NDArray[np.int64],
                line0: int, spike_per_lane: int, quality: QualityReport) -> _Rows:
    """The row logic (``csv`` + :func:`_raw_row`) for the lines the fast path left."""
    out: list[tuple[int, int, int, int, int, int, int, int, int, bool]] = []
    for i in lines.tolist():
        text = data[int(s[i]):int(e[i])].decode("utf-8", errors="replace")
        pieces = text.split("\r") if "\r" in text else [text]
        if len(pieces) > 1 and pieces[-1] == "":
            pieces.pop()
        for sub, piece in enumerate(pieces):
            try:
                rows = list(csv.reader([piece]))
            except csv.Error:
                rows = [["?"]]  # an unparseable line: one bad row
            for row in rows:
                quality.rows_read += 1
                got = _raw_row(row, spike_per_lane)
                if isinstance(got, str):
                    quality.skipped[got] += 1
                else:
                    out.append(((line0 + i) << 16 | min(sub, 0xFFFF), *got))
    if not out:
        return _Rows.concat([])
    cols = list(zip(*out, strict=True))
    return _Rows(order=np.array(cols[0], np.int64), ep0=np.array(cols[1], np.int64),
                 ep1=np.array(cols[2], np.int64), station=np.array(cols[3], np.int64),
                 total=np.array(cols[4], np.int64), bits=np.array(cols[5], np.uint8),
                 n_stuck=np.array(cols[6], np.int64), n_spike=np.array(cols[7], np.int64),
                 n_oor=np.array(cols[8], np.int64), zero=np.array(cols[9], bool))


def _parse_raw(data: bytes, spike_per_lane: int, quality: QualityReport) -> _Rows:
    buf = np.frombuffer(data, np.uint8)
    win = np.zeros(buf.size + 32, np.uint8)  # padded: fixed-width reads past the end stay inside
    win[:buf.size] = buf
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate([[0], nl + 1]).astype(np.int64)
    ends = np.concatenate([nl, [buf.size]]).astype(np.int64)
    if buf.size == 0 or data.endswith(b"\n"):
        starts, ends = starts[:-1], ends[:-1]
    cr = (ends > starts) & (win[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr  # \r\n line ends
    parts: list[_Rows] = []
    for a in range(0, starts.size, _CHUNK_LINES):
        s, e = starts[a:a + _CHUNK_LINES], ends[a:a + _CHUNK_LINES]
        rows, slow = _fast_chunk(win, s, e, a, spike_per_lane, quality.skipped)
        quality.rows_read += int(s.size - slow.size)
        parts.append(rows)
        if slow.size:
            parts.append(_slow_lines(data, s, e, slow, a, spike_per_lane, quality))
    return _Rows.concat(parts)


# ---------------------------------------------------------------------------------------
# Rows -> grid: duplicates, the repeated DST hour, day selection, missing and dead cells
# ---------------------------------------------------------------------------------------
def _place(rows: _Rows, quality: QualityReport, fold_repeats: bool) -> tuple[_Rows, npt.NDArray[np.int64]]:
    """Keep the first reading of a station in an epoch; a second reading of an ambiguous
    (repeated autumn hour) stamp is the later, standard-time one; others are duplicates."""
    order = np.lexsort((rows.order, rows.ep0, rows.station))
    st, e0 = rows.station[order], rows.ep0[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (st[1:] != st[:-1]) | (e0[1:] != e0[:-1])
    group_start = np.maximum.accumulate(np.where(new, np.arange(order.size), 0))
    rank = np.arange(order.size) - group_start
    e1 = rows.ep1[order]
    later = (rank == 1) & (e1 != e0) if fold_repeats else np.zeros(order.size, bool)
    keep = (rank == 0) | later
    n_dup = int((~keep).sum())
    if n_dup:
        quality.skipped["duplicate_epoch"] += n_dup
    sel = order[keep]
    epoch = np.where(later, e1, e0)[keep]
    kept = _Rows(*(getattr(rows, n)[sel] for n in _Rows.__dataclass_fields__))
    return kept, epoch


def _grid(rows: _Rows, epoch: npt.NDArray[np.int64], quality: QualityReport, day: date | None,
          dead_run_epochs: int) -> TrafficDay:
    quality.days_in_file = [d.isoformat() for d in _local_days(epoch)]
    if day is not None:
        quality.day_selected = day.isoformat()
        first, stop = day_epochs(day)
        inside = (epoch >= first) & (epoch < stop)
        n_out = int((~inside).sum())
        if n_out:
            quality.skipped["other_day"] += n_out
        rows = _Rows(*(getattr(rows, n)[inside] for n in _Rows.__dataclass_fields__))
        epoch = epoch[inside]
    quality.rows_used = int(epoch.size)
    for name, counts in (("stuck", rows.n_stuck), ("spike", rows.n_spike), ("out_of_range", rows.n_oor)):
        n = int(counts.sum())
        if n:
            quality.lanes_flagged[name] += n
    if epoch.size == 0:
        return TrafficDay(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.int64),
                          np.zeros((0, 0), np.uint8), quality)
    if day is not None:
        epochs = np.arange(first, stop, dtype=np.int64)
    else:
        lo, hi = int(epoch.min()), int(epoch.max())
        if hi - lo + 1 > MAX_SPAN_EPOCHS:
            raise ValueError(f"{quality.source}: readings span {(hi - lo + 1) * EPOCH_S / 86400:.0f} days "
                             f"({', '.join(quality.days_in_file[:3])} ... {quality.days_in_file[-1]}); "
                             "read one day at a time (day=...)")
        epochs = np.arange(lo, hi + 1, dtype=np.int64)
    stations, col = np.unique(rows.station, return_inverse=True)
    row_i = epoch - epochs[0]
    flows = np.zeros((epochs.size, stations.size), np.int64)
    flags = np.full((epochs.size, stations.size), CELL_MISSING, np.uint8)
    zero = np.zeros((epochs.size, stations.size), bool)
    flows[row_i, col] = rows.total
    flags[row_i, col] = rows.bits
    zero[row_i, col] = rows.zero
    flags[_dead_cells(flows, zero, dead_run_epochs)] |= CELL_DEAD
    _count_cells(flags, quality)
    return TrafficDay(stations.astype(np.int64), epochs, flows, flags, quality)


def _dead_cells(flows: npt.NDArray[np.int64], zero: npt.NDArray[np.bool_], run_epochs: int
                ) -> npt.NDArray[np.bool_]:
    """Cells of runs of >= ``run_epochs`` consecutive epochs in which a station read 0/0 on
    every lane while the other stations of the file had traffic (vectorized run lengths).

    >>> z = np.array([[1, 0], [1, 0], [1, 0], [0, 0]], bool); f = np.array([[0, 5], [0, 5], [0, 5], [2, 0]])
    >>> _dead_cells(f, z, 3)[:, 0].tolist()
    [True, True, True, False]
    """
    others = flows.sum(axis=1) > 0  # a zero-reading cell adds nothing to its epoch's total
    cand = (zero & others[:, None]).T  # stations x epochs
    padded = np.zeros((cand.shape[0], cand.shape[1] + 2), np.int8)
    padded[:, 1:-1] = cand
    d = np.diff(padded, axis=1)
    s_st, s_ep = np.nonzero(d == 1)
    _, e_ep = np.nonzero(d == -1)
    long = (e_ep - s_ep) >= max(1, run_epochs)
    mark = np.zeros((cand.shape[0], cand.shape[1] + 1), np.int32)
    mark[s_st[long], s_ep[long]] += 1
    mark[s_st[long], e_ep[long]] -= 1
    dead: npt.NDArray[np.bool_] = (np.cumsum(mark, axis=1)[:, :-1] > 0).T
    return dead


def _count_cells(flags: npt.NDArray[np.uint8], quality: QualityReport) -> None:
    quality.missing_cells = int(np.count_nonzero(flags & CELL_MISSING))
    dead = (flags & CELL_DEAD) != 0
    quality.dead_cells = int(np.count_nonzero(dead))
    no_truth = (flags & NO_TRUTH) != 0
    quality.dead_stations = int(np.count_nonzero(dead.any(axis=0) & no_truth.all(axis=0)))
    quality.stuck_lane_cells = int(np.count_nonzero(flags & CELL_STUCK_LANE))
    quality.spike_lane_cells = int(np.count_nonzero(flags & CELL_SPIKE_LANE))


def read_station_raw(path: str | Path, spike_per_lane: int = DEFAULT_SPIKE_PER_LANE, *,
                     dead_run_epochs: int = DEFAULT_DEAD_RUN_EPOCHS, day: date | None = None) -> TrafficDay:
    """Read a Station Raw 30-second file (26 fields: timestamp, station, 8 x flow/occ/speed).

    Timestamps are binned to 30-second epochs. Per lane: an empty flow means no such lane;
    flow 0 with occupancy >= 0.99 and speed 0 is a stuck detector, a flow above
    ``spike_per_lane`` an impossible spike, a negative flow or an occupancy outside 0..1 out
    of range -- all flagged (lane counts in the report, ``CELL_*`` bits on the cell) and left
    out of the truth. A second reading of the same station in the same epoch is skipped as a
    duplicate (except the repeated autumn DST hour, see the tests).

    The grid spans the first to the last reading (or the whole local ``day`` if given: rows
    of other days are skipped as ``other_day``); cells without a reading are
    ``CELL_MISSING``, runs of >= ``dead_run_epochs`` 0/0 readings while the others have
    traffic ``CELL_DEAD`` -- flows there are 0 but not truth (:attr:`TrafficDay.has_truth`).
    """
    quality = QualityReport(source=str(path))
    rows = _parse_raw(read_bytes(path), spike_per_lane, quality)
    kept, epoch = _place(rows, quality, fold_repeats=True)
    return _grid(kept, epoch, quality, day, dead_run_epochs)


# ---------------------------------------------------------------------------------------
# Station 5-Minute
# ---------------------------------------------------------------------------------------
def read_station_5min(path: str | Path, *, dead_run_epochs: int = DEFAULT_DEAD_RUN_EPOCHS,
                      day: date | None = None) -> TrafficDay:
    """Read a Station 5-Minute file; each 5-minute Total Flow is spread evenly over its ten
    30-second epochs (integer split, the remainder to the first epochs). A missing or skipped
    5-minute row leaves its ten epochs ``CELL_MISSING``; a run of Total Flow 0 with Avg
    Occupancy 0 is a dead detector as in :func:`read_station_raw`. ``day`` keeps the rows
    starting in that local day (the others are skipped as ``other_day``)."""
    quality = QualityReport(source=str(path))
    starts: dict[tuple[int, int], tuple[int, bool]] = {}
    for row in csv.reader(_text_io(path)):
        quality.rows_read += 1
        reason = _five_min_row(row, starts)
        if reason:
            quality.skipped[reason] += 1
    n = len(starts)
    first = np.fromiter((k[0] for k in starts), np.int64, n)
    station = np.fromiter((k[1] for k in starts), np.int64, n)
    total = np.fromiter((v[0] for v in starts.values()), np.int64, n)
    zero = np.fromiter((v[1] for v in starts.values()), bool, n)
    # one row -> ten cells
    epoch = (first[:, None] + np.arange(10)).ravel()
    base, extra = np.divmod(total, 10)
    flows = (base[:, None] + (np.arange(10) < extra[:, None])).ravel()
    rows = _Rows(order=np.arange(10 * n, dtype=np.int64), ep0=epoch, ep1=epoch, station=np.repeat(station, 10),
                 total=flows, bits=np.zeros(10 * n, np.uint8), n_stuck=np.zeros(10 * n, np.int64),
                 n_spike=np.zeros(10 * n, np.int64), n_oor=np.zeros(10 * n, np.int64), zero=np.repeat(zero, 10))
    if day is not None:  # a row belongs to the day its interval starts in
        lo, hi = day_epochs(day)
        inside = np.repeat((first >= lo) & (first < hi), 10)
        quality.days_in_file = [d.isoformat() for d in _local_days(first)]
        n_out = int((~inside).sum()) // 10
        if n_out:
            quality.skipped["other_day"] += n_out
        rows = _Rows(*(getattr(rows, k)[inside] for k in _Rows.__dataclass_fields__))
        epoch = epoch[inside]
        held = quality.days_in_file
        out = _grid(rows, epoch, quality, None, dead_run_epochs)
        quality.days_in_file, quality.day_selected = held, day.isoformat()
        if out.epochs.size:  # the whole local day on the grid
            out = _regrid(out, lo, hi)
    else:
        out = _grid(rows, epoch, quality, None, dead_run_epochs)
        quality.days_in_file = [d.isoformat() for d in _local_days(first)]
    quality.rows_used = n - quality.skipped["other_day"]
    return out


def _regrid(day: TrafficDay, lo: int, hi: int) -> TrafficDay:
    """The same day on the epochs ``[lo, hi)`` (new cells missing, cells outside dropped)."""
    epochs = np.arange(lo, hi, dtype=np.int64)
    flows = np.zeros((epochs.size, day.stations.size), np.int64)
    flags = np.full((epochs.size, day.stations.size), CELL_MISSING, np.uint8)
    src = (day.epochs >= lo) & (day.epochs < hi)
    flows[day.epochs[src] - lo] = day.flows[src]
    flags[day.epochs[src] - lo] = day.flags[src]
    _count_cells(flags, day.quality)
    return TrafficDay(day.stations, epochs, flows, flags, day.quality, day.meta)


def _five_min_row(row: list[str], starts: dict[tuple[int, int], tuple[int, bool]]) -> str | None:
    if not row or all(not c.strip() for c in row):
        return "blank_line"
    if len(row) < 12:
        return "bad_field_count"
    try:
        ts = _parse_ts(row[0])
        station = int(row[1])
    except ValueError:
        return "bad_timestamp_or_station"
    try:
        total = _num(row[9])
        if total is None:  # fall back to the lane flows
            lane_flows = [_num(row[13 + 5 * k]) for k in range((len(row) - 12) // 5)]
            known = [f for f in lane_flows if f is not None]
            if not known:
                return "empty_row"
            total = float(sum(known))
    except ValueError:
        return "bad_number"
    if not math.isfinite(total):
        return "bad_number"
    if total < 0:
        return "out_of_range"
    first = epoch_of(ts)
    if (first, station) in starts:
        return "duplicate_epoch"
    try:
        occ = _num(row[10])
    except ValueError:
        occ = None
    starts[(first, station)] = (int(round(total)), total == 0 and occ == 0)
    return None


def _num(text: str) -> float | None:
    t = text.strip()
    return None if t == "" else float(t)


# ---------------------------------------------------------------------------------------
# Cache: a parsed day as npz + JSON, keyed by the file's identity and the reader arguments
# ---------------------------------------------------------------------------------------
def load_cached(path: str | Path, cache_dir: str | Path, *, five_minute: bool = False,
                **reader_args: Any) -> TrafficDay:
    """:func:`read_station_raw` (or :func:`read_station_5min`) through a cache in ``cache_dir``.

    The key is the source's absolute path, size and mtime_ns, the reader and its arguments,
    and :data:`CACHE_FORMAT_VERSION`: a changed file (or other arguments) is parsed again. The
    entry holds stations, epochs, flows, flags (npz, uncompressed) and the quality report
    (JSON); metadata is not cached (attach it after loading).
    """
    src = Path(path).absolute()
    st = src.stat()
    args = {k: (v.isoformat() if isinstance(v, date) else v) for k, v in sorted(reader_args.items())}
    ident = json.dumps({"path": str(src), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "args": args,
                        "reader": "5min" if five_minute else "raw", "version": CACHE_FORMAT_VERSION},
                       sort_keys=True)
    key = hashlib.sha256(ident.encode()).hexdigest()[:24]
    folder = Path(cache_dir)
    npz, meta = folder / f"{src.name}.{key}.npz", folder / f"{src.name}.{key}.json"
    if npz.exists() and meta.exists():
        try:
            info = json.loads(meta.read_text())
            if info.get("ident") == ident:
                with np.load(npz, allow_pickle=False) as z:
                    return TrafficDay(z["stations"], z["epochs"], z["flows"], z["flags"],
                                      QualityReport.from_json(info["quality"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged entry is parsed again and rewritten
    day = read_station_5min(src, **reader_args) if five_minute else read_station_raw(src, **reader_args)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{npz.name}.{os.getpid()}.tmp"
    with tmp.open("wb") as fh:
        np.savez(fh, stations=day.stations, epochs=day.epochs, flows=day.flows, flags=day.flags)
    os.replace(tmp, npz)
    tmp.write_text(json.dumps({"ident": ident, "quality": day.quality.to_json()}))
    os.replace(tmp, meta)
    return day


# ---------------------------------------------------------------------------------------
# Station metadata
# ---------------------------------------------------------------------------------------
def read_metadata(path: str | Path) -> tuple[dict[int, StationMeta], QualityReport]:
    """Read a station metadata file (tab-separated, one header row, 18 columns)."""
    quality = QualityReport(source=str(path))
    meta: dict[int, StationMeta] = {}
    with _text_io(path) as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader, None)
        if header is None:
            return meta, quality
        col = {name.strip().lower(): i for i, name in enumerate(header)}
        if "id" not in col:
            quality.skipped["no_id_column"] += 1
            return meta, quality
        for row in reader:
            quality.rows_read += 1
            entry = _meta_row(row, col)
            if isinstance(entry, str):
                quality.skipped[entry] += 1
                continue
            meta[entry.station] = entry
            quality.rows_used += 1
    return meta, quality


def _meta_row(row: list[str], col: dict[str, int]) -> StationMeta | str:
    if not row or all(not c.strip() for c in row):
        return "blank_line"

    def get(name: str) -> str:
        i = col.get(name)
        return row[i].strip() if i is not None and i < len(row) else ""

    try:
        station = int(get("id"))
    except ValueError:
        return "bad_station_id"

    def opt_float(name: str) -> float | None:
        try:
            return float(get(name)) if get(name) else None
        except ValueError:
            return None

    lanes_text = get("lanes")
    return StationMeta(
        station=station, freeway=get("fwy"), direction=get("dir"), district=get("district"),
        lane_type=get("type"), lanes=int(lanes_text) if lanes_text.isdigit() else None, name=get("name"),
        latitude=opt_float("latitude"), longitude=opt_float("longitude"),
    )
