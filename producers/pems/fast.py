"""The fast path of the Station Raw reader: a chunk of whole lines parsed at once. The bytes
up to ``,`` are found in one pass; a line shaped like a reading (one space, 25 commas, the
newline) has its stamp and decimals read eight bytes at a time and its lanes checked in
(lines x 8) boolean arrays. Any line it cannot handle exactly is left to the row logic
(:mod:`producers.pems.rows`), so every skip reason is counted as the row logic counts it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt

from .decimals import decimals
from .model import CELL_OUT_OF_RANGE_LANE, CELL_SPIKE_LANE, CELL_STUCK_LANE
from .records import Rows
from .stamps import chunk_stamps
from .swar import Scratch

FAST_BYTES = np.zeros(256, dtype=bool)  # the fast path's alphabet; without all of it every line takes the row logic
FAST_BYTES[list(b"0123456789,./:")] = True
FAST_ALPHABET = list(b"0123456789,./:")
_SHAPE = np.array([32] + [44] * 25 + [10], np.uint8)  # the bytes <= b"," of a reading: space, 25 commas, \n


def _line_word(lanes: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
    """A contiguous (k, 8) boolean array as one 8-byte word per line: != 0 is any, the popcount
    the number of True lanes."""
    out: npt.NDArray[np.uint64] = lanes.view(np.uint64).reshape(-1)
    return out


def fast_chunk(win: npt.NDArray[np.uint8], n: int, spike_per_lane: int, skipped: Counter[str], fast: bool,
               ws: Scratch) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], Rows, npt.NDArray[np.int64]]:
    """Vectorized parse of a chunk of whole lines (``win[:n]``, padded; :func:`line_chunks`):
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
        return starts, ends, Rows.concat([]), np.arange(ends.size)
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
    ep0, ep1, ts_ok = chunk_stamps(win, ls)
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
    v, v_ok, v_dot = decimals(win, first, np.take(size, sel, out=ws.get("len", sel.size, np.int64)), ws)
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
    rows = Rows(order=lines[rk] << 16, ep0=ep0[rk], ep1=ep1[rk], station=val2[rk, 1].astype(np.int64),
                 total=total[rk], bits=bits[rk], n_stuck=n_stuck[rk], n_spike=n_spike[rk], n_oor=n_oor[rk],
                 zero=zero[rk])
    return starts, ends, rows, np.flatnonzero(to_rows)
