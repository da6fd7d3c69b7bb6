"""Estimate frames (``stream_app.worker.frames``): a frame carries exactly the per-row JSON values.

Each :class:`EpochResult` here is built directly (no window): estimator arrays of seeded random
floats over the full float64 range of the estimators' outputs (negative estimates, -0.0, tiny
and large magnitudes, full-mantissa values), a seeded subset of stations without source data,
at 1, 16 and 3,220 stations, for a one-estimator (SP) and a four-estimator (ALP) query, with
two and three confidence levels. The rows (``EpochResult.render``, what the rows topic carries)
are the reference: ``json.loads`` of each row must equal the frame's row exactly (the same
floats, not approximately), and the frame's ``Estimate`` objects must equal the rows' models.
Withheld epochs (and a withdrawal), an infinite-epsilon query (epsilon null), a NaN standard
deviation, the versioned schema (version 2 adds the ``E.consistent`` columns; a version-1 frame
still reads, its ``consistent`` null) and malformed bytes are checked too. Deterministic: no
statistics, every assertion an identity.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from schemas import Query
from schemas.estimates import Estimate
from stream_app.worker.estimate import EpochResult, StationEstimates
from stream_app.worker.frames import (
    FRAME_SCHEMA_VERSION,
    LONG_SCHEMA,
    decode_frame,
    encode_frame,
    frame_estimates,
    frame_rows,
    long_table,
)
from tests.paths import ROOT

T0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
EPOCH = int(T0.timestamp()) // 30 + 7
SEED = 20261123
COUNTS = (1, 16, 3220)


def make_query(n: int, mechanism: str = "alp", **params: float) -> Query:
    return Query(query_id=f"q-{mechanism}", analyst_id="a", version=3, sensors=tuple(400_000 + 7 * i for i in range(n)),
                 mechanism=mechanism, params=params, population=50_000, t_start=T0, t_end=T0 + timedelta(hours=1))


def floats(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Full-mantissa floats of many magnitudes and signs (from 3 values on, a -0.0 and a subnormal)."""
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-12, 7, size=shape)
    flat = x.reshape(-1)
    if flat.size > 2:
        flat[1], flat[-1] = -0.0, 5e-324
    return x


def make_result(q: Query, confidences: tuple[float, ...] = (0.95, 0.99), withheld: str | None = None,
                seed: int = 0, **kw: Any) -> EpochResult:
    rng = np.random.default_rng([SEED, q.n_stations, seed])
    v, c = q.n_stations, len(confidences)
    values = {} if withheld else {
        name: StationEstimates(floats(rng, (v,)), np.abs(floats(rng, (v,))), floats(rng, (c, v)), floats(rng, (c, v)),
                               np.abs(floats(rng, (v,))))
        for name in q.spec.estimator_names}
    nsd = frozenset(int(i) + 1 for i in np.flatnonzero(rng.random(v) < 0.2))
    return EpochResult(query=q, epoch=EPOCH, closed_by="watermark", confidences=confidences, participants=4_321,
                       reports=8_650, round_reports=[4_321, 4_329], late=3, refused=11, missing_batches=0,
                       withheld=withheld, no_source_data=nsd, values=values, **kw)


def rows_of(res: EpochResult) -> list[dict[str, Any]]:
    return [json.loads(value) for _, value in res.render()]


def frame_of(res: EpochResult) -> list[dict[str, Any]]:
    return list(frame_rows(decode_frame(encode_frame(res))))


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("mechanism,confidences", [("alp", (0.95, 0.99)), ("sp", (0.8, 0.95, 0.99))])
def test_a_frame_carries_exactly_the_rows_values(n: int, mechanism: str, confidences: tuple[float, ...]) -> None:
    res = make_result(make_query(n, mechanism), confidences)
    rows = rows_of(res)
    got = frame_of(res)
    assert len(got) == len(rows) == res.n_records()
    assert got == rows  # same order, same fields, the same floats (== on floats: exact)
    assert any(r["data_quality"] == "no_source_data" for r in rows) or n == 1
    frame = decode_frame(encode_frame(res))
    assert frame.table.num_rows == n  # one row per station; the header once, in the metadata
    assert frame_estimates(frame) == [Estimate.model_validate_json(value) for _, value in res.render()]
    nulls = sum(r["consistent"] is None for r in rows)  # exactly the stations without source data
    assert nulls == sum(r["data_quality"] == "no_source_data" for r in rows)
    assert (nulls < len(rows) or n == 1) and all(r["consistent"] is None for r in rows if r["data_quality"] != "ok")


@pytest.mark.parametrize("n", COUNTS)
def test_a_withheld_epoch_says_what_the_rows_say(n: int) -> None:
    res = make_result(make_query(n), withheld="fewer than 20 participating vehicles (7)",
                      withheld_code="too_few_participants")
    rows = rows_of(res)
    assert all(r["estimate"] is None and r["sd"] is None and r["bounds"] == [] for r in rows)
    assert frame_of(res) == rows
    frame = decode_frame(encode_frame(res))
    assert frame.header["withheld_code"] == "too_few_participants" and frame.header["retracted"] is False
    assert all(frame.table.column(c).null_count == n for c in frame.table.column_names[2:])


def test_a_withdrawal_is_marked_retracted() -> None:
    res = make_result(make_query(16, "sp"), withheld="withdrawn: a later end-of-epoch marker contradicts ...",
                      withheld_code="conflicting_markers", retracted=True)
    frame = decode_frame(encode_frame(res))
    assert frame.header["retracted"] is True and list(frame_rows(frame)) == rows_of(res)


def test_an_infinite_epsilon_is_null_in_both() -> None:
    q = make_query(16, "rr", pi2=0.0)
    assert q.epsilon == math.inf
    res = make_result(q)
    rows = rows_of(res)
    assert rows[0]["epsilon"] is None and frame_of(res) == rows


def test_a_nan_stays_nan_and_is_refused_as_the_rows_refuse_it() -> None:
    res = make_result(make_query(16, "sp"))
    res.values["sp_difference"].sd[[2, 9]] = math.nan
    # the row says ``"sd":nan`` (Python's repr: not JSON; Python's json reads ``NaN``)
    rows = [json.loads(value.replace(b":nan,", b":NaN,")) for _, value in res.render()]
    got = frame_of(res)
    for r, g in zip(rows, got, strict=True):
        if isinstance(r["sd"], float) and math.isnan(r["sd"]):
            assert math.isnan(g["sd"])
            r["sd"] = g["sd"] = "NaN"
    assert sum(r["sd"] == "NaN" for r in rows) == 2 and got == rows
    with pytest.raises(ValidationError):
        Estimate.model_validate_json(res.render()[2][1])
    with pytest.raises(ValidationError):
        frame_estimates(decode_frame(encode_frame(res)))


# the documented schema (docs/wire.md, "Estimate frames"): a change needs a new version
ALP_COLUMNS = ["station", "no_source_data"] + [
    f"{e}.{c}" for e in ("alp_yhat", "alp_bottom", "alp_average", "alp_gls")
    for c in ("estimate", "sd", "lower[0.95]", "lower[0.99]", "upper[0.95]", "upper[0.99]")] + [
    f"{e}.consistent" for e in ("alp_yhat", "alp_bottom", "alp_average", "alp_gls")]


def test_the_schema_is_versioned_and_documented() -> None:
    assert FRAME_SCHEMA_VERSION == 2
    data = encode_frame(make_result(make_query(16)))
    schema = pa.ipc.open_stream(data).schema
    assert schema.metadata[b"ptt.frame_schema_version"] == b"2"
    assert schema.names == ALP_COLUMNS
    assert [str(t) for t in schema.types] == ["int64", "bool"] + ["double"] * 28
    header = json.loads(schema.metadata[b"ptt.header"])
    assert sorted(header) == sorted(["query_id", "query_version", "mechanism", "epoch", "epoch_start", "reports",
                                     "participants", "epsilon", "withheld", "closed_by", "round_count_mismatch",
                                     "late", "refused", "missing_batches", "withheld_code", "retracted",
                                     "estimators", "confidences", "epsilon_shuffled", "span_s", "release"])
    wire = (ROOT / "docs" / "wire.md").read_text()
    assert "ptt.frame_schema_version" in wire and f"version {FRAME_SCHEMA_VERSION}" in wire
    assert all(f"`{k}`" in wire for k in header)


def _with_metadata(data: bytes, meta: dict[bytes, bytes]) -> bytes:
    table = pa.ipc.open_stream(data).read_all()
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _without_column(data: bytes) -> bytes:
    table = pa.ipc.open_stream(data).read_all()
    table = table.drop_columns(["alp_gls.sd"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


GOOD = encode_frame(make_result(make_query(16)))
HEADER = json.loads(pa.ipc.open_stream(GOOD).schema.metadata[b"ptt.header"])


@pytest.mark.parametrize("data,message", [
    (b"", "not an Arrow IPC estimate frame"),
    (b"{\"kind\": \"estimate\"}", "not an Arrow IPC estimate frame"),
    (GOOD[:len(GOOD) // 2], "not an Arrow IPC estimate frame"),
    (_with_metadata(GOOD, {b"ptt.frame_schema_version": b"3"}), "schema version 3; this reader knows version 2"),
    (_with_metadata(GOOD, {b"ptt.frame_schema_version": b"1"}), "columns"),  # version 1 has no E.consistent
    (_with_metadata(GOOD, {b"ptt.header": b"{not json"}),
     "header is not a JSON object"),
    (_with_metadata(GOOD, {b"ptt.header": json.dumps({k: v for k, v in HEADER.items() if k != "epoch"}).encode()}),
     "header lacks ['epoch']"),
    (_without_column(GOOD), "columns"),
])
def test_malformed_bytes_give_a_clear_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_frame(data)


def test_a_stream_without_a_version_is_not_a_frame() -> None:
    sink = pa.BufferOutputStream()
    table = pa.table({"station": [1, 2]})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ValueError, match="no ptt.frame_schema_version"):
        decode_frame(bytes(sink.getvalue().to_pybytes()))


@pytest.mark.parametrize("withheld", [None, "missing_batches: 2 batch(es) never arrived"])
def test_the_long_form_holds_the_rows_values(withheld: str | None) -> None:
    res = make_result(make_query(16), withheld=withheld, withheld_code="missing_batches" if withheld else None)
    table = long_table(decode_frame(encode_frame(res)))
    assert table.schema == LONG_SCHEMA
    rows = rows_of(res)
    got = table.to_pylist()
    assert len(got) == len(rows)
    for r, g in zip(rows, got, strict=True):
        assert g["epoch_start"] == datetime.fromisoformat(r["epoch_start"])
        assert g["withheld_code"] == res.withheld_code and g["retracted"] is False
        assert {k: g[k] for k in r if k not in ("kind", "epoch_start")} == {
            k: v for k, v in r.items() if k not in ("kind", "epoch_start")}


def _as_version_1(data: bytes) -> bytes:
    """The frame a version-1 writer sent: no ``E.consistent`` columns, version ``1``."""
    table = pa.ipc.open_stream(data).read_all()
    table = table.drop_columns([c for c in table.column_names if c.endswith(".consistent")])
    return _with_metadata(_write(table), {b"ptt.frame_schema_version": b"1"})


def _write(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_a_version_1_frame_still_reads_with_consistent_null() -> None:
    res = make_result(make_query(16))
    frame = decode_frame(_as_version_1(encode_frame(res)))
    assert frame.version == 1
    rows = rows_of(res)
    assert any(r["consistent"] is not None for r in rows)
    assert list(frame_rows(frame)) == [{**r, "consistent": None} for r in rows]
    assert long_table(frame).column("consistent").null_count == len(rows)
