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
from estimators.per_station import StationSets


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


# ---------------------------------------------------------------------------------------
# set truths (a span's multi-hot truth): StationSets, sample_bits_sets, sample_sparse_sets,
# tally(multi_hot=True)
# ---------------------------------------------------------------------------------------
def _random_sets(seed: int, n: int, v: int, most: int, least: int = 0) -> StationSets:
    """Each vehicle a uniform set of ``least``..``most`` distinct stations of 1..V, sorted."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(least, most + 1, size=n)
    vehicle = np.repeat(np.arange(n), sizes)
    station = np.concatenate([np.sort(rng.choice(v, size=k, replace=False)) + 1 for k in sizes])
    return StationSets(n, vehicle, station.astype(np.int64))


def test_station_sets_of_truths_is_the_one_station_case() -> None:
    """sample_bits/sample_sparse are the one-station case of the set variants: the same draws."""
    v, n = 37, 3000
    truths = np.random.default_rng(1).integers(0, v + 1, size=n)
    sets = StationSets.of_truths(truths)
    for mech in (E.symmetric_unary(0.3), E.alp_optimal()):
        ps = E.PerStation(mech, v)
        a, b = ps.sample_sparse(np.random.default_rng(2), truths), ps.sample_sparse_sets(np.random.default_rng(2), sets)
        for x, y in ((a.vehicle, b.vehicle), (a.station, b.station), (a.output, b.output)):
            assert np.array_equal(x, y)
    ps = E.PerStation(E.symmetric_unary(0.3), v)
    assert np.array_equal(ps.sample_bits(np.random.default_rng(3), truths).rows,
                          ps.sample_bits_sets(np.random.default_rng(3), sets).rows)


def test_sample_sparse_sets_is_sample_bits_sets_as_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(per_station, "_BIT_CHUNK", 512)  # several chunks, sets split across none of them
    v, n = 29, 2000
    sets = _random_sets(4, n, v, 6)
    ps = E.PerStation(E.symmetric_unary(0.25), v)
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    bits, pairs = ps.sample_bits_sets(a, sets), ps.sample_sparse_sets(b, sets)
    assert np.array_equal(bits.rows, _bits_of(pairs, n, v)) and bits.n_set == pairs.station.size
    assert a.bit_generator.state == b.bit_generator.state


@pytest.mark.parametrize("mechanism", ["unary-bits", "unary-pairs", "alp", "rr"])
def test_set_truths_answer_every_passed_station_from_the_yes_row(mechanism: str) -> None:
    """Per station and output, the rate over the (vehicle, station) cells of passed stations is
    the Yes row's and over the others the No row's. Every vehicle passed 1..6 stations, so a
    sampler that kept only one station of a set (a 30-s truth) answers the other passed cells
    from the No row: their rate of the Yes-likely output moves by |Yes - No| >= 0.1 (unary q 0.2:
    0.8 against 0.2; ALP and RR likewise), >= 30 sd at these sizes. Each bound is 5 sd of a
    binomial rate over >= 40,000 cells (two-sided false-failure < 6e-7 each; < 1e-5 in all)."""
    v, n = 50, 20_000
    sets = _random_sets(6, n, v, 6, least=1)
    mech = {"unary-bits": E.symmetric_unary(0.2), "unary-pairs": E.symmetric_unary(0.2), "alp": E.alp_optimal(),
            "rr": E.two_coin_rr()}[mechanism]
    ps = E.PerStation(mech, v)
    rng = np.random.default_rng(7)
    if mechanism == "unary-bits":
        pairs = ps.sample_bits_sets(rng, sets).to_sparse()
    else:
        pairs = ps.sample_sparse_sets(rng, sets)
    table = mech.output_table(0)
    out = np.full((n, v), ps.default, dtype=np.int64)
    out[pairs.vehicle, pairs.station - 1] = pairs.output
    passed = np.zeros((n, v), dtype=bool)
    passed[sets.vehicle, sets.station - 1] = True
    assert int(passed.sum(axis=1).min()) >= 1 and int(passed.sum(axis=1).max()) >= 5
    multi = passed & (passed.cumsum(axis=1) > 1)  # a set's second and later stations
    for cells, row in ((passed, table[1]), (multi, table[1]), (~passed, table[0])):
        m = int(cells.sum())
        assert m >= 40_000
        for o in range(table.shape[1]):
            rate = float((out[cells] == o).mean())
            assert abs(rate - row[o]) < 5 * np.sqrt(row[o] * (1 - row[o]) / m) + 1e-12, (o, rate, row[o])


def test_tally_takes_yes_counts_of_set_truths() -> None:
    """Multi-hot Yes counts may sum past the vehicles (each at most n); without ``multi_hot``
    that stays refused. Rates: each station's count of 1s is Binomial(yes, 1-q) + Binomial(n -
    yes, q); the mean over 400 tallies is within 5 sd (false-failure < 6e-7 per station, < 1e-5
    over the 8)."""
    q, n = 0.2, 1000
    ps = E.PerStation(E.symmetric_unary(q), 8)
    yes = np.array([1000, 900, 800, 700, 600, 0, 1, 500])  # sums to 4,501 > n
    with pytest.raises(ValueError, match="more vehicles"):
        ps.tally(np.random.default_rng(0), yes, n)
    with pytest.raises(ValueError, match="in \\[0, n_vehicles\\]"):
        ps.tally(np.random.default_rng(0), np.array([1001, 0, 0, 0, 0, 0, 0, 0]), n, multi_hot=True)
    rng = np.random.default_rng(9)
    draws = np.stack([ps.tally(rng, yes, n, multi_hot=True) for _ in range(400)])
    assert np.all(draws.sum(axis=2) == n)
    mean = yes * (1 - q) + (n - yes) * q
    sd = np.sqrt(n * q * (1 - q) / 400)
    assert np.all(np.abs(draws[:, :, 1].mean(axis=0) - mean) < 5 * sd)


def test_station_sets_are_checked() -> None:
    ps = E.PerStation(E.symmetric_unary(0.2), 5)
    rng = np.random.default_rng(0)
    for bad, why in (((2, [0, 0], [3, 3]), "without repeats"), ((2, [1, 0], [1, 2]), "sorted"),
                     ((2, [0], [6]), "1..5"), ((2, [2], [1]), "vehicles must lie")):
        n, veh, st = bad
        with pytest.raises(ValueError, match=why):
            ps.sample_bits_sets(rng, StationSets(n, np.array(veh), np.array(st)))
        with pytest.raises(ValueError, match=why):
            E.PerStation(E.alp_optimal(), 5).sample_sparse_sets(rng, StationSets(n, np.array(veh), np.array(st)))
