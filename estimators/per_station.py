"""Per-station mechanisms: a one-round binary mechanism applied independently to each of ``V``
stations (Anonymized Local Privacy §V and the per-sensor randomized response), with the
fleet's non-default reports kept sparse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._types import IntArray
from .mechanisms import Mechanism

__all__ = ["PerStation", "SparseReports", "bernoulli_positions"]


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
        to the number of non-default reports, not to N x V.
        """
        truths = np.asarray(truths, dtype=np.int64)
        if truths.size and (truths.min() < 0 or truths.max() > self.n_stations):
            raise ValueError(f"truths must lie in 0..{self.n_stations}")
        table = self.mechanism.output_table(0)
        d = self.default
        n, v = truths.size, self.n_stations
        p_nd = 1.0 - float(table[0, d])
        pos = bernoulli_positions(rng, n * v, p_nd)
        veh, st = _divmod_small(pos, v)
        del pos
        st += 1
        keep = st != truths[veh]  # a vehicle's own station is drawn below with the Yes row
        veh, st = veh[keep], st[keep]
        others = np.array([o for o in range(table.shape[1]) if o != d], dtype=np.int64)
        cond = table[0, others] / p_nd
        if others.size == 1:
            out_no = np.full(veh.size, others[0], dtype=np.int64)
        elif others.size == 2:  # branch-free two-way pick
            out_no = others[0] + (others[1] - others[0]) * (rng.random(veh.size) >= cond[0])
        else:
            pick = np.searchsorted(np.cumsum(cond), rng.random(veh.size) * cond.sum(), side="right")
            out_no = others[np.minimum(pick, others.size - 1)]
        yes_veh = np.flatnonzero(truths > 0)
        yes_faces = self.mechanism.draw_faces(rng, np.ones(yes_veh.size, dtype=np.int64))
        yes_out = self.mechanism.emit(0, yes_faces, np.ones_like(yes_faces))
        nd = yes_out != d
        return SparseReports(
            vehicle=np.concatenate([veh, yes_veh[nd]]),
            station=np.concatenate([st, truths[yes_veh[nd]]]),
            output=np.concatenate([out_no, yes_out[nd]]),
        )

    def tally(self, rng: np.random.Generator, yes_counts: IntArray, n_vehicles: int) -> IntArray:
        """Exact-tally path: per-station counts ``(V, O)`` given each station's Yes count."""
        yes = np.asarray(yes_counts, dtype=np.int64)
        if yes.shape != (self.n_stations,) or np.any(yes < 0) or np.any(yes > n_vehicles):
            raise ValueError("yes_counts must be V counts in [0, n_vehicles]")
        if int(yes.sum()) > n_vehicles:
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
