"""Per-station counts of per-sensor pairs through the product's one path: the registry's
``MechanismSpec.accumulate`` (what stage 1 does with a record's pairs) then
``MechanismSpec.complete`` (what the estimates do with the participants). Tests that need the
consumer's view of simulated pairs use this instead of a second implementation;
tests/unit/estimators/test_registry.py holds the two against a per-pair tally written out by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from estimators import Mechanism, MechanismSpec, Pairs, SparseReports
from estimators._types import IntArray

__all__ = ["pair_counts"]


def pair_counts(spec: MechanismSpec, mech: Mechanism, n_stations: int, rounds: Sequence[SparseReports],
                participants: int) -> IntArray:
    """``(V, R, O)`` counts of ``participants`` vehicles from each round's non-default pairs
    (one :class:`~estimators.SparseReports` per round of the mechanism)."""
    summed = np.stack([spec.accumulate(mech, n_stations, Pairs(p.station, p.output)) for p in rounds])
    return spec.complete(mech, n_stations, summed, participants)
