"""Per-station mechanisms: a one-round binary mechanism applied independently to each of ``V``
stations (Anonymized Local Privacy §V and the per-sensor randomized response), with the
fleet's non-default reports kept sparse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ._types import IntArray
from .mechanisms import Mechanism

__all__ = ["BitReports", "PerStation", "SparseReports", "StationCounts", "StationSets", "Truth", "YesCounts",
           "bernoulli_cells", "bernoulli_positions"]

_BIT_CHUNK = 4096  # vehicles whose unpacked bits (V bytes each) are built at a time
_PAIR_BYTES = 8  # a (station, report) pair in the device layout (schemas.device_binary: two u32)


@dataclass(frozen=True)
class SparseReports:
    """The non-default (station, report) pairs of a fleet; the default report is implied.

    ``vehicle`` exists only on the device side to tie a simulated vehicle to its pairs in
    tests; it must never leave the simulator.
    """

    vehicle: IntArray
    station: IntArray  # 1..V
    output: IntArray


@dataclass(frozen=True)
class StationSets:
    """Each vehicle's truth as a set of stations (a multi-hot truth: the stations it passed in
    a span): the pairs ``(vehicle[i], station[i])``, sorted by vehicle then station, without
    repeats; ``station`` in 1..V; a vehicle without a pair passed none. One station or none per
    vehicle (a 30-s epoch's truth) is the special case :meth:`of_truths`. Device side only,
    like :class:`SparseReports`.

    >>> sets = StationSets.of_truths(np.array([0, 3, 1]))
    >>> sets.n_vehicles, sets.vehicle.tolist(), sets.station.tolist(), sets.yes_counts(3).tolist()
    (3, [1, 2], [3, 1], [1, 0, 1])
    """

    n_vehicles: int
    vehicle: IntArray
    station: IntArray

    @classmethod
    def of_truths(cls, truths: IntArray) -> StationSets:
        """One station (1..V) or none (0) per vehicle."""
        truths = np.asarray(truths, dtype=np.int64)
        vehicle = np.flatnonzero(truths > 0)
        return cls(int(truths.size), vehicle, truths[vehicle])

    def yes_counts(self, n_stations: int) -> IntArray:
        """How many vehicles' sets hold each station ``(V,)`` (their sum may exceed the vehicles)."""
        return np.bincount(self.station - 1, minlength=n_stations).astype(np.int64)

    def sizes(self) -> IntArray:
        """Each vehicle's number of stations ``(n_vehicles,)``."""
        return np.bincount(self.vehicle, minlength=self.n_vehicles).astype(np.int64)

    def checked(self, n_stations: int) -> StationSets:
        """Itself, or ValueError unless the pairs are sorted, unique and in range."""
        veh, st = np.asarray(self.vehicle, dtype=np.int64), np.asarray(self.station, dtype=np.int64)
        if veh.shape != st.shape or veh.ndim != 1:
            raise ValueError("a set truth needs one vehicle per station")
        if st.size:
            if st.min() < 1 or st.max() > n_stations:
                raise ValueError(f"set truths' stations must lie in 1..{n_stations}")
            if veh.min() < 0 or veh.max() >= self.n_vehicles:
                raise ValueError(f"set truths' vehicles must lie in 0..{self.n_vehicles - 1}")
            if np.any(np.diff(veh * (n_stations + 1) + st) <= 0):
                raise ValueError("set truths must be sorted by vehicle then station, without repeats")
        return StationSets(self.n_vehicles, veh, st)


@dataclass(frozen=True)
class StationCounts:
    """A 30-s epoch's truth: how many vehicles are at each station, ``counts[s]`` for station s
    (1..V) and ``counts[0]`` at none; each vehicle at one station or none. Its vehicles as one
    station each are ``np.repeat(np.arange(V + 1), counts)``, as sets :meth:`StationSets.of_truths`.

    >>> StationCounts(np.array([2, 0, 1])).n_vehicles
    3
    """

    counts: IntArray

    @property
    def n_vehicles(self) -> int:
        return int(self.counts.sum())


@dataclass(frozen=True)
class YesCounts:
    """A span's set truths seen only through their tally: how many of the ``n`` vehicles' sets
    hold each station, ``yes[s - 1]`` for station s (each at most ``n``; their sum may exceed it,
    :meth:`StationSets.yes_counts`) -- all the exact tally of a per-station mechanism reads.

    >>> sets = StationSets(2, np.array([0, 0, 1]), np.array([1, 2, 2]))
    >>> YesCounts(sets.yes_counts(3), sets.n_vehicles).yes.tolist()
    [1, 2, 0]
    """

    yes: IntArray
    n: int


#: what a producer's devices privatize for one query: a 30-s epoch's station per vehicle
#: (:class:`StationCounts`), a span's set of stations per vehicle (:class:`StationSets`), or
#: a span's sets tallied (:class:`YesCounts`)
Truth = StationCounts | StationSets | YesCounts


@dataclass(frozen=True)
class BitReports:
    """A fleet's reports of a bit-valued per-station mechanism (outputs {0, 1}, default 0) as
    one bitmap per vehicle: ``rows[i]`` holds vehicle ``i``'s V bits, least significant bit
    first (station ``s`` is bit ``(s - 1) % 8`` of byte ``(s - 1) // 8``), the padding 0.
    ``n_set``: how many bits are set (the sparse path's number of pairs). Device side only,
    like :class:`SparseReports`: row ``i`` is one device's report.
    """

    rows: npt.NDArray[np.uint8]
    n_set: int
    n_stations: int

    def to_sparse(self) -> SparseReports:
        """The same reports as (vehicle, station, 1) pairs, by vehicle then station.

        >>> bits = BitReports(np.array([[0b101], [0b010]], dtype=np.uint8), 3, 3)
        >>> sp = bits.to_sparse()
        >>> sp.vehicle.tolist(), sp.station.tolist(), sp.output.tolist()
        ([0, 0, 1], [1, 3, 2], [1, 1, 1])
        """
        v, vehicles, stations = self.n_stations, [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for first in range(0, self.rows.shape[0], _BIT_CHUNK):  # never the whole unpacked table
            bits = np.unpackbits(self.rows[first:first + _BIT_CHUNK], axis=1, count=v, bitorder="little")
            veh, st = _divmod_small(np.flatnonzero(bits.view(np.bool_)), v)
            veh += first
            st += 1
            vehicles.append(veh)
            stations.append(st)
        veh = np.concatenate(vehicles)
        return SparseReports(vehicle=veh, station=np.concatenate(stations), output=np.ones(veh.size, dtype=np.int64))


@dataclass(frozen=True)
class PerStation:
    """A one-round binary mechanism applied independently to each of ``V`` stations.

    Truth per vehicle: its station (1..V) or 0 for none; for station s the vehicle is a
    "Yes" iff its truth is s. Reports equal to ``default`` (the most likely report of a
    "No" vehicle: ⊥ for ALP, 0 for RR) are not materialized.
    """

    mechanism: Mechanism
    n_stations: int

    def __post_init__(self) -> None:
        m = self.mechanism
        if m.n_truths != 2 or m.n_rounds != 1:
            raise ValueError("PerStation needs a one-round binary (No/Yes) mechanism")
        if self.n_stations < 1:
            raise ValueError("n_stations must be >= 1")

    @property
    def default(self) -> int:
        return int(np.argmax(self.mechanism.output_table(0)[0]))

    def sample_sparse(self, rng: np.random.Generator, truths: IntArray) -> SparseReports:
        """Per-vehicle path: every (vehicle, station) pair draws its own report.

        The pairs of "No" vehicles form a Bernoulli process over the flattened
        vehicle x station grid; it is drawn by geometric skips, so the cost is proportional
        to the number of non-default reports, not to N x V. A :attr:`bit_valued` mechanism's
        pairs are by vehicle then station: :meth:`sample_bits`' draws when its bitmaps are the
        smaller encoding, else drawn by those skips (:meth:`sparse_bits`). The one-station case
        of :meth:`sample_sparse_sets` (the same draws).
        """
        return self.sample_sparse_sets(rng, StationSets.of_truths(self._checked(truths)))

    def sample_sparse_sets(self, rng: np.random.Generator, sets: StationSets) -> SparseReports:
        """:meth:`sample_sparse` for set truths (:class:`StationSets`, a span's multi-hot
        truth): a station in a vehicle's set answers from the Yes row, every other from the No
        row."""
        if self.bit_valued and not self.sparse_bits():
            return self.sample_bits_sets(rng, sets).to_sparse()
        sets = sets.checked(self.n_stations)
        table = self.mechanism.output_table(0)
        d = self.default
        n, v = sets.n_vehicles, self.n_stations
        p_nd = 1.0 - float(table[0, d])
        pos = bernoulli_positions(rng, n * v, p_nd)
        if sets.station.size and pos.size:  # a vehicle's own stations are drawn below with the Yes row
            own = sets.vehicle * v + sets.station - 1
            at = np.searchsorted(pos, own)  # the few own cells into the many draws (pos is sorted): O(N log M)
            inside = at < pos.size
            at = at[inside]
            keep = np.ones(pos.size, dtype=bool)
            keep[at[pos[at] == own[inside]]] = False
            pos = pos[keep]
        veh, st = _divmod_small(pos, v)
        del pos
        st += 1
        others = np.array([o for o in range(table.shape[1]) if o != d], dtype=np.int64)
        cond = table[0, others] / p_nd
        if others.size == 1:
            out_no = np.full(veh.size, others[0], dtype=np.int64)
        elif others.size == 2:  # branch-free two-way pick
            out_no = others[0] + (others[1] - others[0]) * (rng.random(veh.size) >= cond[0])
        else:
            pick = np.searchsorted(np.cumsum(cond), rng.random(veh.size) * cond.sum(), side="right")
            out_no = others[np.minimum(pick, others.size - 1)]
        yes_out = self._yes_draws(rng, sets.station.size)
        nd = yes_out != d
        if self.bit_valued:  # by vehicle then station, as the bitmap's pairs: two sorted runs merged
            cells = np.concatenate([veh * v + st - 1, sets.vehicle[nd] * v + sets.station[nd] - 1])
            veh, st = _divmod_small(np.sort(cells, kind="stable"), v)
            st += 1
            return SparseReports(vehicle=veh, station=st, output=np.ones(veh.size, dtype=np.int64))
        return SparseReports(
            vehicle=np.concatenate([veh, sets.vehicle[nd]]),
            station=np.concatenate([st, sets.station[nd]]),
            output=np.concatenate([out_no, yes_out[nd]]),
        )

    def _yes_draws(self, rng: np.random.Generator, cells: int) -> IntArray:
        """The reports of ``cells`` (vehicle, station) cells whose vehicle passed the station:
        the Yes row, each on its own (the one definition of a Yes answer's draw)."""
        faces = self.mechanism.draw_faces(rng, np.ones(cells, dtype=np.int64))
        return self.mechanism.emit(0, faces, np.ones_like(faces))

    def expected_ones(self, yes_stations: float = 1.0) -> float:
        """A :attr:`bit_valued` report's expected number of 1 bits when its truth holds
        ``yes_stations`` of the V stations: ``q (V - k) + p k`` (q, p: a No's and a Yes's chance of
        a 1). At unary q = 1.7e-4 over 3,220 stations and k = 3: 3.4 of 3,220 bits.

        >>> from estimators.mechanisms import symmetric_unary
        >>> round(PerStation(symmetric_unary(0.01), 600).expected_ones(1), 2)
        6.98
        """
        table = self.mechanism.output_table(0)
        q, p = 1.0 - float(table[0, 0]), 1.0 - float(table[1, 0])
        k = min(max(float(yes_stations), 0.0), float(self.n_stations))
        return q * (self.n_stations - k) + p * k

    def sparse_bits(self, yes_stations: float = 1.0) -> bool:
        """Whether a :attr:`bit_valued` mechanism's reports are smaller as station ids (8 bytes a
        (station, 1) pair in the device layout, :mod:`schemas.device_binary`) than as a bitmap of
        ceil(V / 8) bytes, by :meth:`expected_ones` at ``yes_stations`` (by default one: the
        mechanism's own figure; the samplers and the device path use that default) -- a choice
        from the mechanism alone, the same for every device of a round and every round of a
        query (an encoding chosen per device by its own count of ones would tell that count; one
        chosen from the fleet's truths would tell something of them). Sparse,
        :meth:`sample_sparse_sets` draws the 1 bits by geometric skips
        (:func:`bernoulli_positions`: the cost follows the ones, not N x V); else it draws the
        grid outright (:meth:`sample_bits_sets`) and the device path sends bitmaps.

        >>> from estimators.mechanisms import symmetric_unary
        >>> [PerStation(symmetric_unary(q), 3220).sparse_bits() for q in (0.2, 1.7e-4)]
        [False, True]
        """
        return self.bit_valued and _PAIR_BYTES * self.expected_ones(yes_stations) < -(-self.n_stations // 8)

    @property
    def bit_valued(self) -> bool:
        """Reports are bits: outputs {0, 1}, 0 the default (unary RR, per-sensor RR)."""
        return self.mechanism.n_outputs == 2 and self.default == 0

    def sample_bits(self, rng: np.random.Generator, truths: IntArray) -> BitReports:
        """Per-vehicle path of a :attr:`bit_valued` mechanism: one bitmap per vehicle, every
        (vehicle, station) bit drawn on its own (:func:`bernoulli_cells`, the grid drawn
        outright: at q = 0.2 that is cheaper than skipping to the ~q N V set bits), a vehicle's
        own station from the Yes row. The rows are a device's bitmap report as they are (the
        replay's device path); :meth:`sample_sparse` gives the same draws as pairs. The
        one-station case of :meth:`sample_bits_sets` (the same draws).

        >>> from estimators.mechanisms import symmetric_unary
        >>> ps = PerStation(symmetric_unary(0.2), 10)
        >>> bits = ps.sample_bits(np.random.default_rng(5), np.array([0, 3, 10, 7]))
        >>> bits.rows.shape, bits.n_set == int(np.unpackbits(bits.rows).sum())
        ((4, 2), True)
        """
        if not self.bit_valued:
            raise ValueError("sample_bits needs a mechanism with outputs {0, 1} and default 0")
        return self.sample_bits_sets(rng, StationSets.of_truths(self._checked(truths)))

    def sample_bits_sets(self, rng: np.random.Generator, sets: StationSets) -> BitReports:
        """:meth:`sample_bits` for set truths (:class:`StationSets`, a span's multi-hot truth):
        a bit of a station in the vehicle's set from the Yes row, every other from the No row.

        >>> from estimators.mechanisms import symmetric_unary
        >>> ps = PerStation(symmetric_unary(1e-12), 10)  # ~no noise: the bits are the sets
        >>> sets = StationSets(3, np.array([0, 0, 2]), np.array([2, 9, 10]))
        >>> ps.sample_bits_sets(np.random.default_rng(1), sets).to_sparse().station.tolist()
        [2, 9, 10]
        """
        if not self.bit_valued:
            raise ValueError("sample_bits needs a mechanism with outputs {0, 1} and default 0")
        sets = sets.checked(self.n_stations)
        n, v = sets.n_vehicles, self.n_stations
        q = 1.0 - float(self.mechanism.output_table(0)[0, 0])  # a No bit's chance of 1
        rows = np.empty((n, -(-v // 8)), dtype=np.uint8)
        n_set = 0
        bounds = np.searchsorted(sets.vehicle, np.arange(0, n + _BIT_CHUNK, _BIT_CHUNK))
        for c, first in enumerate(range(0, n, _BIT_CHUNK)):
            m = min(_BIT_CHUNK, n - first)
            bits = bernoulli_cells(rng, m * v, q)
            lo, hi = bounds[c], bounds[c + 1]
            bits[(sets.vehicle[lo:hi] - first) * v + sets.station[lo:hi] - 1] = False  # own stations: Yes row below
            n_set += int(np.count_nonzero(bits))
            rows[first:first + m] = np.packbits(bits.reshape(m, v), axis=1, bitorder="little")
        one = self._yes_draws(rng, sets.station.size) != 0
        hit, bit = sets.vehicle[one], sets.station[one] - 1
        if hit.size:  # a vehicle's several stations may share a byte: its bits or-ed together first
            byte = hit * rows.shape[1] + (bit >> 3)  # non-decreasing: the pairs are sorted
            runs = np.flatnonzero(np.r_[True, byte[1:] != byte[:-1]])
            rows.reshape(-1)[byte[runs]] |= np.bitwise_or.reduceat((1 << (bit & 7)).astype(np.uint8), runs)
        return BitReports(rows=rows, n_set=n_set + hit.size, n_stations=v)

    def _checked(self, truths: IntArray) -> IntArray:
        truths = np.asarray(truths, dtype=np.int64)
        if truths.size and (truths.min() < 0 or truths.max() > self.n_stations):
            raise ValueError(f"truths must lie in 0..{self.n_stations}")
        return truths

    def tally(self, rng: np.random.Generator, yes_counts: IntArray, n_vehicles: int,
              multi_hot: bool = False) -> IntArray:
        """Exact-tally path: per-station counts ``(V, O)`` given each station's Yes count.

        ``multi_hot``: the Yes counts of set truths (:meth:`StationSets.yes_counts`: a vehicle
        may be a Yes at several stations, so they may sum to more than ``n_vehicles``; each
        station's still at most ``n_vehicles``). Every station's answers are independent, so
        its counts are the same two multinomials either way.

        >>> from estimators.mechanisms import symmetric_unary
        >>> PerStation(symmetric_unary(1e-12), 3).tally(np.random.default_rng(0), np.array([2, 2, 1]), 2,
        ...                                           multi_hot=True)[:, 1].tolist()
        [2, 2, 1]
        """
        yes = np.asarray(yes_counts, dtype=np.int64)
        if yes.shape != (self.n_stations,) or np.any(yes < 0) or np.any(yes > n_vehicles):
            raise ValueError("yes_counts must be V counts in [0, n_vehicles]")
        if not multi_hot and int(yes.sum()) > n_vehicles:
            raise ValueError("more vehicles at stations than in the fleet")
        table = self.mechanism.output_table(0)
        return (rng.multinomial(yes, table[1]) + rng.multinomial(n_vehicles - yes, table[0])).astype(np.int64)


def _divmod_small(a: IntArray, d: int) -> tuple[IntArray, IntArray]:
    """``np.divmod(a, d)`` for non-negative ``a`` below 2**52 and a positive ``d``, exactly,
    by a float reciprocal and one correction (int64 division costs ~23 ns an element here;
    this ~8: it splits ~10^8 sampled positions into vehicle and station).

    >>> a = np.array([0, 1, 3219, 3220, 3221, 438_428_419, 2**40 + 7])
    >>> all((x == y).all() for x, y in zip(_divmod_small(a, 3220), np.divmod(a, 3220)))
    True
    """
    q = (a * (1.0 / d)).astype(np.int64)
    r = a - q * d
    high, low = r >= d, r < 0
    q[high] += 1
    r[high] -= d
    q[low] -= 1
    r[low] += d
    return q, r


def bernoulli_cells(rng: np.random.Generator, size: int, p: float) -> npt.NDArray[np.bool_]:
    """``size`` independent Bernoulli(p) draws, exact to double precision, at ~2 ns a draw:
    a uniform 16-bit ``u`` per draw (four from each raw 64-bit output of the generator), the
    draw ``u < T`` with ``T = floor(p 2^16)``; the ~1/65,536 draws with ``u == T`` are 1 with
    chance ``p 2^16 - T`` (a uniform double), so P(1) = (T + p 2^16 - T) / 2^16 = p.

    >>> bits = bernoulli_cells(np.random.default_rng(0), 1_000_000, 0.2)
    >>> bits.dtype, bool(abs(bits.mean() - 0.2) < 0.002)
    (dtype('bool'), True)
    >>> [int(bernoulli_cells(np.random.default_rng(0), 10, p).sum()) for p in (0.0, 1.0)]
    [0, 10]
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], not {p}")
    scaled = p * 65536.0  # exact: a power of two
    t = int(scaled)
    rest = scaled - t
    u = rng.bit_generator.random_raw(-(-size // 4)).view(np.uint16)[:size]
    bits = u < t
    if rest > 0.0:
        ties = np.flatnonzero(u == t)
        bits[ties] = rng.random(ties.size) < rest
    return bits


def bernoulli_positions(rng: np.random.Generator, size: int, p: float) -> IntArray:
    """Sorted positions in ``[0, size)`` of a Bernoulli(p) process (geometric skips)."""
    if p <= 0.0 or size == 0:
        return np.zeros(0, dtype=np.int64)
    if p >= 1.0:
        return np.arange(size, dtype=np.int64)
    chunks: list[IntArray] = []
    start = -1
    expected = size * p
    while True:
        m = int(expected + 6.0 * np.sqrt(expected) + 16)
        pos = np.cumsum(rng.geometric(p, size=m), out=None)  # in place below: ~10^8 positions at scale
        pos += start
        if pos[-1] >= size:
            chunks.append(pos[:int(np.searchsorted(pos, size))])  # sorted: the first at or past the end
            break
        chunks.append(pos)
        start = int(pos[-1])
        expected = (size - 1 - start) * p
    out = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return out.astype(np.int64, copy=False)
