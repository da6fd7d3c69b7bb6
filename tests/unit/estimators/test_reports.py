"""estimators.reports: each round type's wire layout and arrays, its report count, and its
batches (``chunks``): every report in exactly one batch, in order, none over the size; a decoded
record's arrays as their round (``round_from_arrays``), and counts expanded into their reports in one
uniformly random order (``expand``, the shuffler's permuted release)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from estimators import Bitmaps, BitReports, Counts, Pairs, Round, SpecError, Values
from estimators.reports import empty_round, expand_counts, round_from_arrays

RNG = np.random.default_rng(11)
V = 13


def _values(n: int) -> Values:
    return Values(RNG.integers(0, V + 1, n))


def _pairs(n: int) -> Pairs:
    return Pairs(RNG.integers(1, V + 1, n), RNG.integers(0, 3, n))


def _bitmaps(n: int) -> Bitmaps:
    bits = RNG.random((n, V)) < 0.3
    return Bitmaps(np.packbits(bits, axis=1, bitorder="little"), int(bits.sum()))


def test_layouts_kinds_and_wire_arrays() -> None:
    v, p, b = _values(4), _pairs(5), _bitmaps(3)
    c = Counts(np.arange(6), n=9)
    assert [(r.layout, r.kind) for r in (v, p, b, c)] == [
        ("values", "reports"), ("pairs", "reports"), ("pairs", "reports"), ("counts", "tally")]
    assert list(v.arrays()) == ["value"] and v.arrays()["value"] is v.value
    assert list(p.arrays()) == ["station", "output"]  # the wire's order of today
    assert p.arrays()["station"] is p.station and p.arrays()["output"] is p.output
    assert list(b.arrays()) == ["bitmap"] and b.arrays()["bitmap"] is b.rows
    assert list(c.arrays()) == ["counts"] and c.arrays()["counts"] is c.counts


def test_report_counts() -> None:
    assert _values(7).n_reports == 7
    assert _pairs(0).n_reports == 0
    b = _bitmaps(20)
    assert b.n_reports == b.n_set == int(np.unpackbits(b.rows).sum())
    assert Counts(np.zeros(4, dtype=np.int64), n=31).n_reports == 31  # the tally's vehicles, not its sum


def _rebuilt(rnd: Round, size: int) -> tuple[list[int], dict[str, np.ndarray]]:
    """The batches' report counts, and their arrays put back together."""
    chunks: list[Round] = list(rnd.chunks(size))
    assert all(type(c) is type(rnd) for c in chunks)
    arrays = {k: np.concatenate([c.arrays()[k] for c in chunks]) if chunks else rnd.arrays()[k][:0]
              for k in rnd.arrays()}
    return [c.n_reports for c in chunks], arrays


@pytest.mark.parametrize("make", [_values, _pairs, _bitmaps])
@pytest.mark.parametrize(("n", "size"), [(0, 3), (1, 3), (9, 3), (10, 3), (11, 3), (5, 1), (5, 100)])
def test_chunks_hold_every_report_once_in_order(make: Callable[[int], Round], n: int, size: int) -> None:
    """Put back together, the batches are the round (nothing dropped, nothing twice, same order);
    each holds at most ``size`` (devices for bitmaps) and their counts sum to the round's."""
    rnd = make(n)
    counts, arrays = _rebuilt(rnd, size)
    for k, a in rnd.arrays().items():
        np.testing.assert_array_equal(arrays[k], a)
    assert sum(counts) == rnd.n_reports
    sizes = [c.arrays()[next(iter(c.arrays()))].shape[0] for c in rnd.chunks(size)]
    assert sizes == [min(size, n - s) for s in range(0, n, size)]  # full batches, then the rest


def test_bitmap_chunks_count_their_own_set_bits() -> None:
    b = Bitmaps(np.array([[0b111], [0], [0b1], [0b11]], dtype=np.uint8), 6)
    assert [c.n_set for c in b.chunks(2)] == [3, 3] and [c.n_set for c in b.chunks(3)] == [4, 2]


def test_a_tally_is_one_batch_whatever_the_size() -> None:
    c = Counts(np.arange(50), n=7)
    assert [x is c for x in c.chunks(1)] == [True]


def test_chunks_refuse_an_empty_batch_size() -> None:
    with pytest.raises(ValueError, match="at least one report"):
        list(_values(3).chunks(0))


def test_sparse_is_the_device_sides_pairs() -> None:
    b = _bitmaps(9)
    s, want = b.sparse(np.arange(9), V), BitReports(b.rows, b.n_set, V).to_sparse()
    for got, exp in ((s.vehicle, want.vehicle), (s.station, want.station), (s.output, want.output)):
        np.testing.assert_array_equal(got, exp)
    p, owners = _pairs(6), np.array([3, 3, 0, 1, 1, 2])
    s = p.sparse(owners, V)
    assert s.vehicle is owners
    np.testing.assert_array_equal(s.station, p.station)
    np.testing.assert_array_equal(s.output, p.output)


@pytest.mark.parametrize("make", [_values, _pairs, lambda n: Counts(RNG.integers(0, 9, n), n=40)])
def test_from_arrays_is_the_round_its_wire_arrays_came_from(make: Callable[[int], Round]) -> None:
    r = make(7)
    back = round_from_arrays(r.layout, r.arrays(), r.n_reports)
    assert type(back) is type(r) and back.n_reports == r.n_reports
    assert back.arrays().keys() == r.arrays().keys()
    assert all(back.arrays()[k] is a for k, a in r.arrays().items())  # the decoded arrays, not copies


def test_from_arrays_refuses_a_layout_the_wire_does_not_have() -> None:
    with pytest.raises(SpecError) as err:
        round_from_arrays("bitmap", {"bitmap": np.zeros((1, 2), np.uint8)}, 1)
    assert err.value.reason == "wrong_layout" and "bitmap" in err.value.detail


def test_empty_rounds() -> None:
    v, p = empty_round(False), empty_round(True)
    assert isinstance(v, Values) and isinstance(p, Pairs) and v.n_reports == p.n_reports == 0
    assert [a.dtype for a in (*v.arrays().values(), *p.arrays().values())] == [np.dtype(np.int64)] * 3


@pytest.mark.parametrize("per_sensor", [False, True])
def test_expand_is_every_counted_report_in_one_permutation_of_them_sorted(per_sensor: bool) -> None:
    """The release's bytes are pinned: ``expand`` is the sorted reports indexed by exactly one
    ``rng.permutation`` of their number (another draw -- ``choice``, ``permuted``, one more
    call -- gives another order, or leaves the generator elsewhere for the next round), and no
    report is lost or added."""
    o = 3
    counts = RNG.integers(0, 5, (V + 1) * o if per_sensor else V + 1)
    if per_sensor:
        counts[:o] = 0  # no station 0
    got = expand_counts(counts, np.random.default_rng(42), per_sensor, o)
    ref = np.random.default_rng(42)
    keys = np.repeat(np.arange(counts.size), counts)
    keys = keys[ref.permutation(keys.size)]
    if per_sensor:
        assert isinstance(got, Pairs)
        flat = got.station * o + got.output
        assert got.station.min() >= 1
    else:
        assert isinstance(got, Values)
        flat = got.value
    assert got.n_reports == counts.sum()
    np.testing.assert_array_equal(np.bincount(flat, minlength=counts.size), counts)  # none lost
    np.testing.assert_array_equal(flat, keys)  # this very order
    again = np.random.default_rng(42)
    expand_counts(counts, again, per_sensor, o)
    assert again.integers(1 << 62) == ref.integers(1 << 62)  # the generator left where one draw leaves it


def test_expand_of_nothing_is_empty_and_its_order_depends_on_the_generator() -> None:
    assert expand_counts(np.zeros(4, np.int64), np.random.default_rng(0), False, 2).n_reports == 0
    counts = np.array([0, 50, 50, 50])
    a, b = (expand_counts(counts, np.random.default_rng(s), False, 2) for s in (1, 2))
    assert isinstance(a, Values) and isinstance(b, Values)
    assert sorted(a.value.tolist()) == sorted(b.value.tolist()) and a.value.tolist() != b.value.tolist()
