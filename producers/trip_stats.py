"""A day's passages per vehicle and what a per-day cap on them drops: the diagnostics of the
trip model (:mod:`producers.trips`). Pure.

A device that names at most ``M`` station passages per query per day names its first ``M`` of
the day; past ``M`` its reports name no station. A vehicle with ``k`` passages in the day drops
``max(0, k - M)`` of them: they go missing from the estimates, a bias low of exactly the sum of
that over the vehicles (:func:`cap_summary`), and per station and hour where the dropped
passages were (:class:`DayTally`). On :class:`~producers.trips.TripFleet`, that bias is the
model's: how vehicles really spread their passages over a day is not in PeMS.

>>> d = cap_summary(np.array([0, 1, 5, 30]), caps=(2, 20))
>>> d.mean, d.max, d.dropped_share[2] == 31 / 36, d.dropped_share[20] == 10 / 36
(9.0, 30, True, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.epochs import EPOCH_S

from .trips import EpochPassages

__all__ = ["DEFAULT_CAPS", "DayTally", "PassageDistribution", "TripLengths", "cap_summary", "dropped_passages"]

IntArray = npt.NDArray[np.int64]

DEFAULT_CAPS = (20, 40, 120, 240)  # passages a device may name per query per day


@dataclass(frozen=True)
class PassageDistribution:
    """Passages per vehicle in a day, over every vehicle of the fleet (the idle ones too), and
    the share of all passages a per-day cap of ``M`` drops (``dropped_share[M]``)."""

    vehicles: int
    passages: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: int
    idle_share: float  # vehicles that passed no station all day
    dropped_share: dict[int, float]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["dropped_share"] = {str(m): v for m, v in self.dropped_share.items()}
        return out


def dropped_passages(counts: npt.ArrayLike, cap: int) -> int:
    """Passages a per-day cap of ``cap`` drops: ``sum(max(0, k - cap))`` over the vehicles' ``k``.

    >>> dropped_passages([3, 10, 1], 2)
    9
    """
    k = np.asarray(counts, dtype=np.int64)
    return int(np.maximum(k - cap, 0).sum())


def cap_summary(counts: npt.ArrayLike, caps: Sequence[int] = DEFAULT_CAPS) -> PassageDistribution:
    """The distribution of a day's per-vehicle passage ``counts`` (mean, p50, p90, p99, max) and,
    per cap ``M`` in ``caps``, the share of the passages it drops."""
    k = np.asarray(counts, dtype=np.int64)
    total = int(k.sum())
    if not k.size:
        return PassageDistribution(0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, {int(m): 0.0 for m in caps})
    p50, p90, p99 = (float(x) for x in np.percentile(k, [50, 90, 99]))
    share = {int(m): dropped_passages(k, int(m)) / total if total else 0.0 for m in caps}
    return PassageDistribution(int(k.size), total, total / k.size, p50, p90, p99, int(k.max()),
                               float(np.count_nonzero(k == 0)) / k.size, share)


class DayTally:
    """A consumer of :class:`~producers.trips.EpochPassages` that keeps what a device knows: each
    vehicle's passages so far today (``counts``, the device's own counter for its day cap), and
    per cap ``M`` the passages past each vehicle's ``M``-th, per station and hour (hours from the
    grid's first epoch, which for a local day's grid is local midnight; a 25-hour day's last
    hour is counted in hour 23).

    >>> ep = EpochPassages(0, np.array([0, 2, 3]), np.array([4, 7, 5]), np.ones(3, bool))
    >>> tally = DayTally(8, 2, caps=(1,))
    >>> tally.add(ep); tally.add(ep)
    >>> tally.counts[[4, 7, 0]].tolist(), tally.dropped(1).sum(axis=1).tolist()
    ([2, 2, 0], [2, 1])
    """

    def __init__(self, n_vehicles: int, n_stations: int, caps: Sequence[int] = DEFAULT_CAPS, hours: int = 24) -> None:
        self.counts = np.zeros(n_vehicles, np.int32)
        self.caps = tuple(int(m) for m in caps)
        self.hours = hours
        self._dropped = {m: np.zeros((n_stations, hours), np.int64) for m in self.caps}

    def add(self, ep: EpochPassages) -> None:
        """Count one epoch's passages (epochs in order, each once)."""
        veh = ep.vehicles
        if not veh.size:
            return
        before = self.counts[veh]  # passages earlier today: this one is the (before + 1)-th
        self.counts[veh] = before + 1  # a vehicle passes at most one station an epoch
        hour = min(ep.index * EPOCH_S // 3600, self.hours - 1)
        stations = ep.stations()
        for m, out in self._dropped.items():
            over = before >= m
            if over.any():
                out[:, hour] += np.bincount(stations[over], minlength=out.shape[0])

    def dropped(self, cap: int) -> IntArray:
        """``(stations, hours)``: the passages a per-day cap of ``cap`` drops, where and when."""
        return self._dropped[int(cap)].copy()

    def summary(self) -> PassageDistribution:
        return cap_summary(self.counts, self.caps)


class TripLengths:
    """The passages of each trip in a day, from the epochs' ``started`` flags (a vehicle's trip
    runs from one start to its next, or to the day's end): :meth:`histogram` after the last epoch.

    >>> tl = TripLengths(3)
    >>> tl.add(EpochPassages(0, np.array([0, 2]), np.array([0, 1]), np.array([True, True])))
    >>> tl.add(EpochPassages(1, np.array([0, 2]), np.array([0, 1]), np.array([False, True])))
    >>> tl.histogram().tolist()
    [0, 2, 1]
    """

    def __init__(self, n_vehicles: int) -> None:
        self._current = np.zeros(n_vehicles, np.int32)  # passages of each vehicle's trip so far
        self._lengths = np.zeros(1, np.int64)  # trips ended, by length

    def _record(self, lengths: npt.NDArray[np.int32]) -> None:
        lengths = lengths[lengths > 0]
        if lengths.size:
            got = np.bincount(lengths)
            if got.size > self._lengths.size:
                self._lengths = np.r_[self._lengths, np.zeros(got.size - self._lengths.size, np.int64)]
            self._lengths[:got.size] += got

    def add(self, ep: EpochPassages) -> None:
        starting = ep.vehicles[ep.started]
        self._record(self._current[starting])
        self._current[starting] = 0
        self._current[ep.vehicles] += 1

    def histogram(self) -> IntArray:
        """Trips by their passages (index: passages), the trips still running counted as they are."""
        self._record(self._current)
        self._current[:] = 0
        return self._lengths.copy()

