"""Rows to the (epochs x stations) grid, and the cleaning on it: duplicates and the
repeated autumn DST hour, day selection, missing cells, and the dead-detector rules (a run
of 0/0 readings while the other stations have traffic, and a station reading 0/0 all local
day while others had traffic). Cells hold the ``CELL_*`` bits; the counts go to the
:class:`~producers.pems.model.QualityReport`.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S

from .model import (
    CELL_DEAD,
    CELL_MISSING,
    CELL_SPIKE_LANE,
    CELL_STUCK_LANE,
    MAX_SPAN_EPOCHS,
    NO_TRUTH,
    QualityReport,
    TrafficDay,
    day_epochs,
    local_days,
)
from .records import Rows

MAX_KEY_CELLS = 1 << 25  # epochs x stations of the one-scatter duplicate check; a longer span sorts


def place(parts: list[Rows], quality: QualityReport, fold_repeats: bool
          ) -> tuple[list[Rows], list[npt.NDArray[np.int64]]]:
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
    if cells > MAX_KEY_CELLS or n >= 1 << 31:
        kept, epoch = _place_sorted(Rows.concat(parts), quality, fold_repeats)
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
    kept, epoch = _place_sorted(Rows.concat([p.take(d) for p, d in zip(parts, dup, strict=True)]), quality,
                                fold_repeats)
    rest = [p.take(~d) for p, d in zip(parts, dup, strict=True)]
    return [kept, *rest], [epoch, *(r.ep0 for r in rest)]


def _place_sorted(rows: Rows, quality: QualityReport, fold_repeats: bool) -> tuple[Rows, npt.NDArray[np.int64]]:
    """:func:`place` by sorting every row by (station, fold-0 epoch, file order)."""
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


def build_grid(parts: list[Rows], epochs_of: list[npt.NDArray[np.int64]], quality: QualityReport, day: date | None,
               dead_run_epochs: int) -> TrafficDay:
    """The (epochs x stations) grid of the kept rows (in parts, with their epochs): later rows
    win a shared cell."""
    quality.days_in_file = [d.isoformat() for d in local_days(epochs_of)]
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
    dead = dead_cells(flows, zero, dead_run_epochs)
    dead |= dead_days(flows, zero, (flags & CELL_MISSING) == 0, epochs)
    flags[dead] |= CELL_DEAD
    count_cells(flags, quality)
    return TrafficDay(stations.astype(np.int64), epochs, flows, flags, quality)


def dead_cells(flows: npt.NDArray[np.int64], zero: npt.NDArray[np.bool_], run_epochs: int
               ) -> npt.NDArray[np.bool_]:
    """Cells of runs of >= ``run_epochs`` consecutive epochs in which a station read 0/0 on
    every lane while the other stations of the file had traffic (vectorized run lengths: the
    distance between the nearest cells before and after that are not in the run).

    >>> z = np.array([[1, 0], [1, 0], [1, 0], [0, 0]], bool); f = np.array([[0, 5], [0, 5], [0, 5], [2, 0]])
    >>> dead_cells(f, z, 3)[:, 0].tolist()
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


def dead_days(flows: npt.NDArray[np.int64], zero: npt.NDArray[np.bool_], read: npt.NDArray[np.bool_],
              epochs: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Cells of stations that read 0/0 on every lane in every reading they have on a local day
    on which other stations carried traffic: dead for that whole day, its night included.

    :func:`dead_cells` alone starts a dead run only where others have traffic, so on a small
    file whose stations all read 0 at night a detector dead all day would be a true 0 until the
    first vehicle elsewhere (and scored as one). A working station's quiet night is kept: it has
    traffic in some reading of the day. ``read``: the cells holding a reading.

    >>> f = np.array([[0, 0, 0], [0, 0, 0], [0, 4, 0]]); r = np.ones((3, 3), bool)
    >>> z = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 1]], bool); r[1, 2] = z[1, 2] = False
    >>> dead_days(f, z, r, np.arange(3) + 44_000_000).astype(int).tolist()
    [[1, 0, 1], [1, 0, 0], [1, 0, 1]]
    """
    dead = np.zeros(zero.shape, bool)
    if not epochs.size:
        return dead
    starts = np.array([day_epochs(d)[0] for d in local_days([epochs])], np.int64)
    bounds = [*np.searchsorted(epochs, starts).tolist()[1:], int(epochs.size)]
    a = 0
    for b in bounds:
        if b > a and bool(flows[a:b].any()):  # some station carried traffic that day
            z, r = zero[a:b], read[a:b]
            whole = r.any(axis=0) & ~(r & ~z).any(axis=0)  # read, and 0/0 wherever read
            dead[a:b] = z & whole
        a = b
    return dead


def count_cells(flags: npt.NDArray[np.uint8], quality: QualityReport) -> None:
    quality.missing_cells = int(np.count_nonzero(flags & CELL_MISSING))
    dead = (flags & CELL_DEAD) != 0
    quality.dead_cells = int(np.count_nonzero(dead))
    no_truth = (flags & NO_TRUTH) != 0
    quality.dead_stations = int(np.count_nonzero(dead.any(axis=0) & no_truth.all(axis=0)))
    quality.stuck_lane_cells = int(np.count_nonzero(flags & CELL_STUCK_LANE))
    quality.spike_lane_cells = int(np.count_nonzero(flags & CELL_SPIKE_LANE))


def regrid(day: TrafficDay, lo: int, hi: int) -> TrafficDay:
    """The same day on the epochs ``[lo, hi)`` (new cells missing, cells outside dropped)."""
    epochs = np.arange(lo, hi, dtype=np.int64)
    flows = np.zeros((epochs.size, day.stations.size), np.int64)
    flags = np.full((epochs.size, day.stations.size), CELL_MISSING, np.uint8)
    src = (day.epochs >= lo) & (day.epochs < hi)
    flows[day.epochs[src] - lo] = day.flows[src]
    flags[day.epochs[src] - lo] = day.flags[src]
    count_cells(flags, day.quality)
    return TrafficDay(day.stations, epochs, flows, flags, day.quality, day.meta)
