"""Loading for ``ptt report``: estimates and ground truth from any iterable of JSON lines
(or estimate frames, or a long-form Parquet/Arrow file), as small rows: :func:`load_estimates`
(deduplicated, filtered by :class:`Selection`, every record not kept counted by why) and
:func:`load_truth` (only cells that have a truth: missing is not zero); the bounded code of a
withheld row's reason (:func:`withheld_code`); the truth's epochs no estimate covers
(:func:`unestimated_lines`). Functions of their arguments, testable without
a broker.
"""

from __future__ import annotations

import math
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.epochs import EPOCH_S, spans_epochs
from schemas.estimates import Estimate
from schemas.wire import GroundTruth

__all__ = [
    "LoadedEstimates",
    "LoadedTruth",
    "ReportError",
    "Row",
    "Selection",
    "Truth",
    "estimates_of_frames",
    "estimates_of_long_table",
    "load_estimates",
    "load_truth",
    "unestimated_lines",
    "withheld_code",
]

Truth = Mapping[tuple[int, int], int]  # (epoch, station) -> vehicles


def _same_level(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


class ReportError(Exception):
    """An input or output problem of a report (nothing matching, an unwritable directory): one line."""


# the worker's withheld texts (stream_app/worker/estimate.py, stream_app/worker/rollups.py) -> their bounded codes; the
# row on the wire carries the text only. A rollup's text is "epoch E withheld[ (and k more ...)]: CODE: why".
_ROLLUP_WITHHELD = re.compile(r"^epoch \d+ withheld(?: \(and \d+ more of its epochs\))?: (\w+): ")
_WITHHELD_PREFIXES = (
    ("withdrawn: a later end-of-epoch marker", "conflicting_markers"),
    ("conflicting end-of-epoch markers", "conflicting_markers"),
    ("participants unknown", "participants_unknown"),
    ("epoch interrupted", "interrupted"),
    ("fewer than ", "too_few_participants"),
    ("impossible", "impossible_counts"),
    ("more reports arrived", "impossible_counts"),
    ("round reports ", "impossible_counts"),
    ("internal", "internal"),
)
_WITHHELD_PATTERNS = (
    (re.compile(r"^\d+ end-of-epoch marker"), "missing_markers"),
    (re.compile(r"^\d+ batch\(es\) the markers announce"), "missing_batches"),
    (re.compile(r"^(\w+): "), None),  # "no_reports: ...", "late: ...", "below_min_crowd: ...": the code itself
)


def withheld_code(text: str) -> str:
    """The bounded code (``stream_app.worker.estimate.WITHHELD_CODES``, or a rollup's first withheld
    epoch's, e.g. ``outside_query_window``) of a withheld row's reason text; ``other`` for a
    text of none of the worker's forms.

    >>> withheld_code("fewer than 20 participating vehicles (3)")
    'too_few_participants'
    >>> withheld_code("epoch 59 withheld (and 2 more of its epochs): no_reports: no_reports: nothing came")
    'no_reports'
    >>> withheld_code("3 end-of-epoch marker(s) never arrived (round, producer, partition: [])")
    'missing_markers'
    >>> withheld_code("the moon was full")
    'other'
    """
    m = _ROLLUP_WITHHELD.match(text)
    if m:
        return m.group(1)
    for prefix, code in _WITHHELD_PREFIXES:
        if text.startswith(prefix):
            return code
    for pattern, fixed in _WITHHELD_PATTERNS:
        m = pattern.match(text)
        if m:
            return fixed or m.group(1)
    return "other"


# --------------------------------------------------------------------------- loading


@dataclass(frozen=True, slots=True)
class Row:
    """What the report needs of one :class:`Estimate` (far smaller than the model)."""

    query_id: str
    query_version: int
    mechanism: str
    estimator: str
    epoch: int
    epoch_start: datetime
    station: int
    estimate: float | None
    bounds: tuple[tuple[float, float, float], ...]  # (confidence, lower, upper)
    epsilon: float
    participants: int
    withheld: str | None
    epsilon_shuffled: float | None = None  # null on the wire: not attested (or infinite)
    sd: float | None = None
    no_source_data: bool = False  # data_quality "no_source_data": the source had no reading, nothing to score
    span_s: int = EPOCH_S  # 30: one epoch; longer: a flow (a rollup of the query's estimates, or a span query's)
    release: str | None = None  # the shuffler's release the estimate attests (null: the direct path)

    @property
    def is_flow(self) -> bool:
        """Whether it covers more than one epoch (:attr:`Estimate.is_flow`)."""
        return spans_epochs(self.span_s)

    @classmethod
    def of(cls, e: Estimate, starts: dict[tuple[datetime, timedelta | None], datetime] | None = None) -> Row:
        """``starts``: a cache shared by the rows of a load, so that the many rows of an epoch
        share one datetime (and the repeated names are interned): a day is ~300k rows."""
        start = e.epoch_start
        if starts is not None:
            start = starts.setdefault((start, start.utcoffset()), start)
        return cls(sys.intern(e.query_id), e.query_version, sys.intern(e.mechanism), sys.intern(e.estimator),
                   e.epoch, start, e.station, e.estimate, tuple((b.confidence, b.lower, b.upper) for b in e.bounds),
                   math.inf if e.epsilon is None else e.epsilon,  # null on the wire = infinite
                   e.participants, None if e.withheld is None else sys.intern(e.withheld), e.epsilon_shuffled, e.sd,
                   e.data_quality == "no_source_data", e.span_s, None if e.release is None else sys.intern(e.release))

    @property
    def key(self) -> tuple[str, int, int, int, int, str]:
        """(query, version, span, epoch, station, estimator): a rollup's ``epoch`` is its first
        epoch's, so the span tells it from that epoch's row."""
        return (self.query_id, self.query_version, self.span_s, self.epoch, self.station, self.estimator)

    @property
    def withheld_code(self) -> str | None:
        """The bounded code of why the row is withheld (:func:`withheld_code`), None if it is not."""
        return None if self.withheld is None else withheld_code(self.withheld)

    @property
    def published(self) -> bool:
        return self.withheld is None and self.estimate is not None

    def bound(self, confidence: float) -> tuple[float, float] | None:
        for c, lo, hi in self.bounds:
            if _same_level(c, confidence):
                return lo, hi
        return None


@dataclass(frozen=True)
class Selection:
    """The ``--query``, ``--station``, ``--estimator`` and ``--span`` filters (empty: everything)."""

    queries: frozenset[str] = frozenset()
    stations: frozenset[int] = frozenset()
    estimators: frozenset[str] = frozenset()
    spans: frozenset[int] = frozenset()

    def __contains__(self, e: object) -> bool:
        return isinstance(e, Estimate | Row) and self.why_not(e) is None

    def why_not(self, e: Estimate | Row) -> str | None:
        """The first filter that leaves ``e`` out (``"--query sp-day"``), None if it is selected."""
        if self.queries and e.query_id not in self.queries:
            return f"--query {','.join(sorted(self.queries))}"
        if self.stations and e.station not in self.stations:
            return f"--station {','.join(str(s) for s in sorted(self.stations))}"
        if self.estimators and e.estimator not in self.estimators:
            return f"--estimator {','.join(sorted(self.estimators))}"
        if self.spans and e.span_s not in self.spans:
            return f"--span {','.join(str(s) for s in sorted(self.spans))}"
        return None

    def describe(self) -> str:
        parts = [f"--query {','.join(sorted(self.queries))}" if self.queries else "",
                 f"--station {','.join(str(s) for s in sorted(self.stations))}" if self.stations else "",
                 f"--estimator {','.join(sorted(self.estimators))}" if self.estimators else "",
                 f"--span {','.join(str(s) for s in sorted(self.spans))}" if self.spans else ""]
        return " ".join(p for p in parts if p) or "none"


@dataclass(frozen=True)
class LoadedEstimates:
    rows: list[Row]  # deduplicated, sorted by key
    read: int  # records (non-empty lines) read
    invalid: int  # not an Estimate
    duplicates: int  # dropped: an earlier record of the same key
    filtered_out: int  # valid but not selected (the sum of ``not_selected``)
    not_selected: dict[str, int] = field(default_factory=dict)  # the filter that left them out -> rows
    own_span: dict[str, int] = field(default_factory=dict)  # query -> its shortest span over every valid row

    def by_span(self) -> dict[int, int]:
        """Kept rows per span (seconds), shortest first."""
        out: dict[int, int] = defaultdict(int)
        for r in self.rows:
            out[r.span_s] += 1
        return dict(sorted(out.items()))


@dataclass(frozen=True)
class LoadedTruth:
    truth: dict[tuple[int, int], int]
    epochs: int  # distinct epochs with a ground-truth record
    read: int
    invalid: int
    epoch_ids: frozenset[int] = frozenset()  # those epochs


def _lines(values: Iterable[bytes | str]) -> Iterator[bytes]:
    for v in values:
        b = v.encode() if isinstance(v, str) else v
        b = b.strip()
        if b:
            yield b


def _estimates(values: Iterable[bytes | str | Estimate]) -> Iterator[Estimate | None]:
    """Each item as an :class:`Estimate` (already one, or parsed from its JSON), ``None`` for one
    that is not an estimate; blank lines are skipped."""
    for v in values:
        if isinstance(v, Estimate):
            yield v
            continue
        b = (v.encode() if isinstance(v, str) else v).strip()
        if not b:
            continue
        try:
            yield Estimate.model_validate_json(b)
        except ValidationError:
            yield None


def estimates_of_frames(values: Iterable[bytes]) -> Iterator[Estimate | bytes]:
    """The estimates of estimate frames (record values of the frames topic,
    :func:`stream_app.worker.frames.frame_estimates`), in the rows' order, for :func:`load_estimates`;
    a value that is not a frame (or whose values the rows would refuse) is passed on as it is,
    to be counted as unreadable."""
    from ..worker.frames import decode_frame, frame_estimates

    for v in values:
        try:
            got = frame_estimates(decode_frame(v))
        except ValueError:
            yield v or b"?"
            continue
        yield from got


def estimates_of_long_table(path: Path) -> Iterator[Estimate]:
    """The estimates of a long-form file (:data:`stream_app.worker.frames.LONG_SCHEMA`) that ``ptt demo``
    (``estimates.parquet``) or ``ptt subscribe --parquet/--arrow`` wrote. A ValueError (one line)
    if it is not such a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..worker.frames import LONG_SCHEMA

    try:
        with path.open("rb") as fh:
            magic = fh.read(6)
        if magic[:4] == b"PAR1":
            table = pq.read_table(path)
        else:
            with pa.ipc.open_file(path) as reader:
                table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path} is not a Parquet or Arrow file: {exc}") from None
    optional = ("epsilon_shuffled", "span_s", "release")  # added later: absent from older files (null, 30, null)
    missing = [f for f in LONG_SCHEMA.names if f not in table.column_names and f not in optional]
    if missing:
        raise ValueError(f"{path} is not a long-form estimates file (no column {', '.join(missing)})")
    extra = ("withheld_code", "retracted")
    keep = [f for f in LONG_SCHEMA.names if f not in extra and f in table.column_names]
    for batch in table.select(keep).to_batches():
        for row in batch.to_pylist():
            yield Estimate.model_validate({"kind": "estimate", **row})


def load_estimates(values: Iterable[bytes | str | Estimate], selection: Selection | None = None) -> LoadedEstimates:
    """Parse estimate records (JSON, one per item, or :class:`Estimate` objects, e.g. of
    :func:`estimates_of_frames`), keep the selected ones, and deduplicate by (query, version,
    epoch, station, estimator), the last record winning (a worker that restarts may publish an
    epoch again). Items that are not estimates are counted, not fatal."""
    sel = selection or Selection()
    latest: dict[tuple[str, int, int, int, int, str], Row] = {}
    starts: dict[tuple[datetime, timedelta | None], datetime] = {}
    read = invalid = duplicates = 0
    not_selected: dict[str, int] = defaultdict(int)
    own_span: dict[str, int] = {}
    for e in _estimates(values):
        read += 1
        if e is None:
            invalid += 1
            continue
        own_span[e.query_id] = min(e.span_s, own_span.get(e.query_id, e.span_s))
        why = sel.why_not(e)
        if why is not None:
            not_selected[why] += 1
            continue
        row = Row.of(e, starts)
        if row.key in latest:
            duplicates += 1
        latest[row.key] = row
    return LoadedEstimates([latest[k] for k in sorted(latest)], read, invalid, duplicates,
                           sum(not_selected.values()), dict(sorted(not_selected.items())), own_span)


def load_truth(values: Iterable[bytes | str], stations: Iterable[int] | None = None) -> LoadedTruth:
    """Parse :class:`GroundTruth` records into ``{(epoch, station): vehicles}`` -- only cells that
    have a truth (a missing reading or a dead detector is no truth, never 0) and only for
    ``stations`` if given (a 3,220-station day is 9 million cells); a later record of the same
    epoch replaces an earlier one."""
    keep = None if stations is None else frozenset(stations)
    by_epoch: dict[int, dict[int, int]] = {}
    read = invalid = 0
    for line in _lines(values):
        read += 1
        try:
            t = GroundTruth.model_validate_json(line)
        except ValidationError:
            invalid += 1
            continue
        by_epoch[t.epoch] = {s: f for s, f in t.truth().items() if keep is None or s in keep}
    truth = {(epoch, s): f for epoch, flows in by_epoch.items() for s, f in flows.items()}
    return LoadedTruth(truth, len(by_epoch), read, invalid, frozenset(by_epoch))


def _span(epochs: Sequence[int], tz: Any) -> str:
    from schemas.epochs import epoch_start

    first, last = (epoch_start(e).astimezone(tz).isoformat() for e in (epochs[0], epochs[-1]))
    return first if len(epochs) == 1 else f"{first} .. {last}"


def unestimated_lines(truth_epochs: frozenset[int], rows: Sequence[Row]) -> list[str]:
    """Lines on the ground truth's epochs that no estimate covers (none: no line), and why (a
    row of a longer span covers each of its epochs).

    A replay sends an epoch's ground truth when it begins the epoch; the worker publishes the
    epoch's estimates when it closes it, a little later. So the last epochs of a run stopped
    (e.g. by Ctrl-C) while the worker was behind the replay have a truth and no estimate."""
    estimated: set[int] = set()
    for epoch, span_s in {(r.epoch, r.span_s) for r in rows}:
        estimated.update(range(epoch, epoch + max(1, span_s // EPOCH_S)))
    missing = sorted(truth_epochs - estimated)
    if not missing:
        return []
    tz = rows[0].epoch_start.tzinfo
    last = max(estimated)
    after = [e for e in missing if e > last]
    before = [e for e in missing if e <= last]
    lines = []
    if after:
        lines.append(f"  the last {len(after):,} of them ({_span(after, tz)}) have no estimate: the worker had not "
                     "closed them when the estimates were read (a run stopped, e.g. by Ctrl-C, while the worker was "
                     "behind the replay)")
    if before:
        lines.append(f"  {len(before):,} earlier ones ({_span(before, tz)}) have no estimate: no query was active "
                     "then, or their estimates were not read")
    return lines
