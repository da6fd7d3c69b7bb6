"""Readers for Caltrans PeMS Station Raw (30 s), Station 5-Minute and station metadata files.

Real files are messy (docs/wire.md, "Input data, fleet and queries"): timestamps off the :00/:30 marks,
empty lanes and rows, stuck detectors, impossible spikes, dead detectors, missing rows, files
spanning more than one day, stations missing from metadata. Readers never crash on a bad row:
they skip or flag it and count why in a :class:`QualityReport`.

Ground truth per station and epoch = flow summed over the usable lanes, **only where**
:attr:`TrafficDay.has_truth`: every cell of the (epochs x stations) grid also carries a
bitmask in :attr:`TrafficDay.flags` (``CELL_*``). Missing is not zero: a cell without a
reading is ``CELL_MISSING`` (its flow is 0 only because the simulation needs a number).

Files are read by content, not by name: gzip, bz2, xz, zip (one member) or plain text.
The Station Raw reader is vectorized, with an exact per-row fallback to the row logic for
any line the fast path cannot handle, so every skip reason is counted as the row logic
counts it. A file streams through it: gzip is decompressed piece by piece in a read-ahead
thread while a pool of threads parses chunks of whole lines (numpy releases the GIL) --
bytes up to ``,`` found in one pass, decimals read eight bytes at a time -- and the rows are
placed on the grid chunk by chunk (a 3,220-station day, 9.3M rows: ~5 s on 2 cores, about
3x the time just to decompress it). :func:`load_cached` keeps a parsed day as npz + JSON.

One module per job:

- :mod:`~producers.pems.model`: the day model (:class:`TrafficDay`, :class:`QualityReport`,
  :class:`StationMeta`, the ``CELL_*`` bits, :func:`day_epochs`);
- :mod:`~producers.pems.streams`: compression by content, the streamed gzip, chunks of whole
  lines, the read-ahead thread;
- :mod:`~producers.pems.swar`, :mod:`~producers.pems.decimals`, :mod:`~producers.pems.stamps`:
  eight bytes at a time -- the byte-lane constants, decimals, timestamps;
- :mod:`~producers.pems.fast`: the fast path over a chunk; :mod:`~producers.pems.rows`: the row
  logic for the lines it leaves; :mod:`~producers.pems.records`: the rows both produce;
- :mod:`~producers.pems.grid`: rows to the grid, duplicates, day selection, dead detectors;
- :mod:`~producers.pems.raw`: the Station Raw reader (the parse thread pool);
- :mod:`~producers.pems.five_minute`, :mod:`~producers.pems.metadata`: the other two readers;
- :mod:`~producers.pems.cache`: :func:`load_cached`.
"""

from __future__ import annotations

from schemas.epochs import EPOCH_S, PACIFIC, epoch_of, epoch_start  # the one epoch clock

from .cache import CACHE_FORMAT_VERSION, load_cached
from .five_minute import read_station_5min
from .metadata import read_metadata
from .model import (
    CELL_DEAD,
    CELL_MISSING,
    CELL_OUT_OF_RANGE_LANE,
    CELL_SPIKE_LANE,
    CELL_STUCK_LANE,
    DEFAULT_DEAD_RUN_EPOCHS,
    DEFAULT_SPIKE_PER_LANE,
    MAX_LANES,
    MAX_SPAN_EPOCHS,
    NO_TRUTH,
    QualityReport,
    StationMeta,
    TrafficDay,
    day_epochs,
)
from .raw import read_station_raw
from .streams import read_bytes

__all__ = [
    "CACHE_FORMAT_VERSION",
    "CELL_DEAD",
    "CELL_MISSING",
    "CELL_OUT_OF_RANGE_LANE",
    "CELL_SPIKE_LANE",
    "CELL_STUCK_LANE",
    "DEFAULT_DEAD_RUN_EPOCHS",
    "DEFAULT_SPIKE_PER_LANE",
    "EPOCH_S",
    "MAX_LANES",
    "MAX_SPAN_EPOCHS",
    "NO_TRUTH",
    "PACIFIC",
    "QualityReport",
    "StationMeta",
    "TrafficDay",
    "day_epochs",
    "epoch_of",
    "epoch_start",
    "load_cached",
    "read_bytes",
    "read_metadata",
    "read_station_5min",
    "read_station_raw",
]
