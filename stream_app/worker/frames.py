"""Estimate frames: one closed epoch of one query version as ONE Arrow IPC stream message (pure,
no I/O). The header travels once, in the schema's metadata; the columns once per station.

Schema version :data:`FRAME_SCHEMA_VERSION` (docs/wire.md, "Estimate frames"):

* metadata ``ptt.frame_schema_version``: ``"2"``;
* metadata ``ptt.header``: a JSON object -- the fields every per-row estimate record of the epoch
  shares (:meth:`~stream_app.worker.estimate.EpochResult.header`: ``query_id``, ``query_version``,
  ``mechanism``, ``epoch``, ``epoch_start``, ``reports``, ``participants``, ``epsilon``,
  ``withheld``, ``closed_by``, ``round_count_mismatch``, ``late``, ``refused``,
  ``missing_batches``) plus ``withheld_code``, ``retracted``, ``estimators`` and
  ``confidences`` (which name the columns), and the optional ``epsilon_shuffled``, ``span_s``
  and ``release`` (added within version 2: a header from before them lacks them, read as null,
  30 and null);
* columns: ``station`` (int64), ``no_source_data`` (bool), and per estimator ``E``:
  ``E.estimate``, ``E.sd`` and, per confidence level ``c``, ``E.lower[c]`` and ``E.upper[c]``
  (float64; ``c`` written as in the rows, e.g. ``0.95``); then per estimator ``E.consistent``
  (float64, null where the rows' ``consistent`` is null). A withheld epoch's estimator
  columns are all null; otherwise they hold exactly the floats the rows carry (a NaN stays NaN),
  null where a row has no number (a rollup's station without source data: its ``estimate`` is
  null and its ``bounds`` empty).
  Version 1 (no ``E.consistent`` columns) is still read: its rows' ``consistent`` is null.

:func:`frame_rows` gives back the per-row records as plain dicts (what ``json.loads`` of each
row gives) and :func:`frame_estimates` as :class:`schemas.estimates.Estimate` objects, in the
rows' order; :func:`long_table` is the long form ``ptt subscribe --parquet`` keeps.

>>> from datetime import UTC, datetime, timedelta
>>> import numpy as np
>>> from schemas import Query
>>> from stream_app.worker.estimate import EpochResult, StationEstimates
>>> t0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
>>> q = Query(query_id="sp-day", analyst_id="a", version=1, sensors=(400001, 400002), mechanism="sp",
...           population=100, t_start=t0, t_end=t0 + timedelta(hours=1))
>>> one = np.array([[1.0, 2.0]])
>>> res = EpochResult(query=q, epoch=59_832_960, closed_by="markers", confidences=(0.95,), participants=40,
...                   reports=80, round_reports=[40, 40], late=0, refused=0, missing_batches=0, withheld=None,
...                   values={"sp_difference": StationEstimates(np.array([3.5, -0.5]), np.array([1.0, 0.5]),
...                                                             one - 1, one + 4)})
>>> frame = decode_frame(encode_frame(res))
>>> frame.table.column_names
['station', 'no_source_data', 'sp_difference.estimate', 'sp_difference.sd', 'sp_difference.lower[0.95]', \
'sp_difference.upper[0.95]', 'sp_difference.consistent']
>>> [(e.station, e.estimate, e.bounds[0].upper) for e in frame_estimates(frame)]
[(400001, 3.5, 5.0), (400002, -0.5, 6.0)]
>>> decode_frame(b"not a frame")
Traceback (most recent call last):
...
ValueError: not an Arrow IPC estimate frame: ...
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.epochs import EPOCH_S, PACIFIC
from schemas.estimates import Estimate

from .estimate import EpochResult

__all__ = ["FRAME_SCHEMA_VERSION", "LONG_SCHEMA", "Frame", "decode_frame", "encode_frame", "frame_estimates",
           "frame_rows", "long_table"]

FRAME_SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: no ``E.consistent`` columns
VERSION_KEY = b"ptt.frame_schema_version"
HEADER_KEY = b"ptt.header"


def column_names(estimator: str, confidences: list[float]) -> list[str]:
    """The float64 columns of one estimator, in order."""
    levels = [json.dumps(c) for c in confidences]
    return [f"{estimator}.estimate", f"{estimator}.sd", *(f"{estimator}.lower[{c}]" for c in levels),
            *(f"{estimator}.upper[{c}]" for c in levels)]


def consistent_names(estimators: list[str], version: int = FRAME_SCHEMA_VERSION) -> list[str]:
    """The ``E.consistent`` columns that follow every estimator's own (none in version 1)."""
    return [f"{e}.consistent" for e in estimators] if version >= 2 else []


def _consistent_array(res: EpochResult, name: str) -> pa.Array:
    v = None if res.withheld is not None else res.values[name].consistent
    if v is None:
        return pa.nulls(res.query.n_stations, pa.float64())
    gap = np.array([i + 1 in res.no_source_data for i in range(res.query.n_stations)], dtype=bool)
    return pa.array(v, pa.float64(), mask=gap)


def _header(res: EpochResult) -> dict[str, Any]:
    return {**res.header(), "withheld_code": res.withheld_code, "retracted": res.retracted,
            "estimators": list(res.query.spec.estimator_names), "confidences": list(res.confidences)}


def _estimator_arrays(res: EpochResult, name: str) -> list[pa.Array]:
    n = res.query.n_stations
    if res.withheld is not None:
        return [pa.nulls(n, pa.float64())] * (2 + 2 * len(res.confidences))
    v = res.values[name]
    blank = np.array([i + 1 in res.blank for i in range(n)], dtype=bool) if res.blank else None
    return [pa.array(a, pa.float64(), mask=blank) for a in (v.estimate, v.sd, *v.lower, *v.upper)]


def encode_frame(res: EpochResult) -> bytes:
    """One closed epoch's result as one Arrow IPC stream (schema, one record batch, end)."""
    q = res.query
    header = _header(res)
    names, arrays = ["station", "no_source_data"], [
        pa.array(q.sensors, pa.int64()),
        pa.array([i + 1 in res.no_source_data for i in range(q.n_stations)], pa.bool_())]
    for name in header["estimators"]:
        names += column_names(name, header["confidences"])
        arrays += _estimator_arrays(res, name)
    names += consistent_names(header["estimators"])
    arrays += [_consistent_array(res, name) for name in header["estimators"]]
    meta = {VERSION_KEY: str(FRAME_SCHEMA_VERSION).encode(), HEADER_KEY: json.dumps(header).encode()}
    batch = pa.RecordBatch.from_arrays(arrays, names=names).replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@dataclass(frozen=True)
class Frame:
    """A decoded frame: the header (the JSON object of ``ptt.header``) and the per-station table."""

    header: dict[str, Any]
    table: pa.Table
    version: int = FRAME_SCHEMA_VERSION

    @property
    def estimators(self) -> list[str]:
        return list(self.header["estimators"])

    @property
    def confidences(self) -> list[float]:
        return [float(c) for c in self.header["confidences"]]


HEADER_FIELDS = ("query_id", "query_version", "mechanism", "epoch", "epoch_start", "reports", "participants",
                 "epsilon", "withheld", "closed_by", "round_count_mismatch", "late", "refused", "missing_batches",
                 "withheld_code", "retracted", "estimators", "confidences")


def _check(header: Any, table: pa.Table, version: int) -> None:
    if not isinstance(header, dict) or (missing := [f for f in HEADER_FIELDS if f not in header]):
        raise ValueError(f"estimate frame header lacks {missing if isinstance(header, dict) else HEADER_FIELDS}")
    want = ["station", "no_source_data"]
    for name in header["estimators"]:
        want += column_names(name, header["confidences"])
    want += consistent_names(header["estimators"], version)
    if table.column_names != want:
        raise ValueError(f"estimate frame columns {table.column_names} are not the header's {want}")


def decode_frame(data: bytes) -> Frame:
    """The frame in ``data``; a ValueError (one line) if it is not a frame of a known version."""
    try:
        with pa.ipc.open_stream(data) as reader:
            table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"not an Arrow IPC estimate frame: {exc}") from None
    meta = table.schema.metadata or {}
    version = meta.get(VERSION_KEY)
    if version is None:
        raise ValueError("not an estimate frame: its schema has no ptt.frame_schema_version")
    known = {str(v).encode(): v for v in READABLE_VERSIONS}
    if version not in known:
        raise ValueError(f"estimate frame schema version {version.decode(errors='replace')}; this reader knows "
                         f"version {FRAME_SCHEMA_VERSION} (and {READABLE_VERSIONS[0]}) (upgrade the reader)")
    try:
        header = json.loads(meta.get(HEADER_KEY, b""))
    except ValueError:
        raise ValueError("estimate frame header is not a JSON object") from None
    _check(header, table, known[version])
    return Frame(header, table, known[version])


SHARED = HEADER_FIELDS[:14]  # the header fields a per-row estimate record repeats
# shared fields added within a version, and what their absence reads as
OPTIONAL_SHARED: dict[str, Any] = {"epsilon_shuffled": None, "span_s": EPOCH_S, "release": None}


def frame_rows(frame: Frame) -> Iterator[dict[str, Any]]:
    """The per-row estimate records, as dicts equal to ``json.loads`` of the rows, in the rows'
    order (estimator by estimator, station by station)."""
    h = frame.header
    common = {"kind": "estimate", **{f: h[f] for f in SHARED}, **{f: h.get(f, d) for f, d in OPTIONAL_SHARED.items()}}
    cols = frame.table.to_pydict()
    quality = ["no_source_data" if flag else "ok" for flag in cols["no_source_data"]]
    for name in frame.estimators:
        est, sd, *bounds = (cols[c] for c in column_names(name, frame.confidences))
        lows, ups = bounds[:len(frame.confidences)], bounds[len(frame.confidences):]
        levels = [] if h["withheld"] is not None else list(enumerate(frame.confidences))
        cons = cols.get(f"{name}.consistent") or [None] * len(cols["station"])
        for i, station in enumerate(cols["station"]):
            yield {**common, "estimator": name, "station": station, "estimate": est[i], "sd": sd[i],
                   "bounds": [{"confidence": c, "lower": lows[j][i], "upper": ups[j][i]} for j, c in levels
                              if est[i] is not None],  # a station without a number has no bounds
                   "consistent": cons[i], "data_quality": quality[i]}


def frame_estimates(frame: Frame) -> list[Estimate]:
    """The frame as the :class:`~schemas.estimates.Estimate` records the rows topic carries
    (a NaN is refused as the rows' JSON is)."""
    return [Estimate.model_validate(row) for row in frame_rows(frame)]


_BOUND = pa.struct([("confidence", pa.float64()), ("lower", pa.float64()), ("upper", pa.float64())])
#: the long form: one row per (query, epoch, station, estimator) with the header's fields
LONG_SCHEMA = pa.schema([
    ("query_id", pa.string()), ("query_version", pa.int64()), ("mechanism", pa.string()), ("epoch", pa.int64()),
    ("epoch_start", pa.timestamp("ms", tz=str(PACIFIC))), ("station", pa.int64()), ("estimator", pa.string()),
    ("estimate", pa.float64()), ("sd", pa.float64()), ("bounds", pa.list_(_BOUND)), ("data_quality", pa.string()),
    ("reports", pa.int64()), ("participants", pa.int64()), ("epsilon", pa.float64()), ("withheld", pa.string()),
    ("withheld_code", pa.string()), ("closed_by", pa.string()), ("round_count_mismatch", pa.int64()),
    ("late", pa.int64()), ("refused", pa.int64()), ("missing_batches", pa.int64()), ("retracted", pa.bool_()),
    ("consistent", pa.float64()), ("epsilon_shuffled", pa.float64()), ("span_s", pa.int64()),
    ("release", pa.string()),
])


def long_table(frame: Frame) -> pa.Table:
    """The frame in long form (:data:`LONG_SCHEMA`), built column-wise: its rows' values,
    ``epoch_start`` as a timestamp (the same instant), plus ``withheld_code``, ``retracted`` and
    ``consistent`` (null from a version-1 frame), ``epsilon_shuffled``, ``span_s`` and ``release``
    (null, 30 and null from a frame whose header lacks them)."""
    parts = [_long_part(frame, name) for name in frame.estimators]
    return pa.concat_tables(parts) if parts else LONG_SCHEMA.empty_table()


def _bounds(frame: Frame, cols: list[str]) -> pa.Array:
    t, n, c = frame.table, frame.table.num_rows, len(frame.confidences)
    if frame.header["withheld"] is not None:
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], _BOUND))
    has = ~np.asarray(t.column(cols[0]).is_null().to_numpy(zero_copy_only=False), dtype=bool)  # blank: no bounds
    low = np.stack([t.column(x).to_numpy(zero_copy_only=False) for x in cols[2:2 + c]], axis=1)[has].ravel()
    up = np.stack([t.column(x).to_numpy(zero_copy_only=False) for x in cols[2 + c:]], axis=1)[has].ravel()
    level = np.tile(np.array(frame.confidences, np.float64), int(has.sum()))
    values = pa.StructArray.from_arrays([level, low, up], fields=list(_BOUND))
    offsets = np.concatenate([[0], np.cumsum(has.astype(np.int32) * c)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _long_part(frame: Frame, name: str) -> pa.Table:
    h, t = frame.header, frame.table
    cols = column_names(name, frame.confidences)
    given = {"station": t.column("station"), "estimator": pa.repeat(pa.scalar(name), t.num_rows),
             "estimate": t.column(cols[0]), "sd": t.column(cols[1]), "bounds": _bounds(frame, cols),
             "data_quality": pc.if_else(t.column("no_source_data"), "no_source_data", "ok"),
             "consistent": (t.column(f"{name}.consistent") if f"{name}.consistent" in t.column_names
                            else pa.nulls(t.num_rows, pa.float64())),
             "epoch_start": pa.repeat(pa.scalar(h["epoch"] * EPOCH_S * 1000, LONG_SCHEMA.field("epoch_start").type),
                                      t.num_rows)}
    return pa.table({f.name: given[f.name] if f.name in given
                     else pa.repeat(pa.scalar(_header_value(h, f.name), f.type), t.num_rows)
                     for f in LONG_SCHEMA}, schema=LONG_SCHEMA)


def _header_value(h: dict[str, Any], name: str) -> Any:
    return h.get(name, OPTIONAL_SHARED[name]) if name in OPTIONAL_SHARED else h[name]
