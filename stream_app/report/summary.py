"""Loading, joining and summarizing for ``ptt report``: how good were the published estimates?

Inputs are the stream app's estimates (:class:`schemas.estimates.Estimate`) and the replay's
ground truth (:class:`schemas.wire.GroundTruth`) as any iterable of JSON lines. Outputs are
per (query, estimator) the number of (station, epoch) cells, how often each confidence
level's bounds cover the truth, the mean absolute error, the mean band width per level,
epsilon, and what was withheld or had no ground truth (:func:`summarize`), as text
(:func:`format_summary`, ``summary.txt``) and JSON (:func:`summary_json`, ``summary.json``).
Every function here is a function of its arguments, testable without a broker.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from estimators import plain_words
from schemas.epochs import EPOCH_S
from schemas.estimates import Estimate
from schemas.wire import GroundTruth, json_safe

__all__ = [
    "Cell",
    "GroupSummary",
    "LoadedEstimates",
    "LoadedTruth",
    "ReportError",
    "Row",
    "Selection",
    "format_summary",
    "join",
    "estimates_of_frames",
    "estimates_of_long_table",
    "load_estimates",
    "load_truth",
    "sp_caveat",
    "summarize",
    "summary_json",
]

Truth = Mapping[tuple[int, int], int]  # (epoch, station) -> vehicles


class ReportError(Exception):
    """An input or output problem of a report (nothing matching, an unwritable directory): one line."""


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
                   e.data_quality == "no_source_data")

    @property
    def key(self) -> tuple[str, int, int, int, str]:
        return (self.query_id, self.query_version, self.epoch, self.station, self.estimator)

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
    """The ``--query``, ``--station`` and ``--estimator`` filters (empty: everything)."""

    queries: frozenset[str] = frozenset()
    stations: frozenset[int] = frozenset()
    estimators: frozenset[str] = frozenset()

    def __contains__(self, e: object) -> bool:
        if not isinstance(e, Estimate | Row):
            return False
        return ((not self.queries or e.query_id in self.queries)
                and (not self.stations or e.station in self.stations)
                and (not self.estimators or e.estimator in self.estimators))

    def describe(self) -> str:
        parts = [f"--query {','.join(sorted(self.queries))}" if self.queries else "",
                 f"--station {','.join(str(s) for s in sorted(self.stations))}" if self.stations else "",
                 f"--estimator {','.join(sorted(self.estimators))}" if self.estimators else ""]
        return " ".join(p for p in parts if p) or "none"


@dataclass(frozen=True)
class LoadedEstimates:
    rows: list[Row]  # deduplicated, sorted by key
    read: int  # records (non-empty lines) read
    invalid: int  # not an Estimate
    duplicates: int  # dropped: an earlier record of the same key
    filtered_out: int  # valid but not selected


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
    :func:`stream_app.frames.frame_estimates`), in the rows' order, for :func:`load_estimates`;
    a value that is not a frame (or whose values the rows would refuse) is passed on as it is,
    to be counted as unreadable."""
    from ..frames import decode_frame, frame_estimates

    for v in values:
        try:
            got = frame_estimates(decode_frame(v))
        except ValueError:
            yield v or b"?"
            continue
        yield from got


def estimates_of_long_table(path: Path) -> Iterator[Estimate]:
    """The estimates of a long-form file (:data:`stream_app.frames.LONG_SCHEMA`) that ``ptt demo``
    (``estimates.parquet``) or ``ptt subscribe --parquet/--arrow`` wrote. A ValueError (one line)
    if it is not such a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..frames import LONG_SCHEMA

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
    latest: dict[tuple[str, int, int, int, str], Row] = {}
    starts: dict[tuple[datetime, timedelta | None], datetime] = {}
    read = invalid = duplicates = filtered = 0
    for e in _estimates(values):
        read += 1
        if e is None:
            invalid += 1
            continue
        if e not in sel or e.span_s != EPOCH_S:  # rollups are not scored here (one span: the epoch's)
            filtered += 1
            continue
        row = Row.of(e, starts)
        if row.key in latest:
            duplicates += 1
        latest[row.key] = row
    return LoadedEstimates([latest[k] for k in sorted(latest)], read, invalid, duplicates, filtered)


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


# --------------------------------------------------------------------------- joining and summary


@dataclass(frozen=True, slots=True)
class Cell:
    """One (query, version, station, epoch, estimator) estimate and the truth it estimates."""

    row: Row
    truth: int | None


def join(rows: Iterable[Row], truth: Truth) -> list[Cell]:
    return [Cell(r, truth.get((r.epoch, r.station))) for r in rows]


def _same_level(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclass(frozen=True)
class GroupSummary:
    """How one estimator of one query did over all its (station, epoch) cells.

    ``coverage[c]``: fraction of the published cells with truth whose level-``c`` bounds hold
    the truth (``lower <= truth <= upper``); ``mean_width[c]``: mean ``upper - lower`` over the
    published cells; ``mae``/``bias``/``rmse``: of ``estimate - truth`` over the published
    cells with truth. ``None`` where there is nothing to average. A cell flagged
    ``no_source_data`` (a dead or silent detector) is never compared with a truth, whatever
    the truth file says of it (a placeholder 0 is not a quiet road): it is counted apart.
    """

    query_id: str
    estimator: str
    mechanism: str
    versions: tuple[int, ...]
    epsilon_by_version: dict[int, float]
    cells: int  # all (station, epoch) cells, withheld included
    withheld: int
    without_truth: int  # published cells with no ground truth (no_source_data cells not included)
    with_truth: int  # published cells with ground truth: what coverage and error are over
    stations: int
    epochs: int
    first_epoch_start: datetime
    last_epoch_start: datetime
    coverage: dict[float, float | None]
    mean_width: dict[float, float | None]
    mae: float | None
    bias: float | None
    rmse: float | None
    withheld_reasons: dict[str, int] = field(default_factory=dict)
    # the largest shuffled epsilon over the epochs that have one, and how many epochs have one
    epsilon_shuffled: float | None = None
    shuffled_epochs: int = 0
    noise: str | None = None  # noise_note of its published cells
    no_source_data: int = 0  # published cells flagged no_source_data: neither scored nor "without truth"

    @property
    def epsilon(self) -> float:
        """The largest per-epoch epsilon over the query's versions."""
        return max(self.epsilon_by_version.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id, "estimator": self.estimator, "mechanism": self.mechanism,
            "versions": list(self.versions), "epsilon": self.epsilon,
            "epsilon_by_version": {str(v): e for v, e in self.epsilon_by_version.items()},
            "cells": self.cells, "withheld": self.withheld, "without_truth": self.without_truth,
            "with_truth": self.with_truth, "stations": self.stations, "epochs": self.epochs,
            "first_epoch_start": self.first_epoch_start.isoformat(),
            "last_epoch_start": self.last_epoch_start.isoformat(),
            "coverage": {f"{c:g}": v for c, v in self.coverage.items()},
            "mean_width": {f"{c:g}": v for c, v in self.mean_width.items()},
            "mae": self.mae, "bias": self.bias, "rmse": self.rmse,
            "withheld_reasons": dict(self.withheld_reasons),
            "epsilon_shuffled": self.epsilon_shuffled, "shuffled_epochs": self.shuffled_epochs,
            "noise": self.noise,
            "no_source_data": self.no_source_data,
        }


def summarize(cells: Iterable[Cell]) -> list[GroupSummary]:
    """One :class:`GroupSummary` per (query, estimator), sorted by both."""
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c.row.query_id, c.row.estimator)].append(c)
    return [_summarize_group(qid, name, group) for (qid, name), group in sorted(groups.items())]


def _summarize_group(query_id: str, estimator: str, cells: list[Cell]) -> GroupSummary:
    published = [c for c in cells if c.row.published]
    no_source = [c for c in published if c.row.no_source_data]
    scored = [c for c in published if c.truth is not None and not c.row.no_source_data]
    levels = sorted({lvl for c in published for lvl, _, _ in c.row.bounds})
    coverage: dict[float, float | None] = {}
    width: dict[float, float | None] = {}
    for lvl in levels:
        hits = []
        for c in scored:
            b = c.row.bound(lvl)
            if b is not None and c.truth is not None:
                hits.append(1.0 if b[0] <= c.truth <= b[1] else 0.0)
        coverage[lvl] = _mean(hits)
        width[lvl] = _mean([b[1] - b[0] for c in published if (b := c.row.bound(lvl)) is not None])
    errors = [float(c.row.estimate) - float(c.truth) for c in scored
              if c.row.estimate is not None and c.truth is not None]
    mse = _mean([e * e for e in errors])
    reasons: dict[str, int] = defaultdict(int)
    for c in cells:
        if not c.row.published:
            reasons[c.row.withheld or "no estimate"] += 1
    starts = [c.row.epoch_start for c in cells]
    shuffled = {c.row.epoch: c.row.epsilon_shuffled for c in cells if c.row.epsilon_shuffled is not None}
    return GroupSummary(
        query_id=query_id, estimator=estimator, mechanism=cells[0].row.mechanism,
        versions=tuple(sorted({c.row.query_version for c in cells})),
        epsilon_by_version={c.row.query_version: c.row.epsilon for c in sorted(cells, key=lambda c: c.row.epoch)},
        cells=len(cells), withheld=len(cells) - len(published),
        without_truth=len(published) - len(scored) - len(no_source),
        with_truth=len(scored), stations=len({c.row.station for c in cells}), epochs=len({c.row.epoch for c in cells}),
        first_epoch_start=min(starts), last_epoch_start=max(starts), coverage=coverage, mean_width=width,
        mae=_mean([abs(e) for e in errors]), bias=_mean(errors), rmse=None if mse is None else math.sqrt(mse),
        withheld_reasons=dict(sorted(reasons.items())),
        epsilon_shuffled=max(shuffled.values()) if shuffled else None, shuffled_epochs=len(shuffled),
        noise=noise_note([c.row.sd for c in published if c.row.sd is not None], [float(c.truth) for c in scored
                                                                                  if c.truth is not None]),
        no_source_data=len(no_source),
    )


NOISE_RATIO = 0.5  # noise-dominated: the median sd is at least this fraction of the largest true count


def noise_note(sds: Sequence[float], truths: Sequence[float]) -> str | None:
    """``"noise-dominated: sd X against counts up to Y"`` when the median per-epoch sd of the
    published estimates is at least half the largest true count -- a band of one sd either side
    of the truth then spans its whole range, and single epochs show noise, not traffic -- else
    None (also without an sd or a truth).

    >>> noise_note([130.0, 140.0, 150.0], [0, 10, 80])
    'noise-dominated: sd 140 against counts up to 80'
    >>> noise_note([7.0, 8.0], [0, 80]) is None
    True
    """
    if not sds or not truths:
        return None
    sd, top = float(sorted(sds)[len(sds) // 2]), max(truths)
    return f"noise-dominated: sd {sd:.3g} against counts up to {top:.3g}" if sd >= NOISE_RATIO * top else None


def _f(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _level(confidence: float) -> str:
    return f"{100 * confidence:.10g}%"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _span(epochs: Sequence[int], tz: Any) -> str:
    from schemas.epochs import epoch_start

    first, last = (epoch_start(e).astimezone(tz).isoformat() for e in (epochs[0], epochs[-1]))
    return first if len(epochs) == 1 else f"{first} .. {last}"


def _unestimated(truth_epochs: frozenset[int], rows: Sequence[Row]) -> list[str]:
    """Lines on the ground truth's epochs that no estimate has (none: no line), and why.

    A replay sends an epoch's ground truth when it begins the epoch; the worker publishes the
    epoch's estimates when it closes it, a little later. So the last epochs of a run stopped
    (e.g. by Ctrl-C) while the worker was behind the replay have a truth and no estimate."""
    estimated = {r.epoch for r in rows}
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


def format_summary(groups: Sequence[GroupSummary], estimates: LoadedEstimates | None = None,
                   truth: LoadedTruth | None = None, plots: Sequence[Path] = ()) -> str:
    """The plain-text summary: what was read, then one block per (query, estimator)."""
    lines = []
    if estimates is not None:
        lines.append(f"estimates: {estimates.read:,} records read, {len(estimates.rows):,} kept; "
                     f"{estimates.duplicates:,} duplicates dropped, {estimates.filtered_out:,} filtered out, "
                     f"{estimates.invalid:,} unreadable")
    if truth is not None:
        lines.append(f"ground truth: {truth.epochs:,} epochs ({truth.read:,} records, {truth.invalid:,} unreadable)")
        if estimates is not None and estimates.rows:
            lines += _unestimated(truth.epoch_ids, estimates.rows)
    else:
        lines.append("ground truth: none given (coverage and error not computed)")
    for g in groups:
        eps = ", ".join(f"v{v}: {e:.4g}" for v, e in g.epsilon_by_version.items())
        lines += [
            "",
            f"{g.query_id} / {g.estimator} ({g.mechanism}; epsilon per epoch {eps})",
            f"  cells (station x epoch)  {g.cells:,}  ({g.stations:,} stations x {g.epochs:,} epochs, "
            f"{g.first_epoch_start.isoformat()} .. {g.last_epoch_start.isoformat()})",
            f"  withheld                 {g.withheld:,}",
        ]
        lines += [f"    {n:,}  {reason}" for reason, n in g.withheld_reasons.items()]
        lines.append("  shuffled epsilon         " + (
            "not attested (no epoch came through a shuffler that attests its shuffle size)"
            if g.epsilon_shuffled is None else
            f"at most {g.epsilon_shuffled:.4g} per epoch, in {g.shuffled_epochs:,} of {g.epochs:,} epochs "
            f"(assumes the shuffler does not collude with the analyst and mixed each report among the n reports "
            f"of its epoch and round)"))
        if (caveat := sp_caveat(g.mechanism)) is not None:
            lines.append(f"  caveat                   {caveat}")
        if g.noise is not None:
            lines.append(f"  noise                    {g.noise} (single epochs show noise, not traffic; the "
                         f"5-minute and hourly rollups sum them)")
        if g.no_source_data:
            lines.append(f"  no source data           {g.no_source_data:,}  (no reading from the station: not compared "
                         "with the truth)")
        lines.append(f"  without ground truth     {g.without_truth:,}")
        lines.append(f"  compared with the truth  {g.with_truth:,}")
        for lvl in sorted(g.coverage, reverse=True):
            lines.append(f"  {_level(lvl) + ' bounds':<23}  coverage {_pct(g.coverage[lvl]):>6}   "
                         f"mean width {_f(g.mean_width[lvl])}")
        lines.append(f"  error                    MAE {_f(g.mae)}   bias {_f(g.bias, '+.2f')}   RMSE {_f(g.rmse)}")
    if groups:
        lines += ["", f"privacy: {plain_words()} A vehicle's day figure for these queries: ptt analyst list, or "
                      f"ptt plan fleet."]
    if plots:
        lines += ["", f"plots: {len(plots)} PNG files"]
    return "\n".join(lines) + "\n"


def sp_caveat(mechanism: str) -> str | None:
    """The one caveat of a mechanism whose rounds share the device's randomness (Sampling Privacy:
    no shuffled or whole-day bound, :data:`estimators.SP_CAVEAT`); None for every other one.

    >>> sp_caveat("sp") is not None, sp_caveat("alp")
    (True, None)
    """
    from estimators import SP_CAVEAT, get_spec, privacy, registry

    if mechanism not in registry.REGISTRY:
        return None
    return None if privacy.rounds_independent(get_spec(mechanism).build({}, 1)) else SP_CAVEAT


def summary_json(groups: Sequence[GroupSummary], estimates: LoadedEstimates | None = None,
                 truth: LoadedTruth | None = None, plots: Sequence[Path] = ()) -> dict[str, Any]:
    """The summary as a JSON-ready object (``summary.json``): ``groups`` (as
    :meth:`GroupSummary.to_json`; levels are keys like ``"0.95"``), ``plots`` (file names),
    ``estimates`` and ``truth`` (what was read; ``truth`` is null without ground truth)."""
    out: dict[str, Any] = {"groups": [g.to_json() for g in groups], "plots": [p.name for p in plots]}
    if estimates is not None:
        out["estimates"] = {"read": estimates.read, "kept": len(estimates.rows), "duplicates": estimates.duplicates,
                            "filtered_out": estimates.filtered_out, "invalid": estimates.invalid}
    out["truth"] = None if truth is None else {"epochs": truth.epochs, "read": truth.read, "invalid": truth.invalid}
    result: dict[str, Any] = json_safe(out)
    return result

