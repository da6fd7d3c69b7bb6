"""The Station Raw (30 s) reader: the file streamed through a read-ahead thread
(:mod:`producers.pems.streams`), its chunks parsed by a pool of threads (the fast path,
then the row logic for the lines it leaves; numpy releases the GIL), and the rows placed on
the grid (:mod:`producers.pems.grid`).

The tunables are read from their modules when a file is read (``streams.CHUNK_BYTES``,
``fast.FAST_BYTES``, :data:`WORKERS`), so a test may change them for one read.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import date
from pathlib import Path

import numpy as np

# whole modules: their knobs and fast_chunk are looked up at call time (``from . import`` would be an import of the
# package, whose __init__ imports this module)
import producers.pems.fast as fast
import producers.pems.streams as streams

from .grid import build_grid, place
from .model import DEFAULT_DEAD_RUN_EPOCHS, DEFAULT_SPIKE_PER_LANE, QualityReport, TrafficDay
from .records import Rows
from .rows import slow_lines
from .streams import Chunk, ahead, line_chunks, pieces
from .swar import Scratch

WORKERS = max(1, min(4, os.cpu_count() or 1))  # threads parsing chunks (numpy releases the GIL in its loops)


def parse_raw(chunks: Iterable[Chunk], spike_per_lane: int, quality: QualityReport,
              workers: int | None = None) -> list[Rows]:
    """Every line of the chunks (:func:`line_chunks`): the fast path, then the row logic for
    the lines it leaves. The rows of each chunk, in file order: ``order`` is (chunk << 24 |
    line in the chunk) << 16 | row within the line. Chunks are parsed by ``workers`` threads,
    up to two each ahead, and collected in file order."""
    use_fast = bool(fast.FAST_BYTES[fast.FAST_ALPHABET].all())
    workers = WORKERS if workers is None else workers
    local = threading.local()

    def parse(chunk: Chunk, line0: int) -> tuple[Rows, QualityReport]:
        if not hasattr(local, "ws"):
            local.ws = Scratch()
        q = QualityReport(source=quality.source)
        buf, start, stop = chunk
        win = np.frombuffer(buf, np.uint8)[start:]
        starts, ends, rows, slow = fast.fast_chunk(win, stop - start, spike_per_lane, q.skipped, use_fast, local.ws)
        rows.order += line0 << 16
        q.rows_read += int(starts.size - slow.size)
        if slow.size:
            rows = Rows.concat([rows, slow_lines(buf[start:stop], starts, ends, slow, line0, spike_per_lane, q)])
        return rows, q

    parts: list[Rows] = []

    def collect(got: tuple[Rows, QualityReport]) -> None:
        parts.append(got[0])
        quality.rows_read += got[1].rows_read
        quality.skipped.update(got[1].skipped)

    line_bits = max(24, streams.CHUNK_BYTES.bit_length() + 1)  # more than the lines of a chunk
    if workers <= 1:
        for i, chunk in enumerate(chunks):
            collect(parse(chunk, i << line_bits))
        return parts
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pems-parse") as pool:
        pending: deque[Future[tuple[Rows, QualityReport]]] = deque()
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
    chunks = ahead(line_chunks(pieces(path)))
    try:
        parts = parse_raw(chunks, spike_per_lane, quality)
    finally:
        chunks.close()  # stops the read-ahead thread when parsing failed
    kept, epochs_of = place(parts, quality, fold_repeats=True)
    return build_grid(kept, epochs_of, quality, day, dead_run_epochs)
