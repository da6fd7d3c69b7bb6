"""A realistic synthetic PeMS day, written in the Station Raw 30-second format.

The embedded default data source: seeded, with AM and PM peaks (or a weekend shape), busy
mainline and quiet ramp stations, 1-5 lanes, Poisson counts per lane, and the glitches of
real files (timestamps off the :00/:30 marks, single-loop lanes without speed, a few empty
rows, a stuck detector, a spike, a dead detector, a block of absent rows). It is read back
with the same reader as real files.
"""

from __future__ import annotations

import gzip
import os
import threading
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .pems import EPOCH_S

__all__ = ["SyntheticDay", "daily_profile", "write_synthetic_day"]

EPOCHS_PER_DAY = 24 * 3600 // EPOCH_S
MAX_LANES = 8


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


class _Tokens:
    """Byte strings looked up by id: the writer assembles lines from token ids, vectorized."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def add(self, texts: list[str]) -> int:
        """Append tokens; returns the id of the first."""
        first = len(self.parts)
        self.parts += [t.encode() for t in texts]
        return first

    def freeze(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        lengths = np.array([len(p) for p in self.parts], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return np.frombuffer(b"".join(self.parts), np.uint8), offsets, lengths


def _assemble_lines(ids: npt.NDArray[np.int64], table: tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64],
                                                              npt.NDArray[np.int64]]) -> bytes:
    """Rows of token ids (each token ends with ``,``) -> lines (the last ``,`` becomes ``\n``)."""
    buf, offsets, lengths = table
    flat = ids.ravel()
    lens = lengths[flat]
    ends = np.cumsum(lens)
    total = int(ends[-1]) if ends.size else 0
    idx = np.repeat(offsets[flat] - (ends - lens), lens) + np.arange(total)
    out = buf[idx]
    out[ends.reshape(ids.shape)[:, -1] - 1] = ord("\n")
    return out.tobytes()


def _temporary(path: Path) -> Path:
    """A temporary name beside ``path``, unique per process and thread."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_synthetic_day(out_dir: str | Path, n_stations: int = 16, seed: int = 2026,
                        day: date = date(2026, 11, 18), weekend: bool | None = None,
                        glitches: bool = True, gzip_output: bool = True) -> SyntheticDay:
    """Write ``dNN_text_station_raw_YYYY_MM_DD.txt[.gz]`` and a metadata file to ``out_dir``.

    ``weekend`` defaults to whether ``day`` is a Saturday or Sunday. Busy mainline stations
    average 20-35 vehicles per 30 s with peaks of 55-80; quiet ones 5-10 (PEMS_FORMAT.md).
    With ``glitches``: about 0.1% empty rows, one detector stuck (lane 1 at 0/1/0 for two
    hours), one spike (63 vehicles on one lane), one dead detector (0/0 on every lane for
    three hours from 01:00) and one block of ten absent rows at one station. Vectorized (a
    3,220-station day in seconds); the same seed gives the same bytes.
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
    share = np.zeros((n_stations, MAX_LANES))
    for j, k in enumerate(lanes):
        share[j, :k] = rng.dirichlet(np.full(int(k), 30.0))

    stuck = (int(rng.integers(n_stations)), int(rng.integers(0, EPOCHS_PER_DAY - 240))) if glitches else None
    spike = (int(rng.integers(n_stations)), int(rng.integers(EPOCHS_PER_DAY))) if glitches else None
    missing = rng.random((EPOCHS_PER_DAY, n_stations)) < (0.001 if glitches else 0.0)
    dead = absent = None
    if glitches:
        others = [j for j in range(n_stations) if stuck is None or j != stuck[0]] or [0]
        dead = (others[int(rng.integers(len(others)))], 120)  # 01:00-04:00
        absent = (int(rng.integers(n_stations)), int(rng.integers(0, EPOCHS_PER_DAY - 10)))

    tokens = _Tokens()
    stamp0 = tokens.add([f"{day:%m/%d/%Y} {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}," for s in range(86_400)])
    station0 = tokens.add([f"{s}," for s in stations])
    num0 = tokens.add([f"{k}," for k in range(1000)])
    occ0 = tokens.add([f"{k / 10_000:.4f},".lstrip("0") for k in range(10_001)])
    empty_tok = tokens.add([","])
    stuck_occ = tokens.add(["1,"])
    table = tokens.freeze()

    name = f"d07_text_station_raw_{day:%Y_%m_%d}.txt" + (".gz" if gzip_output else "")
    raw_path = out / name
    chunks: list[bytes] = []
    cols = np.arange(n_stations)
    step = max(1, 200_000 // n_stations)
    for e0 in range(0, EPOCHS_PER_DAY, step):
        ep = np.arange(e0, min(e0 + step, EPOCHS_PER_DAY))
        n_e = ep.size
        counts = rng.poisson(rate[ep])
        left = counts.copy()
        flow = np.zeros((n_e, n_stations, MAX_LANES), np.int64)
        rest = np.ones(n_stations)
        for k in range(MAX_LANES):
            p = np.where(rest > 1e-12, share[:, k] / np.maximum(rest, 1e-12), 0.0).clip(0, 1)
            p = np.where(k == lanes - 1, 1.0, np.where(k < lanes, p, 0.0))
            flow[:, :, k] = rng.binomial(left, p[None, :])
            left -= flow[:, :, k]
            rest = rest - share[:, k]
        occ = np.minimum(0.95, flow / 180.0 + rng.uniform(0, 0.01, flow.shape))
        occ_id = occ0 + np.rint(occ * 10_000).astype(np.int64)
        speed = np.maximum(5.0, 68 - 0.5 * flow + rng.normal(0, 3, flow.shape))
        speed_id = np.where(single_loop[None, :, None], empty_tok, num0 + np.rint(speed).astype(np.int64))
        has_lane = np.arange(MAX_LANES)[None, None, :] < lanes[None, :, None]
        if spike is not None:
            flow[ep == spike[1], spike[0], 0] = 63
        flow_id = num0 + np.minimum(flow, 999)
        if stuck is not None:
            sel = (ep >= stuck[1]) & (ep < stuck[1] + 240)
            flow_id[sel, stuck[0], 0], occ_id[sel, stuck[0], 0], speed_id[sel, stuck[0], 0] = num0, stuck_occ, num0
        if dead is not None:
            sel = (ep >= dead[1]) & (ep < dead[1] + 360)
            flow_id[sel, dead[0], :] = num0
            occ_id[sel, dead[0], :] = num0
            speed_id[sel, dead[0], :] = np.where(single_loop[dead[0]], empty_tok, num0)
        blank = ~has_lane | missing[ep][:, :, None]
        lane_ids = np.stack([np.where(blank, empty_tok, flow_id), np.where(blank, empty_tok, occ_id),
                             np.where(blank, empty_tok, speed_id)], axis=-1).reshape(n_e, n_stations, 3 * MAX_LANES)
        ids = np.empty((n_e, n_stations, 2 + 3 * MAX_LANES), np.int64)
        ids[:, :, 0] = stamp0 + ep[:, None] * EPOCH_S + offset_s[None, :]
        ids[:, :, 1] = station0 + cols[None, :]
        ids[:, :, 2:] = lane_ids
        keep = np.ones((n_e, n_stations), bool)
        if absent is not None:
            keep[(ep >= absent[1]) & (ep < absent[1] + 10), absent[0]] = False
        chunks.append(_assemble_lines(ids[keep], table))
    # written under a temporary name and renamed: a reader (or a second writer of the same day,
    # e.g. a replay thread and its caller) never sees a half-written file
    raw_tmp = _temporary(raw_path)
    if gzip_output:
        with open(raw_tmp, "wb") as raw_fh, \
                gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw_fh, mtime=0) as fh:
            for chunk in chunks:
                fh.write(chunk)  # mtime 0: the same seed gives the same bytes
    else:
        raw_tmp.write_bytes(b"".join(chunks))
    os.replace(raw_tmp, raw_path)

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
    meta_tmp = _temporary(meta_path)
    meta_tmp.write_text("\n".join(rows) + "\n")
    os.replace(meta_tmp, meta_path)  # last: a day whose metadata exists is complete
    return SyntheticDay(raw_path, meta_path, tuple(int(s) for s in stations), day)
