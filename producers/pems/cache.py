"""The parse cache: a parsed day as npz + JSON, keyed by the file's identity and the
reader arguments (a changed file, or other arguments, is parsed again)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from .five_minute import read_station_5min
from .model import QualityReport, TrafficDay
from .raw import read_station_raw

CACHE_FORMAT_VERSION = 2  # 2: a station dead all day is dead at night too


def load_cached(path: str | Path, cache_dir: str | Path, *, five_minute: bool = False,
                **reader_args: Any) -> TrafficDay:
    """:func:`read_station_raw` (or :func:`read_station_5min`) through a cache in ``cache_dir``.

    The key is the source's absolute path, size and mtime_ns, the reader and its arguments,
    and :data:`CACHE_FORMAT_VERSION`: a changed file (or other arguments) is parsed again. The
    entry holds stations, epochs, flows, flags (npz, uncompressed) and the quality report
    (JSON); metadata is not cached (attach it after loading).
    """
    src = Path(path).absolute()
    st = src.stat()
    args = {k: (v.isoformat() if isinstance(v, date) else v) for k, v in sorted(reader_args.items())}
    ident = json.dumps({"path": str(src), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "args": args,
                        "reader": "5min" if five_minute else "raw", "version": CACHE_FORMAT_VERSION},
                       sort_keys=True)
    key = hashlib.sha256(ident.encode()).hexdigest()[:24]
    folder = Path(cache_dir)
    npz, meta = folder / f"{src.name}.{key}.npz", folder / f"{src.name}.{key}.json"
    if npz.exists() and meta.exists():
        try:
            info = json.loads(meta.read_text())
            if info.get("ident") == ident:
                with np.load(npz, allow_pickle=False) as z:
                    return TrafficDay(z["stations"], z["epochs"], z["flows"], z["flags"],
                                      QualityReport.from_json(info["quality"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged entry is parsed again and rewritten
    day = read_station_5min(src, **reader_args) if five_minute else read_station_raw(src, **reader_args)
    folder.mkdir(parents=True, exist_ok=True)
    # one temporary name per process and thread: two loads of one day at once (a replay thread
    # and the caller) must not rename each other's file away
    tmp = folder / f".{npz.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    with tmp.open("wb") as fh:
        np.savez(fh, stations=day.stations, epochs=day.epochs, flows=day.flows, flags=day.flags)
    os.replace(tmp, npz)
    tmp.write_text(json.dumps({"ident": ident, "quality": day.quality.to_json()}))
    os.replace(tmp, meta)
    return day
