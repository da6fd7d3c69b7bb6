"""The row logic of the Station Raw reader: one ``csv`` row at a time, exact, with a skip
reason for every row it cannot use. It reads the lines the fast path leaves
(:mod:`producers.pems.fast`), and defines what the fast path must match.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import numpy.typing as npt

from .model import CELL_OUT_OF_RANGE_LANE, CELL_SPIKE_LANE, CELL_STUCK_LANE, MAX_LANES, QualityReport
from .records import Rows
from .stamps import stamp_epochs


def _raw_row(row: list[str], spike_per_lane: int) -> str | tuple[int, int, int, int, int, int, int, int, bool]:
    """The row logic: a skip reason, or (epoch, fold-1 epoch, station, truth, cell bits,
    stuck lanes, spike lanes, out-of-range lanes, every present lane 0/0)."""
    n_fields = len(row)
    if n_fields == 0 or not "".join(row).strip():
        return "blank_line"
    if n_fields < 2 or n_fields > 2 + 3 * MAX_LANES:
        return "bad_field_count"
    try:
        ep0, ep1 = stamp_epochs(row[0])
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


def slow_lines(data: bytes, s: npt.NDArray[np.int64], e: npt.NDArray[np.int64], lines: npt.NDArray[np.int64],
               line0: int, spike_per_lane: int, quality: QualityReport) -> Rows:
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
        return Rows.concat([])
    cols = list(zip(*out, strict=True))
    return Rows(order=np.array(cols[0], np.int64), ep0=np.array(cols[1], np.int64),
                 ep1=np.array(cols[2], np.int64), station=np.array(cols[3], np.int64),
                 total=np.array(cols[4], np.int64), bits=np.array(cols[5], np.uint8),
                 n_stuck=np.array(cols[6], np.uint8), n_spike=np.array(cols[7], np.uint8),
                 n_oor=np.array(cols[8], np.uint8), zero=np.array(cols[9], bool))
