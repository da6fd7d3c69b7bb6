"""The Station 5-Minute reader: each 5-minute Total Flow spread evenly over its ten
30-second epochs, on the same grid and with the same cleaning as the Station Raw reader
(docs/wire.md, "Input data, fleet and queries")."""

from __future__ import annotations

import csv
import math
from datetime import date
from pathlib import Path

import numpy as np

from schemas.epochs import epoch_of

from .grid import build_grid, regrid
from .model import DEFAULT_DEAD_RUN_EPOCHS, QualityReport, TrafficDay, day_epochs, local_days
from .records import Rows
from .stamps import parse_ts
from .streams import text_io


def read_station_5min(path: str | Path, *, dead_run_epochs: int = DEFAULT_DEAD_RUN_EPOCHS,
                      day: date | None = None) -> TrafficDay:
    """Read a Station 5-Minute file; each 5-minute Total Flow is spread evenly over its ten
    30-second epochs (integer split, the remainder to the first epochs). A missing or skipped
    5-minute row leaves its ten epochs ``CELL_MISSING``; a run of Total Flow 0 with Avg
    Occupancy 0 is a dead detector as in :func:`read_station_raw`. ``day`` keeps the rows
    starting in that local day (the others are skipped as ``other_day``)."""
    quality = QualityReport(source=str(path))
    starts: dict[tuple[int, int], tuple[int, bool]] = {}
    for row in csv.reader(text_io(path)):
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
    rows = Rows(order=np.arange(10 * n, dtype=np.int64), ep0=epoch, ep1=epoch, station=np.repeat(station, 10),
                 total=flows, bits=np.zeros(10 * n, np.uint8), n_stuck=np.zeros(10 * n, np.uint8),
                 n_spike=np.zeros(10 * n, np.uint8), n_oor=np.zeros(10 * n, np.uint8), zero=np.repeat(zero, 10))
    if day is not None:  # a row belongs to the day its interval starts in
        lo, hi = day_epochs(day)
        inside = np.repeat((first >= lo) & (first < hi), 10)
        quality.days_in_file = [d.isoformat() for d in local_days([first])]
        n_out = int((~inside).sum()) // 10
        if n_out:
            quality.skipped["other_day"] += n_out
        rows = rows.take(inside)
        epoch = epoch[inside]
        held = quality.days_in_file
        out = build_grid([rows], [epoch], quality, None, dead_run_epochs)
        quality.days_in_file, quality.day_selected = held, day.isoformat()
        if out.epochs.size:  # the whole local day on the grid
            out = regrid(out, lo, hi)
    else:
        out = build_grid([rows], [epoch], quality, None, dead_run_epochs)
        quality.days_in_file = [d.isoformat() for d in local_days([first])]
    quality.rows_used = n - quality.skipped["other_day"]
    return out


def _five_min_row(row: list[str], starts: dict[tuple[int, int], tuple[int, bool]]) -> str | None:
    if not row or all(not c.strip() for c in row):
        return "blank_line"
    if len(row) < 12:
        return "bad_field_count"
    try:
        ts = parse_ts(row[0])
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
