"""The day model: a station-by-epoch grid of flows with a ``CELL_*`` bitmask per cell
(:class:`TrafficDay`), the :class:`QualityReport` of what a reader did with a file, station
metadata (:class:`StationMeta`) and the local-day epoch ranges (docs/wire.md, "Input data,
fleet and queries").

Ground truth per station and epoch = flow summed over the usable lanes, **only where**
:attr:`TrafficDay.has_truth`. Missing is not zero: a cell without a reading is
``CELL_MISSING`` (its flow is 0 only because the simulation needs a number).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.epochs import PACIFIC, epoch_of, epoch_start  # the one epoch clock

MAX_LANES = 8
DEFAULT_SPIKE_PER_LANE = 40  # vehicles per lane per 30 s; ~4,800 veh/h/lane is not physical
DEFAULT_DEAD_RUN_EPOCHS = 120  # one hour of 0/0 on every lane while the rest of the file has traffic
MAX_SPAN_EPOCHS = 31 * 2880  # a grid longer than a month is a garbage timestamp, not a file

CELL_MISSING = 1  # no usable reading at all (no row, an empty row, a skipped row)
CELL_DEAD = 2  # dead detector: 0/0 on every lane for >= dead_run_epochs while others have traffic,
#                or in every reading of a local day on which others had traffic (the night too)
CELL_STUCK_LANE = 4  # some lane was stuck (flow 0, occupancy >= .99, speed 0) and left out
CELL_SPIKE_LANE = 8  # some lane had an impossible flow and was left out
CELL_OUT_OF_RANGE_LANE = 16  # some lane had a negative flow or occupancy outside 0..1, left out
NO_TRUTH = CELL_MISSING | CELL_DEAD


def day_epochs(day: date) -> tuple[int, int]:
    """``[first, stop)`` epochs of a local (Pacific) calendar day: 2,880 epochs, or 2,760 /
    3,000 on the spring / autumn DST days.

    >>> a, b = day_epochs(date(2012, 11, 4)); b - a
    3000
    """
    nxt = day + timedelta(days=1)
    first = epoch_of(datetime(day.year, day.month, day.day, tzinfo=PACIFIC))
    return first, epoch_of(datetime(nxt.year, nxt.month, nxt.day, tzinfo=PACIFIC))


def local_days(epochs: list[npt.NDArray[np.int64]]) -> list[date]:
    """The distinct local calendar days of absolute epochs (vectorized: one boundary per day)."""
    epochs = [e for e in epochs if e.size]
    if not epochs:
        return []
    lo, hi = min(int(e.min()) for e in epochs), max(int(e.max()) for e in epochs)
    d0 = epoch_start(lo).date()
    d1 = epoch_start(hi).date()
    days = [d0 + timedelta(days=k) for k in range((d1 - d0).days + 1)]
    bounds = np.array([day_epochs(d)[0] for d in days], dtype=np.int64)
    held = np.zeros(len(days), bool)
    for e in epochs:
        held[np.searchsorted(bounds, e, side="right") - 1] = True
    return [days[int(i)] for i in np.flatnonzero(held)]


@dataclass
class QualityReport:
    """What a reader did with a file: rows read, used, skipped (and why), lanes flagged, and
    what the cell grid holds (missing cells, dead cells and stations, cells with left-out lanes)."""

    source: str
    rows_read: int = 0
    rows_used: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    lanes_flagged: Counter[str] = field(default_factory=Counter)
    stations_without_metadata: int = 0
    missing_cells: int = 0
    dead_cells: int = 0
    dead_stations: int = 0
    stuck_lane_cells: int = 0
    spike_lane_cells: int = 0
    days_in_file: list[str] = field(default_factory=list)  # ISO dates holding used rows
    day_selected: str | None = None

    @property
    def rows_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        parts = [f"{self.source}: {self.rows_read} rows read, {self.rows_used} used, {self.rows_skipped} skipped"]
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())))
        if self.lanes_flagged:
            parts.append("lanes flagged: " + ", ".join(f"{k}={v}" for k, v in sorted(self.lanes_flagged.items())))
        if self.missing_cells or self.dead_cells or self.stuck_lane_cells or self.spike_lane_cells:
            parts.append(f"cells without truth: {self.missing_cells} missing, {self.dead_cells} dead "
                         f"({self.dead_stations} stations dead all file); cells with lanes left out: "
                         f"{self.stuck_lane_cells} stuck, {self.spike_lane_cells} spike")
        if self.day_selected is not None and self.rows_used == 0:
            held = ", ".join(self.days_in_file) or "no usable rows at all"
            parts.append(f"no rows on {self.day_selected}; the file holds {held}")
        elif len(self.days_in_file) > 1:
            parts.append("the file holds " + ", ".join(self.days_in_file)
                         + (f" (read {self.day_selected})" if self.day_selected else ""))
        if self.stations_without_metadata:
            parts.append(f"{self.stations_without_metadata} stations not in the metadata (replayed anyway)")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "rows_read": self.rows_read, "rows_used": self.rows_used,
                "skipped": dict(self.skipped), "lanes_flagged": dict(self.lanes_flagged),
                "stations_without_metadata": self.stations_without_metadata,
                "missing_cells": self.missing_cells, "dead_cells": self.dead_cells,
                "dead_stations": self.dead_stations, "stuck_lane_cells": self.stuck_lane_cells,
                "spike_lane_cells": self.spike_lane_cells, "days_in_file": list(self.days_in_file),
                "day_selected": self.day_selected}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QualityReport:
        return cls(**{**d, "skipped": Counter(d["skipped"]), "lanes_flagged": Counter(d["lanes_flagged"])})


@dataclass(frozen=True)
class StationMeta:
    station: int
    freeway: str = ""
    direction: str = ""
    district: str = ""
    lane_type: str = ""
    lanes: int | None = None
    name: str = ""
    latitude: float | None = None
    longitude: float | None = None
    abs_postmile: float | None = None  # the file's ``Abs_PM``: miles along the freeway, increasing N/E


@dataclass
class TrafficDay:
    """Per-station flows per epoch on a full grid: ``flows[i, j]`` = vehicles at
    ``stations[j]`` in epoch ``epochs[i]`` (absolute epoch indices, consecutive).

    ``flows`` is ground truth **only where** :attr:`has_truth`; a ``CELL_MISSING`` or
    ``CELL_DEAD`` cell holds 0 because the simulation needs a number, not because 0
    vehicles passed. ``flags[i, j]`` is the ``CELL_*`` bitmask of that cell.
    """

    stations: npt.NDArray[np.int64]
    epochs: npt.NDArray[np.int64]
    flows: npt.NDArray[np.int64]
    flags: npt.NDArray[np.uint8]
    quality: QualityReport
    meta: dict[int, StationMeta] = field(default_factory=dict)

    @property
    def has_truth(self) -> npt.NDArray[np.bool_]:
        """True where ``flows`` is a real count: neither missing nor a dead detector."""
        out: npt.NDArray[np.bool_] = (self.flags & NO_TRUTH) == 0
        return out

    def peak_total(self) -> int:
        """The largest number of vehicles at monitored stations in any one epoch."""
        return int(self.flows.sum(axis=1).max()) if self.flows.size else 0

    def attach_metadata(self, meta: dict[int, StationMeta]) -> None:
        self.meta = meta
        self.quality.stations_without_metadata = int(sum(1 for s in self.stations if int(s) not in meta))
