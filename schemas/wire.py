"""Records on the reports and ground-truth topics, and their byte encoding.

Reports topic, one Kafka record each:

* ``reports`` -- a columnar batch of many vehicles' privatized reports for one
  (query, version, epoch, round), binary: ``b"PTT1"``, a 4-byte big-endian header length,
  the JSON :class:`BatchHeader`, then the arrays it declares (little-endian, in order).
  ``layout="values"``: one array ``value`` of reported station indices (Sampling Privacy).
  ``layout="pairs"``: arrays ``station`` and ``output`` -- the non-default (station, report)
  pairs of a per-sensor mechanism (ALP: the non-⊥ pairs; RR: the "1" answers).
* ``tally`` -- the exact-tally path: the same header with ``layout="counts"`` and one array
  ``counts`` of per-output counts (``n_outputs`` for Sampling Privacy; ``n_stations x
  n_outputs``, row-major, for per-sensor mechanisms).
* ``report`` -- one device's report as JSON (:class:`SingleReport`), so that a real device
  can send one without the batch encoding.
* ``end_of_epoch`` -- JSON (:class:`EndOfEpoch`), sent by each producer to every partition
  after an epoch's round, with what it sent there and in total.
* ``end_of_epoch_set`` -- JSON (:class:`EndOfEpochSet`): all of one producer's markers for
  one epoch and partition (every active query and round) in one record. The replay sends
  these; a single ``end_of_epoch`` is still accepted (a gateway with one query).

Privacy: nothing here names a vehicle. Batches hold reports of one round only, shuffled;
``batch_id`` is random; ``producer_id`` names a producer process run. Partition keys are
batch ids (end-of-epoch markers go to an explicit partition).
"""

from __future__ import annotations

import math
import struct
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from .device_binary import BINARY_VERSION, DeviceFields, unpack_device

__all__ = [
    "MAGIC",
    "ArraySpec",
    "BatchHeader",
    "FRAME_LENGTH",
    "DecodedBatch",
    "DeviceReport",
    "MAX_DEVICE_PAIRS",
    "MAX_MARKERS_PER_SET",
    "RELEASES",
    "Release",
    "SHUFFLER_WITHHELD",
    "ShufflerWithheld",
    "EndOfEpoch",
    "EndOfEpochSet",
    "GroundTruth",
    "SingleReport",
    "SourceEpoch",
    "decode_device_binary",
    "decode_device_record",
    "WireError",
    "decode_device_report",
    "decode_record",
    "encode_batch",
    "encode_json",
    "json_safe",
    "json_schemas",
    "new_batch_id",
]

MAGIC = b"PTT1"
# every binary frame of the project (these batches, the stream app's stage records, bundles and
# window states) prefixes a length as 4 bytes, big-endian, unsigned
FRAME_LENGTH = struct.Struct(">I")
_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_DTYPES = {"u1": np.uint8, "u2": np.uint16, "u4": np.uint32, "i8": np.int64}
DTypeName = Literal["u1", "u2", "u4", "i8"]
Round = Annotated[int, Field(ge=0, le=1)]
#: what a shuffler releases per (query, version, epoch, round): the reports permuted, or only their counts
Release = Literal["permuted", "aggregate"]
RELEASES: tuple[Release, ...] = ("aggregate", "permuted")
#: why a shuffler withheld a (query, version, epoch) it held: nobody reported, too small a crowd,
#: source notes that could have opened its window were refused (so its reports may have been
#: refused too), or the query fixes another release than the shuffler's
ShufflerWithheld = Literal["no_reports", "below_min_crowd", "notes_refused", "release_mismatch"]
SHUFFLER_WITHHELD: tuple[ShufflerWithheld, ...] = ("no_reports", "below_min_crowd", "notes_refused",
                                                   "release_mismatch")


class WireError(ValueError):
    """A record that cannot be decoded; ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def new_batch_id() -> str:
    return uuid.uuid4().hex


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ArraySpec(_Frozen):
    name: Literal["value", "station", "output", "counts"]
    dtype: DTypeName
    length: int = Field(ge=0)


class BatchHeader(_Frozen):
    """Header of a binary ``reports`` or ``tally`` record."""

    kind: Literal["reports", "tally"]
    query_id: str = Field(pattern=_ID)
    query_version: int = Field(ge=1)
    epoch: int = Field(ge=0, description="absolute epoch index: epoch start (Unix s) // epoch length")
    round: Round
    batch_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    producer_id: str = Field(pattern=_ID)
    reports: int = Field(ge=0, description="how many reports (tally: vehicles) the record stands for")
    layout: Literal["values", "pairs", "counts"]
    n_stations: int = Field(ge=1)
    n_outputs: int = Field(ge=2)
    arrays: tuple[ArraySpec, ...]


class SingleReport(_Frozen):
    """One device's report in JSON. ``value`` (Sampling Privacy: station index 0..V) or
    ``pairs`` (per-sensor mechanisms: the non-default ``[station index, report]`` pairs)."""

    kind: Literal["report"] = "report"
    query_id: str = Field(pattern=_ID)
    query_version: int = Field(ge=1)
    epoch: int = Field(ge=0)
    round: Round = 0
    batch_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    value: int | None = Field(default=None, ge=0)
    pairs: tuple[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]], ...] | None = None

    @model_validator(mode="after")
    def _one_payload(self) -> SingleReport:
        if (self.value is None) == (self.pairs is None):
            raise ValueError("a report carries exactly one of value (Sampling Privacy) or pairs (per-sensor)")
        return self


MAX_DEVICE_PAIRS = 65_535  # (station, report) pairs in one device report


class DeviceReport(_Frozen):
    """One device's report on the device topic (``ptt.device-reports``), for the anonymizing
    shuffler (``ptt shuffler``): one Kafka record per device, query version, epoch and round,
    with no key and no header. Nothing in it names or links a
    vehicle but, for the shuffler only, the enrolled ``device`` id and its ``mac`` (hex: the
    16-byte MAC of :func:`~schemas.device_binary.auth_message`, :mod:`schemas.enrollment`), which
    the shuffler checks and drops: no batch id, no producer id. ``value`` (station-valued mechanisms:
    station index 0..V) or ``pairs`` (per-sensor mechanisms: the device's non-default
    ``[station index, report]`` pairs, possibly none -- an empty list still counts the device
    as a participant). A binary bitmap report decodes to its pairs, and :attr:`bitmap_stations`
    keeps the V it covers for the shuffler's check against its query (not a field: nothing on
    the JSON wire; it makes the report unequal to the same pairs sent as pairs).

    >>> r = DeviceReport(query_id="sp-day", query_version=1, epoch=9, round=1, value=3)
    >>> decode_device_report(encode_json(r)) == r
    True
    """

    kind: Literal["device_report"] = "device_report"
    query_id: str = Field(pattern=_ID)
    query_version: int = Field(ge=1)
    epoch: int = Field(ge=0)
    round: Round = 0
    value: int | None = Field(default=None, ge=0)
    pairs: tuple[tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=0)]], ...] | None = Field(
        default=None, max_length=MAX_DEVICE_PAIRS)
    device: int | None = Field(default=None, ge=0, le=2**32 - 1, description="the enrolled device's id")
    mac: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$", description="the report's MAC, hex")
    _bitmap_stations: int | None = PrivateAttr(default=None)

    @property
    def bitmap_stations(self) -> int | None:
        """A binary bitmap report's V, the stations its bitmap covers (None: not a bitmap)."""
        return self._bitmap_stations

    @model_validator(mode="after")
    def _one_payload(self) -> DeviceReport:
        if (self.value is None) == (self.pairs is None):
            raise ValueError("a report carries exactly one of value (station-valued) or pairs (per-sensor)")
        if (self.device is None) != (self.mac is None):
            raise ValueError("an authenticated report carries both device and mac")
        return self


class SourceEpoch(_Frozen):
    """Replays only: the fleet's source note of one epoch, on the source-notes topic that only
    the replay principal may write (the shuffler's trusted clock), sent by each replay producer
    once its device reports of that epoch are acknowledged -- and once, ``opens``, before its
    first epoch. Nothing in it is per vehicle: the epoch, the producer (``producer_index`` of
    ``producer_count``), the device-topic offsets below which its reports of the epoch lie
    (``device_offsets``: (partition, end offset) pairs), the stations (sensor ids) whose source
    reading is missing this epoch (the direct path's markers' ``readings_missing``), and whether
    the replay stopped in the middle of the epoch (the markers' ``interrupted``). The shuffler
    carries the last two into the markers it writes. ``mac``: the replay's HMAC of the note
    under the notes key (:meth:`schemas.enrollment.Enrollment.sign_note`, hex); the shuffler
    refuses a note without a MAC that verifies (``untrusted_note``), whatever the broker's ACLs.

    >>> n = SourceEpoch(epoch=9, readings_missing=(400001,), interrupted=True)
    >>> decode_device_record(encode_json(n)) == n
    True
    """

    kind: Literal["source_epoch"] = "source_epoch"
    epoch: int = Field(ge=0)
    readings_missing: tuple[Annotated[int, Field(ge=0)], ...] = Field(
        default=(), max_length=65_000, description="station (sensor) ids without a source reading this epoch")
    interrupted: bool = False
    opens: bool = Field(default=False, description="the producer begins with this epoch (nothing of it sent yet)")
    ends: bool = Field(default=False, description="the producer sends nothing after this epoch (the replay's last): "
                                                  "a span it ends inside is cut short there")
    producer_index: int = Field(default=0, ge=0)
    producer_count: int = Field(default=1, ge=1, le=1024)
    device_offsets: tuple[tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]], ...] = Field(
        default=(), max_length=4096, description="(device partition, end offset): the producer's reports lie below")
    mac: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$",
                            description="HMAC-SHA256 of the note's other fields under the notes key (hex)")

    @model_validator(mode="after")
    def _index(self) -> SourceEpoch:
        if self.producer_index >= self.producer_count:
            raise ValueError(f"producer_index {self.producer_index} must be below producer_count {self.producer_count}")
        return self


_DEVICE = TypeAdapter(DeviceReport)
_DEVICE_RECORD = TypeAdapter(Annotated[DeviceReport | SourceEpoch, Field(discriminator="kind")])


def _device_json(value: bytes | None) -> bytes:
    if not value:
        raise WireError("empty", "record has no value")
    if value[:1] != b"{":
        raise WireError("bad_encoding", "a device report is a JSON object or the binary layout (first byte 1)")
    return value


def decode_device_binary(value: bytes) -> DeviceReport:
    """A binary device report (:mod:`schemas.device_binary`) as a :class:`DeviceReport`;
    :class:`WireError` with the JSON path's reasons if it is malformed. The layout's own
    checks are the model's bounds, so the model is built without validating twice."""
    got = unpack_device(value)
    if isinstance(got, tuple) and not isinstance(got, DeviceFields):
        raise WireError(*got)
    report = DeviceReport.model_construct(query_id=got.query_id, query_version=got.query_version, epoch=got.epoch,
                                          round=got.round, value=got.value, pairs=got.pairs, device=got.device,
                                          mac=None if got.mac is None else got.mac.hex())
    report._bitmap_stations = got.bitmap_stations
    return report


def decode_device_report(value: bytes | None) -> DeviceReport:
    """Decode a device-topic record (JSON or binary); :class:`WireError` if it is not a valid
    :class:`DeviceReport`."""
    if value and value[0] == BINARY_VERSION:
        return decode_device_binary(value)
    try:
        return _DEVICE.validate_json(_device_json(value))
    except ValidationError as exc:
        raise WireError("bad_json_record", _short(exc)) from exc


def decode_device_record(value: bytes | None) -> DeviceReport | SourceEpoch:
    """Decode a device-topic record: a :class:`DeviceReport` (JSON or binary) or a replay's
    :class:`SourceEpoch` (JSON); :class:`WireError` if it is neither."""
    if value and value[0] == BINARY_VERSION:
        return decode_device_binary(value)
    try:
        return _DEVICE_RECORD.validate_json(_device_json(value))
    except ValidationError as exc:
        raise WireError("bad_json_record", _short(exc)) from exc


class EndOfEpoch(_Frozen):
    """A producer's end-of-epoch marker for one (query, version, epoch, round), sent to
    every partition of the reports topic."""

    kind: Literal["end_of_epoch"] = "end_of_epoch"
    producer_id: str = Field(pattern=_ID)
    producer_index: int = Field(ge=0)
    producer_count: int = Field(ge=1, description="producer processes sharing the fleet")
    query_id: str = Field(pattern=_ID)
    query_version: int = Field(ge=1)
    epoch: int = Field(ge=0)
    round: Round
    partition: int = Field(ge=0)
    reports_to_partition: int = Field(ge=0)
    batches_to_partition: int = Field(ge=0)
    reports_total: int = Field(ge=0)
    batches_total: int = Field(ge=0)
    participants: int = Field(ge=0, description="vehicles of this producer that answered the query")
    refused: int = Field(ge=0, description="vehicles of this producer whose device refused the query")
    mode: Literal["per-vehicle", "tally"]
    interrupted: bool = False
    readings_missing: tuple[Annotated[int, Field(ge=1)], ...] = Field(
        default=(), max_length=65_000,
        description="replays only: station indices (1..V) whose source reading is missing this epoch (no reading, "
                    "or a dead detector), so their estimates carry no truth; a real gateway sends none")
    shuffle_size: int | None = Field(
        default=None, ge=1,
        description="optional: the number of device reports this producer mixed in one uniform shuffle for this "
                    "(query, version, epoch, round) -- a shuffler's attestation (absent: not attested; the worker "
                    "bounds it by the query's population and by the reports the producer released in the round)")
    release: Release | None = Field(
        default=None,
        description="optional, with shuffle_size: what the shuffler released for this (query, version, epoch, "
                    "round) -- 'permuted' (the device reports, permuted: reports batches) or 'aggregate' (only their "
                    "counts: tally batches); absent: a direct producer, or a shuffler from before the field "
                    "(permuted)")
    span_s: int | None = Field(
        default=None, ge=30, le=86_400,
        description="optional: the seconds the marked epoch covers, the query's span_s (a span query's epoch is its "
                    "span's first 30-s epoch); absent: not said. The worker dead-letters a marker whose span is not "
                    "its query's (bad_marker)")
    withheld: ShufflerWithheld | None = Field(
        default=None,
        description="optional: a shuffler withheld this (query, version, epoch) -- 'no_reports' (nobody reported), "
                    "'below_min_crowd' (a round held fewer than its --min-crowd reports), 'notes_refused' (source "
                    "notes that could have opened its window were refused) or 'release_mismatch' (the query fixes "
                    "another release than the shuffler's) -- and released nothing of "
                    "it: the marker then attests 0 reports, batches and participants, and the worker withholds the "
                    "epoch with this reason")

    @model_validator(mode="after")
    def _withheld_attests_nothing(self) -> EndOfEpoch:
        if self.withheld is not None and (self.reports_to_partition or self.batches_to_partition or self.reports_total
                                          or self.batches_total or self.participants or self.refused
                                          or self.shuffle_size is not None or self.interrupted):
            raise ValueError("a withheld marker attests nothing: 0 reports, batches, participants and refused, "
                             "no shuffle size, not interrupted")
        return self


class GroundTruth(_Frozen):
    """Evaluation only: the true per-station flows of an epoch, for dashboards during replays.
    Never produced from vehicles' reports; a real deployment has no such topic."""

    kind: Literal["ground_truth"] = "ground_truth"
    evaluation_only: Literal[True] = True
    epoch: int = Field(ge=0)
    epoch_start: AwareDatetime
    stations: tuple[int, ...]
    flows: tuple[Annotated[int, Field(ge=0)], ...]
    no_truth: tuple[int, ...] = Field(
        default=(), description="stations with no ground truth this epoch (no reading, or a dead detector): "
                                "their flow is a placeholder 0, never a count to score against")

    @model_validator(mode="after")
    def _aligned(self) -> GroundTruth:
        if len(self.stations) != len(self.flows):
            raise ValueError(f"{len(self.stations)} stations but {len(self.flows)} flows")
        if not set(self.no_truth) <= set(self.stations):
            raise ValueError("no_truth names stations that are not in the record")
        return self

    def truth(self) -> dict[int, int]:
        """Station -> true flow, only where the epoch has a truth."""
        missing = frozenset(self.no_truth)
        return {s: f for s, f in zip(self.stations, self.flows, strict=True) if s not in missing}


MAX_MARKERS_PER_SET = 256  # (query, version, round) markers in one set


class EndOfEpochSet(_Frozen):
    """One producer's end-of-epoch markers for one epoch and one partition: one record instead
    of one per (query, round). Every marker keeps its own meaning and bounds; the set itself
    must be coherent -- one producer, epoch, partition, mode and interruption state, and no
    (query, version, round) twice -- or the whole record is refused.

    >>> m = dict(producer_id="p0-ab", producer_index=0, producer_count=1, query_id="q", query_version=1,
    ...          epoch=9, partition=0, reports_to_partition=1, batches_to_partition=1, reports_total=1,
    ...          batches_total=1, participants=1, refused=0, mode="tally")
    >>> s = EndOfEpochSet(markers=(EndOfEpoch(**m, round=0), EndOfEpoch(**m, round=1)))
    >>> decode_record(encode_json(s)) == s
    True
    >>> try:
    ...     EndOfEpochSet(markers=(EndOfEpoch(**m, round=0), EndOfEpoch(**{**m, "epoch": 10}, round=1)))
    ... except ValueError as exc:
    ...     print("refused:", "must share" in str(exc))
    refused: True
    """

    kind: Literal["end_of_epoch_set"] = "end_of_epoch_set"
    markers: tuple[EndOfEpoch, ...] = Field(min_length=1, max_length=MAX_MARKERS_PER_SET)

    @model_validator(mode="after")
    def _coherent(self) -> EndOfEpochSet:
        shared = ("producer_id", "producer_index", "producer_count", "epoch", "partition", "mode", "interrupted")
        first = self.markers[0]
        if any(getattr(m, f) != getattr(first, f) for m in self.markers[1:] for f in shared):
            raise ValueError(f"every marker of a set must share {', '.join(shared[:-1])} and {shared[-1]}")
        slots = {(m.query_id, m.query_version, m.round) for m in self.markers}
        if len(slots) != len(self.markers):
            raise ValueError("a (query, version, round) appears twice in one marker set")
        return self


JsonRecord = Annotated[SingleReport | EndOfEpoch | EndOfEpochSet | GroundTruth, Field(discriminator="kind")]
_JSON = TypeAdapter(JsonRecord)


@dataclass(frozen=True)
class DecodedBatch:
    header: BatchHeader
    arrays: dict[str, npt.NDArray[Any]]


def _min_unsigned(max_value: int) -> DTypeName:
    return "u1" if max_value < 2**8 else "u2" if max_value < 2**16 else "u4"


def encode_batch(header_fields: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]) -> bytes:
    """Encode a binary record. Index arrays use the smallest unsigned dtype that fits.

    Values outside their range (a station index above ``n_stations``, a report value at or
    above ``n_outputs``, a negative count) are refused with ``ValueError``, never wrapped.
    """
    specs = []
    blobs = []
    limits = {"value": int(header_fields["n_stations"]), "station": int(header_fields["n_stations"]),
              "output": int(header_fields["n_outputs"]) - 1}
    for name, arr in arrays.items():
        a = np.asarray(arr)
        if a.size and (a.min() < 0 or (name in limits and a.max() > limits[name])):
            raise ValueError(f"array {name!r} has values outside 0..{limits.get(name, 'inf')}")
        if name == "counts":
            dt: DTypeName = "i8"
        elif name == "output":
            dt = "u1"
        else:
            dt = _min_unsigned(int(header_fields["n_stations"]))
        specs.append(ArraySpec(name=name, dtype=dt, length=int(a.size)))
        blobs.append(np.ascontiguousarray(a.ravel(), dtype=np.dtype(_DTYPES[dt]).newbyteorder("<")).tobytes())
    header = BatchHeader(**header_fields, arrays=tuple(specs))
    head = header.model_dump_json().encode()
    return b"".join([MAGIC, FRAME_LENGTH.pack(len(head)), head, *blobs])


def encode_json(record: DeviceReport | SingleReport | EndOfEpoch | EndOfEpochSet | GroundTruth
                | SourceEpoch) -> bytes:
    # a marker without a shuffle size leaves the field out: the bytes a producer that attests
    # nothing sends are those it sent before the field existed; so does an unauthenticated
    # device report its device and mac
    if isinstance(record, DeviceReport) and record.device is None:
        return record.model_dump_json(exclude={"device", "mac"}).encode()
    return record.model_dump_json(exclude_none=isinstance(record, (EndOfEpoch, EndOfEpochSet))).encode()


def decode_record(value: bytes | None) -> DecodedBatch | SingleReport | EndOfEpoch | EndOfEpochSet | GroundTruth:
    """Decode any record of the reports or truth topics; :class:`WireError` if impossible."""
    if not value:
        raise WireError("empty", "record has no value")
    if value[:4] == MAGIC:
        return _decode_binary(value)
    if value[:1] == b"{":
        try:
            return _JSON.validate_json(value)
        except ValidationError as exc:
            raise WireError("bad_json_record", _short(exc)) from exc
    raise WireError("bad_encoding", "neither a PTT1 binary batch nor a JSON object")


def _decode_binary(value: bytes) -> DecodedBatch:
    if len(value) < 8:
        raise WireError("truncated", "binary record shorter than its frame header")
    (hlen,) = FRAME_LENGTH.unpack_from(value, 4)
    if 8 + hlen > len(value):
        raise WireError("truncated", f"header length {hlen} exceeds the record")
    try:
        header = BatchHeader.model_validate_json(value[8:8 + hlen])
    except ValidationError as exc:
        raise WireError("bad_header", _short(exc)) from exc
    names = [spec.name for spec in header.arrays]
    if len(set(names)) != len(names):
        raise WireError("bad_layout", f"array names repeat: {names}")
    offset = 8 + hlen
    arrays: dict[str, npt.NDArray[Any]] = {}
    for spec in header.arrays:
        dt = np.dtype(_DTYPES[spec.dtype]).newbyteorder("<")
        size = spec.length * dt.itemsize
        if offset + size > len(value):
            raise WireError("size_mismatch", f"array {spec.name} needs {size} bytes, record too short")
        arrays[spec.name] = np.frombuffer(value, dtype=dt, count=spec.length, offset=offset).astype(np.int64)
        offset += size
    if offset != len(value):
        raise WireError("size_mismatch", f"{len(value) - offset} trailing bytes after the declared arrays")
    _check_layout(header, arrays)
    return DecodedBatch(header, arrays)


def _check_layout(h: BatchHeader, arrays: dict[str, npt.NDArray[Any]]) -> None:
    want = {"values": {"value"}, "pairs": {"station", "output"}, "counts": {"counts"}}[h.layout]
    if set(arrays) != want:
        raise WireError("bad_layout", f"layout {h.layout} needs arrays {sorted(want)}, got {sorted(arrays)}")
    if (h.kind == "tally") != (h.layout == "counts"):
        raise WireError("bad_layout", f"kind {h.kind} cannot use layout {h.layout}")
    if h.layout == "values":
        v = arrays["value"]
        if v.size != h.reports:
            raise WireError("size_mismatch", f"{v.size} values for {h.reports} reports")
        if v.size and v.max() > h.n_stations:
            raise WireError("out_of_range", f"station index {int(v.max())} > {h.n_stations}")
    elif h.layout == "pairs":
        s, o = arrays["station"], arrays["output"]
        if s.size != o.size or s.size != h.reports:
            raise WireError("size_mismatch", f"{s.size} stations, {o.size} outputs, {h.reports} reports")
        if s.size and (s.min() < 1 or s.max() > h.n_stations):
            raise WireError("out_of_range", f"station index outside 1..{h.n_stations}")
        if o.size and o.max() >= h.n_outputs:
            raise WireError("out_of_range", f"report value {int(o.max())} >= {h.n_outputs}")
    else:
        c = arrays["counts"]
        if c.size not in (h.n_outputs, h.n_stations * h.n_outputs):
            raise WireError("size_mismatch", f"{c.size} counts for {h.n_stations} stations x {h.n_outputs} outputs")
        if c.size and c.min() < 0:
            raise WireError("out_of_range", "negative count")


def _short(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {first.get('msg', 'invalid')}{more}"


def json_safe(v: Any) -> Any:
    """JSON has no NaN or infinity: write them as null (recursively through dicts and lists)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [json_safe(x) for x in v]
    return v


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas of the JSON records, for subscribers and devices."""
    return {m.__name__: m.model_json_schema() for m in (SingleReport, EndOfEpoch, EndOfEpochSet, GroundTruth,
                                                        BatchHeader, DeviceReport, SourceEpoch)}

