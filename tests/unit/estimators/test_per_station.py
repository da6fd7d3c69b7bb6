"""PerStation.sample_bits and bernoulli_cells: a bit-valued mechanism's per-vehicle reports as one
bitmap per vehicle, and sample_sparse's pairs from the same draws.

The equality tests are deterministic (fixed seeds); each Monte Carlo bound is at >= 5 sd of a
binomial rate (two-sided false-failure < 6e-7 each).
"""

from __future__ import annotations

import numpy as np
import pytest

import estimators as E
from estimators import per_station


def _bits_of(pairs: E.SparseReports, n: int, v: int) -> np.ndarray:
    """The bitmap rows the sparse pairs stand for (each pair (s, 1) sets bit s - 1)."""
    bits = np.zeros((n, v), dtype=bool)
    bits[pairs.vehicle, pairs.station - 1] = pairs.output == 1
    return np.packbits(bits, axis=1, bitorder="little")


@pytest.mark.parametrize(("mech", "v", "n", "seed"), [
    (E.symmetric_unary(0.2), 3220, 300, 1),
    (E.symmetric_unary(0.45), 13, 5000, 2),  # more than one chunk of vehicles, V not a multiple of 8
    (E.symmetric_unary(0.01), 64, 700, 3),
    (E.symmetric_unary(0.2), 1, 50, 4),
])
def test_sample_sparse_is_sample_bits_as_pairs(mech: E.Mechanism, v: int, n: int, seed: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(per_station, "_BIT_CHUNK", 1024)
    ps = E.PerStation(mech, v)
    truths = np.random.default_rng(seed).integers(0, v + 1, size=n)  # some vehicles at no station (0)
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    bits, pairs = ps.sample_bits(a, truths), ps.sample_sparse(b, truths)
    assert bits.rows.shape == (n, -(-v // 8)) and bits.rows.dtype == np.uint8
    assert np.array_equal(bits.rows, _bits_of(pairs, n, v))
    assert bits.n_set == pairs.station.size == int(np.unpackbits(bits.rows).sum())
    assert a.bit_generator.state == b.bit_generator.state  # nothing drawn more or less
    assert np.all(np.diff(pairs.vehicle * (v + 1) + pairs.station) > 0)  # by vehicle then station
    assert np.all(pairs.output == 1)
    if v % 8:
        assert not np.any(bits.rows[:, -1] >> (v % 8))  # the padding bits are 0


@pytest.mark.parametrize(("p", "size", "seed"), [
    (2.5 / 65536, 40_000_000, 11),  # half of it from the ties u == T: 2 / 65536 without them (8 sd away)
    (0.2, 10_000_000, 12),
    (0.45, 3_000_001, 13),  # a size that is not a multiple of 4
])
def test_bernoulli_cells_rate_and_independence(p: float, size: int, seed: int) -> None:
    bits = E.bernoulli_cells(np.random.default_rng(seed), size, p)
    assert bits.shape == (size,) and bits.dtype == np.bool_
    assert abs(bits.mean() - p) < 5 * np.sqrt(p * (1 - p) / size)
    both = bits[:-1] & bits[1:]  # neighbours (often one raw output's 16-bit quarters) are independent
    assert abs(both.mean() - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / (size - 1))


def test_bernoulli_cells_edges() -> None:
    rng = np.random.default_rng(0)
    assert not E.bernoulli_cells(rng, 1000, 0.0).any() and E.bernoulli_cells(rng, 1000, 1.0).all()
    assert E.bernoulli_cells(rng, 0, 0.3).size == 0
    with pytest.raises(ValueError, match="p must lie"):
        E.bernoulli_cells(rng, 3, 1.5)


def test_sample_bits_draws_each_vehicles_own_station_from_the_yes_row() -> None:
    """A vehicle's own bit is its Yes row's draw, 1 w.p. 1 - q; every other bit is 1 w.p. q.
    Keeping the No row's bit at the own station as well (the slip of not clearing it) would set
    it w.p. 1 - q + q^2 (0.75 here, not 0.55). Binomial bounds at 6 sd: false-failure < 1e-8."""
    q, v, n = 0.45, 40, 20_000
    ps = E.PerStation(E.symmetric_unary(q), v)
    truths = np.random.default_rng(7).integers(1, v + 1, size=n)
    bits = np.unpackbits(ps.sample_bits(np.random.default_rng(8), truths).rows, axis=1, count=v,
                         bitorder="little").astype(bool)
    own = bits[np.arange(n), truths - 1]
    assert abs(own.mean() - (1 - q)) < 6 * np.sqrt(q * (1 - q) / n)
    others = bits.sum() - own.sum()
    assert abs(others / (n * (v - 1)) - q) < 6 * np.sqrt(q * (1 - q) / (n * (v - 1)))


def test_sample_bits_needs_bit_reports() -> None:
    with pytest.raises(ValueError, match="outputs"):
        E.PerStation(E.alp_optimal(), 5).sample_bits(np.random.default_rng(0), np.array([1, 2]))
    with pytest.raises(ValueError, match="truths must lie"):
        E.PerStation(E.symmetric_unary(0.2), 5).sample_bits(np.random.default_rng(0), np.array([6]))
