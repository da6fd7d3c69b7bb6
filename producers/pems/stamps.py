"""Timestamps ``MM/DD/YYYY HH:MM:SS`` (Pacific) to 30-second epochs: one text at a time for
the row logic (``datetime``, cached), and a chunk's stamps at once for the fast path (the
few dates placed once, the times of day read eight bytes at a time). Both give the epoch
and the epoch of the same text in the repeated autumn DST hour.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S, PACIFIC, epoch_of

from .swar import ASCII_ZERO_X8, HIGH_NIBBLES, SIX_X8


@lru_cache(maxsize=1 << 16)
def parse_ts(text: str) -> datetime:
    """Parse ``MM/DD/YYYY HH:MM:SS`` (Pacific). Cached: a file repeats each stamp per station."""
    t = text.strip()
    if len(t) != 19 or t[2] != "/" or t[5] != "/" or t[10] != " ":
        raise ValueError(f"bad timestamp {text!r}")
    return datetime(int(t[6:10]), int(t[0:2]), int(t[3:5]), int(t[11:13]), int(t[14:16]), int(t[17:19]),
                    tzinfo=PACIFIC)


@lru_cache(maxsize=1 << 16)
def stamp_epochs(text: str) -> tuple[int, int]:
    """(epoch, epoch of the same text in the repeated autumn hour); equal unless ambiguous."""
    ts = parse_ts(text)
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


def chunk_stamps(win: npt.NDArray[np.uint8], at: npt.NDArray[np.int64]
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
    ok &= (x & (HIGH_NIBBLES & _HMS_DIGITS)) == (ASCII_ZERO_X8 & _HMS_DIGITS)
    ok &= ((x + (SIX_X8 & _HMS_DIGITS)) & (HIGH_NIBBLES & _HMS_DIGITS)) == (ASCII_ZERO_X8 & _HMS_DIGITS)
    x -= ASCII_ZERO_X8 & _HMS_DIGITS  # digit values
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
    matrix, and which stamps are valid: exactly what :func:`stamp_epochs` gives. The few
    distinct dates of a chunk are placed once each (:func:`_date_offsets`).

    >>> stamps = np.frombuffer(b"11/04/2012 01:00:0502/30/2012 10:00:05", np.uint8).reshape(2, 19)
    >>> ep0, ep1, ok = _vector_stamps(stamps)
    >>> ok.tolist(), int(ep1[0] - ep0[0]) * EPOCH_S, int(ep0[0]) == stamp_epochs("11/04/2012 01:00:05")[0]
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
