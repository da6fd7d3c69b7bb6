"""PerStation.sample_bits: the bitmap form of sample_sparse's reports, from exactly its draws.

Deterministic (fixed seeds, exact equality): no false-failure rate.
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
def test_sample_bits_are_sample_sparse_from_the_same_draws(mech: E.Mechanism, v: int, n: int, seed: int,
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
    sp = bits.to_sparse()
    order = np.lexsort((pairs.station, pairs.vehicle))
    assert np.array_equal(sp.vehicle, pairs.vehicle[order]) and np.array_equal(sp.station, pairs.station[order])
    assert np.all(sp.output == 1)


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
