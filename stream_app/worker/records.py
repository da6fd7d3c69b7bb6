"""Typed records between the stream app's stages, in a binary encoding.

Stage 1 turns each record of the reports topic into one of these and re-keys it by window;
stage 2 decodes them. A record is ``b"PTS1"``, one kind byte, a 4-byte big-endian header
length, a small JSON header of scalars, then (batches only) the count array in the
smallest unsigned dtype that holds it. No count ever travels as a JSON list, and no key is
parsed back with ``split``.

>>> import numpy as np
>>> b = BatchPartial("q", 1, 100, 0, 2, "p0-ab", "f" * 32, 3, True, np.array([1, 0, 2]))
>>> decode_partial(encode_partial(b)) == b
True
>>> decode_partial(encode_partial(Tick(12.5)))
Tick(now_s=12.5)
>>> decode_partial(encode_partial(Gap("q", 1, 101, 2, 104)))
Gap(query_id='q', query_version=1, epoch=101, source_partition=2, until=104)

Stage 1 sends the records of one batch that go to the same stage-2 partition as one
*bundle* (``b"PTS1L"``, a 4-byte count, then each record with a 4-byte length): one Kafka
record instead of one per marker or batch. Each record in it keeps its own identity (batch
ids are still deduplicated one by one).

>>> [type(p).__name__ for p in decode_partials(encode_bundle([encode_partial(b), encode_partial(Tick(1.0))]))]
['BatchPartial', 'Tick']
>>> decode_partials(encode_partial(Tick(2.0)))
[Tick(now_s=2.0)]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.wire import FRAME_LENGTH, RELEASES, SHUFFLER_WITHHELD

__all__ = ["BUNDLE_BYTES", "BatchPartial", "EpochSummary", "Gap", "MarkerPartial", "Partial", "StageRecord", "Tick",
           "WindowId", "bundle", "decode_partial", "decode_partials", "encode_bundle", "encode_partial", "split_bundle"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MAGIC = b"PTS1"
_KINDS = {b"B": "batch", b"M": "marker", b"T": "tick", b"S": "summary", b"G": "gap"}
_DTYPES = ("<u1", "<u2", "<u4", "<i8")
_BUNDLE = MAGIC + b"L"
BUNDLE_BYTES = 256 * 1024  # a bundle is closed once it holds this much (a bigger record goes alone)


@dataclass(frozen=True)
class WindowId:
    """(query id, version, epoch): the key of an epoch window."""

    query_id: str
    query_version: int
    epoch: int

    @property
    def key(self) -> bytes:
        """Kafka/table key: partitions by window, never by vehicle."""
        return f"{self.query_id}\x1f{self.query_version}\x1f{self.epoch}".encode()


@dataclass(frozen=True, eq=False)
class _Windowed:
    """The window a stage record belongs to."""

    query_id: str
    query_version: int
    epoch: int

    @property
    def window(self) -> WindowId:
        return WindowId(self.query_id, self.query_version, self.epoch)


@dataclass(frozen=True, eq=False)
class BatchPartial(_Windowed):
    """One decoded batch of one round: its count array (``width`` entries) and provenance.

    ``tallied``: an exact tally (every row holds all its vehicles) rather than per-vehicle
    reports; ``reports``: reports (tally: vehicles) the batch stands for.
    """

    round: int
    source_partition: int
    producer_id: str
    batch_id: str
    reports: int
    tallied: bool
    counts: IntArray

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchPartial):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.name != "counts") \
            and np.array_equal(self.counts, other.counts)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class MarkerPartial(_Windowed):
    """A producer's end-of-epoch marker for one round, as it arrived on one source partition."""

    round: int
    source_partition: int
    producer_id: str
    producer_index: int
    producer_count: int
    reports: int
    batches: int
    participants: int
    refused: int
    interrupted: bool
    readings_missing: tuple[int, ...] = ()
    shuffle_size: int | None = None  # a shuffler's attested shuffle size for this round (None: not attested)
    release: str | None = None  # what that shuffler released: "permuted" or "aggregate" (None: not said)
    withheld: str | None = None  # a shuffler withheld the epoch: "no_reports" or "below_min_crowd" (None: not)


@dataclass(frozen=True)
class Gap(_Windowed):
    """Stage 1 saw ``source_partition`` jump past this epoch of the query with nothing of it
    (:mod:`stream_app.worker.gaps`). It only opens the epoch's window -- no counts, no markers, no
    claim on the watermark -- so an epoch nobody wrote anything for still closes, withheld as
    ``no_reports``, instead of having no row at all. ``until``: the epoch of the record that
    jumped past it (stage 2 ignores the gap when that epoch lies beyond its horizon)."""

    source_partition: int
    until: int


@dataclass(frozen=True)
class Tick:
    """Wall-clock tick, sent by the worker's timer to every stage-2 partition."""

    now_s: float


@dataclass(frozen=True, eq=False)
class EpochSummary(_Windowed):
    """What one decided epoch contributes to its rollups (:mod:`stream_app.worker.rollups`): stage 2
    sends it, keyed by the epoch's hour, after the epoch's estimates are published.

    ``estimate`` and ``variance`` are ``(estimators, stations)`` float64 arrays (``variance`` is
    the published sd squared); both ``(0, 0)`` when the epoch is withheld (``withheld_code``
    and ``withheld`` say why) or ``retracted`` (its published estimates were withdrawn)."""

    closed_by: str
    withheld_code: str | None
    withheld: str | None
    retracted: bool
    participants: int
    reports: int
    round_reports: tuple[int, ...]
    late: int
    refused: int
    missing_batches: int
    epsilon_shuffled: float | None
    no_source_data: tuple[int, ...]  # station indices 1..V
    estimators: tuple[str, ...]
    estimate: FloatArray
    variance: FloatArray
    release: str | None = None  # what the shuffler released (wire.RELEASES); None: not attested (the direct path)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochSummary):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self)
                   if f.name not in ("estimate", "variance")) \
            and np.array_equal(self.estimate, other.estimate) and np.array_equal(self.variance, other.variance)

    __hash__ = None  # type: ignore[assignment]


Partial = BatchPartial | MarkerPartial | Gap | Tick  # what the window policy takes
StageRecord = Partial | EpochSummary  # what the partials topic carries
_SUMMARY_FIELDS = tuple(f.name for f in fields(EpochSummary) if f.name not in ("estimate", "variance"))
_BATCH_FIELDS = tuple(f for f in fields(BatchPartial) if f.name != "counts")
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (MarkerPartial, Gap, Tick)}
_FLAT_KINDS = {MarkerPartial: b"M", Gap: b"G", Tick: b"T"}


def _smallest(a: IntArray) -> str:
    top = int(a.max()) if a.size else 0
    if int(a.min() if a.size else 0) < 0:
        return "<i8"
    return "<u1" if top < 2**8 else "<u2" if top < 2**16 else "<u4" if top < 2**32 else "<i8"


def encode_partial(p: StageRecord) -> bytes:
    if isinstance(p, EpochSummary):
        head = {name: getattr(p, name) for name in _SUMMARY_FIELDS}
        head["shape"] = list(p.estimate.shape)
        blob = (np.ascontiguousarray(p.estimate, dtype="<f8").tobytes()
                + np.ascontiguousarray(p.variance, dtype="<f8").tobytes())
        kind = b"S"
    elif isinstance(p, BatchPartial):
        head = {f.name: getattr(p, f.name) for f in _BATCH_FIELDS}
        dt = _smallest(p.counts)
        head["dtype"] = dt
        head["n"] = int(p.counts.size)
        blob = np.ascontiguousarray(p.counts, dtype=dt).tobytes()
        kind = b"B"
    else:  # flat dataclasses: their fields by name (dataclasses.asdict deep-copies: slow)
        head = {name: getattr(p, name) for name in _FIELDS[type(p)]}
        for optional in ("shuffle_size", "release", "withheld"):  # unset: the record a worker wrote before the field
            if head.get(optional, 0) is None:
                del head[optional]
        blob = b""
        kind = _FLAT_KINDS[type(p)]
    h = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([MAGIC, kind, FRAME_LENGTH.pack(len(h)), h, blob])


def decode_partial(data: bytes) -> StageRecord:
    """Inverse of :func:`encode_partial`; ``ValueError`` on anything else."""
    if data[:4] != MAGIC or len(data) < 9 or data[4:5] not in _KINDS:
        raise ValueError("not a stage record")
    (hlen,) = FRAME_LENGTH.unpack_from(data, 5)
    head: dict[str, Any] = json.loads(data[9:9 + hlen])
    kind = _KINDS[data[4:5]]
    try:  # a well-framed record with the wrong fields is garbage too: ValueError, not TypeError
        if kind == "tick":
            return Tick(**head)
        if kind == "gap":
            return Gap(**head)
        if kind == "summary":
            shape = tuple(int(x) for x in head.pop("shape"))
            if len(shape) != 2 or min(shape) < 0:
                raise ValueError(f"bad summary shape {shape}")
            cells = shape[0] * shape[1]
            if len(data) != 9 + hlen + 16 * cells:
                raise ValueError("summary arrays do not match their shape")
            est = np.frombuffer(data, dtype="<f8", count=cells, offset=9 + hlen).reshape(shape).astype(np.float64)
            var = np.frombuffer(data, dtype="<f8", count=cells, offset=9 + hlen + 8 * cells).reshape(shape)
            for name in ("round_reports", "no_source_data", "estimators"):
                head[name] = tuple(head[name])
            if head.get("release") not in (None, *RELEASES):  # absent: a summary written before the field
                raise ValueError(f"bad release {head.get('release')!r}")
            return EpochSummary(estimate=est, variance=var.astype(np.float64), **head)
        if kind == "marker":
            head["readings_missing"] = tuple(head.get("readings_missing", ()))
            size = head.get("shuffle_size")
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
                raise ValueError(f"bad shuffle size {size!r}")
            if head.get("release") not in (None, *RELEASES):
                raise ValueError(f"bad release {head.get('release')!r}")
            if head.get("withheld") not in (None, *SHUFFLER_WITHHELD):
                raise ValueError(f"bad withheld reason {head.get('withheld')!r}")
            return MarkerPartial(**head)
        dt = head.pop("dtype")
        if dt not in _DTYPES:
            raise ValueError(f"bad dtype {dt!r}")
        n = head.pop("n")
        counts = np.frombuffer(data, dtype=dt, count=n, offset=9 + hlen).astype(np.int64)
        return BatchPartial(counts=counts, **head)
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"bad stage record header: {exc}") from exc


def encode_bundle(records: Sequence[bytes]) -> bytes:
    """Several encoded stage records as one (see the module's docstring)."""
    out = [_BUNDLE, FRAME_LENGTH.pack(len(records))]
    for r in records:
        out += [FRAME_LENGTH.pack(len(r)), r]
    return b"".join(out)


def split_bundle(data: bytes) -> list[bytes]:
    """The encoded records of a bundle (a single record: itself); ``ValueError`` if malformed."""
    if data[:5] != _BUNDLE:
        return [data]
    if len(data) < 9:
        raise ValueError("truncated stage bundle")
    (n,) = FRAME_LENGTH.unpack_from(data, 5)
    out: list[bytes] = []
    pos = 9
    for _ in range(n):
        if pos + 4 > len(data):
            raise ValueError("truncated stage bundle")
        (size,) = FRAME_LENGTH.unpack_from(data, pos)
        pos += 4
        if pos + size > len(data):
            raise ValueError("truncated stage bundle")
        out.append(data[pos:pos + size])
        pos += size
    if pos != len(data):
        raise ValueError("trailing bytes after a stage bundle")
    return out


def decode_partials(data: bytes) -> list[StageRecord]:
    """Every stage record in ``data`` (a bundle or a single record)."""
    return [decode_partial(r) for r in split_bundle(data)]


def bundle(records: Iterable[tuple[int, bytes, bytes]],
           max_bytes: int = BUNDLE_BYTES) -> list[tuple[int, bytes, bytes]]:
    """Group (partition, key, encoded record) into bundles per partition, in order, each at
    most ``max_bytes`` unless a single record is bigger; a bundle's key is its first record's.

    >>> out = bundle([(0, b"a", b"x" * 10), (1, b"b", b"y"), (0, b"c", b"z")], max_bytes=100)
    >>> [(p, k, len(split_bundle(v))) for p, k, v in out]
    [(0, b'a', 2), (1, b'b', 1)]
    """
    open_: dict[int, tuple[bytes, list[bytes], int]] = {}
    out: list[tuple[int, bytes, bytes]] = []
    for part, key, value in records:
        first, members, size = open_.get(part, (key, [], 0))
        if members and size + len(value) > max_bytes:
            out.append((part, first, encode_bundle(members)))
            first, members, size = key, [], 0
        members.append(value)
        open_[part] = (first, members, size + len(value))
    out += [(part, first, encode_bundle(members)) for part, (first, members, _) in open_.items()]
    return out
