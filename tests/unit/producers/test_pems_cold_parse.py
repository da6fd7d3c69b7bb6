"""The Station Raw reader at scale (issue 8): the streamed, chunked, threaded fast path.

The cold parse reads a file in pieces (gzip streamed, in a read-ahead thread), cuts them
into chunks of whole lines (a view of each piece; lines straddling two pieces are joined),
parses the chunks in a thread pool (bytes <= ``,`` found in one pass, decimals eight bytes
at a time) and hands every line it cannot read to the row logic. Checked here, each
against an independent or exact reference:

* a file mixing readings with every kind of malformed row reads exactly as the row logic
  alone reads it (grid, flags and the whole quality report, skip reasons counted exactly),
  plain and gzip, with ``\\n`` and ``\\r\\n`` line ends, with and without a last newline;
* chunk and piece boundaries anywhere (down to one byte: every line straddles) and any
  number of parse threads change nothing;
* the gzip stream equals ``gzip.decompress`` (several members, zero padding, every header
  flag, reads cut inside headers and trailers) and fails where it fails, as a one-line
  ``ValueError``; a failing parse stops its threads;
* the pieces of the fast path against plain references: decimals against ``float``,
  stamps against ``datetime`` (both DST days), dead-detector runs against a loop, the
  one-scatter duplicate check against sorting every row.

Deterministic: every random input comes from a fixed seed.
"""

from __future__ import annotations

import gzip
import re
import threading
import zlib
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producers import pems
from producers.pems import QualityReport, TrafficDay, read_bytes, read_station_raw
from producers.synthetic import write_synthetic_day
from tests.unit.producers.test_pems import accounted, raw_line

SEED = 8


def _lane(rng: np.random.Generator) -> tuple[str, str, str]:
    flow = str(rng.choice([0, 1, 2, 3, 7, 12, 25, 39, 41, 60]))
    occ = str(rng.choice([".0124", ".05", "0", "1", ".995", ".99", "1.5", "0.2500", ""]))
    speed = str(rng.choice(["65", "0", "", "61.5"]))
    return flow, occ, speed


def _messy_lines(rng: np.random.Generator, n: int = 400) -> list[str]:
    """Readings of 12 stations over the autumn DST night (the repeated hour read twice) and
    the next morning, with every glitch the reader handles: off-mark stamps, absent lanes,
    stuck / spike / out-of-range lanes, decimals (long ones too), duplicates, empty rows,
    and malformed rows of every kind."""
    bad_rows = [
        "", "x,y", "\x00\x01garbage",
        raw_line("2012-11-04 10:00:05", 31, [("1", ".1", "60")]),
        raw_line("11/04/2012 25:00:05", 31, [("1", ".1", "60")]),
        raw_line("13/04/2012 10:00:05", 31, [("1", ".1", "60")]),
        raw_line("02/30/2012 10:00:05", 31, [("1", ".1", "60")]),
        raw_line("11/04/2012 10:0:05", 31, [("1", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", "S31", [("1", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", "31.5", [("1", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", "31.", [("1", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", "", [("1", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("x", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("1", "1..2", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("nan", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("1e3", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("-3", ".1", "60"), ("2", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("+4", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [(" 4", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("4", ".", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("", "garbage", "-1")]),  # an absent lane is never read
        raw_line("11/04/2012 10:00:05", 31, [('"5"', ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 31, [("1", ".1", "60")]) + ",",
        "11/04/2012 10:00:05,31",
        "11/04/2012 10:00:05",
        raw_line("11/04/2012 10:00:05", 32, []),
        raw_line("11/04/2012 10:00:05", 33, [("2.000000001", "0.000012345", "65.00000000001")]),
        raw_line("11/04/2012 10:00:05", 34, [("12345678901234567", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 99999999, [("3", ".1", "60")]),
        raw_line("11/04/2012 10:00:05", 123456789, [("3", ".1", "60")]),
    ]
    lines = list(bad_rows)  # every kind at least once, more at random
    for _ in range(n - len(bad_rows)):
        if rng.random() < 0.1:
            lines.append(str(rng.choice(bad_rows)))
            continue
        day, hour = (("11/04/2012", int(rng.integers(0, 3))) if rng.random() < 0.8
                     else ("11/05/2012", int(rng.integers(7, 9))))
        stamp = f"{day} {hour:02d}:{int(rng.integers(0, 60)):02d}:{int(rng.choice([0, 21, 30, 51])):02d}"
        lanes = [_lane(rng) for _ in range(int(rng.integers(0, 9)))]
        lines.append(raw_line(stamp, int(rng.integers(500, 512)), lanes))
    return [lines[i] for i in rng.permutation(len(lines))]


def _write(path: Path, lines: list[str], *, gz: bool = False, crlf: bool = False, last_newline: bool = True) -> Path:
    end = "\r\n" if crlf else "\n"
    data = (end.join(lines) + (end if last_newline else "")).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


def _same(a: TrafficDay, b: TrafficDay) -> None:
    for name in ("stations", "epochs", "flows", "flags"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert a.quality == b.quality


def _row_logic(path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> TrafficDay:
    """The reader with every line sent to the row logic (the fast path's alphabet emptied)."""
    with monkeypatch.context() as m:
        m.setattr(pems.fast, "FAST_BYTES", np.zeros(256, bool))
        return read_station_raw(path, **kw)


# ---------------------------------------------------------------------------------------
# The whole reader: fast path == row logic, whatever the chunks, threads and line ends
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("gz", "crlf", "last_newline"), [(False, False, True), (True, False, True),
                                                          (False, True, True), (True, True, False),
                                                          (False, False, False)])
def test_messy_file_reads_as_the_row_logic_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gz: bool,
                                                    crlf: bool, last_newline: bool) -> None:
    path = _write(tmp_path / "raw.dat", _messy_lines(np.random.default_rng(SEED)), gz=gz, crlf=crlf,
                  last_newline=last_newline)
    fast = read_station_raw(path)
    _same(fast, _row_logic(path, monkeypatch))
    q = fast.quality
    accounted(q)
    assert q.rows_read == 400  # every line is a row (a blank one too)
    # every kind of trouble happened, and is counted by its reason
    assert {"bad_timestamp", "bad_station_id", "bad_number", "bad_field_count", "blank_line", "empty_row",
            "duplicate_epoch"} <= set(q.skipped)
    assert {"stuck", "spike", "out_of_range"} <= set(q.lanes_flagged)
    # the repeated autumn hour: readings in both the PDT and the PST 01:xx
    assert fast.epochs.size > 2 * 120
    for day in (date(2012, 11, 4), date(2012, 11, 5)):
        _same(read_station_raw(path, day=day), _row_logic(path, monkeypatch, day=day))


@pytest.mark.parametrize("chunk", [1, 7, 64, 333, 4096])
@pytest.mark.parametrize("workers", [1, 3])
def test_chunk_boundaries_and_threads_change_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int,
                                                     workers: int) -> None:
    """Pieces (and chunks) of ``chunk`` bytes cut lines anywhere -- inside a stamp, a field,
    between ``\\r`` and ``\\n``; at 1 byte every line is joined from pieces."""
    lines = _messy_lines(np.random.default_rng(SEED + 1), 250)
    for gz, crlf in ((True, True), (False, False)):
        path = _write(tmp_path / f"raw{gz}{crlf}.dat", lines, gz=gz, crlf=crlf)
        reference = read_station_raw(path)
        with monkeypatch.context() as m:
            m.setattr(pems.streams, "CHUNK_BYTES", chunk)
            m.setattr(pems.streams, "READ_BYTES", max(1, chunk // 3))
            m.setattr(pems.raw, "WORKERS", workers)
            _same(read_station_raw(path), reference)


@pytest.mark.slow
def test_synthetic_day_in_small_chunks_and_threads_equals_row_logic(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sd = write_synthetic_day(tmp_path, n_stations=24, seed=SEED)
    with monkeypatch.context() as m:
        m.setattr(pems.streams, "CHUNK_BYTES", 50_000)  # about 40 chunks, 680 lines each
        m.setattr(pems.raw, "WORKERS", 3)
        fast = read_station_raw(sd.raw_path)
    _same(fast, _row_logic(sd.raw_path, monkeypatch))
    assert fast.quality.rows_read == read_bytes(sd.raw_path).count(b"\n")
    assert fast.quality.skipped.keys() == {"empty_row"}


def test_line_chunks_are_whole_lines_with_room_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """Joined, the chunks are the lines of the pieces (a last newline added, CRLF made LF),
    each chunk ends a line and has the padding after it inside its buffer."""
    rng = np.random.default_rng(SEED)
    text = b"".join(bytes(rng.integers(48, 58, int(rng.integers(0, 90)), np.uint8)) + rng.choice(
        [b"\n", b"\r\n", b"\r"]) for _ in range(300)) + b"tail without newline\r"
    for size in (1, 5, 40, 100, 10_000):
        monkeypatch.setattr(pems.streams, "CHUNK_BYTES", size)
        pieces = [text[i:i + 37] for i in range(0, len(text), 37)]
        chunks = list(pems.streams.line_chunks(pieces))
        assert b"".join(buf[a:b] for buf, a, b in chunks) == (text + b"\n").replace(b"\r\n", b"\n")
        for buf, a, b in chunks:
            assert b > a and buf[b - 1:b] == b"\n" and len(buf) - b >= len(pems.streams.PAD)


def test_the_knobs_reach_the_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above change the reader through module attributes (``fast.FAST_BYTES``,
    ``streams.CHUNK_BYTES``, ``raw.WORKERS``, ``grid.MAX_KEY_CELLS``); each must reach the
    read, else a "row logic" or "small chunks" comparison would compare the reader with itself
    and could not fail. Seen from a spy on the fast path: which lines it leaves to the row
    logic, how many chunks, in which threads; and whether the sorted placement ran."""
    path = _write(tmp_path / "raw.txt", [raw_line(f"01/23/2012 10:{m:02d}:05", s, [("3", ".1", "60")])
                                         for m in range(40) for s in (1, 2, 3)])
    real_chunk, real_sorted = pems.fast.fast_chunk, pems.grid._place_sorted
    seen: list[tuple[int, int, str]] = []  # (lines, lines left to the row logic, thread) per chunk
    sorted_calls = Counter[str]()

    def spy(*args: Any, **kw: Any) -> Any:
        out = real_chunk(*args, **kw)
        seen.append((out[0].size, out[3].size, threading.current_thread().name))
        return out

    def sorted_spy(*args: Any, **kw: Any) -> Any:
        sorted_calls["sorted"] += 1
        return real_sorted(*args, **kw)

    monkeypatch.setattr(pems.fast, "fast_chunk", spy)
    monkeypatch.setattr(pems.grid, "_place_sorted", sorted_spy)

    def read(**knobs: tuple[Any, str, Any]) -> list[tuple[int, int, str]]:
        seen.clear()
        sorted_calls.clear()
        with monkeypatch.context() as m:
            for module, name, value in knobs.values():
                m.setattr(module, name, value)
            read_station_raw(path)
        return list(seen)

    plain = read(workers=(pems.raw, "WORKERS", 1))
    assert sum(n for n, _, _ in plain) == 120 and sum(left for _, left, _ in plain) == 0  # clean: none left
    assert len(plain) <= 2 and not sorted_calls  # (the last line gets a chunk of its own: the padding)
    assert all(n == left for n, left, _ in read(alphabet=(pems.fast, "FAST_BYTES", np.zeros(256, bool))))
    assert len(read(chunk=(pems.streams, "CHUNK_BYTES", 500), workers=(pems.raw, "WORKERS", 1))) > 5
    threads = {name for _, _, name in read(chunk=(pems.streams, "CHUNK_BYTES", 500),
                                           workers=(pems.raw, "WORKERS", 3))}
    assert threads and all(name.startswith("pems-parse") for name in threads)
    read(cells=(pems.grid, "MAX_KEY_CELLS", 0))
    assert sorted_calls["sorted"] == 1


# ---------------------------------------------------------------------------------------
# The gzip stream
# ---------------------------------------------------------------------------------------
def _member(data: bytes, flags: int = 0) -> bytes:
    """A gzip member written by hand: header with the given flags (and their fields),
    raw deflate, CRC32 and length."""
    header = b"\x1f\x8b\x08" + bytes([flags]) + b"\x00\x00\x00\x00\x00\xff"
    if flags & gzip.FEXTRA:
        header += (6).to_bytes(2, "little") + b"ab\x02\x00xy"
    if flags & gzip.FNAME:
        header += b"d07_text_station_raw.txt\x00"
    if flags & gzip.FCOMMENT:
        header += b"a comment\x00"
    if flags & gzip.FHCRC:
        header += (zlib.crc32(header) & 0xFFFF).to_bytes(2, "little")
    deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    return header + body + zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(4, "little")


def test_gzip_stream_equals_one_shot_decompress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(SEED)
    parts = [("\n".join(_messy_lines(rng, 60)) + "\n").encode() for _ in range(4)]
    blob = (_member(parts[0]) + _member(parts[1], gzip.FEXTRA | gzip.FNAME | gzip.FCOMMENT | gzip.FHCRC)
            + b"\x00" * 5 + _member(b"") + _member(parts[2], gzip.FNAME) + _member(parts[3]) + b"\x00" * 3)
    assert gzip.decompress(blob) == b"".join(parts)
    path = tmp_path / "members.gz"
    path.write_bytes(blob)
    for chunk, read in ((1 << 21, 1 << 18), (100, 7), (3, 1)):
        monkeypatch.setattr(pems.streams, "CHUNK_BYTES", chunk)
        monkeypatch.setattr(pems.streams, "READ_BYTES", read)
        pieces = list(pems.streams.pieces(path))
        assert b"".join(pieces) == b"".join(parts) and max(map(len, pieces)) <= chunk
    day = read_station_raw(path)
    plain = _write(tmp_path / "plain.txt", [line for p in parts for line in p.decode().splitlines()])
    _same_but_source(day, read_station_raw(plain))


def _same_but_source(a: TrafficDay, b: TrafficDay) -> None:
    b.quality.source = a.quality.source
    _same(a, b)


@pytest.mark.parametrize("damage", ["truncated_body", "truncated_trailer", "truncated_header", "crc", "length",
                                    "trailing_garbage", "bad_method"])
def test_gzip_stream_fails_where_one_shot_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    data = ("\n".join(_messy_lines(np.random.default_rng(SEED), 200)) + "\n").encode()
    good = _member(data, gzip.FNAME)
    bad = {"truncated_body": good[:len(good) // 2], "truncated_trailer": good[:-3],
           "truncated_header": good[:14],
           "crc": good[:-8] + bytes([good[-8] ^ 1]) + good[-7:],
           "length": good[:-4] + bytes([good[-4] ^ 1]) + good[-3:],
           "trailing_garbage": good + b"\x00\x00PK garbage", "bad_method": good[:2] + b"\x07" + good[3:]}[damage]
    with pytest.raises((OSError, EOFError)):
        gzip.decompress(bad)
    path = tmp_path / "bad.gz"
    path.write_bytes(bad)
    for read in (1 << 18, 5):
        monkeypatch.setattr(pems.streams, "READ_BYTES", read)
        for reader in (read_bytes, read_station_raw):
            with pytest.raises(ValueError) as info:
                reader(path)
            msg = str(info.value)
            assert "bad.gz" in msg and "gzip" in msg and "\n" not in msg


def _pems_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pems-")]


def test_a_failing_parse_stops_its_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "raw.txt.gz", _messy_lines(np.random.default_rng(SEED), 300), gz=True)
    calls = Counter[str]()

    def boom(*args: Any, **kw: Any) -> Any:
        calls["chunk"] += 1
        if calls["chunk"] == 3:
            raise RuntimeError("parse failed")
        return real(*args, **kw)

    real = pems.fast.fast_chunk
    monkeypatch.setattr(pems.streams, "CHUNK_BYTES", 500)
    monkeypatch.setattr(pems.streams, "READ_BYTES", 100)
    monkeypatch.setattr(pems.fast, "fast_chunk", boom)
    for workers in (1, 2):
        monkeypatch.setattr(pems.raw, "WORKERS", workers)
        calls.clear()
        with pytest.raises(RuntimeError, match="parse failed"):
            read_station_raw(path)
        assert _pems_threads() == []


def test_a_failing_read_stops_its_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _member(("\n".join(_messy_lines(np.random.default_rng(SEED), 300)) + "\n").encode())
    path = tmp_path / "cut.gz"
    path.write_bytes(good[:len(good) * 2 // 3])
    monkeypatch.setattr(pems.streams, "CHUNK_BYTES", 500)
    with pytest.raises(ValueError, match="unreadable gzip"):
        read_station_raw(path)
    assert _pems_threads() == []


# ---------------------------------------------------------------------------------------
# The pieces of the fast path against plain references
# ---------------------------------------------------------------------------------------
def _is_plain_decimal(text: str) -> bool:
    return (0 < len(text) <= 15 and set(text) <= set("0123456789.") and text.count(".") <= 1
            and any(c.isdigit() for c in text))


def test_decimals_equal_float() -> None:
    rng = np.random.default_rng(SEED)
    alphabet = list("0123456789") * 3 + [".", ".", "/", ":", "a", "-", "e", "\x7f", "\xff"]
    texts = ["".join(rng.choice(alphabet, int(rng.integers(1, 18)))) for _ in range(20_000)]
    texts += [".0124", "0.0124", "12345678", "99999999.", ".00000001", "123456789012345", "1" * 16]
    raw = [t.encode("latin-1") for t in texts]
    buf = b"".join(r + b"," for r in raw) + bytes(32)
    starts = np.cumsum([0] + [len(r) + 1 for r in raw[:-1]])
    lengths = np.array([len(r) for r in raw])
    val, ok, dot = pems.decimals.decimals(np.frombuffer(buf, np.uint8), starts, lengths)
    expected = np.array([_is_plain_decimal(t) for t in texts])
    assert np.array_equal(ok, expected)
    assert [float(t) for t, e in zip(texts, expected, strict=True) if e] == val[ok].tolist()
    assert np.array_equal(dot[ok], np.array(["." in t for t, e in zip(texts, expected, strict=True) if e]))


def test_stamps_equal_datetime() -> None:
    """Single-date chunks (times read eight bytes at a time) and mixed ones: epochs (fold 0
    and 1) and validity as :func:`pems.stamps.stamp_epochs` (``datetime``) has them, on both DST
    days."""
    rng = np.random.default_rng(SEED)
    for day in ("11/04/2012", "03/11/2012", "01/23/2012", "02/29/2012", "02/30/2011", "00/10/2012"):
        stamps = [f"{day} {h:02d}:{m:02d}:{s:02d}" for h, m, s in zip(
            rng.integers(0, 26, 500), rng.integers(0, 62, 500), rng.integers(0, 62, 500), strict=True)]
        stamps += [day + " 1a:00:00", day + " 10-00:00", day + " 10:00:0/"]
        for mixed in (False, True):
            if mixed:
                stamps[::7] = ["11/05/2012 " + s[11:] for s in stamps[::7]]
            buf = ("".join(s + "," for s in stamps)).encode() + bytes(32)
            at = np.arange(len(stamps), dtype=np.int64) * 20
            ep0, ep1, ok = pems.stamps.chunk_stamps(np.frombuffer(buf, np.uint8), at)
            for i, s in enumerate(stamps):
                try:
                    want = pems.stamps.stamp_epochs(s)
                except ValueError:
                    assert not ok[i], s  # never accepts what the row logic rejects
                    continue
                if ok[i]:
                    assert (int(ep0[i]), int(ep1[i])) == want, s
                else:  # it may leave a stamp to the row logic, but never a well-formed one
                    assert re.fullmatch(r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d", s) is None, s


def _dead_reference(flows: np.ndarray, zero: np.ndarray, run: int) -> np.ndarray:
    others = flows.sum(axis=1) > 0
    dead = np.zeros(zero.shape, bool)
    for j in range(zero.shape[1]):
        i = 0
        while i < zero.shape[0]:
            if zero[i, j] and others[i]:
                k = i
                while k < zero.shape[0] and zero[k, j] and others[k]:
                    k += 1
                if k - i >= max(1, run):
                    dead[i:k, j] = True
                i = k
            else:
                i += 1
    return dead


@pytest.mark.parametrize("run", [0, 1, 3, 7])
def test_dead_cells_equal_a_loop(run: int) -> None:
    rng = np.random.default_rng(SEED + run)
    zero = rng.random((300, 9)) < 0.8
    flows = (rng.random((300, 9)) < 0.5) * (~zero) * 3
    flows[rng.random(300) < 0.1] = 0  # epochs without traffic anywhere break runs
    assert np.array_equal(pems.grid.dead_cells(flows, zero, run), _dead_reference(flows, zero, run))


def test_one_scatter_placement_equals_sorting_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Duplicates across chunks and the repeated DST hour: the scatter check (sorting only
    the cells read twice) gives what sorting every row gives."""
    lines = _messy_lines(np.random.default_rng(SEED + 2), 600)
    lines += lines[::5]  # duplicates far from their first reading
    path = _write(tmp_path / "raw.txt", lines)
    monkeypatch.setattr(pems.streams, "CHUNK_BYTES", 2000)
    scattered = read_station_raw(path)
    assert scattered.quality.skipped["duplicate_epoch"] > 100
    monkeypatch.setattr(pems.grid, "MAX_KEY_CELLS", 0)
    _same(scattered, read_station_raw(path))


def test_parse_raw_counts_every_line_once(tmp_path: Path) -> None:
    lines = _messy_lines(np.random.default_rng(SEED + 3), 300)
    path = _write(tmp_path / "raw.txt", lines)
    q = QualityReport(source="x")
    parts = pems.raw.parse_raw(pems.streams.line_chunks(pems.streams.pieces(path)), 40, q, workers=2)
    kept_rows = sum(p.order.size for p in parts)
    assert q.rows_read == kept_rows + q.rows_skipped == len(lines)
    order = [np.sort(p.order) for p in parts if p.order.size]
    assert np.unique(np.concatenate(order)).size == kept_rows  # one key per row
    assert all(a[-1] < b[0] for a, b in zip(order, order[1:], strict=False))  # parts in file order
