"""SWAR (SIMD within a register): eight bytes of text in one little-endian uint64 word, the
same operation on every byte at once. The byte-lane constants the decimal and time parsers
share, the join of eight digit values into their number, and the scratch buffers the
in-place passes reuse from chunk to chunk.

Constants are ``np.uint64`` scalars: numpy keeps a uint64 array's dtype only when the other
operand is uint64 too (a Python int would make it float64 or fail).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


class Scratch:
    """Buffers reused from chunk to chunk, by name: fresh temporaries of every chunk would be
    fresh memory each time, and page faults would cost as much as the parsing."""

    def __init__(self) -> None:
        self._bufs: dict[str, npt.NDArray[Any]] = {}

    def get(self, name: str, n: int, dtype: type[Any]) -> npt.NDArray[Any]:
        buf = self._bufs.get(name)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = self._bufs[name] = np.empty(n + n // 4, dtype)
        return buf[:n]


# Byte-lane constants: one byte value repeated in all eight bytes of a word.
HIGH_BITS = np.uint64(0x8080808080808080)  # bit 7 of every byte: where the per-byte tests leave their answer
LOW_SEVEN_BITS = np.uint64(0x7F7F7F7F7F7F7F7F)  # bits 0-6 of every byte: x & 7F + 7F sets bit 7 iff x != 0
HIGH_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)  # the high half of every byte (0x3_ for an ASCII digit)
LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)  # the low half of every byte (the digit's value)
ASCII_ZERO_X8 = np.uint64(0x3030303030303030)  # "0" in every byte: subtracted, digits become their values
SIX_X8 = np.uint64(0x0606060606060606)  # 6 in every byte: a low nibble + 6 carries into 0x10 iff it is over 9
ASCII_DOT_X8 = np.uint64(0x2E2E2E2E2E2E2E2E)  # "." in every byte: xor'd, a dot byte becomes 0
HIGH_BITS_BUT_FIRST = np.uint64(0x8080808080808000)  # bit 7 of every byte but the first: a dot after it

LOW_BYTES = np.array([(1 << 8 * k) - 1 for k in range(9)], np.uint64)  # LOW_BYTES[k]: the k low bytes of a word

# Masks of the digit join (:func:`join_digits`): what is kept after each step
LOW_BYTE_OF_PAIRS = np.uint64(0x00FF00FF00FF00FF)  # after pairs: a 2-digit number in the low byte of each 16 bits
LOW_HALF_OF_FOURS = np.uint64(0x0000FFFF0000FFFF)  # after fours: a 4-digit number in the low 16 of each 32 bits
LOW_HALF_OF_EIGHT = np.uint64(0xFFFFFFFF)  # after eights: the 8-digit number in the low 32 bits

# Shift counts (and the 1 of ``x - 1``) as uint64 scalars, so uint64 arrays stay uint64
U64_1, U64_3, U64_7, U64_8, U64_16, U64_32 = (np.uint64(k) for k in (1, 3, 7, 8, 16, 32))


def join_digits(x: npt.NDArray[np.uint64], scratch: npt.NDArray[np.uint64]) -> None:
    """Eight digit values (the first in the low byte) joined in place into their number, by
    pairs, fours and eights."""
    for step, keep, shift in ((10, LOW_BYTE_OF_PAIRS, U64_8), (100, LOW_HALF_OF_FOURS, U64_16),
                              (10000, LOW_HALF_OF_EIGHT, U64_32)):
        np.right_shift(x, shift, out=scratch)
        x *= np.uint64(step)
        x += scratch
        x &= keep
