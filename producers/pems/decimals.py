"""Plain decimals (``12``, ``.0278``, ``3.``) parsed in bulk: texts of up to eight characters
(all of them in PeMS files) eight bytes at a time (SWAR, :mod:`producers.pems.swar`), longer
ones one character position at a time. The values equal ``float(text)``; anything else
(sign, exponent, letters, two dots) is reported not ok and left to the row logic.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .swar import (
    ASCII_DOT_X8,
    ASCII_ZERO_X8,
    HIGH_BITS,
    HIGH_BITS_BUT_FIRST,
    HIGH_NIBBLES,
    LOW_BYTES,
    LOW_NIBBLES,
    LOW_SEVEN_BITS,
    SIX_X8,
    U64_1,
    U64_3,
    U64_7,
    U64_8,
    Scratch,
    join_digits,
)

_POW10 = 10.0 ** np.arange(32)


def _short_decimals(u: npt.NDArray[np.uint64], n: npt.NDArray[np.uint8], ws: Scratch | None = None
                    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """:func:`decimals` for texts of 1 to 8 characters, eight bytes at a time (SWAR): ``u``
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
    ws = ws if ws is not None else Scratch()
    m = u.size
    x = u
    low = np.take(LOW_BYTES, n, out=ws.get("sd_low", m, np.uint64), mode="clip")
    a = ws.get("sd_a", m, np.uint64)
    b = ws.get("sd_b", m, np.uint64)
    c = ws.get("sd_c", m, np.uint64)
    x &= low
    np.bitwise_and(x, HIGH_NIBBLES, out=a)
    np.bitwise_and(low, ASCII_ZERO_X8, out=b)
    a ^= b
    np.bitwise_and(a, LOW_SEVEN_BITS, out=b)
    b += LOW_SEVEN_BITS
    b |= a  # bit 7 of a byte: its high nibble is not 3
    np.bitwise_and(x, LOW_NIBBLES, out=a)
    a += SIX_X8
    a <<= U64_3
    b |= a  # bit 7: or its low nibble is over 9
    low &= HIGH_BITS  # bit 7 of every byte of the text
    b &= low  # bit 7: a byte of the text that is not a digit
    np.bitwise_xor(x, ASCII_DOT_X8, out=a)
    np.bitwise_and(a, LOW_SEVEN_BITS, out=c)
    c += LOW_SEVEN_BITS
    c |= a
    np.bitwise_not(c, out=c)
    c &= low  # bit 7: a dot
    np.bitwise_not(c, out=a)
    b &= a  # bit 7: neither digit nor dot
    n_dot = np.bitwise_count(c, out=ws.get("sd_ndot", m, np.uint8))
    ok = np.equal(b, 0, out=ws.get("sd_ok", m, np.bool_))
    ok &= n_dot <= 1
    ok &= n_dot < n
    inner = np.flatnonzero(np.bitwise_and(c, HIGH_BITS_BUT_FIRST, out=a))  # a dot after the first byte ("31.5", "3.")
    dotted = _inner_dot_values(x[inner], n[inner]) if inner.size else None
    # the dot read as a 0 ("." ^ 0x1E == "0"), then "0" taken from every byte: digit values
    np.right_shift(c, U64_7, out=a)
    a *= np.uint64(0x1E)
    x ^= a
    np.right_shift(low, U64_7, out=b)
    b *= np.uint64(0x30)
    x -= b
    join_digits(x, a)  # the digits followed by 8 - n zeros
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


def _inner_dot_values(x: npt.NDArray[np.uint64], n: npt.NDArray[np.uint8]) -> npt.NDArray[np.float64]:
    """:func:`_short_decimals` values of texts (``x``: their bytes, masked to ``n``) whose
    dot is not the first byte: the dot taken out, the digits joined, divided by 10^(8 - dot)."""
    found = (~(((((x ^ ASCII_DOT_X8) & LOW_SEVEN_BITS) + LOW_SEVEN_BITS) | (x ^ ASCII_DOT_X8)) & HIGH_BITS)
             & HIGH_BITS & np.take(LOW_BYTES, n, mode="clip"))
    at = np.minimum(np.bitwise_count((found - U64_1) & ~found) >> np.uint8(3), n)  # the first dot's byte
    below = np.take(LOW_BYTES, at, mode="clip")
    x = (x & below) | ((x >> U64_8) & ~below)
    x -= ASCII_ZERO_X8 & np.take(LOW_BYTES, n - 1, mode="clip")
    join_digits(x, np.empty_like(x))
    out: npt.NDArray[np.float64] = x.astype(np.float64) / np.take(_POW10, 8 - at, mode="clip")
    return out


def decimals(win: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
             ws: Scratch | None = None
             ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Parse plain decimals (``12``, ``.0278``, ``3.``) at ``starts`` of ``win`` (a buffer
    padded by at least 8 bytes): (values, ok, has a dot). ``ok`` is False where the text is
    anything else (sign, exponent, letters, two dots, no digit, more than 15 characters) --
    those rows go to the exact row logic. An exact integer over an exact power of ten is
    correctly rounded, so the values equal ``float(text)``. Texts of up to 8 characters (all
    of them in PeMS files) are read 8 bytes at a time (:func:`_short_decimals`)."""
    ws = ws if ws is not None else Scratch()
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
    """:func:`decimals` one character position at a time (any length; over 15: not ok)."""
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
