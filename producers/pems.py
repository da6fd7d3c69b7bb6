"""Readers for Caltrans PeMS Station Raw (30 s), Station 5-Minute and station metadata files.

Real files are messy (docs/wire.md, "Input data, fleet and queries"): timestamps off the :00/:30 marks,
empty lanes and rows, stuck detectors, impossible spikes, dead detectors, missing rows, files
spanning more than one day, stations missing from metadata. Readers never crash on a bad row:
they skip or flag it and count why in a :class:`QualityReport`.

Ground truth per station and epoch = flow summed over the usable lanes, **only where**
:attr:`TrafficDay.has_truth`: every cell of the (epochs x stations) grid also carries a
bitmask in :attr:`TrafficDay.flags` (``CELL_*``). Missing is not zero: a cell without a
reading is ``CELL_MISSING`` (its flow is 0 only because the simulation needs a number).

Files are read by content, not by name: gzip, bz2, xz, zip (one member) or plain text.
The Station Raw reader is vectorized, with an exact per-row fallback to the row logic for
any line the fast path cannot handle, so every skip reason is counted as the row logic
counts it. A file streams through it: gzip is decompressed piece by piece in a read-ahead
thread while a pool of threads parses chunks of whole lines (numpy releases the GIL) --
bytes up to ``,`` found in one pass, decimals read eight bytes at a time -- and the rows are
placed on the grid chunk by chunk (a 3,220-station day, 9.3M rows: ~5 s on 2 cores, about
3x the time just to decompress it). :func:`load_cached` keeps a parsed day as npz + JSON.
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
import queue
import threading
import zipfile
import zlib
from collections import Counter, deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

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
CELL_DEAD = 2  # dead detector: 0/0 on every lane for >= dead_run_epochs while others have traffic,
#                or in every reading of a local day on which others had traffic (the night too)
CELL_STUCK_LANE = 4  # some lane was stuck (flow 0, occupancy >= .99, speed 0) and left out
CELL_SPIKE_LANE = 8  # some lane had an impossible flow and was left out
CELL_OUT_OF_RANGE_LANE = 16  # some lane had a negative flow or occupancy outside 0..1, left out
NO_TRUTH = CELL_MISSING | CELL_DEAD

CACHE_FORMAT_VERSION = 2  # 2: a station dead all day is dead at night too


def day_epochs(day: date) -> tuple[int, int]:
    """``[first, stop)`` epochs of a local (Pacific) calendar day: 2,880 epochs, or 2,760 /
    3,000 on the spring / autumn DST days.

    >>> a, b = day_epochs(date(2012, 11, 4)); b - a
    3000
    """
    nxt = day + timedelta(days=1)
    first = epoch_of(datetime(day.year, day.month, day.day, tzinfo=PACIFIC))
    return first, epoch_of(datetime(nxt.year, nxt.month, nxt.day, tzinfo=PACIFIC))


def _local_days(epochs: list[npt.NDArray[np.int64]]) -> list[date]:
    """The distinct local calendar days of absolute epochs (vectorized: one boundary per day)."""
    epochs = [e for e in epochs if e.size]
    if not epochs:
        return []
    lo, hi = min(int(e.min()) for e in epochs), max(int(e.max()) for e in epochs)
    d0 = epoch_start(lo).date()
    d1 = epoch_start(hi).date()
    days = [d0 + timedelta(days=k) for k in range((d1 - d0).days + 1)]
    bounds = np.array([day_epochs(d)[0] for d in days], dtype=np.int64)
    held = np.zeros(len(days), bool)
    for e in epochs:
        held[np.searchsorted(bounds, e, side="right") - 1] = True
    return [days[int(i)] for i in np.flatnonzero(held)]


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


_CHUNK_BYTES = 1 << 21  # decompressed bytes per parsed chunk (rounded down to whole lines)
_READ_BYTES = 1 << 18  # bytes per read from the file
_PAD = bytes(32)  # zero bytes after each chunk: fixed-width reads at a field stay inside the buffer
_GZIP_EOF = "Compressed file ended before the end-of-stream marker was reached"


def _pieces(path: str | Path) -> Iterator[bytes]:
    """The decompressed bytes of a file in pieces of at most :data:`_CHUNK_BYTES`, exactly
    what :func:`read_bytes` returns, with its errors. Plain and gzip files are streamed; bz2,
    xz and zip come from :func:`read_bytes` in one go."""
    p = Path(path)
    with p.open("rb") as fh:
        fmt = _sniff(fh.read(6))
        fh.seek(0)
        if fmt == "plain":
            while piece := fh.read(_CHUNK_BYTES):
                yield piece
            return
        if fmt == "gzip":
            try:
                yield from _gunzip(fh)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(_one_line(f"{p}: unreadable gzip file ({type(exc).__name__}: {exc})")) from None
            return
    yield read_bytes(p)


def _gzip_header_size(buf: bytes, final: bool) -> int | None:
    """Length of the gzip member header at the start of ``buf`` (checked as ``gzip.decompress``
    checks it); None when ``buf`` may end inside the header and more input follows."""
    if len(buf) < 2 and not final:
        return None
    if buf[:2] != b"\x1f\x8b":
        raise gzip.BadGzipFile(f"Not a gzipped file ({buf[:2]!r})")
    size: int | None = 10
    if len(buf) >= 10:
        if buf[2] != 8:
            raise gzip.BadGzipFile("Unknown compression method")
        flag = buf[3]
        if flag & gzip.FEXTRA:
            size = 12 + int.from_bytes(buf[10:12], "little") if len(buf) >= 12 else None
        for bit in (gzip.FNAME, gzip.FCOMMENT):
            if size is not None and flag & bit:
                end = buf.find(b"\x00", size)
                size = end + 1 if end >= 0 else None
        if size is not None and flag & gzip.FHCRC:
            size += 2
    if size is not None and size <= len(buf):
        return size
    if final:
        raise EOFError(_GZIP_EOF)
    return None


def _gunzip(fh: BinaryIO) -> Iterator[bytes]:
    """The members of a gzip file one after the other, checked like ``gzip.decompress``
    (header, CRC32 and length of every member, only zero padding between members), in
    pieces of at most :data:`_CHUNK_BYTES`. zlib releases the GIL while it inflates."""
    buf = fh.read(_READ_BYTES)
    member = 0
    while True:
        if member:  # after a member: zero padding, then the end of the file or another member
            buf = buf.lstrip(b"\x00")
            while not buf:
                more = fh.read(_READ_BYTES)
                if not more:
                    return
                buf = more.lstrip(b"\x00")
        while (size := _gzip_header_size(buf, final=False)) is None:
            more = fh.read(_READ_BYTES)
            if not more:
                _gzip_header_size(buf, final=True)  # raises
            buf += more
        member += 1
        buf = buf[size:]
        inflate = zlib.decompressobj(wbits=-zlib.MAX_WBITS)
        crc = length = 0
        full = False
        while not inflate.eof:
            if not buf and not full:  # (a full piece may leave output pending without input)
                buf = fh.read(_READ_BYTES)
                if not buf:
                    raise EOFError(_GZIP_EOF)
            out = inflate.decompress(buf, _CHUNK_BYTES)
            buf = inflate.unconsumed_tail
            full = len(out) == _CHUNK_BYTES
            if out:
                crc = zlib.crc32(out, crc)
                length += len(out)
                yield out
        buf = inflate.unused_data
        while len(buf) < 8:
            more = fh.read(_READ_BYTES)
            if not more:
                raise EOFError(_GZIP_EOF)
            buf += more
        if int.from_bytes(buf[:4], "little") != crc:
            raise gzip.BadGzipFile("CRC check failed")
        if int.from_bytes(buf[4:8], "little") != length & 0xFFFFFFFF:
            raise gzip.BadGzipFile("Incorrect length of data produced")
        buf = buf[8:]


_Chunk = tuple[bytes, int, int]  # (buffer, start, stop): whole lines, at least len(_PAD) bytes after stop


def _line_chunks(pieces: Iterable[bytes]) -> Iterator[_Chunk]:
    """Whole lines of the pieces, in file order: ``buffer[start:stop]`` ends with ``\n`` and
    at least :data:`_PAD` bytes follow it in ``buffer`` (reads of a fixed width past a field
    stay inside). The lines of a piece are a view of it, not copied; the lines that straddle
    two pieces (or close the file) are joined into a small chunk of their own, and a last
    line without ``\n`` gets one. ``\r\n`` line ends become ``\n`` (the row logic never saw
    that ``\r`` either)."""
    carry: list[memoryview] = []  # the start of a line that the next piece ends
    for piece in pieces:
        if b"\r" in piece:
            piece = piece.replace(b"\r\n", b"\n")
        view = memoryview(piece)
        for a in range(0, len(piece), _CHUNK_BYTES):  # (a piece of bz2 / xz / zip is the whole file)
            b = min(a + _CHUNK_BYTES, len(piece))
            first = piece.find(b"\n", a, b) + 1
            if first == 0:  # no line ends here: a longer line
                carry.append(view[a:b])
                continue
            if carry:
                yield _joined([*carry, view[a:first]])
                carry, a = [], first
            stop = max(a, piece.rfind(b"\n", a, min(b, max(0, len(piece) - len(_PAD)))) + 1)
            if stop > a:
                yield piece, a, stop
            carry = [view[stop:b]]
    tail = b"".join(carry)
    if tail:
        yield _joined([memoryview(tail if tail.endswith(b"\n") else tail + b"\n")])


def _joined(parts: list[memoryview]) -> _Chunk:
    chunk = b"".join([*parts, memoryview(_PAD)])
    if b"\r" in chunk:
        chunk = chunk.replace(b"\r\n", b"\n")
    return chunk, 0, len(chunk) - len(_PAD)


_T = TypeVar("_T")


def _ahead(items: Iterator[_T], depth: int = 3) -> Generator[_T, None, None]:
    """``items``, produced in a background thread up to ``depth`` ahead of the consumer: the
    file is read and decompressed (zlib, bz2 and lzma release the GIL) while the previous
    chunk is parsed. An exception in the thread is raised here; closing stops the thread."""
    box: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: int, value: Any) -> bool:
        while not stop.is_set():
            try:
                box.put((kind, value), timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put(0, item):
                    return
            put(1, None)
        except BaseException as exc:  # noqa: BLE001 -- handed to the consumer, raised there
            put(2, exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=run, name="pems-read-ahead", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = box.get()
            if kind == 1:
                return
            if kind == 2:
                raise value
            yield value
    finally:
        stop.set()
        worker.join()


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


@lru_cache(maxsize=1 << 12)
def _date_offsets(key: int) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
    """(days since 1970, UTC offsets in seconds of its 24 local hours at fold 0 and at fold 1)
    of a date given as the number YYYYMMDD; None if there is no such date."""
    try:
        d = date(key // 10000, key // 100 % 100, key % 100)
        days = (d - date(1970, 1, 1)).days
        hours = [_hour_offsets(days * 24 + h) for h in range(24)]
    except (ValueError, OverflowError):
        return None
    return days, tuple(h[0] for h in hours), tuple(h[1] for h in hours)


_HMS_DIGITS = np.uint64(0xFFFF00FFFF00FFFF)  # the digit bytes of "HH:MM:SS" read as a little-endian word
_HMS_COLONS, _HMS_COLON_BYTES = np.uint64(0x00003A00003A0000), np.uint64(0x0000FF0000FF0000)


def _chunk_stamps(win: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """:func:`_vector_stamps` of the 19-byte stamps starting at ``at`` in ``win`` (padded).
    A chunk mostly holds one date: then it is placed once, and only the times of day are
    read, eight bytes at a time; chunks with several dates go to :func:`_vector_stamps`."""
    words = np.ndarray((win.size - 7,), np.dtype("<u8"), buffer=win, strides=(1,))
    head, tail = words[at], words[at + 2]  # bytes 0-7 and 2-9: the date
    if not at.size or not (bool((head == head[0]).all()) and bool((tail == tail[0]).all())):
        stamps = np.lib.stride_tricks.as_strided(win, shape=(win.size - 18, 19), strides=(1, 1), writeable=False)
        return _vector_stamps(stamps[at])
    text = bytes(win[int(at[0]):int(at[0]) + 10])
    placed = None
    if text[2:3] == text[5:6] == b"/" and (text[:2] + text[3:5] + text[6:]).isdigit():
        placed = _date_offsets(int(text[6:] + text[:2] + text[3:5]))
    if placed is None:
        return np.zeros(at.size, np.int64), np.zeros(at.size, np.int64), np.zeros(at.size, bool)
    t = words[at + 11]  # "HH:MM:SS"
    ok = (t & _HMS_COLON_BYTES) == _HMS_COLONS
    x = t & _HMS_DIGITS
    ok &= (x & (_BF0 & _HMS_DIGITS)) == (_B30 & _HMS_DIGITS)
    ok &= ((x + (_B06 & _HMS_DIGITS)) & (_BF0 & _HMS_DIGITS)) == (_B30 & _HMS_DIGITS)
    x -= _B30 & _HMS_DIGITS  # digit values
    x = x * np.uint64(10) + (x >> np.uint64(8))  # bytes 0, 3, 6: hour, minute, second
    hms = [((x >> np.uint64(b)) & np.uint64(0xFF)).astype(np.int64) for b in (0, 24, 48)]
    ok &= (hms[0] < 24) & (hms[1] < 60) & (hms[2] < 60)
    hour = np.where(ok, hms[0], 0)
    local = placed[0] * 86400 + hour * 3600 + hms[1] * 60 + hms[2]
    return (local - np.take(placed[1], hour)) // EPOCH_S, (local - np.take(placed[2], hour)) // EPOCH_S, ok


_STAMP_TENS = [0, 3, 6, 8, 11, 14, 17]  # month, day, century, year, hour, minute, second


def _vector_stamps(m: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                                         npt.NDArray[np.bool_]]:
    """Epochs (fold 0 and fold 1) of ``MM/DD/YYYY HH:MM:SS`` stamps given as an (n, 19) byte
    matrix, and which stamps are valid: exactly what :func:`_stamp_epochs` gives. The few
    distinct dates of a chunk are placed once each (:func:`_date_offsets`).

    >>> stamps = np.frombuffer(b"11/04/2012 01:00:0502/30/2012 10:00:05", np.uint8).reshape(2, 19)
    >>> ep0, ep1, ok = _vector_stamps(stamps)
    >>> ok.tolist(), int(ep1[0] - ep0[0]) * EPOCH_S, int(ep0[0]) == _stamp_epochs("11/04/2012 01:00:05")[0]
    ([True, False], 3600, True)
    """
    n = m.shape[0]
    d = m - np.uint8(48)
    ok = (m[:, 2] == 47) & (m[:, 5] == 47) & (m[:, 10] == 32) & (m[:, 13] == 58) & (m[:, 16] == 58)
    ok &= np.all(d[:, _STAMP_TENS] <= 9, axis=1) & np.all(d[:, [t + 1 for t in _STAMP_TENS]] <= 9, axis=1)
    pairs = d[:, _STAMP_TENS].astype(np.int64) * 10 + d[:, [t + 1 for t in _STAMP_TENS]]
    month, mday, century, year, hour, minute, sec = pairs.T
    ok &= (hour < 24) & (minute < 60) & (sec < 60)
    key = np.where(ok, ((century * 100 + year) * 100 + month) * 100 + mday, 0)
    if n and (key == key[0]).all():
        dates, which = key[:1], np.zeros(n, np.intp)
    else:
        dates, which = np.unique(key, return_inverse=True)
    table = np.zeros((dates.size, 49), np.int64)  # days, 24 offsets at fold 0, 24 at fold 1
    valid = np.zeros(dates.size, bool)
    for i, k in enumerate(dates.tolist()):
        placed = _date_offsets(k)
        if placed is not None:
            valid[i] = True
            table[i] = (placed[0], *placed[1], *placed[2])
    ok &= valid[which]
    hour = np.where(ok, hour, 0)
    at = which * 49 + hour
    flat = table.ravel()
    local = flat[which * 49] * 86400 + hour * 3600 + minute * 60 + sec
    return (local - flat[at + 1]) // EPOCH_S, (local - flat[at + 25]) // EPOCH_S, ok


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
    n_stuck: npt.NDArray[np.uint8]
    n_spike: npt.NDArray[np.uint8]
    n_oor: npt.NDArray[np.uint8]
    zero: npt.NDArray[np.bool_]

    @staticmethod
    def concat(parts: list[_Rows]) -> _Rows:
        names = list(_Rows.__dataclass_fields__)
        if not parts:
            return _Rows(*(np.zeros(0, _ROW_DTYPES[n]) for n in names))
        if len(parts) == 1:
            return parts[0]
        return _Rows(*(np.concatenate([getattr(p, n) for p in parts]) for n in names))

    def take(self, which: npt.NDArray[Any]) -> _Rows:
        """The rows at ``which`` (indices or a mask)."""
        return _Rows(*(getattr(self, n)[which] for n in _Rows.__dataclass_fields__))


_ROW_DTYPES: dict[str, type[Any]] = {"bits": np.uint8, "n_stuck": np.uint8, "n_spike": np.uint8, "n_oor": np.uint8,
                                     "zero": np.bool_, **{n: np.int64 for n in ("order", "ep0", "ep1", "station",
                                                                                "total")}}


_FAST_BYTES = np.zeros(256, dtype=bool)  # the fast path's alphabet; without all of it every line takes the row logic
_FAST_BYTES[list(b"0123456789,./:")] = True
_FAST_ALPHABET = list(b"0123456789,./:")
_POW10 = 10.0 ** np.arange(32)
_SHAPE = np.array([32] + [44] * 25 + [10], np.uint8)  # the bytes <= b"," of a reading: space, 25 commas, \n


class _Scratch:
    """Buffers reused from chunk to chunk, by name: fresh temporaries of every chunk would be
    fresh memory each time, and page faults would cost as much as the parsing."""

    def __init__(self) -> None:
        self._bufs: dict[str, npt.NDArray[Any]] = {}

    def get(self, name: str, n: int, dtype: type[Any]) -> npt.NDArray[Any]:
        buf = self._bufs.get(name)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = self._bufs[name] = np.empty(n + n // 4, dtype)
        return buf[:n]


def _bytes8(b: int) -> np.uint64:
    return np.uint64(b * 0x0101010101010101)


_LOW = np.array([(1 << 8 * k) - 1 for k in range(9)], np.uint64)  # the k low bytes of a word
_B80, _B7F, _BF0, _B0F, _B30, _B06, _B2E = (_bytes8(b) for b in (0x80, 0x7F, 0xF0, 0x0F, 0x30, 0x06, 0x2E))
_PAIRS, _FOURS, _EIGHTS = np.uint64(0x00FF00FF00FF00FF), np.uint64(0x0000FFFF0000FFFF), np.uint64(0xFFFFFFFF)
_U1, _U3, _U7, _U8, _U16, _U32 = (np.uint64(k) for k in (1, 3, 7, 8, 16, 32))
_INNER_DOTS = np.uint64(0x8080808080808000)  # bit 7 of every byte but the first


def _short_decimals(u: npt.NDArray[np.uint64], n: npt.NDArray[np.uint8], ws: _Scratch | None = None
                    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """:func:`_decimals` for texts of 1 to 8 characters, eight bytes at a time (SWAR): ``u``
    holds the 8 bytes from each text's start (little endian; overwritten), ``n`` its length.
    Digits and at most one dot, at least one digit. The bytes become digit values (a leading
    dot a 0), are joined into one integer by pairs, fours and eights, and divided by the
    power of ten that puts the dot back: exact integer over exact power of ten, so the value
    is ``float(text)``. A dot further in ("31.5") is taken out first, for those texts alone.
    Every operation is in place on ``ws`` buffers (the results too: use them before the next
    call).

    >>> texts = [b"7", b"65", b".0124", b"3.", b"31.5", b"12345678", b"1..2", b"6O", b"."]
    >>> u = np.array([int.from_bytes(t.ljust(8, b"\\0"), "little") for t in texts], np.uint64)
    >>> v, ok, dot = _short_decimals(u, np.array([len(t) for t in texts], np.uint8))
    >>> v[ok].tolist(), ok.tolist()[6:], dot[:5].tolist()
    ([7.0, 65.0, 0.0124, 3.0, 31.5, 12345678.0], [False, False, False], [False, False, True, True, True])
    """
    ws = ws if ws is not None else _Scratch()
    m = u.size
    x = u
    low = np.take(_LOW, n, out=ws.get("sd_low", m, np.uint64), mode="clip")
    a = ws.get("sd_a", m, np.uint64)
    b = ws.get("sd_b", m, np.uint64)
    c = ws.get("sd_c", m, np.uint64)
    x &= low
    np.bitwise_and(x, _BF0, out=a)
    np.bitwise_and(low, _B30, out=b)
    a ^= b
    np.bitwise_and(a, _B7F, out=b)
    b += _B7F
    b |= a  # bit 7 of a byte: its high nibble is not 3
    np.bitwise_and(x, _B0F, out=a)
    a += _B06
    a <<= _U3
    b |= a  # bit 7: or its low nibble is over 9
    low &= _B80  # bit 7 of every byte of the text
    b &= low  # bit 7: a byte of the text that is not a digit
    np.bitwise_xor(x, _B2E, out=a)
    np.bitwise_and(a, _B7F, out=c)
    c += _B7F
    c |= a
    np.bitwise_not(c, out=c)
    c &= low  # bit 7: a dot
    np.bitwise_not(c, out=a)
    b &= a  # bit 7: neither digit nor dot
    n_dot = np.bitwise_count(c, out=ws.get("sd_ndot", m, np.uint8))
    ok = np.equal(b, 0, out=ws.get("sd_ok", m, np.bool_))
    ok &= n_dot <= 1
    ok &= n_dot < n
    inner = np.flatnonzero(np.bitwise_and(c, _INNER_DOTS, out=a))  # a dot after the first byte ("31.5", "3.")
    dotted = _inner_dot_values(x[inner], n[inner]) if inner.size else None
    # the dot read as a 0 ("." ^ 0x1E == "0"), then "0" taken from every byte: digit values
    np.right_shift(c, _U7, out=a)
    a *= np.uint64(0x1E)
    x ^= a
    np.right_shift(low, _U7, out=b)
    b *= np.uint64(0x30)
    x -= b
    _join_digits(x, a)  # the digits followed by 8 - n zeros
    # no dot: x / 10^(8 - n); a dot first (".0124", every PeMS occupancy): x / 10^(8 - n + n - 1)
    e = np.subtract(n, 1, out=ws.get("sd_e", m, np.uint8))
    e *= n_dot
    e += 8
    e -= n
    val = ws.get("sd_val", m, np.float64)
    np.copyto(val, x, casting="unsafe")
    val /= np.take(_POW10, e, out=ws.get("sd_pow", m, np.float64), mode="clip")
    if dotted is not None:
        val[inner] = dotted
    return val, ok, np.greater(n_dot, 0, out=ws.get("sd_dot", m, np.bool_))


def _join_digits(x: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    """Eight digit values (the first in the low byte) joined in place into their number, by
    pairs, fours and eights."""
    for step, keep, shift in ((10, _PAIRS, _U8), (100, _FOURS, _U16), (10000, _EIGHTS, _U32)):
        np.right_shift(x, shift, out=scratch)
        x *= np.uint64(step)
        x += scratch
        x &= keep


def _inner_dot_values(x: npt.NDArray[np.uint64], n: npt.NDArray[np.uint8]) -> npt.NDArray[np.float64]:
    """:func:`_short_decimals` values of texts (``x``: their bytes, masked to ``n``) whose
    dot is not the first byte: the dot taken out, the digits joined, divided by 10^(8 - dot)."""
    found = ~(((((x ^ _B2E) & _B7F) + _B7F) | (x ^ _B2E)) & _B80) & _B80 & np.take(_LOW, n, mode="clip")
    at = np.minimum(np.bitwise_count((found - _U1) & ~found) >> np.uint8(3), n)  # the first dot's byte
    below = np.take(_LOW, at, mode="clip")
    x = (x & below) | ((x >> _U8) & ~below)
    x -= _B30 & np.take(_LOW, n - 1, mode="clip")
    _join_digits(x, np.empty_like(x))
    out: npt.NDArray[np.float64] = x.astype(np.float64) / np.take(_POW10, 8 - at, mode="clip")
    return out


def _decimals(win: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
              ws: _Scratch | None = None
              ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Parse plain decimals (``12``, ``.0278``, ``3.``) at ``starts`` of ``win`` (a buffer
    padded by at least 8 bytes): (values, ok, has a dot). ``ok`` is False where the text is
    anything else (sign, exponent, letters, two dots, no digit, more than 15 characters) --
    those rows go to the exact row logic. An exact integer over an exact power of ten is
    correctly rounded, so the values equal ``float(text)``. Texts of up to 8 characters (all
    of them in PeMS files) are read 8 bytes at a time (:func:`_short_decimals`)."""
    ws = ws if ws is not None else _Scratch()
    words = np.ndarray((win.size - 7,), np.dtype("<u8"), buffer=win, strides=(1,))
    short = lengths <= 8
    if short.all():
        # (fancy indexing: np.take would first copy all of an unaligned ``words`` to align it)
        return _short_decimals(words[starts], lengths.astype(np.uint8), ws)
    val, ok, dot = np.zeros(starts.size), np.zeros(starts.size, bool), np.zeros(starts.size, bool)
    val[short], ok[short], dot[short] = (np.copy(r) for r in _short_decimals(
        words[starts[short]], lengths[short].astype(np.uint8), ws))
    val[~short], ok[~short], dot[~short] = _long_decimals(win, starts[~short], lengths[~short])
    return val, ok, dot


def _long_decimals(win: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """:func:`_decimals` one character position at a time (any length; over 15: not ok)."""
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


def _line_word(lanes: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
    """A contiguous (k, 8) boolean array as one 8-byte word per line: != 0 is any, the popcount
    the number of True lanes."""
    out: npt.NDArray[np.uint64] = lanes.view(np.uint64).reshape(-1)
    return out


def _fast_chunk(win: npt.NDArray[np.uint8], n: int, spike_per_lane: int, skipped: Counter[str], fast: bool,
                ws: _Scratch) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], _Rows, npt.NDArray[np.int64]]:
    """Vectorized parse of a chunk of whole lines (``win[:n]``, padded; :func:`_line_chunks`):
    the lines' starts and ends, the usable rows (``order`` = line in the chunk << 16) and the
    lines left to the row logic. Empty rows are counted in ``skipped``.

    A line is a reading when its bytes up to ``,`` (found in one pass) are one space, 25
    commas and the newline, its stamp is 19 characters and every field that is read is a
    plain decimal; anything else (signs, exponents, quotes, stray spaces or ``\\r``, other
    field counts, bad stamps or numbers) goes to the row logic."""
    body = win[:n]
    pos = np.flatnonzero(np.less_equal(body, 44, out=ws.get("special", n, np.bool_)))
    kind = np.take(body, pos, out=ws.get("kind", pos.size, np.uint8))
    nl = np.flatnonzero(np.equal(kind, 10, out=ws.get("is_nl", pos.size, np.bool_)))
    ends = pos[nl]
    starts = np.zeros(ends.size, np.int64)
    starts[1:] = ends[:-1] + 1
    if not fast or not ends.size:
        return starts, ends, _Rows.concat([]), np.arange(ends.size)
    if pos.size == 27 * ends.size and bool(np.equal(kind.reshape(-1, 27), _SHAPE, out=ws.get(
            "shaped", pos.size, np.bool_).reshape(-1, 27)).all()):
        lines, flat = np.arange(ends.size), pos
    else:
        lines = np.flatnonzero(np.diff(nl, prepend=-1) == 27)
        idx = (nl[lines] - 26)[:, None] + np.arange(27)
        shaped = np.all(kind[idx] == _SHAPE, axis=1)
        lines, flat = lines[shaped], pos[idx[shaped]].reshape(-1)
    k = lines.size
    at = flat.reshape(k, 27)
    ls = starts[lines]
    ok = (at[:, 0] == ls + 10) & (at[:, 1] == ls + 19)
    ep0, ep1, ts_ok = _chunk_stamps(win, ls)
    ok &= ts_ok
    # field c (1..25) of a line lies between its c-th and (c+1)-th byte <= ",": the station
    # (c = 1), then flow, occupancy and speed of lane l (c = 2 + 3l, 3 + 3l, 4 + 3l)
    size = ws.get("size", 27 * k, np.int64)
    np.subtract(flat[1:], flat[:-1], out=size[:-1])
    size -= 1
    size[0::27] = 0  # the time of day
    size[26::27] = 0  # the date of the next line
    filled = np.greater(size, 0, out=ws.get("filled", 27 * k, np.bool_))
    sel = np.flatnonzero(filled)
    first = np.take(flat, sel, out=ws.get("first", sel.size, np.int64))
    first += 1
    v, v_ok, v_dot = _decimals(win, first, np.take(size, sel, out=ws.get("len", sel.size, np.int64)), ws)
    val = ws.get("val", 27 * k, np.float64)
    val.fill(np.nan)
    val[sel] = v
    bad = ws.get("bad", 27 * k, np.bool_)
    bad.fill(False)
    bad[sel] = ~v_ok
    dot = ws.get("dot", 27 * k, np.bool_)
    dot.fill(False)
    dot[sel] = v_dot
    val2, bad2, filled2 = val.reshape(k, 27), bad.reshape(k, 27), filled.reshape(k, 27)
    flow, occ, speed = val2[:, 2:26:3], val2[:, 3:26:3], val2[:, 4:26:3]
    ok &= filled2[:, 1] & ~bad2[:, 1] & ~dot.reshape(k, 27)[:, 1]  # an empty or "31.5" id: bad_station_id
    # per lane, (k, 8) booleans, one 8-byte word per line (any / count over a line's lanes)
    present, oor, stuck, spike, flagged, t = (ws.get(f"lanes{i}", 8 * k, np.bool_).reshape(k, 8) for i in range(6))
    np.copyto(present, filled2[:, 2:26:3])
    np.logical_or(bad2[:, 3:26:3], bad2[:, 4:26:3], out=t)
    t &= present  # occupancy / speed of an absent lane (empty flow) are never read
    t |= bad2[:, 2:26:3]
    ok &= _line_word(t) == 0
    with np.errstate(invalid="ignore"):  # NaN (empty) compares False. No signs here: nothing is negative
        np.greater(occ, 1, out=oor)
        oor &= present
        np.equal(flow, 0, out=stuck)
        stuck &= np.greater_equal(occ, 0.99, out=t)
        stuck &= np.equal(speed, 0, out=t)
        stuck &= present
        stuck &= np.logical_not(oor, out=t)
        np.greater(flow, spike_per_lane, out=spike)
        spike &= t
        spike &= np.logical_not(stuck, out=t)
        spike &= present
        np.logical_or(oor, stuck, out=flagged)
        flagged |= spike
        used = ws.get("used", 8 * k, np.float64).reshape(k, 8)
        used.fill(0.0)
        np.copyto(used, flow, where=np.logical_and(present, np.logical_not(flagged, out=t), out=t))
        np.rint(used, out=used)
        total = np.einsum("ij->i", used).astype(np.int64)
        np.equal(flow, 0, out=t)
        t &= occ == 0
    zero = _line_word(np.logical_and(present, np.logical_not(t, out=t), out=t)) == 0  # every lane read 0/0
    empty = ok & (_line_word(present) == 0)
    if empty.any():
        skipped["empty_row"] += int(empty.sum())
    keep = ok & ~empty
    to_rows = np.ones(ends.size, bool)
    to_rows[lines[ok]] = False
    counts = {}
    if bool(_line_word(flagged).any()):
        counts = {name: np.bitwise_count(_line_word(lane)) for name, lane in
                  (("stuck", stuck), ("spike", spike), ("oor", oor))}
    none = np.zeros(k, np.uint8)
    n_stuck, n_spike, n_oor = (counts.get(name, none) for name in ("stuck", "spike", "oor"))
    bits = (((n_stuck > 0) * CELL_STUCK_LANE) | ((n_spike > 0) * CELL_SPIKE_LANE)
            | ((n_oor > 0) * CELL_OUT_OF_RANGE_LANE)).astype(np.uint8)
    rk: slice | npt.NDArray[np.bool_] = slice(None) if keep.all() else keep
    rows = _Rows(order=lines[rk] << 16, ep0=ep0[rk], ep1=ep1[rk], station=val2[rk, 1].astype(np.int64),
                 total=total[rk], bits=bits[rk], n_stuck=n_stuck[rk], n_spike=n_spike[rk], n_oor=n_oor[rk],
                 zero=zero[rk])
    return starts, ends, rows, np.flatnonzero(to_rows)


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
                 n_stuck=np.array(cols[6], np.uint8), n_spike=np.array(cols[7], np.uint8),
                 n_oor=np.array(cols[8], np.uint8), zero=np.array(cols[9], bool))


_WORKERS = max(1, min(4, os.cpu_count() or 1))  # threads parsing chunks (numpy releases the GIL in its loops)


def _parse_raw(chunks: Iterable[_Chunk], spike_per_lane: int, quality: QualityReport,
               workers: int | None = None) -> list[_Rows]:
    """Every line of the chunks (:func:`_line_chunks`): the fast path, then the row logic for
    the lines it leaves. The rows of each chunk, in file order: ``order`` is (chunk << 24 |
    line in the chunk) << 16 | row within the line. Chunks are parsed by ``workers`` threads,
    up to two each ahead, and collected in file order."""
    fast = bool(_FAST_BYTES[_FAST_ALPHABET].all())
    workers = _WORKERS if workers is None else workers
    local = threading.local()

    def parse(chunk: _Chunk, line0: int) -> tuple[_Rows, QualityReport]:
        if not hasattr(local, "ws"):
            local.ws = _Scratch()
        q = QualityReport(source=quality.source)
        buf, start, stop = chunk
        win = np.frombuffer(buf, np.uint8)[start:]
        starts, ends, rows, slow = _fast_chunk(win, stop - start, spike_per_lane, q.skipped, fast, local.ws)
        rows.order += line0 << 16
        q.rows_read += int(starts.size - slow.size)
        if slow.size:
            rows = _Rows.concat([rows, _slow_lines(buf[start:stop], starts, ends, slow, line0, spike_per_lane, q)])
        return rows, q

    parts: list[_Rows] = []

    def collect(got: tuple[_Rows, QualityReport]) -> None:
        parts.append(got[0])
        quality.rows_read += got[1].rows_read
        quality.skipped.update(got[1].skipped)

    line_bits = max(24, _CHUNK_BYTES.bit_length() + 1)  # more than the lines of a chunk
    if workers <= 1:
        for i, chunk in enumerate(chunks):
            collect(parse(chunk, i << line_bits))
        return parts
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pems-parse") as pool:
        pending: deque[Future[tuple[_Rows, QualityReport]]] = deque()
        try:
            for i, chunk in enumerate(chunks):
                pending.append(pool.submit(parse, chunk, i << line_bits))
                if len(pending) > 2 * workers:
                    collect(pending.popleft().result())
            while pending:
                collect(pending.popleft().result())
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    return parts


# ---------------------------------------------------------------------------------------
# Rows -> grid: duplicates, the repeated DST hour, day selection, missing and dead cells
# ---------------------------------------------------------------------------------------
_MAX_KEY_CELLS = 1 << 25  # epochs x stations of the one-scatter duplicate check; a longer span sorts


def _place(parts: list[_Rows], quality: QualityReport, fold_repeats: bool
           ) -> tuple[list[_Rows], list[npt.NDArray[np.int64]]]:
    """Keep the first reading of a station in an epoch; a second reading of an ambiguous
    (repeated autumn hour) stamp is the later, standard-time one; others are duplicates.
    ``parts``: rows in file order; the kept rows come back in parts, with their epochs.

    One scatter over a (fold-0 epoch x station) key finds the cells with one reading (all
    of them in a clean file): those rows are kept as they are. Only the rows of cells read
    more than once are sorted (:func:`_place_sorted`), and come first: where a fold-1 reading
    lands on the cell of another reading, the other one wins, as in the sorted order."""
    parts = [p for p in parts if p.order.size]
    if not parts:
        return [], []
    stations, cols = _station_columns([p.station for p in parts])
    lo = min(int(p.ep0.min()) for p in parts)
    cells = (max(int(p.ep0.max()) for p in parts) - lo + 1) * stations.size
    n = sum(p.order.size for p in parts)
    if cells > _MAX_KEY_CELLS or n >= 1 << 31:
        kept, epoch = _place_sorted(_Rows.concat(parts), quality, fold_repeats)
        return [kept], [epoch]
    last = np.empty(cells, np.int32)  # only the cells written here are read
    keys, first = [], 0
    for p, col in zip(parts, cols, strict=True):
        key = p.ep0 - lo
        key *= stations.size
        key += col
        last[key] = np.arange(first, first + key.size, dtype=np.int32)
        keys.append(key)
        first += key.size
    several: npt.NDArray[np.bool_] | None = None
    first = 0
    for key in keys:
        shared = last[key] != np.arange(first, first + key.size, dtype=np.int32)
        if shared.any():
            if several is None:
                several = np.zeros(cells, bool)
            several[key[shared]] = True
        first += key.size
    if several is None:
        return parts, [p.ep0 for p in parts]
    dup = [several[key] for key in keys]
    kept, epoch = _place_sorted(_Rows.concat([p.take(d) for p, d in zip(parts, dup, strict=True)]), quality,
                                fold_repeats)
    rest = [p.take(~d) for p, d in zip(parts, dup, strict=True)]
    return [kept, *rest], [epoch, *(r.ep0 for r in rest)]


def _place_sorted(rows: _Rows, quality: QualityReport, fold_repeats: bool) -> tuple[_Rows, npt.NDArray[np.int64]]:
    """:func:`_place` by sorting every row by (station, fold-0 epoch, file order)."""
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
    return rows.take(sel), epoch


def _station_columns(station: list[npt.NDArray[np.int64]]) -> tuple[npt.NDArray[np.int64], list[npt.NDArray[np.intp]]]:
    """The distinct stations (sorted) of the parts, and each part's column in them:
    ``np.unique(..., return_inverse=True)`` without sorting the rows (a table over the range
    of the ids when it is below 4 M)."""
    lo = min(int(s.min()) for s in station)
    hi = max(int(s.max()) for s in station)
    if hi - lo >= 1 << 22:
        stations, col = np.unique(np.concatenate(station), return_inverse=True)
        return stations, np.split(col, np.cumsum([s.size for s in station])[:-1])
    seen = np.zeros(hi - lo + 1, bool)
    for s in station:
        seen[s - lo] = True
    index = np.cumsum(seen, dtype=np.intp)
    index -= 1
    return np.flatnonzero(seen) + lo, [index[s - lo] for s in station]


def _grid(parts: list[_Rows], epochs_of: list[npt.NDArray[np.int64]], quality: QualityReport, day: date | None,
          dead_run_epochs: int) -> TrafficDay:
    """The (epochs x stations) grid of the kept rows (in parts, with their epochs): later rows
    win a shared cell."""
    quality.days_in_file = [d.isoformat() for d in _local_days(epochs_of)]
    if day is not None:
        quality.day_selected = day.isoformat()
        first, stop = day_epochs(day)
        for i, epoch in enumerate(epochs_of):
            inside = (epoch >= first) & (epoch < stop)
            n_out = int(inside.size - np.count_nonzero(inside))
            if n_out:
                quality.skipped["other_day"] += n_out
                parts[i], epochs_of[i] = parts[i].take(inside), epoch[inside]
    quality.rows_used = sum(int(e.size) for e in epochs_of)
    for name, field_name in (("stuck", "n_stuck"), ("spike", "n_spike"), ("out_of_range", "n_oor")):
        n = sum(int(getattr(p, field_name).sum()) for p in parts)
        if n:
            quality.lanes_flagged[name] += n
    parts = [p for p in parts if p.order.size]
    epochs_of = [e for e in epochs_of if e.size]
    if not parts:
        return TrafficDay(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.int64),
                          np.zeros((0, 0), np.uint8), quality)
    if day is not None:
        epochs = np.arange(first, stop, dtype=np.int64)
    else:
        lo, hi = min(int(e.min()) for e in epochs_of), max(int(e.max()) for e in epochs_of)
        if hi - lo + 1 > MAX_SPAN_EPOCHS:
            raise ValueError(f"{quality.source}: readings span {(hi - lo + 1) * EPOCH_S / 86400:.0f} days "
                             f"({', '.join(quality.days_in_file[:3])} ... {quality.days_in_file[-1]}); "
                             "read one day at a time (day=...)")
        epochs = np.arange(lo, hi + 1, dtype=np.int64)
    stations, cols = _station_columns([p.station for p in parts])
    flows = np.zeros((epochs.size, stations.size), np.int64)
    flags = np.full((epochs.size, stations.size), CELL_MISSING, np.uint8)
    zero = np.zeros((epochs.size, stations.size), bool)
    for p, epoch, col in zip(parts, epochs_of, cols, strict=True):
        cell = epoch - epochs[0]
        cell *= stations.size
        cell += col
        flows.reshape(-1)[cell] = p.total
        flags.reshape(-1)[cell] = p.bits
        zero.reshape(-1)[cell] = p.zero
    dead = _dead_cells(flows, zero, dead_run_epochs)
    dead |= _dead_days(flows, zero, (flags & CELL_MISSING) == 0, epochs)
    flags[dead] |= CELL_DEAD
    _count_cells(flags, quality)
    return TrafficDay(stations.astype(np.int64), epochs, flows, flags, quality)


def _dead_cells(flows: npt.NDArray[np.int64], zero: npt.NDArray[np.bool_], run_epochs: int
                ) -> npt.NDArray[np.bool_]:
    """Cells of runs of >= ``run_epochs`` consecutive epochs in which a station read 0/0 on
    every lane while the other stations of the file had traffic (vectorized run lengths: the
    distance between the nearest cells before and after that are not in the run).

    >>> z = np.array([[1, 0], [1, 0], [1, 0], [0, 0]], bool); f = np.array([[0, 5], [0, 5], [0, 5], [2, 0]])
    >>> _dead_cells(f, z, 3)[:, 0].tolist()
    [True, True, True, False]
    """
    others = flows.sum(axis=1) > 0  # a zero-reading cell adds nothing to its epoch's total
    cand = zero & others[:, None]
    dead = np.zeros(cand.shape, bool)
    cols = np.flatnonzero(cand.any(axis=0))
    if cols.size:
        sub = cand[:, cols]
        t = np.arange(sub.shape[0], dtype=np.int32)[:, None]
        before = np.where(sub, np.int32(-1), t)
        np.maximum.accumulate(before, axis=0, out=before)
        after = np.where(sub, np.int32(sub.shape[0]), t)[::-1]
        after = np.minimum.accumulate(after, axis=0)[::-1]
        after -= before
        dead[:, cols] = sub & (after > max(1, run_epochs))  # run length = after - before - 1
    return dead


def _dead_days(flows: npt.NDArray[np.int64], zero: npt.NDArray[np.bool_], read: npt.NDArray[np.bool_],
               epochs: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Cells of stations that read 0/0 on every lane in every reading they have on a local day
    on which other stations carried traffic: dead for that whole day, its night included.

    :func:`_dead_cells` alone starts a dead run only where others have traffic, so on a small
    file whose stations all read 0 at night a detector dead all day would be a true 0 until the
    first vehicle elsewhere (and scored as one). A working station's quiet night is kept: it has
    traffic in some reading of the day. ``read``: the cells holding a reading.

    >>> f = np.array([[0, 0, 0], [0, 0, 0], [0, 4, 0]]); r = np.ones((3, 3), bool)
    >>> z = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 1]], bool); r[1, 2] = z[1, 2] = False
    >>> _dead_days(f, z, r, np.arange(3) + 44_000_000).astype(int).tolist()
    [[1, 0, 1], [1, 0, 0], [1, 0, 1]]
    """
    dead = np.zeros(zero.shape, bool)
    if not epochs.size:
        return dead
    starts = np.array([day_epochs(d)[0] for d in _local_days([epochs])], np.int64)
    bounds = [*np.searchsorted(epochs, starts).tolist()[1:], int(epochs.size)]
    a = 0
    for b in bounds:
        if b > a and bool(flows[a:b].any()):  # some station carried traffic that day
            z, r = zero[a:b], read[a:b]
            whole = r.any(axis=0) & ~(r & ~z).any(axis=0)  # read, and 0/0 wherever read
            dead[a:b] = z & whole
        a = b
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
    ``CELL_MISSING``; runs of >= ``dead_run_epochs`` 0/0 readings while the others have
    traffic, and every reading of a station that read 0/0 all local day while others had
    traffic that day (its night too), are ``CELL_DEAD`` -- flows there are 0 but not truth
    (:attr:`TrafficDay.has_truth`). A working station's 0 at night stays a true 0.
    """
    quality = QualityReport(source=str(path))
    chunks = _ahead(_line_chunks(_pieces(path)))
    try:
        parts = _parse_raw(chunks, spike_per_lane, quality)
    finally:
        chunks.close()  # stops the read-ahead thread when parsing failed
    kept, epochs_of = _place(parts, quality, fold_repeats=True)
    return _grid(kept, epochs_of, quality, day, dead_run_epochs)


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
                 total=flows, bits=np.zeros(10 * n, np.uint8), n_stuck=np.zeros(10 * n, np.uint8),
                 n_spike=np.zeros(10 * n, np.uint8), n_oor=np.zeros(10 * n, np.uint8), zero=np.repeat(zero, 10))
    if day is not None:  # a row belongs to the day its interval starts in
        lo, hi = day_epochs(day)
        inside = np.repeat((first >= lo) & (first < hi), 10)
        quality.days_in_file = [d.isoformat() for d in _local_days([first])]
        n_out = int((~inside).sum()) // 10
        if n_out:
            quality.skipped["other_day"] += n_out
        rows = rows.take(inside)
        epoch = epoch[inside]
        held = quality.days_in_file
        out = _grid([rows], [epoch], quality, None, dead_run_epochs)
        quality.days_in_file, quality.day_selected = held, day.isoformat()
        if out.epochs.size:  # the whole local day on the grid
            out = _regrid(out, lo, hi)
    else:
        out = _grid([rows], [epoch], quality, None, dead_run_epochs)
        quality.days_in_file = [d.isoformat() for d in _local_days([first])]
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
    # one temporary name per process and thread: two loads of one day at once (a replay thread
    # and the caller) must not rename each other's file away
    tmp = folder / f".{npz.name}.{os.getpid()}.{threading.get_ident()}.tmp"
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
