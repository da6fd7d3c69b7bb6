"""One round of a producer's privatized reports, typed by its shape. Pure numpy.

A round is one of four shapes, each a frozen dataclass that knows its wire layout
(``schemas.wire``: ``layout``, and the batch ``kind`` it travels as), its wire arrays
(:meth:`arrays`, the dict ``encode_batch`` takes), how many reports it stands for
(``n_reports``) and how it is cut into batches of at most ``size`` reports (:meth:`chunks`,
each a round of the same type):

* :class:`Values` -- a station-valued mechanism's reports, one station index per vehicle;
* :class:`Pairs` -- a per-sensor mechanism's non-default (station, output) pairs;
* :class:`Bitmaps` -- a bit-valued per-sensor round as one row of bits per vehicle (the
  device path's: :class:`~estimators.per_station.BitReports`' ``rows`` and ``n_set``);
* :class:`Counts` -- the exact tally of ``n`` vehicles' reports (tally mode).

The consumer's side: :func:`round_from_arrays`, a decoded record's arrays as its round (the
worker's, before :meth:`~estimators.MechanismSpec.accumulate` counts it); :func:`empty_round`, a
round of no reports; :func:`expand_counts`, counts of reports as those reports in a uniformly random
order (the shuffler's permuted release: it holds only counts).

>>> r = Values(np.array([3, 0, 1, 2, 2]))
>>> r.layout, r.kind, r.n_reports, sorted(r.arrays())
('values', 'reports', 5, ['value'])
>>> [c.value.tolist() for c in r.chunks(2)]
[[3, 0], [1, 2], [2]]
>>> Counts(np.array([4, 1, 0]), n=5).n_reports, [c.n for c in Counts(np.array([4, 1, 0]), n=5).chunks(2)]
(5, [5])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from ._types import IntArray
from .per_station import BitReports, SparseReports

__all__ = ["Bitmaps", "Counts", "Pairs", "Round", "SpecError", "Values", "empty_round", "expand_counts",
           "round_from_arrays"]

WireLayout = Literal["values", "pairs", "counts"]  # estimators.registry.Layout
WireKind = Literal["reports", "tally"]

_POPCOUNT = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)


class SpecError(ValueError):
    """Reports that do not fit a mechanism's layout; ``reason`` is a short code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _starts(n: int, size: int) -> range:
    """Where each batch of at most ``size`` of ``n`` reports starts (none when ``n`` is 0)."""
    if size < 1:
        raise ValueError(f"a batch holds at least one report, not {size}")
    return range(0, n, size)


@dataclass(frozen=True, eq=False)
class Values:
    """A station-valued round: ``value[i]`` is the i-th report sent (a station index, 0 = none)."""

    value: npt.NDArray[np.integer]
    layout: ClassVar[WireLayout] = "values"
    kind: ClassVar[WireKind] = "reports"

    @property
    def n_reports(self) -> int:
        return int(self.value.size)

    def arrays(self) -> dict[str, npt.NDArray[np.integer]]:
        return {"value": self.value}

    def chunks(self, size: int) -> Iterator[Values]:
        for s in _starts(self.value.size, size):
            yield Values(self.value[s:s + size])


@dataclass(frozen=True, eq=False)
class Pairs:
    """A per-sensor round's non-default reports: pair i says ``output[i]`` about ``station[i]`` (1..V).

    >>> p = Pairs(np.array([2, 1, 3]), np.array([1, 1, 2]))
    >>> p.n_reports, [(c.station.tolist(), c.output.tolist()) for c in p.chunks(2)]
    (3, [([2, 1], [1, 1]), ([3], [2])])
    >>> p.sparse(np.array([1, 0, 0]), 3).vehicle.tolist()
    [1, 0, 0]
    """

    station: npt.NDArray[np.integer]
    output: npt.NDArray[np.integer]
    layout: ClassVar[WireLayout] = "pairs"
    kind: ClassVar[WireKind] = "reports"

    @property
    def n_reports(self) -> int:
        return int(self.station.size)

    def arrays(self) -> dict[str, npt.NDArray[np.integer]]:
        return {"station": self.station, "output": self.output}

    def chunks(self, size: int) -> Iterator[Pairs]:
        for s in _starts(self.station.size, size):
            yield Pairs(self.station[s:s + size], self.output[s:s + size])

    def sparse(self, vehicle: IntArray, n_stations: int) -> SparseReports:
        """The pairs with the vehicle behind each (device side: ``vehicle`` never leaves the
        simulator); ``n_stations`` is not needed (the signature is :meth:`Bitmaps.sparse`'s)."""
        return SparseReports(vehicle=vehicle, station=np.asarray(self.station, dtype=np.int64),
                             output=np.asarray(self.output, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class Bitmaps:
    """A bit-valued per-sensor round (outputs {0, 1}, default 0) as one bitmap per vehicle:
    ``rows[i]`` is vehicle i's V bits (:class:`~estimators.per_station.BitReports`' layout);
    ``n_set`` how many bits are set, the pairs it stands for. Its reports reach the reports
    topic as pairs (``layout``), after the shuffler; the device path sends the rows as they are.

    >>> b = Bitmaps(np.array([[0b101], [0b010], [0b000]], dtype=np.uint8), 3)
    >>> b.n_reports, [(c.rows.shape[0], c.n_set) for c in b.chunks(2)]
    (3, [(2, 3), (1, 0)])
    >>> s = b.sparse(np.arange(3), 3)
    >>> s.vehicle.tolist(), s.station.tolist()
    ([0, 0, 1], [1, 3, 2])
    """

    rows: npt.NDArray[np.uint8]
    n_set: int
    layout: ClassVar[WireLayout] = "pairs"
    kind: ClassVar[WireKind] = "reports"

    @property
    def n_reports(self) -> int:
        return self.n_set

    def arrays(self) -> dict[str, npt.NDArray[np.integer]]:
        return {"bitmap": self.rows}

    def chunks(self, size: int) -> Iterator[Bitmaps]:
        """Batches of at most ``size`` vehicles' rows (each its set bits' count)."""
        for s in _starts(self.rows.shape[0], size):
            rows = self.rows[s:s + size]
            yield Bitmaps(rows, int(np.bincount(rows.ravel(), minlength=256) @ _POPCOUNT))

    def sparse(self, vehicle: IntArray, n_stations: int) -> SparseReports:
        """The set bits as (vehicle, station, 1) pairs by vehicle then station: row i is vehicle i,
        so ``vehicle`` is not read (the signature is :meth:`Pairs.sparse`'s)."""
        return BitReports(self.rows, self.n_set, n_stations).to_sparse()


@dataclass(frozen=True, eq=False)
class Counts:
    """An exact tally of ``n`` vehicles' reports (the wire's kind ``tally``): one record, never cut."""

    counts: npt.NDArray[np.integer]
    n: int
    layout: ClassVar[WireLayout] = "counts"
    kind: ClassVar[WireKind] = "tally"

    @property
    def n_reports(self) -> int:
        return self.n

    def arrays(self) -> dict[str, npt.NDArray[np.integer]]:
        return {"counts": self.counts}

    def chunks(self, size: int) -> Iterator[Counts]:
        yield self


Round: TypeAlias = Values | Pairs | Bitmaps | Counts


def round_from_arrays(layout: str, arrays: Mapping[str, npt.NDArray[np.integer]], reports: int) -> Round:
    """A decoded record's arrays (``schemas.wire``: its ``layout`` and the arrays it names) as its
    round; ``reports`` is the header's count, what a tally stands for (a :class:`Counts`' ``n``).
    Whether the round fits a query is :meth:`~estimators.MechanismSpec.accumulate`'s question.
    :class:`SpecError` ``wrong_layout`` for a layout the wire does not have.

    >>> round_from_arrays("pairs", {"station": np.array([2]), "output": np.array([1])}, 1).n_reports
    1
    >>> round_from_arrays("counts", {"counts": np.array([2, 1])}, 3).n
    3
    >>> round_from_arrays("bits", {}, 0)
    Traceback (most recent call last):
    ...
    estimators.reports.SpecError: wrong_layout: bits is not a wire layout (values, pairs or counts)
    """
    if layout == "values":
        return Values(arrays["value"])
    if layout == "pairs":
        return Pairs(arrays["station"], arrays["output"])
    if layout == "counts":
        return Counts(arrays["counts"], reports)
    raise SpecError("wrong_layout", f"{layout} is not a wire layout (values, pairs or counts)")


def empty_round(per_sensor: bool) -> Values | Pairs:
    """A round of no reports, station-valued or (``per_sensor``) pairs.

    >>> empty_round(False).arrays(), empty_round(True).n_reports
    ({'value': array([], dtype=int64)}, 0)
    """
    if per_sensor:
        return Pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    return Values(np.zeros(0, np.int64))


def expand_counts(counts: IntArray, rng: np.random.Generator, per_sensor: bool, n_outputs: int) -> Values | Pairs:
    """The reports ``counts`` counts, in a uniformly random order (one ``rng.permutation`` of
    them all, sorted first: the order depends on the counts and ``rng`` only).

    Station-valued, ``counts[v]`` reports of value ``v``; per-sensor, ``counts[s * n_outputs + o]``
    pairs (station ``s``, report ``o``) -- ``n_outputs`` is read only then.

    >>> expand_counts(np.array([0, 2, 1]), np.random.default_rng(0), False, 3).value.tolist()
    [2, 1, 1]
    >>> p = expand_counts(np.array([0, 0, 0, 1, 0, 2]), np.random.default_rng(0), True, 3)
    >>> sorted(zip(p.station.tolist(), p.output.tolist()))
    [(1, 0), (1, 2), (1, 2)]
    """
    keys = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    keys = keys[rng.permutation(keys.size)]
    if not per_sensor:
        return Values(keys)
    station, output = np.divmod(keys, n_outputs)  # one key per pair: station * O + output
    return Pairs(station, output)
