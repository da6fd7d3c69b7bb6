"""Readers for Caltrans PeMS Station Raw (30 s), Station 5-Minute and station metadata files.

Real files are messy (``shared/reference/PEMS_FORMAT.md``): timestamps off the :00/:30 marks,
empty lanes and rows, stuck detectors, impossible spikes, stations missing from metadata.
Readers never crash on a bad row: they skip or flag it and count why in a
:class:`QualityReport`. Ground truth per station and epoch = flow summed over the usable lanes.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import IO
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt

__all__ = [
    "EPOCH_S",
    "PACIFIC",
    "QualityReport",
    "StationMeta",
    "TrafficDay",
    "epoch_of",
    "epoch_start",
    "read_metadata",
    "read_station_5min",
    "read_station_raw",
]

EPOCH_S = 30
PACIFIC = ZoneInfo("America/Los_Angeles")
MAX_LANES = 8
DEFAULT_SPIKE_PER_LANE = 40  # vehicles per lane per 30 s; ~4,800 veh/h/lane is not physical


def epoch_of(ts: datetime) -> int:
    """Absolute epoch index of an aware timestamp: Unix seconds // 30."""
    return int(ts.timestamp()) // EPOCH_S


def epoch_start(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch * EPOCH_S, tz=PACIFIC)


@dataclass
class QualityReport:
    """What a reader did with a file: rows read, used, skipped (and why), lanes flagged."""

    source: str
    rows_read: int = 0
    rows_used: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    lanes_flagged: Counter[str] = field(default_factory=Counter)
    stations_without_metadata: int = 0

    @property
    def rows_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        parts = [f"{self.source}: {self.rows_read} rows read, {self.rows_used} used, {self.rows_skipped} skipped"]
        if self.skipped:
            parts.append("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(self.skipped.items())))
        if self.lanes_flagged:
            parts.append("lanes flagged: " + ", ".join(f"{k}={v}" for k, v in sorted(self.lanes_flagged.items())))
        if self.stations_without_metadata:
            parts.append(f"{self.stations_without_metadata} stations not in the metadata (replayed anyway)")
        return "; ".join(parts)


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


@dataclass
class TrafficDay:
    """Per-station flows per epoch: ``flows[i, j]`` = vehicles at ``stations[j]`` in
    epoch ``epochs[i]`` (absolute epoch indices, consecutive)."""

    stations: npt.NDArray[np.int64]
    epochs: npt.NDArray[np.int64]
    flows: npt.NDArray[np.int64]
    quality: QualityReport
    meta: dict[int, StationMeta] = field(default_factory=dict)

    def peak_total(self) -> int:
        """The largest number of vehicles at monitored stations in any one epoch."""
        return int(self.flows.sum(axis=1).max()) if self.flows.size else 0

    def attach_metadata(self, meta: dict[int, StationMeta]) -> None:
        self.meta = meta
        self.quality.stations_without_metadata = int(sum(1 for s in self.stations if int(s) not in meta))


def _open_text(path: str | Path) -> IO[str]:
    p = Path(path)
    with p.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    if gz:
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", errors="replace", newline="")
    return p.open("r", encoding="utf-8", errors="replace", newline="")


@lru_cache(maxsize=1 << 16)
def _parse_ts(text: str) -> datetime:
    """Parse ``MM/DD/YYYY HH:MM:SS`` (Pacific). Cached: a file repeats each stamp per station."""
    t = text.strip()
    if len(t) != 19 or t[2] != "/" or t[5] != "/" or t[10] != " ":
        raise ValueError(f"bad timestamp {text!r}")
    return datetime(int(t[6:10]), int(t[0:2]), int(t[3:5]), int(t[11:13]), int(t[14:16]), int(t[17:19]),
                    tzinfo=PACIFIC)


@lru_cache(maxsize=1 << 16)
def _epoch_of_stamp(text: str) -> int:
    return epoch_of(_parse_ts(text))


def _num(text: str) -> float | None:
    t = text.strip()
    return None if t == "" else float(t)


def _assemble(cells: dict[tuple[int, int], int], quality: QualityReport) -> TrafficDay:
    if not cells:
        return TrafficDay(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, 0), np.int64), quality)
    epochs_seen = np.array(sorted({e for e, _ in cells}), dtype=np.int64)
    stations = np.array(sorted({s for _, s in cells}), dtype=np.int64)
    epochs = np.arange(epochs_seen[0], epochs_seen[-1] + 1, dtype=np.int64)
    flows = np.zeros((epochs.size, stations.size), dtype=np.int64)
    s_idx = {int(s): j for j, s in enumerate(stations)}
    for (e, s), f in cells.items():
        flows[e - epochs[0], s_idx[s]] = f
    return TrafficDay(stations, epochs, flows, quality)


def read_station_raw(path: str | Path, spike_per_lane: int = DEFAULT_SPIKE_PER_LANE) -> TrafficDay:
    """Read a Station Raw 30-second file (26 fields: timestamp, station, 8 x flow/occ/speed).

    Timestamps are binned to 30-second epochs. Per lane: an empty flow means no such lane;
    flow 0 with occupancy >= 0.99 and speed 0 is a stuck detector and a flow above
    ``spike_per_lane`` is an impossible spike -- both are flagged and left out of the truth.
    A second reading of the same station in the same epoch is skipped as a duplicate.
    """
    quality = QualityReport(source=str(path))
    cells: dict[tuple[int, int], int] = {}
    with _open_text(path) as fh:
        for row in csv.reader(fh):
            quality.rows_read += 1
            reason = _raw_row(row, cells, quality, spike_per_lane)
            if reason:
                quality.skipped[reason] += 1
            else:
                quality.rows_used += 1
    return _assemble(cells, quality)


def _raw_row(row: list[str], cells: dict[tuple[int, int], int], quality: QualityReport,
             spike_per_lane: int) -> str | None:
    n_fields = len(row)
    if n_fields == 0 or not "".join(row).strip():
        return "blank_line"
    if n_fields < 2 or n_fields > 2 + 3 * MAX_LANES:
        return "bad_field_count"
    try:
        epoch = _epoch_of_stamp(row[0])
    except ValueError:
        return "bad_timestamp"
    try:
        station = int(row[1])
    except ValueError:
        return "bad_station_id"
    total = 0
    present = 0
    flags: list[str] = []
    for k in range(2, n_fields, 3):
        flow_text = row[k].strip()
        if not flow_text:
            continue
        occ_text = row[k + 1].strip() if k + 1 < n_fields else ""
        speed_text = row[k + 2].strip() if k + 2 < n_fields else ""
        try:
            flow = float(flow_text)
            occ = float(occ_text) if occ_text else None
            speed = float(speed_text) if speed_text else None
        except ValueError:
            return "bad_number"
        if not all(math.isfinite(v) for v in (flow, occ, speed) if v is not None):
            return "bad_number"  # float() also takes "nan", "inf", "1e400"
        present += 1
        if flow < 0 or (occ is not None and not 0 <= occ <= 1):
            flags.append("out_of_range")
        elif flow == 0 and occ is not None and occ >= 0.99 and speed == 0:
            flags.append("stuck")
        elif flow > spike_per_lane:
            flags.append("spike")
        else:
            total += int(round(flow))
    if present == 0:
        return "empty_row"
    key = (epoch, station)
    if key in cells:
        # Local timestamps carry no offset: on the autumn DST day the hour 01:00-02:00 comes
        # twice. A second reading of such an ambiguous stamp is the later (standard-time) one.
        later = epoch_of(_parse_ts(row[0]).replace(fold=1))
        if later == epoch or (later, station) in cells:
            return "duplicate_epoch"
        key = (later, station)
    for f in flags:
        quality.lanes_flagged[f] += 1
    cells[key] = total
    return None


def read_station_5min(path: str | Path) -> TrafficDay:
    """Read a Station 5-Minute file; each 5-minute Total Flow is spread evenly over its ten
    30-second epochs (integer split, the remainder to the first epochs)."""
    quality = QualityReport(source=str(path))
    cells: dict[tuple[int, int], int] = {}
    with _open_text(path) as fh:
        for row in csv.reader(fh):
            quality.rows_read += 1
            reason = _five_min_row(row, cells)
            if reason:
                quality.skipped[reason] += 1
            else:
                quality.rows_used += 1
    return _assemble(cells, quality)


def _five_min_row(row: list[str], cells: dict[tuple[int, int], int]) -> str | None:
    if not row or all(not c.strip() for c in row):
        return "blank_line"
    if len(row) < 12:
        return "bad_field_count"
    try:
        ts = _parse_ts(row[0])
        station = int(row[1])
    except ValueError:
        return "bad_timestamp_or_station"
    try:
        total = _num(row[9])
        if total is None:  # fall back to the lane flows
            lane_flows = [_num(row[13 + 5 * k]) for k in range((len(row) - 12) // 5)]
            known = [f for f in lane_flows if f is not None]
            if not known:
                return "empty_row"
            total = float(sum(known))
    except ValueError:
        return "bad_number"
    if not math.isfinite(total):
        return "bad_number"
    if total < 0:
        return "out_of_range"
    first = epoch_of(ts)
    if (first, station) in cells:
        return "duplicate_epoch"
    base, extra = divmod(int(round(total)), 10)
    for i in range(10):
        cells[(first + i, station)] = base + (1 if i < extra else 0)
    return None


def read_metadata(path: str | Path) -> tuple[dict[int, StationMeta], QualityReport]:
    """Read a station metadata file (tab-separated, one header row, 18 columns)."""
    quality = QualityReport(source=str(path))
    meta: dict[int, StationMeta] = {}
    with _open_text(path) as fh:
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader, None)
        if header is None:
            return meta, quality
        col = {name.strip().lower(): i for i, name in enumerate(header)}
        if "id" not in col:
            quality.skipped["no_id_column"] += 1
            return meta, quality
        for row in reader:
            quality.rows_read += 1
            entry = _meta_row(row, col)
            if isinstance(entry, str):
                quality.skipped[entry] += 1
                continue
            meta[entry.station] = entry
            quality.rows_used += 1
    return meta, quality


def _meta_row(row: list[str], col: dict[str, int]) -> StationMeta | str:
    if not row or all(not c.strip() for c in row):
        return "blank_line"

    def get(name: str) -> str:
        i = col.get(name)
        return row[i].strip() if i is not None and i < len(row) else ""

    try:
        station = int(get("id"))
    except ValueError:
        return "bad_station_id"

    def opt_float(name: str) -> float | None:
        try:
            return float(get(name)) if get(name) else None
        except ValueError:
            return None

    lanes_text = get("lanes")
    return StationMeta(
        station=station, freeway=get("fwy"), direction=get("dir"), district=get("district"),
        lane_type=get("type"), lanes=int(lanes_text) if lanes_text.isdigit() else None, name=get("name"),
        latitude=opt_float("latitude"), longitude=opt_float("longitude"),
    )
