"""A realistic synthetic PeMS day, written in the Station Raw 30-second format.

The embedded default data source: seeded, with AM and PM peaks (or a weekend shape), busy
mainline and quiet ramp stations, 1-5 lanes, Poisson counts per lane, and the glitches of
real files (timestamps off the :00/:30 marks, single-loop lanes without speed, a few missing
rows, a stuck detector, a spike). It is read back with the same reader as real files.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .pems import EPOCH_S, PACIFIC

__all__ = ["SyntheticDay", "daily_profile", "write_synthetic_day"]

EPOCHS_PER_DAY = 24 * 3600 // EPOCH_S


def daily_profile(weekend: bool = False) -> npt.NDArray[np.float64]:
    """Relative traffic intensity over the 2,880 epochs of a day, peak = 1."""
    h = np.arange(EPOCHS_PER_DAY) * EPOCH_S / 3600.0

    def bump(centre: float, width: float) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = np.exp(-0.5 * ((h - centre) / width) ** 2)
        return out

    if weekend:
        shape = 0.08 + 0.75 * bump(13.5, 3.5) + 0.15 * bump(19.0, 2.0)
    else:
        shape = 0.06 + 0.95 * bump(7.75, 1.2) + 0.7 * bump(12.5, 2.8) + 1.0 * bump(17.25, 1.5)
    out: npt.NDArray[np.float64] = shape / shape.max()
    return out


@dataclass(frozen=True)
class SyntheticDay:
    raw_path: Path
    meta_path: Path
    stations: tuple[int, ...]
    day: date


def write_synthetic_day(out_dir: str | Path, n_stations: int = 16, seed: int = 2026,
                        day: date = date(2026, 11, 18), weekend: bool | None = None,
                        glitches: bool = True, gzip_output: bool = True) -> SyntheticDay:
    """Write ``dNN_text_station_raw_YYYY_MM_DD.txt[.gz]`` and a metadata file to ``out_dir``.

    ``weekend`` defaults to whether ``day`` is a Saturday or Sunday. Busy mainline stations
    average 20-35 vehicles per 30 s with peaks of 55-80; quiet ones 5-10 (PEMS_FORMAT.md).
    """
    if n_stations < 1:
        raise ValueError("n_stations must be >= 1")
    rng = np.random.default_rng(seed)
    weekend = day.weekday() >= 5 if weekend is None else weekend
    profile = daily_profile(weekend)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    stations = 700_000 + np.sort(rng.choice(90_000, size=n_stations, replace=False)) + 10_000
    mainline = rng.random(n_stations) < 0.7
    lanes = np.where(mainline, rng.integers(3, 6, n_stations), rng.integers(1, 3, n_stations))
    # station peak intensity (vehicles per 30 s at the profile's peak)
    peak = np.where(mainline, rng.uniform(45, 66, n_stations), rng.uniform(10, 22, n_stations))
    peak = np.minimum(peak, 16.0 * lanes)  # keep lanes physical (< ~2,000 veh/h/lane)
    single_loop = rng.random(n_stations) < 0.25  # no speed measurement
    offset_s = rng.integers(0, EPOCH_S, n_stations)  # readings at e.g. hh:mm:21 and hh:mm:51
    rate = profile[:, None] * peak[None, :] * rng.lognormal(0, 0.08, (EPOCHS_PER_DAY, n_stations))
    lane_share = [rng.dirichlet(np.full(int(k), 30.0)) for k in lanes]
    start = datetime(day.year, day.month, day.day, tzinfo=PACIFIC)

    stuck = (int(rng.integers(n_stations)), int(rng.integers(0, EPOCHS_PER_DAY - 240))) if glitches else None
    spike = (int(rng.integers(n_stations)), int(rng.integers(EPOCHS_PER_DAY))) if glitches else None
    missing = rng.random((EPOCHS_PER_DAY, n_stations)) < (0.001 if glitches else 0.0)

    name = f"d07_text_station_raw_{day:%Y_%m_%d}.txt" + (".gz" if gzip_output else "")
    raw_path = out / name
    lines: list[str] = []
    for e in range(EPOCHS_PER_DAY):
        ts_base = start + timedelta(seconds=e * EPOCH_S)
        counts = rng.poisson(rate[e])
        for j in range(n_stations):
            ts = ts_base + timedelta(seconds=int(offset_s[j]))
            stamp = ts.strftime("%m/%d/%Y %H:%M:%S")
            if missing[e, j]:
                lines.append(f"{stamp},{stations[j]}" + "," * 24)  # an empty row
                continue
            per_lane = rng.multinomial(counts[j], lane_share[j])
            fields: list[str] = []
            for k in range(8):
                if k >= lanes[j]:
                    fields += ["", "", ""]
                    continue
                flow = int(per_lane[k])
                occ = min(0.95, flow / 180.0 + rng.uniform(0, 0.01))
                speed = "" if single_loop[j] else f"{max(5.0, 68 - 0.5 * flow + rng.normal(0, 3)):.0f}"
                if stuck and j == stuck[0] and stuck[1] <= e < stuck[1] + 240 and k == 0:
                    fields += ["0", "1", "0"]
                    continue
                if spike and j == spike[0] and e == spike[1] and k == 0:
                    flow = 63
                fields += [str(flow), f"{occ:.4f}".lstrip("0"), speed]
            lines.append(f"{stamp},{stations[j]}," + ",".join(fields))
    data = ("\n".join(lines) + "\n").encode()
    if gzip_output:
        with open(raw_path, "wb") as raw_fh, \
                gzip.GzipFile(filename="", mode="wb", compresslevel=5, fileobj=raw_fh, mtime=0) as fh:
            fh.write(data)  # mtime 0: the same seed gives the same bytes
    else:
        raw_path.write_bytes(data)

    meta_path = out / f"d07_text_meta_{day:%Y_%m_%d}.txt"
    header = ["ID", "Fwy", "Dir", "District", "County", "City", "State_PM", "Abs_PM", "Latitude", "Longitude",
              "Length", "Type", "Lanes", "Name", "User_ID_1", "User_ID_2", "User_ID_3", "User_ID_4"]
    rows = ["\t".join(header)]
    for j in range(n_stations):
        fwy = int(rng.choice([5, 10, 101, 110, 405, 605]))
        rows.append("\t".join([
            str(stations[j]), str(fwy), str(rng.choice(["N", "S", "E", "W"])), "7", "37", "",
            f"R{rng.uniform(0, 60):.1f}", f"{rng.uniform(0, 60):.3f}",
            f"{34 + rng.uniform(-0.3, 0.3):.6f}", f"{-118.3 + rng.uniform(-0.4, 0.4):.6f}",
            "" if j % 5 == 0 else f"{rng.uniform(0.2, 1.5):.3f}",
            "ML" if mainline[j] else str(rng.choice(["OR", "FR"])), str(lanes[j]),
            f"Synthetic {j + 1}", "", "", "", "",
        ]))
    meta_path.write_text("\n".join(rows) + "\n")
    return SyntheticDay(raw_path, meta_path, tuple(int(s) for s in stations), day)
