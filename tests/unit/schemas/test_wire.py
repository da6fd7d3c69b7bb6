"""The wire contract (``schemas``): byte encoding, decode errors, the Query model, and the
privacy of the message models themselves.

* ``encode_batch``/``decode_record`` round trips for the three layouts (``values``,
  ``pairs``, ``counts``), with index dtypes chosen by size (u1/u2/u4) and the documented
  frame (``PTT1``, 4-byte big-endian header length, JSON header, little-endian arrays);
* JSON round trips of ``SingleReport``, ``EndOfEpoch``, ``GroundTruth``;
* every decode failure is a :class:`WireError` with the right reason code;
* ``Query`` validation, and ``Query.epsilon`` equal to the statistics core's epsilon;
* THE PRIVACY SCHEMA TEST: no message model has a field that could carry a vehicle
  identifier, a per-vehicle key or a link between rounds -- by name (deny-list, and every
  ``*_id`` field is one of four justified ids) and by structure (``extra="forbid"``, JSON
  Schemas with ``additionalProperties: false``, no per-report timestamps, array names
  limited to the four report arrays), and batch ids are random uuid4 values.

No randomness is asserted on statistically, except uniqueness of 2,000 uuid4 values
(collision probability ~1e-32).
"""

from __future__ import annotations

import json
import re
import struct
import types
import typing
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

import estimators as E
from producers.replay import active_queries
from schemas import (
    MAGIC,
    ArraySpec,
    BatchHeader,
    DecodedBatch,
    DeviceReport,
    EndOfEpoch,
    GroundTruth,
    Query,
    SingleReport,
    WireError,
    decode_device_report,
    decode_record,
    encode_batch,
    encode_json,
    json_schemas,
    new_batch_id,
)

T0 = datetime(2026, 11, 18, 8, 0, tzinfo=UTC)
PACIFIC = ZoneInfo("America/Los_Angeles")
BATCH_ID = "0123456789abcdef0123456789abcdef"


def header(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"kind": "reports", "query_id": "q-wire", "query_version": 2, "epoch": 59_000_000,
                            "round": 1, "batch_id": BATCH_ID, "producer_id": "p0-1a2b3c4d", "reports": 5,
                            "layout": "values", "n_stations": 3, "n_outputs": 4}
    base.update(overrides)
    return base


def frame(head: dict[str, Any] | bytes, *blobs: bytes) -> bytes:
    """A binary record built by hand (no validation): magic, length, header, arrays."""
    h = head if isinstance(head, bytes) else json.dumps(head).encode()
    return MAGIC + struct.pack(">I", len(h)) + h + b"".join(blobs)


def spec(name: str, dtype: str, length: int) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "length": length}


def make_query(**overrides: Any) -> Query:
    fields: dict[str, Any] = {"query_id": "q-wire", "analyst_id": "analyst-1", "version": 1,
                              "sensors": (500001, 500004, 500010), "mechanism": "sp", "params": {},
                              "population": 47_719, "t_start": T0, "t_end": T0 + timedelta(hours=2)}
    fields.update(overrides)
    return Query(**fields)


def wire_error(value: bytes | None) -> WireError:
    with pytest.raises(WireError) as info:
        decode_record(value)
    err = info.value
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"{err.reason}: ") and err.detail
    return err


# ---------------------------------------------------------------------------------------
# Binary round trips
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n_stations", "dtype"), [
    (1, "u1"), (3, "u1"), (255, "u1"), (256, "u2"), (3220, "u2"), (65_535, "u2"), (65_536, "u4"), (100_000, "u4"),
])
def test_values_round_trip_with_smallest_dtype(n_stations: int, dtype: str) -> None:
    rng = np.random.default_rng(n_stations)
    values = rng.integers(0, n_stations + 1, size=37)
    values[0], values[1] = 0, n_stations  # both ends of the range
    rec = encode_batch(header(n_stations=n_stations, n_outputs=n_stations + 1, reports=37), {"value": values})
    out = decode_record(rec)
    assert isinstance(out, DecodedBatch)
    assert out.header.arrays == (ArraySpec.model_validate({"name": "value", "dtype": dtype, "length": 37}),)
    assert out.header.layout == "values" and out.header.reports == 37
    assert out.arrays["value"].dtype == np.int64
    assert np.array_equal(out.arrays["value"], values)
    # the documented frame: magic, big-endian header length, JSON header, little-endian array
    assert rec[:4] == b"PTT1"
    (hlen,) = struct.unpack(">I", rec[4:8])
    assert json.loads(rec[8:8 + hlen])["batch_id"] == BATCH_ID
    assert rec[8 + hlen:] == values.astype(np.dtype(dtype).newbyteorder("<")).tobytes()


def test_pairs_round_trip() -> None:
    station = np.array([1, 300, 17, 300, 2], dtype=np.int64)
    output = np.array([1, 0, 1, 1, 0], dtype=np.int64)
    rec = encode_batch(header(layout="pairs", n_stations=300, n_outputs=3, round=0),
                       {"station": station, "output": output})
    out = decode_record(rec)
    assert isinstance(out, DecodedBatch)
    assert [(s.name, s.dtype, s.length) for s in out.header.arrays] == [("station", "u2", 5), ("output", "u1", 5)]
    assert np.array_equal(out.arrays["station"], station) and np.array_equal(out.arrays["output"], output)


@pytest.mark.parametrize(("n_stations", "n_outputs", "size"), [(3, 4, 4), (20, 3, 60), (1, 2, 2)])
def test_counts_round_trip(n_stations: int, n_outputs: int, size: int) -> None:
    counts = (np.arange(size, dtype=np.int64) * 123_456_789) % 10_000_000_019  # beyond 32 bits too
    rec = encode_batch(header(kind="tally", layout="counts", n_stations=n_stations, n_outputs=n_outputs,
                              reports=10_000_000), {"counts": counts})
    out = decode_record(rec)
    assert isinstance(out, DecodedBatch)
    assert out.header.kind == "tally" and out.header.arrays[0].dtype == "i8"
    assert np.array_equal(out.arrays["counts"], counts)


def test_empty_batch_round_trips() -> None:
    out = decode_record(encode_batch(header(reports=0), {"value": np.zeros(0, dtype=np.int64)}))
    assert isinstance(out, DecodedBatch) and out.arrays["value"].size == 0
    out = decode_record(encode_batch(header(layout="pairs", reports=0, n_outputs=3),
                                     {"station": np.zeros(0, np.int64), "output": np.zeros(0, np.int64)}))
    assert isinstance(out, DecodedBatch) and out.arrays["station"].size == 0


def test_header_round_trips_exactly() -> None:
    rec = encode_batch(header(), {"value": np.array([0, 1, 2, 3, 3])})
    out = decode_record(rec)
    assert isinstance(out, DecodedBatch)
    assert out.header.model_dump(exclude={"arrays"}) == header()


# ---------------------------------------------------------------------------------------
# JSON round trips
# ---------------------------------------------------------------------------------------
JSON_RECORDS: list[SingleReport | EndOfEpoch | GroundTruth] = [
    SingleReport(query_id="q-wire", query_version=1, epoch=59_000_000, round=1, batch_id=new_batch_id(), value=3),
    SingleReport(query_id="q-wire", query_version=1, epoch=59_000_000, batch_id=new_batch_id(),
                 pairs=((1, 1), (7, 0))),
    EndOfEpoch(producer_id="p1-abcdef01", producer_index=1, producer_count=4, query_id="q-wire", query_version=3,
               epoch=59_000_001, round=0, partition=5, reports_to_partition=120, batches_to_partition=2,
               reports_total=980, batches_total=12, participants=980, refused=20, mode="per-vehicle"),
    EndOfEpoch(producer_id="p0", producer_index=0, producer_count=1, query_id="q", query_version=1, epoch=0, round=1,
               partition=0, reports_to_partition=0, batches_to_partition=0, reports_total=0, batches_total=0,
               participants=0, refused=0, mode="tally", interrupted=True),
    GroundTruth(epoch=59_000_000, epoch_start=datetime(2026, 1, 23, 0, 0, tzinfo=PACIFIC),
                stations=(500001, 500004), flows=(1, 3)),
]


@pytest.mark.parametrize("record", JSON_RECORDS, ids=lambda r: type(r).__name__)
def test_json_records_round_trip(record: SingleReport | EndOfEpoch | GroundTruth) -> None:
    raw = encode_json(record)
    assert raw[:1] == b"{"
    back = decode_record(raw)
    assert type(back) is type(record)
    assert back == record
    assert json.loads(raw)["kind"] == record.kind


def test_ground_truth_keeps_the_instant() -> None:
    gt = GroundTruth(epoch=1, epoch_start=datetime(2026, 7, 4, 12, 0, tzinfo=PACIFIC), stations=(1,), flows=(2,))
    back = decode_record(encode_json(gt))
    assert isinstance(back, GroundTruth) and back.evaluation_only is True
    assert back.epoch_start == gt.epoch_start and back.epoch_start.utcoffset() == timedelta(hours=-7)


# ---------------------------------------------------------------------------------------
# Decode errors: WireError with the right reason
# ---------------------------------------------------------------------------------------
GOOD_VALUES = np.array([0, 1, 2, 3, 3], dtype=np.uint8).tobytes()


@pytest.mark.parametrize("value", [b"", None])
def test_empty_value(value: bytes | None) -> None:
    assert wire_error(value).reason == "empty"


@pytest.mark.parametrize("value", [b"\x00\x01\x02\xff", b"hello", b"PTT", b"PTT2" + b"\x00" * 8, b" {}", b"[1, 2]"])
def test_garbage_bytes(value: bytes) -> None:
    assert wire_error(value).reason == "bad_encoding"


@pytest.mark.parametrize("value", [
    MAGIC,
    MAGIC + b"\x00\x00",
    MAGIC + struct.pack(">I", 1000) + b'{"kind": "reports"}',  # header longer than the record
    frame(header(arrays=[spec("value", "u1", 5)]), GOOD_VALUES)[:12],
])
def test_truncated_frame(value: bytes) -> None:
    assert wire_error(value).reason == "truncated"


@pytest.mark.parametrize("head", [
    b"{not json",
    b"",
    b"[]",
    json.dumps({"kind": "reports"}).encode(),  # missing fields
    json.dumps(header(arrays=[spec("value", "u1", 5)], epoch=-1)).encode(),
    json.dumps(header(arrays=[spec("value", "u1", 5)], batch_id="not-a-hex-id")).encode(),
    json.dumps(header(arrays=[spec("value", "f8", 5)])).encode(),  # dtype not allowed
    json.dumps(header(arrays=[spec("value", "u1", 5)], round=2)).encode(),
    b"\xff\xfe" + json.dumps(header(arrays=[spec("value", "u1", 5)])).encode(),
])
def test_bad_header_json(head: bytes) -> None:
    assert wire_error(frame(head, GOOD_VALUES)).reason == "bad_header"


def test_array_length_mismatch() -> None:
    # values: 5 values declared and present, but the header says 6 reports
    assert wire_error(frame(header(reports=6, arrays=[spec("value", "u1", 5)]), GOOD_VALUES)).reason == "size_mismatch"
    # pairs: station and output of different lengths
    rec = frame(header(layout="pairs", reports=2, arrays=[spec("station", "u1", 2), spec("output", "u1", 3)]),
                bytes([1, 2]), bytes([0, 1, 1]))
    assert wire_error(rec).reason == "size_mismatch"
    # counts: neither n_outputs nor n_stations x n_outputs
    rec = frame(header(kind="tally", layout="counts", arrays=[spec("counts", "i8", 5)]),
                np.arange(5, dtype="<i8").tobytes())
    assert wire_error(rec).reason == "size_mismatch"
    # an array declared longer than the bytes that follow
    assert wire_error(frame(header(arrays=[spec("value", "u1", 5)]), GOOD_VALUES[:4])).reason == "size_mismatch"
    assert wire_error(frame(header(arrays=[spec("value", "u2", 5)]), GOOD_VALUES)).reason == "size_mismatch"


def test_trailing_bytes() -> None:
    good = encode_batch(header(), {"value": np.array([0, 1, 2, 3, 3])})
    assert isinstance(decode_record(good), DecodedBatch)
    assert wire_error(good + b"\x00").reason == "size_mismatch"


@pytest.mark.parametrize("record", [
    frame(header(arrays=[spec("value", "u1", 5)]), bytes([0, 1, 2, 3, 4])),  # 4 > n_stations
    frame(header(arrays=[spec("value", "u2", 5)]), np.array([0, 1, 2, 3, 300], "<u2").tobytes()),
    frame(header(layout="pairs", reports=2, arrays=[spec("station", "u1", 2), spec("output", "u1", 2)]),
          bytes([0, 1]), bytes([1, 1])),  # station index 0 in a pair
    frame(header(layout="pairs", reports=2, arrays=[spec("station", "u1", 2), spec("output", "u1", 2)]),
          bytes([1, 4]), bytes([1, 1])),  # station index 4 > 3
    frame(header(layout="pairs", reports=2, n_outputs=3, arrays=[spec("station", "u1", 2), spec("output", "u1", 2)]),
          bytes([1, 2]), bytes([1, 3])),  # report 3 >= n_outputs
    frame(header(kind="tally", layout="counts", arrays=[spec("counts", "i8", 4)]),
          np.array([5, -1, 2, 0], "<i8").tobytes()),  # negative count
])
def test_index_or_value_out_of_range(record: bytes) -> None:
    assert wire_error(record).reason == "out_of_range"


@pytest.mark.parametrize(("layout", "arrays"), [
    ("values", [("station", 5)]),
    ("values", [("value", 5), ("output", 5)]),
    ("pairs", [("station", 5)]),
    ("pairs", [("value", 5)]),
    ("counts", [("value", 4)]),
    ("values", []),
])
def test_wrong_arrays_for_the_layout(layout: str, arrays: list[tuple[str, int]]) -> None:
    kind = "tally" if layout == "counts" else "reports"
    specs = [spec(name, "u1", n) for name, n in arrays]
    rec = frame(header(kind=kind, layout=layout, arrays=specs), *[bytes(n) for _, n in arrays])
    assert wire_error(rec).reason == "bad_layout"


def test_duplicate_array_names_are_rejected() -> None:
    """BUG: ``_decode_binary`` stores arrays in a dict by name, so a header declaring
    ``value`` twice decodes without error -- the first array's bytes are silently dropped
    and ``_check_layout`` (which compares ``set(arrays)``) sees one ``value``. Expected: a
    WireError (``bad_layout``)."""
    rec = frame(header(arrays=[spec("value", "u1", 5), spec("value", "u1", 5)]), bytes([3] * 5), GOOD_VALUES)
    assert wire_error(rec).reason == "bad_layout"


@pytest.mark.parametrize(("kind", "layout", "arrays"), [
    ("reports", "counts", {"counts": np.arange(4)}),
    ("tally", "values", {"value": np.array([0, 1, 2, 3, 3])}),
    ("tally", "pairs", {"station": np.array([1, 2, 3, 1, 1]), "output": np.ones(5, np.int64)}),
])
def test_kind_layout_mismatch(kind: str, layout: str, arrays: dict[str, np.ndarray]) -> None:
    rec = encode_batch(header(kind=kind, layout=layout), arrays)
    assert wire_error(rec).reason == "bad_layout"


@pytest.mark.parametrize("value", [
    b"{garbage",
    b"{}",
    b'{"kind": "unknown"}',
    b'{"kind": "reports"}',  # a binary kind sent as JSON
    encode_json(JSON_RECORDS[0]).replace(b'"epoch":59000000', b'"epoch":-1'),
    encode_json(JSON_RECORDS[0]).replace(b'"round":1', b'"round":2'),
    encode_json(JSON_RECORDS[4]).replace(b"-08:00", b""),  # naive datetime
    encode_json(JSON_RECORDS[4]).replace(b'"evaluation_only":true', b'"evaluation_only":false'),
])
def test_invalid_json_record(value: bytes) -> None:
    assert value[:1] == b"{"
    assert wire_error(value).reason == "bad_json_record"


# ---------------------------------------------------------------------------------------
# Encoder and model contracts that are not enforced today (bugs; see the report)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "arrays"), [
    (header(n_stations=3), {"value": np.array([0, 1, 257, 2, 3])}),  # u1: 257 would become 1
    (header(n_stations=3), {"value": np.array([0, 1, -1, 2, 3])}),  # u1: -1 would become 255
    (header(layout="pairs", n_stations=300, n_outputs=3, reports=2),
     {"station": np.array([1, 65_537]), "output": np.array([1, 1])}),  # u2: 65,537 would become 1
    (header(layout="pairs", n_stations=3, n_outputs=3, reports=2),
     {"station": np.array([1, 2]), "output": np.array([1, 256])}),  # u1: output 256 would become 0
])
def test_encode_never_silently_changes_a_value(fields: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """BUG: ``encode_batch`` casts with ``np.ascontiguousarray(a, dtype=...)``, which wraps
    out-of-range integers modulo 2^8 / 2^16, so a wrong value can arrive as a different,
    *valid* report (257 -> station 1, output 256 -> report 0). Expected: refuse
    (ValueError/WireError) rather than encode a different value."""
    try:
        rec = encode_batch(fields, arrays)
    except ValueError:
        return
    try:
        out = decode_record(rec)
    except WireError:
        return
    assert isinstance(out, DecodedBatch)
    for name, arr in arrays.items():
        assert np.array_equal(out.arrays[name], arr), f"{name} changed on the wire"


@pytest.mark.parametrize("fields", [
    {},  # neither a value nor pairs: an empty report
    {"value": 1, "pairs": ((1, 1),)},  # both: which one counts?
    {"pairs": ((-5, 1),)},  # a station index below 1
    {"pairs": ((1, -1),)},  # a negative report
])
def test_single_report_carries_exactly_one_valid_payload(fields: dict[str, Any]) -> None:
    """BUG (validation gap): ``SingleReport`` documents ``value`` (Sampling Privacy) *or*
    ``pairs`` (per-sensor), with ``[station index, report]`` pairs; it accepts neither,
    both, and negative indices (``value`` has ``ge=0``, ``pairs`` has no bound)."""
    with pytest.raises(ValidationError):
        SingleReport(query_id="q", query_version=1, epoch=1, batch_id=BATCH_ID, **fields)


def test_ground_truth_flows_match_stations() -> None:
    """BUG (validation gap): ``GroundTruth`` pairs ``flows[i]`` with ``stations[i]`` but
    accepts tuples of different lengths (3 stations, 1 flow)."""
    with pytest.raises(ValidationError):
        GroundTruth(epoch=1, epoch_start=T0, stations=(1, 2, 3), flows=(1,))


# ---------------------------------------------------------------------------------------
# Query
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("mechanism", "params", "stations"), [
    ("sp", {}, 3), ("sp", {"pis": 0.3}, 3), ("sp", {"pis": 0.45, "pi0": 0.25}, 5), ("sp", {}, 400),
    ("alp", {}, 1), ("alp", {"pisNo": 0.00025}, 40), ("rr", {}, 2), ("rr", {"pi1": 0.6, "pi2": 0.3}, 7),
])
def test_query_epsilon_is_the_core_epsilon(mechanism: str, params: dict[str, float], stations: int) -> None:
    q = make_query(mechanism=mechanism, params=params, sensors=tuple(range(1, stations + 1)))
    mech = E.build_mechanism(mechanism, params, stations=stations)
    assert q.epsilon_per_answer == E.mechanism_epsilon(mech).epsilon
    if q.spec.per_sensor:  # the whole report vector: brute force over its joint table
        joint = E.per_sensor_joint_table(mech.output_table(0), stations) if stations <= 7 else None
        want = E.local_epsilon(joint) if joint is not None else E.per_sensor_report_epsilon(mech.output_table(0),
                                                                                               stations)
        assert q.epsilon == pytest.approx(want, rel=1e-12)
    else:  # one station index per round: the round table is the whole report
        assert q.epsilon == E.mechanism_epsilon(q.build()).epsilon
    assert np.array_equal(q.build().output_table(q.n_rounds - 1), mech.output_table(mech.n_rounds - 1))
    assert q.n_rounds == (2 if mechanism == "sp" else 1)
    assert (q.per_station is None) == (not q.spec.per_sensor)


def test_query_known_epsilons() -> None:
    # two-coin RR at pi1=0.8, pi2=0.2: ln 21 per answer (MECHANISMS.md §1); over 3 sensors a move
    # flips two answers: ln 21 + ln 6 = ln 126 (§6)
    assert make_query(mechanism="rr").epsilon_per_answer == pytest.approx(np.log(21.0))
    assert make_query(mechanism="rr").epsilon == pytest.approx(np.log(126.0))
    # ALP at the papers' parameters: ln 3.5 per answer, ln(3.5 x 0.95/0.9) for the report vector
    assert make_query(mechanism="alp").epsilon_per_answer == pytest.approx(np.log(3.5))
    assert make_query(mechanism="alp").epsilon == pytest.approx(np.log(3.5 * 0.95 / 0.9))
    # Sampling Privacy over V stations, uniform pi_v = (1 - pis)/(V + 1): ln((pi_v + pis)/pi_v)
    pv = 0.55 / 4
    assert make_query().epsilon == pytest.approx(np.log((pv + 0.45) / pv))


def test_query_derived_fields() -> None:
    q = make_query(version=3)
    assert q.record_key == "q-wire:v3"
    assert q.station_index() == {500001: 1, 500004: 2, 500010: 3}
    assert q.n_stations == 3
    # the devices answer it from T_start (inclusive) to T_end (exclusive): the replay's rule
    assert active_queries([q], T0) == [q]
    assert active_queries([q], T0 + timedelta(hours=2)) == [] and active_queries([q], T0 - timedelta(seconds=1)) == []
    assert Query.model_validate_json(q.model_dump_json()) == q
    with pytest.raises(ValidationError):
        q.version = 4  # type: ignore[misc]  # frozen


@pytest.mark.parametrize(("overrides", "match"), [
    ({"params": {"pis": 0.3, "foo": 1.0}}, "unknown"),
    ({"params": {"vehicle_id": 17.0}}, "unknown"),
    ({"mechanism": "alp", "params": {"pis": 0.3}}, "unknown"),
    ({"params": {"pis": 1.5}}, "probability"),
    ({"params": {"pis": -0.1}}, "probability"),
    ({"mechanism": "rr", "params": {"pi1": 2.0}}, "probability"),
    ({"mechanism": "alp", "params": {"pisNo": float("nan")}}, "probability"),
    ({"mechanism": "alp", "params": {"pisYes1": 0.7, "pisYes2": 0.7}}, "<= 1"),
    ({"sensors": (500001, 500004, 500001)}, "unique"),
    ({"sensors": ()}, "at least 1"),
    ({"sensors": (0, 5)}, "positive"),
    ({"t_end": T0}, "after"),
    ({"t_end": T0 - timedelta(minutes=1)}, "after"),
    ({"t_start": datetime(2026, 11, 18, 8, 0)}, "timezone"),  # noqa: DTZ001 - the naive datetime under test
    ({"t_end": datetime(2026, 11, 18, 10, 0)}, "timezone"),  # noqa: DTZ001
    ({"mechanism": "nope"}, "unknown mechanism 'nope'; choose one of sp, sp-binary, alp, rr, unary, fresh"),
    ({"mechanism": "sp-binary"}, "at most 1 station"),
    ({"version": 0}, "greater than or equal"),
    ({"population": 0}, "greater than or equal"),
    ({"query_id": "bad id with spaces"}, "pattern"),
    ({"query_id": ""}, "pattern"),
    ({"owner_id": "x"}, "Extra inputs"),
])
def test_query_validation(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        make_query(**overrides)


# ---------------------------------------------------------------------------------------
# THE PRIVACY SCHEMA TEST
# ---------------------------------------------------------------------------------------
MODELS: list[type[BaseModel]] = [BatchHeader, ArraySpec, SingleReport, DeviceReport, EndOfEpoch, GroundTruth, Query]
JSON_MODELS: list[type[BaseModel]] = [SingleReport, EndOfEpoch, GroundTruth]

# Word tokens (field names split on "_") that name or key a vehicle/person/device, or
# sequence/link its reports.
DENY_TOKENS = {
    "vehicle", "vehicles", "veh", "vin", "device", "devices", "owner", "owners", "user", "users", "car", "cars",
    "plate", "license", "mac", "imei", "imsi", "msisdn", "phone", "ip", "serial", "uid", "uuid", "guid",
    "link", "linked", "linkage", "link_id", "pair_id", "pairing", "seq", "sequence", "seqno", "nonce",
    "pseudonym", "alias", "token", "session", "cookie", "fingerprint", "hash", "key", "trip", "journey",
    "driver", "person", "subject", "account", "client", "sender", "source", "origin", "member",
    "ordinal", "position", "slot", "previous", "prev", "next", "parent", "correlation", "trace",
}
# Substrings that must not appear anywhere in a field name.
DENY_SUBSTRINGS = ("vehicle", "device", "owner", "plate", "imei", "pseudonym", "linkage", "driver", "fingerprint",
                   "vin_", "_vin", "pair_id", "seq_", "_seq", "user_", "_user")
# Every identifier on the wire, and why it cannot single out a vehicle:
ALLOWED_IDS = {
    "query_id",     # the analyst's query, shared by every vehicle
    "analyst_id",   # the analyst, not a data owner
    "batch_id",     # random uuid4 per batch (per report for SingleReport), never reused across rounds
    "producer_id",  # a simulator process run holding thousands of vehicles
}


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found.append(annotation)
    for arg in typing.get_args(annotation):
        found += _nested_models(arg)
    return found


def _all_fields() -> dict[str, set[str]]:
    """Field names per model, nested models included."""
    out: dict[str, set[str]] = {}
    todo = list(MODELS)
    while todo:
        m = todo.pop()
        if m.__name__ in out:
            continue
        out[m.__name__] = set(m.model_fields)
        for f in m.model_fields.values():
            todo += _nested_models(f.annotation)
    return out


def _annotation_types(annotation: Any) -> set[Any]:
    args = typing.get_args(annotation)
    if not args:
        return {annotation}
    found: set[Any] = {typing.get_origin(annotation)}
    for a in args:
        found |= _annotation_types(a)
    return found


# The one exception, justified: a device report on the device topic -- read by the shuffler
# only -- carries its enrolled device's id and MAC (schemas/enrollment.py); the shuffler checks
# and drops both, and tests/integration/test_wire_privacy.py shows nothing after it holds them.
SHUFFLER_ONLY = {("DeviceReport", "device"), ("DeviceReport", "mac")}


def test_no_field_can_carry_a_vehicle_identifier_or_link() -> None:
    fields = _all_fields()
    assert set(fields) == {m.__name__ for m in MODELS}
    assert SHUFFLER_ONLY <= {(m, n) for m, names in fields.items() for n in names}
    for model, names in fields.items():
        for name in names:
            if (model, name) in SHUFFLER_ONLY:
                continue
            low = name.lower()
            tokens = set(low.split("_"))
            assert not tokens & DENY_TOKENS, f"{model}.{name}: denied token {sorted(tokens & DENY_TOKENS)}"
            assert not any(s in low for s in DENY_SUBSTRINGS), f"{model}.{name}: denied substring"
            if low == "id" or low.endswith(("_id", "_ids", "id")):
                assert low in ALLOWED_IDS, f"{model}.{name}: an identifier not on the justified list"


def test_per_report_models_have_no_timestamp() -> None:
    """A per-report time (finer than the epoch) would let a listener match a vehicle's two
    rounds by timing. Reports and report batches carry the epoch index only."""
    for model in (SingleReport, BatchHeader, ArraySpec):
        for name, f in model.model_fields.items():
            kinds = _annotation_types(f.annotation)
            assert datetime not in kinds, f"{model.__name__}.{name} is a datetime"
            assert not re.search(r"(^|_)(ts|time|timestamp|at|sent|created)($|_)", name), f"{model.__name__}.{name}"


def test_report_arrays_cannot_be_named_vehicle() -> None:
    """The simulator's ``SparseReports.vehicle`` must never leave it: the wire admits only
    the four report arrays."""
    allowed = typing.get_args(ArraySpec.model_fields["name"].annotation)
    assert set(allowed) == {"value", "station", "output", "counts"}
    with pytest.raises(ValidationError):
        encode_batch(header(layout="pairs", reports=2),
                     {"station": np.array([1, 2]), "output": np.array([1, 1]), "vehicle": np.array([7, 7])})
    rec = frame(header(arrays=[spec("value", "u1", 5), spec("vehicle", "u1", 5)]), GOOD_VALUES, bytes(5))
    assert wire_error(rec).reason == "bad_header"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_models_are_frozen_and_forbid_extra_fields(model: type[BaseModel]) -> None:
    assert model.model_config.get("extra") == "forbid"
    assert model.model_config.get("frozen") is True


_VALID: dict[str, dict[str, Any]] = {
    "SingleReport": json.loads(encode_json(JSON_RECORDS[0])),
    "DeviceReport": {"kind": "device_report", "query_id": "q-wire", "query_version": 1, "epoch": 59_000_000,
                     "round": 1, "pairs": [[1, 1], [3, 1]]},
    "EndOfEpoch": json.loads(encode_json(JSON_RECORDS[2])),
    "GroundTruth": json.loads(encode_json(JSON_RECORDS[4])),
    "BatchHeader": {**header(), "arrays": [spec("value", "u1", 5)]},
    "ArraySpec": spec("value", "u1", 5),
    "Query": json.loads(make_query().model_dump_json()),
}


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("extra", ["vehicle_id", "device_key", "round1_link", "seq", "owner"])
def test_an_added_identifier_is_rejected(model: type[BaseModel], extra: str) -> None:
    good = _VALID[model.__name__]
    model.model_validate(good)  # the base record is valid ...
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        model.model_validate({**good, extra: 12345})  # ... and an added field is not


@pytest.mark.parametrize("model", JSON_MODELS, ids=lambda m: m.__name__)
def test_decoder_rejects_a_json_record_with_a_vehicle_id(model: type[BaseModel]) -> None:
    raw = json.dumps({**_VALID[model.__name__], "vehicle_id": "veh-42"}).encode()
    assert wire_error(raw).reason == "bad_json_record"


def test_device_report_decoder_rejects_a_vehicle_id_and_anything_but_one_report() -> None:
    good = _VALID["DeviceReport"]
    assert decode_device_report(json.dumps(good).encode()).pairs == ((1, 1), (3, 1))
    for bad in ({**good, "vehicle_id": "veh-42"}, {**good, "value": 2},
                {k: v for k, v in good.items() if k != "pairs"}, {**good, "batch_id": "0" * 32}):
        with pytest.raises(WireError) as info:
            decode_device_report(json.dumps(bad).encode())
        assert info.value.reason == "bad_json_record"
    with pytest.raises(WireError) as info:
        decode_device_report(b"PTT1....")
    assert info.value.reason == "bad_encoding"


def test_decoder_rejects_a_batch_header_with_a_vehicle_id() -> None:
    rec = frame({**_VALID["BatchHeader"], "vehicle_id": 42}, GOOD_VALUES)
    assert wire_error(rec).reason == "bad_header"
    with pytest.raises(ValidationError):
        encode_batch({**header(), "vehicle_id": 42}, {"value": np.array([0, 1, 2, 3, 3])})


def _object_schemas(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            found.append((path, node))
        for k, v in node.items():
            found += _object_schemas(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _object_schemas(v, f"{path}[{i}]")
    return found


def test_json_schemas_forbid_additional_properties() -> None:
    schemas = json_schemas()
    assert set(schemas) == {"SingleReport", "EndOfEpoch", "EndOfEpochSet", "GroundTruth", "BatchHeader",
                            "DeviceReport", "SourceEpoch"}
    checked = 0
    for name, schema in [*schemas.items(), ("Query", Query.model_json_schema())]:
        for path, obj in _object_schemas(schema):
            if "properties" in obj:  # a model: closed
                assert obj.get("additionalProperties") is False, f"{name} {path}"
                checked += 1
            else:  # a free-form mapping: only Query.params (checked by name at validation)
                assert (name, path) == ("Query", "$.properties.params"), f"{name} {path} is an open object"
                assert obj["additionalProperties"] == {"type": "number"}
    assert checked == 10  # 8 top-level models + ArraySpec inside BatchHeader + EndOfEpoch inside EndOfEpochSet
    assert "ArraySpec" in schemas["BatchHeader"]["$defs"]


def test_batch_ids_are_random_uuid4() -> None:
    ids = [new_batch_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for i in ids[:50]:
        assert re.fullmatch(r"[0-9a-f]{32}", i)
        u = uuid.UUID(hex=i)
        assert u.version == 4 and u.variant == uuid.RFC_4122
    # not derived from content: the same reports get a different id each time
    arrays = {"value": np.array([0, 1, 2, 3, 3])}
    a = decode_record(encode_batch(header(batch_id=new_batch_id()), arrays))
    b = decode_record(encode_batch(header(batch_id=new_batch_id()), arrays))
    assert isinstance(a, DecodedBatch) and isinstance(b, DecodedBatch)
    assert a.header.batch_id != b.header.batch_id
    # the uuid4 source is the operating system's randomness, not a seeded generator
    assert isinstance(new_batch_id, types.FunctionType)
    assert "uuid4" in new_batch_id.__code__.co_names
