"""The station metadata reader (tab-separated, one header row): a :class:`StationMeta` per
station id, bad rows skipped and counted."""

from __future__ import annotations

import csv
from pathlib import Path

from .model import QualityReport, StationMeta
from .streams import text_io


def read_metadata(path: str | Path) -> tuple[dict[int, StationMeta], QualityReport]:
    """Read a station metadata file (tab-separated, one header row, 18 columns)."""
    quality = QualityReport(source=str(path))
    meta: dict[int, StationMeta] = {}
    with text_io(path) as fh:
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
        latitude=opt_float("latitude"), longitude=opt_float("longitude"), abs_postmile=opt_float("abs_pm"),
    )
