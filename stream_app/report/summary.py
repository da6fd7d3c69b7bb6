"""Joining and summarizing for ``ptt report``: how good were the published estimates?

Inputs are the stream app's estimates (:class:`schemas.estimates.Estimate`) and the replay's
ground truth (:class:`schemas.wire.GroundTruth`) as any iterable of JSON lines. Outputs are
per (query, span, estimator) the number of (station, epoch) cells, how often each confidence
level's bounds cover the truth (overall and by truth bin), the mean absolute error and bias,
the mean band width per level, epsilon, and every cell not scored and why
(:func:`summarize`), as text (:func:`format_summary`, ``summary.txt``: the flows first, the
span queries' before the rollups, each with what it is good for, :mod:`.flows`) and JSON
(:func:`summary_json`, ``summary.json``). A flow (a row of a span longer than an epoch: a
rollup, or a span query's) is held against the sum of its epochs' truth, and has none when
any of them has none for its station (:func:`join`: missing is not zero).
Loading is :mod:`.loading`. Every function here is a function of its arguments, testable
without a broker.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from estimators import plain_words
from schemas.epochs import EPOCH_S, spans_epochs
from schemas.wire import json_safe

from .cap_drops import CapDrops, cap_drop_words
from .flows import flow_rank, flow_what, good_for
from .loading import (
    LoadedEstimates,
    LoadedTruth,
    ReportError,
    Row,
    Selection,
    Truth,
    estimates_of_frames,
    estimates_of_long_table,
    load_estimates,
    load_truth,
    unestimated_lines,
    withheld_code,
)

__all__ = [
    "NO_READING",
    "NO_TRUTH_GIVEN",
    "NO_TRUTH_RECORD",
    "TRUTH_BINS",
    "BinScore",
    "Cell",
    "GroupSummary",
    "LoadedEstimates",
    "LoadedTruth",
    "ReportError",
    "Row",
    "Selection",
    "flows_first",
    "format_summary",
    "join",
    "estimates_of_frames",
    "estimates_of_long_table",
    "load_estimates",
    "load_truth",
    "noise_dominated",
    "sp_caveat",
    "summarize",
    "span_words",
    "summary_json",
    "truth_bin",
    "withheld_code",
]

# why a published row has no truth to be scored against (missing is not zero: never summed as 0)
NO_TRUTH_GIVEN = "no truth: no ground truth given"
NO_TRUTH_RECORD = "no truth: the ground truth of its epoch (or of one of its span's epochs) was not read"
NO_READING = "no truth: no reading from the station in its epoch (or in one of its span's epochs)"

#: truth bins of the coverage by truth (as tests/benchmarks/bench_rollups.py): [0,1), [1,10), ... , >=1000
TRUTH_BINS = (0, 1, 10, 50, 200, 1000)


def truth_bin(y: float) -> str:
    """The label of the truth bin of ``y``.

    >>> truth_bin(0), truth_bin(9), truth_bin(200), truth_bin(4321)
    ('[0,1)', '[1,10)', '[200,1000)', '>=1000')
    """
    for lo, hi in zip(TRUTH_BINS, TRUTH_BINS[1:], strict=False):
        if lo <= y < hi:
            return f"[{lo},{hi})"
    return f">={TRUTH_BINS[-1]}"


def span_words(span_s: int) -> str:
    """A span for a reader: ``30 s``, ``5 min``, ``1 h``.

    >>> span_words(30), span_words(300), span_words(3600), span_words(5400), span_words(90)
    ('30 s', '5 min', '1 h', '90 min', '90 s')
    """
    if span_s % 3600 == 0:
        return f"{span_s // 3600} h"
    if span_s % 60 == 0:
        return f"{span_s // 60} min"
    return f"{span_s} s"


# --------------------------------------------------------------------------- joining and summary


@dataclass(frozen=True, slots=True)
class Cell:
    """One (query, version, span, station, epoch, estimator) estimate and the truth it estimates:
    the epoch's, or for a longer span the sum of its epochs' -- None (``missing`` says why) when
    any of them has none for the station: missing is not zero."""

    row: Row
    truth: int | None
    missing: str | None = None  # why truth is None (NO_TRUTH_GIVEN, NO_TRUTH_RECORD, NO_READING)


def join(rows: Iterable[Row], truth: Truth | None, truth_epochs: Collection[int] | None = None) -> list[Cell]:
    """Each row with its truth: ``truth[(epoch, station)]`` for an epoch's row; for a row of a
    longer span (a rollup, a span query) the sum over the span's ``span_s / 30`` epochs from its
    first, and no truth at all if any of them lacks the station's -- a station without a reading
    in one epoch of an hour has no hourly truth, not the sum of the others. ``truth`` None: no
    ground truth was given. ``truth_epochs`` (the epochs that have a truth record) tells a
    record that was not read (``NO_TRUTH_RECORD``) from a station without a reading
    (``NO_READING``); without it every missing truth is ``NO_READING``."""
    rows = list(rows)
    if truth is None:
        return [Cell(r, None, NO_TRUTH_GIVEN) for r in rows]
    # an epoch with a truth cell has a record, whatever ``truth_epochs`` says
    records = None if truth_epochs is None else frozenset(truth_epochs) | {e for e, _ in truth}
    spans = _span_truths({(r.epoch, r.station, r.span_s // EPOCH_S) for r in rows if r.is_flow},
                         truth, records)
    out = []
    for r in rows:
        if not r.is_flow:
            y = truth.get((r.epoch, r.station))
            why = None if y is not None else (NO_TRUTH_RECORD if records is not None and r.epoch not in records
                                              else NO_READING)
        else:
            y, why = spans[(r.epoch, r.station, r.span_s // EPOCH_S)]
        out.append(Cell(r, y, why))
    return out


def _span_truths(keys: set[tuple[int, int, int]], truth: Truth, records: frozenset[int] | None
                 ) -> dict[tuple[int, int, int], tuple[int | None, str | None]]:
    """(sum of the truth, None) or (None, why) per (first epoch, station, epochs), by prefix
    sums over a dense (epoch, station) table of the keys' stations and epochs."""
    if not keys:
        return {}
    listed = list(keys)
    k = np.fromiter(itertools.chain.from_iterable(listed), dtype=np.int64, count=3 * len(listed)).reshape(-1, 3)
    first, end = int(k[:, 0].min()), int((k[:, 0] + k[:, 2]).max())
    stations = np.unique(k[:, 1])
    values = np.zeros((end - first, stations.size), dtype=np.int64)
    has = np.zeros((end - first, stations.size), dtype=bool)
    cell = np.fromiter(itertools.chain.from_iterable(truth), dtype=np.int64, count=2 * len(truth)).reshape(-1, 2)
    flow = np.fromiter(truth.values(), dtype=np.int64, count=len(truth))
    at = np.minimum(np.searchsorted(stations, cell[:, 1]), stations.size - 1)
    keep = (stations[at] == cell[:, 1]) & (cell[:, 0] >= first) & (cell[:, 0] < end)
    values[cell[keep, 0] - first, at[keep]] = flow[keep]
    has[cell[keep, 0] - first, at[keep]] = True
    if records is None:
        recorded = np.ones(end - first, dtype=bool)
    else:
        recorded = np.isin(np.arange(first, end), np.fromiter(records, dtype=np.int64, count=len(records)))
    zero = np.zeros((1, stations.size), dtype=np.int64)
    sums = np.concatenate([zero, np.cumsum(values, axis=0)])
    holes = np.concatenate([zero, np.cumsum(~has, axis=0)])
    unread = np.concatenate([[0], np.cumsum(~recorded)])
    i, n, c = k[:, 0] - first, k[:, 2], np.searchsorted(stations, k[:, 1])
    unread_n = (unread[i + n] - unread[i]).tolist()
    holes_n = (holes[i + n, c] - holes[i, c]).tolist()
    totals = (sums[i + n, c] - sums[i, c]).tolist()
    return {key: ((None, NO_TRUTH_RECORD) if u else (None, NO_READING) if h else (t, None))
            for key, u, h, t in zip(listed, unread_n, holes_n, totals, strict=True)}


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@dataclass(frozen=True)
class BinScore:
    """The scored cells of one truth bin (:func:`truth_bin`): how many, the coverage of each
    level's bounds, the mean absolute error and the bias."""

    bin: str
    cells: int
    coverage: dict[float, float | None]
    mae: float | None
    bias: float | None

    def to_json(self) -> dict[str, Any]:
        return {"bin": self.bin, "cells": self.cells, "coverage": {f"{c:g}": v for c, v in self.coverage.items()},
                "mae": self.mae, "bias": self.bias}


#: what a group is: the epochs of a 30-s query, a rollup (sums of a query's own-span estimates), or
#: the rows of a span query (one report per device per span)
KINDS = ("epoch", "rollup", "span")


@dataclass(frozen=True)
class GroupSummary:
    """How one estimator of one query did at one span over all its (station, epoch) cells.

    ``coverage[c]``: fraction of the published cells with truth whose level-``c`` bounds hold
    the truth (``lower <= truth <= upper``); ``mean_width[c]``: mean ``upper - lower`` over the
    published cells; ``mae``/``bias``/``rmse``: of ``estimate - truth`` over the published
    cells with truth; ``by_bin``: the same by truth bin. ``None`` where there is nothing to
    average. A cell flagged ``no_source_data`` (a dead or silent detector) is never compared
    with a truth, whatever the truth file says of it (a placeholder 0 is not a quiet road): it
    is counted apart. ``left_out`` names every cell not scored and why, with counts (withheld:
    its code; no_source_data; no truth: why); with the scored ones they are all the cells.
    ``span_s`` 30 is the epochs'; a longer span is a flow: ``kind`` ``rollup`` (the sum of the
    query's estimates over the span) or ``span`` (a span query's own reports).
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
    epochs: int  # distinct epochs (or spans) of the cells
    first_epoch_start: datetime
    last_epoch_start: datetime
    coverage: dict[float, float | None]
    mean_width: dict[float, float | None]
    mae: float | None
    bias: float | None
    rmse: float | None
    withheld_reasons: dict[str, int] = field(default_factory=dict)  # withheld code -> cells
    # the largest shuffled epsilon over the epochs that have one, and how many epochs have one
    epsilon_shuffled: float | None = None
    shuffled_epochs: int = 0
    noise: str | None = None  # noise_note of its published cells
    no_source_data: int = 0  # published cells flagged no_source_data: neither scored nor "without truth"
    span_s: int = EPOCH_S
    kind: str = "epoch"
    left_out: dict[str, int] = field(default_factory=dict)  # why -> cells not scored
    by_bin: tuple[BinScore, ...] = ()
    withheld_examples: dict[str, str] = field(default_factory=dict)  # withheld code -> one reason text
    # scored cells with an sd, those of them noise-dominated (noise_dominated: sd >= half the truth), and
    # the median of sd / truth over those with a truth above 0: what the flows are good for (flows.good_for)
    judged: int = 0
    noisy: int = 0
    relative_sd: float | None = None

    @property
    def epsilon(self) -> float:
        """The largest epsilon (per epoch, or per span report of a span query) over the query's versions."""
        return max(self.epsilon_by_version.values())

    @property
    def is_flow(self) -> bool:
        return spans_epochs(self.span_s)

    @property
    def good_for(self) -> str:
        """What its cells are good for (:func:`stream_app.report.flows.good_for`)."""
        return good_for(self.judged, self.noisy, self.relative_sd, self.noise)

    @property
    def what(self) -> str:
        """What it is: a span query's flows, a rollup with the epochs it composes, or epochs."""
        return flow_what(self.kind, self.span_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id, "estimator": self.estimator, "mechanism": self.mechanism,
            "span_s": self.span_s, "kind": self.kind,
            "versions": list(self.versions), "epsilon": self.epsilon,
            "epsilon_by_version": {str(v): e for v, e in self.epsilon_by_version.items()},
            "cells": self.cells, "withheld": self.withheld, "without_truth": self.without_truth,
            "with_truth": self.with_truth, "stations": self.stations, "epochs": self.epochs,
            "first_epoch_start": self.first_epoch_start.isoformat(),
            "last_epoch_start": self.last_epoch_start.isoformat(),
            "coverage": {f"{c:g}": v for c, v in self.coverage.items()},
            "mean_width": {f"{c:g}": v for c, v in self.mean_width.items()},
            "mae": self.mae, "bias": self.bias, "rmse": self.rmse,
            "coverage_by_truth_bin": [b.to_json() for b in self.by_bin],
            "withheld_reasons": dict(self.withheld_reasons),
            "left_out": dict(self.left_out),
            "epsilon_shuffled": self.epsilon_shuffled, "shuffled_epochs": self.shuffled_epochs,
            "noise": self.noise, "what": self.what, "good_for": self.good_for, "judged_cells": self.judged,
            "noise_dominated_cells": self.noisy, "median_relative_sd": self.relative_sd,
            "no_source_data": self.no_source_data,
        }


def summarize(cells: Iterable[Cell], own_span: Mapping[str, int] | None = None) -> list[GroupSummary]:
    """One :class:`GroupSummary` per (query, span, estimator), sorted by them. ``own_span``: each
    query's own span (:attr:`LoadedEstimates.own_span`; default: its shortest among the cells):
    a longer span of the query is its rollup."""
    groups: dict[tuple[str, int, str], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c.row.query_id, c.row.span_s, c.row.estimator)].append(c)
    shortest: dict[str, int] = {}
    for qid, span, _ in groups:
        shortest[qid] = min(span, shortest.get(qid, span))
    own = {**shortest, **(own_span or {})}
    out = []
    for (qid, span, name), group in sorted(groups.items()):
        kind = "rollup" if span > own[qid] else ("epoch" if span == EPOCH_S else "span")
        out.append(_summarize_group(qid, name, group, span, kind))
    return out


def _scores(scored: Sequence[Cell], levels: Sequence[float]) -> tuple[dict[float, float | None], list[float]]:
    """(coverage per level, errors) of cells with truth."""
    coverage: dict[float, float | None] = {}
    for lvl in levels:
        hits = []
        for c in scored:
            b = c.row.bound(lvl)
            if b is not None and c.truth is not None:
                hits.append(1.0 if b[0] <= c.truth <= b[1] else 0.0)
        coverage[lvl] = _mean(hits)
    errors = [float(c.row.estimate) - float(c.truth) for c in scored
              if c.row.estimate is not None and c.truth is not None]
    return coverage, errors


def _summarize_group(query_id: str, estimator: str, cells: list[Cell], span_s: int = EPOCH_S,
                     kind: str = "epoch") -> GroupSummary:
    published = [c for c in cells if c.row.published]
    no_source = [c for c in published if c.row.no_source_data]
    scored = [c for c in published if c.truth is not None and not c.row.no_source_data]
    levels = sorted({lvl for c in published for lvl, _, _ in c.row.bounds})
    coverage, errors = _scores(scored, levels)
    width: dict[float, float | None] = {
        lvl: _mean([b[1] - b[0] for c in published if (b := c.row.bound(lvl)) is not None]) for lvl in levels}
    mse = _mean([e * e for e in errors])
    reasons: dict[str, int] = defaultdict(int)
    examples: dict[str, str] = {}
    left_out: dict[str, int] = defaultdict(int)
    for c in cells:
        if not c.row.published:
            code = c.row.withheld_code or "no estimate"
            reasons[code] += 1
            examples.setdefault(code, c.row.withheld or "no estimate")
            left_out[f"withheld: {code}" if c.row.withheld is not None else "no estimate"] += 1
        elif c.row.no_source_data:
            left_out["no_source_data"] += 1
        elif c.truth is None:
            left_out[c.missing or NO_READING] += 1
    by_bin: dict[str, list[Cell]] = defaultdict(list)
    for c in scored:
        if c.truth is not None:
            by_bin[truth_bin(c.truth)].append(c)
    bins = []
    for label in [truth_bin(lo) for lo in TRUTH_BINS]:
        if label in by_bin:
            cov, errs = _scores(by_bin[label], levels)
            bins.append(BinScore(label, len(by_bin[label]), cov, _mean([abs(e) for e in errs]), _mean(errs)))
    judged = [c for c in scored if c.row.sd is not None and c.truth is not None]
    relative = sorted(float(c.row.sd or 0.0) / c.truth for c in judged if c.truth)
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
        noise=noise_note([c.row.sd for c in published if c.row.sd is not None],
                         [float(c.truth) for c in scored if c.truth is not None],
                         "flows" if spans_epochs(span_s) else "counts"),
        no_source_data=len(no_source), span_s=span_s, kind=kind, left_out=dict(sorted(left_out.items())),
        by_bin=tuple(bins), withheld_examples=dict(sorted(examples.items())), judged=len(judged),
        noisy=sum(noise_dominated(c.row.sd, c.truth) for c in judged),
        relative_sd=relative[len(relative) // 2] if relative else None,
    )


NOISE_RATIO = 0.5  # noise-dominated: the median sd is at least this fraction of the largest true count


def noise_note(sds: Sequence[float], truths: Sequence[float], what: str = "counts") -> str | None:
    """``"noise-dominated: sd X against counts up to Y"`` when the median sd of the published
    estimates is at least half the largest true count (``what``: ``flows`` for a span's) -- a
    band of one sd either side of the truth then spans its whole range, and the estimates show
    noise, not traffic -- else None (also without an sd or a truth).

    >>> noise_note([130.0, 140.0, 150.0], [0, 10, 80])
    'noise-dominated: sd 140 against counts up to 80'
    >>> noise_note([7.0, 8.0], [0, 80]) is None
    True
    >>> noise_note([1500.0], [700, 2000], "flows")
    'noise-dominated: sd 1.5e+03 against flows up to 2e+03'
    """
    if not sds or not truths:
        return None
    sd, top = float(sorted(sds)[len(sds) // 2]), max(truths)
    return f"noise-dominated: sd {sd:.3g} against {what} up to {top:.3g}" if sd >= NOISE_RATIO * top else None


def noise_dominated(sd: float | None, flow: float | None) -> bool:
    """:func:`noise_note`'s rule for one estimate: its ``sd`` against the one ``flow`` (or count)
    it estimates (a negative one counts as 0); False without either."""
    return sd is not None and flow is not None and noise_note([sd], [max(float(flow), 0.0)]) is not None


def flows_first(groups: Iterable[GroupSummary]) -> list[GroupSummary]:
    """The groups in reading order (:func:`stream_app.report.flows.flow_rank`): the span queries'
    flows, then the rollups (each the longest span first), then the epochs; then by query and estimator."""
    return sorted(groups, key=lambda g: (*flow_rank(g.kind, g.span_s), g.query_id, g.estimator))


def _f(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _level(confidence: float) -> str:
    return f"{100 * confidence:.10g}%"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _kind_words(g: GroupSummary) -> str:
    n = g.span_s // EPOCH_S
    if g.kind == "rollup":
        return (f"rollup: the sum of the query's estimates over {n} epochs, so a device in all of them spends {n} "
                "reports; epsilon per epoch (not per rollup)")
    if g.kind == "span":
        return "span query: one report per device per span; epsilon per span report"
    return "epsilon per epoch"


def _estimates_lines(estimates: LoadedEstimates) -> list[str]:
    chosen = "; ".join(f"{n:,} by {why}" for why, n in estimates.not_selected.items())
    spans = ", ".join(f"{span_words(s)} {n:,}" for s, n in estimates.by_span().items())
    return [f"estimates: {estimates.read:,} records read, {len(estimates.rows):,} kept; "
            f"{estimates.duplicates:,} duplicates dropped (a later record of the same row replaced them), "
            f"{estimates.filtered_out:,} not selected{f' ({chosen})' if chosen else ''}, "
            f"{estimates.invalid:,} unreadable (not an estimate)",
            f"  kept by span: {spans or 'none'}"]


def _flows_table(groups: Sequence[GroupSummary]) -> list[str]:
    """One line per flow group (span > 30 s), the span queries' first (:func:`flows_first`):
    scored cells, MAE, bias, coverage per level, and what it is good for."""
    flows = [g for g in flows_first(groups) if g.is_flow]
    if not flows:
        return []
    levels = sorted({lvl for g in flows for lvl in g.coverage})
    head = (f"{'query':<16} {'span':>6} {'kind':<6} {'estimator':<14} {'scored':>13} {'MAE':>9} {'bias':>9}  "
            + "  ".join(f"{_level(lvl) + ' cov':>8}" for lvl in levels) + "  good for")
    lines = ["", "flows by span, the span queries' first, then the rollups of 30-s queries (each against the sum of "
                 "its epochs' ground truth; none where an epoch has none)", "  " + head]
    for g in flows:
        lines.append("  " + f"{g.query_id:<16} {span_words(g.span_s):>6} {g.kind:<6} {g.estimator:<14} "
                     f"{f'{g.with_truth:,}/{g.cells:,}':>13} {_f(g.mae, '.1f'):>9} {_f(g.bias, '+.1f'):>9}  "
                     + "  ".join(f"{_pct(g.coverage.get(lvl)):>8}" for lvl in levels)
                     + f"  {flow_what(g.kind, g.span_s, short=True)}: {g.good_for}")
    return lines


def _shuffled_words(g: GroupSummary, unit: str) -> str:
    """The shuffled epsilon of a group, per what it is: an epoch's, a span report's, or -- for a
    rollup -- one epoch's (the largest), labelled so, with the epochs the rollup composes."""
    if g.epsilon_shuffled is None:
        return f"not attested (no {unit} came through a shuffler that attests its shuffle size)"
    assumes = ("(assumes the shuffler does not collude with the analyst and mixed each report among the n reports "
               "of its epoch and round)")
    if g.kind == "rollup":
        n = g.span_s // EPOCH_S
        return (f"at most {g.epsilon_shuffled:.4g} per epoch -- one epoch's figure, not the rollup's: each rollup sums "
                f"{n} epochs, and a device in all of them spent {n} such reports (a vehicle's day, composed: ptt "
                f"analyst list, ptt plan fleet) -- in {g.shuffled_epochs:,} of {g.epochs:,} rollups {assumes}")
    per = "span report" if g.kind == "span" else unit
    return f"at most {g.epsilon_shuffled:.4g} per {per}, in {g.shuffled_epochs:,} of {g.epochs:,} {unit}s {assumes}"


def _head_lines(estimates: LoadedEstimates | None, truth: LoadedTruth | None,
                day: Mapping[str, Any] | None) -> list[str]:
    """The summary's first lines: the run's day figure, what was read, the ground truth."""
    lines = [] if day is None else [f"privacy: {day['line']}"]
    if estimates is not None:
        lines += _estimates_lines(estimates)
    if truth is not None:
        lines.append(f"ground truth: {truth.epochs:,} epochs ({truth.read:,} records, {truth.invalid:,} unreadable)")
        if estimates is not None and estimates.rows:
            lines += unestimated_lines(truth.epoch_ids, estimates.rows)
    else:
        lines.append("ground truth: none given (coverage and error not computed)")
    return lines


def format_summary(groups: Sequence[GroupSummary], estimates: LoadedEstimates | None = None,
                   truth: LoadedTruth | None = None, plots: Sequence[Path] = (),
                   day: Mapping[str, Any] | None = None, cap_drops: CapDrops | None = None) -> str:
    """The plain-text summary: what was read, the flows (spans longer than an epoch) in a table
    with what each is good for, then one block per (query, span, estimator) -- both the span
    queries' flows first, then the rollups, then the epochs (:func:`flows_first`). ``day``: a
    vehicle's whole day across the run's queries (:mod:`stream_app.day_figure`), its own line;
    ``cap_drops``: what a day cap dropped (:mod:`.cap_drops`), after the flows' blocks."""
    lines = _head_lines(estimates, truth, day) + _flows_table(groups)
    for g in flows_first(groups):
        eps = ", ".join(f"v{v}: {e:.4g}" for v, e in g.epsilon_by_version.items())
        unit = "epoch" if not g.is_flow else "span"
        title = (f"{g.query_id} / {g.estimator} ({g.mechanism}; {_kind_words(g)} {eps})" if not g.is_flow else
                 f"{g.query_id} / {g.estimator}, flows over {span_words(g.span_s)} ({g.mechanism}; {_kind_words(g)} "
                 f"{eps})")
        lines += [
            "",
            title,
            f"  cells (station x {unit})  {' ' if g.is_flow else ''}{g.cells:,}  ({g.stations:,} stations x "
            f"{g.epochs:,} {unit}s, {g.first_epoch_start.isoformat()} .. {g.last_epoch_start.isoformat()})",
            f"  withheld                 {g.withheld:,}",
        ]
        if g.is_flow:
            lines.insert(len(lines) - 2, f"  good for                 {flow_what(g.kind, g.span_s, short=True)}: "
                                         f"{g.good_for}")
        lines += [f"    {n:,}  {code}" + ("" if g.withheld_examples.get(code, code) == code else
                                         f" (e.g. {g.withheld_examples[code]})")
                  for code, n in g.withheld_reasons.items()]
        lines.append("  shuffled epsilon         " + _shuffled_words(g, unit))
        if (caveat := sp_caveat(g.mechanism)) is not None:
            lines.append(f"  caveat                   {caveat}")
        if g.noise is not None:
            lines.append(f"  noise                    {g.noise} " + (
                "(single epochs show noise, not traffic; the 5-minute and hourly rollups sum them)" if not g.is_flow
                else "(these flows show noise, not traffic)"))
        if g.no_source_data:
            lines.append(f"  no source data           {g.no_source_data:,}  (no reading from the station: not compared "
                         "with the truth)")
        lines.append(f"  without ground truth     {g.without_truth:,}")
        lines.append(f"  compared with the truth  {g.with_truth:,}")
        for lvl in sorted(g.coverage, reverse=True):
            lines.append(f"  {_level(lvl) + ' bounds':<23}  coverage {_pct(g.coverage[lvl]):>6}   "
                         f"mean width {_f(g.mean_width[lvl])}")
        lines.append(f"  error                    MAE {_f(g.mae)}   bias {_f(g.bias, '+.2f')}   RMSE {_f(g.rmse)}")
        if g.by_bin:
            lines.append("  by truth bin")
            lines += [f"    {b.bin:<12} cells {b.cells:>7,}   " + "   ".join(
                f"{_level(lvl)} {_pct(b.coverage.get(lvl)):>6}" for lvl in sorted(g.coverage))
                + f"   MAE {_f(b.mae, '.1f')}   bias {_f(b.bias, '+.1f')}" for b in g.by_bin]
        if g.left_out:
            lines.append("  not scored               " + "; ".join(f"{n:,} {why}" for why, n in g.left_out.items()))
    lines += _cap_drop_lines(groups, cap_drops)
    if groups:
        lines += ["", f"privacy: {plain_words()} " + ("A vehicle's day figure for these queries: the first line." if day
                                                      else "A vehicle's day figure for these queries: ptt analyst "
                                                           "list, or ptt report --queries.")]
    if plots:
        lines += ["", f"plots: {len(plots)} PNG files"]
    return "\n".join(lines) + "\n"


def _span_group(groups: Sequence[GroupSummary], query_id: str) -> GroupSummary | None:
    return next((g for g in groups if g.query_id == query_id and g.kind == "span"), None)


def _cap_drop_lines(groups: Sequence[GroupSummary], cap_drops: CapDrops | None) -> list[str]:
    """What each day-capped query's cap dropped, beside its flows' bias (:mod:`.cap_drops`;
    None: no cap drops file, no section)."""
    if cap_drops is None:
        return []
    if not cap_drops:
        return ["", "what the day cap dropped: no passage (a simulation diagnostic: no vehicle passed more stations "
                    "than its cap in the replay)"]
    lines = ["", "what the day cap dropped (a simulation diagnostic, never published; the flows are scored "
                 "against the uncapped truth, so their bias includes these passages)"]
    for qid, drops in sorted(cap_drops.items()):
        g = _span_group(groups, qid)
        lines.append("  " + cap_drop_words(qid, drops, g.cells if g else 0, g.bias if g else None))
    return lines


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
                 truth: LoadedTruth | None = None, plots: Sequence[Path] = (),
                 day: Mapping[str, Any] | None = None, cap_drops: CapDrops | None = None) -> dict[str, Any]:
    """The summary as a JSON-ready object (``summary.json``): ``cap_drops`` (per day-capped
    query its dropped ``passages`` and the ``station_spans`` they fell in; null without a cap
    drops file), ``groups`` (as
    :meth:`GroupSummary.to_json`; levels are keys like ``"0.95"``; one per query, span and
    estimator, in ``groups``' order; each says ``what`` it is and what it is ``good_for``), ``plots`` (file names),
    ``estimates`` and ``truth`` (what was read; ``truth`` is null without ground truth);
    ``estimates.not_selected`` names the filter that left rows out."""
    out: dict[str, Any] = {"groups": [g.to_json() for g in groups], "plots": [p.name for p in plots],
                           "vehicle_day": None if day is None else dict(day),
                           "cap_drops": None if cap_drops is None else {
                               qid: {"passages": sum(sum(st.values()) for st in d.values()),
                                     "station_spans": sum(len(st) for st in d.values())}
                               for qid, d in sorted(cap_drops.items())}}
    if estimates is not None:
        out["estimates"] = {"read": estimates.read, "kept": len(estimates.rows), "duplicates": estimates.duplicates,
                            "filtered_out": estimates.filtered_out, "not_selected": dict(estimates.not_selected),
                            "kept_by_span": {str(s): n for s, n in estimates.by_span().items()},
                            "invalid": estimates.invalid}
    out["truth"] = None if truth is None else {"epochs": truth.epochs, "read": truth.read, "invalid": truth.invalid}
    result: dict[str, Any] = json_safe(out)
    return result
