"""``ptt report``: how good were the published estimates? Plots and a summary of a replay.

Inputs are the stream app's estimates (``schemas.estimates.Estimate``) and the replay's ground
truth (``schemas.wire.GroundTruth``), read from their topics or from saved JSON lines (as
written by ``ptt subscribe --json``). Outputs, in ``--out``:

* one PNG per (query, station, estimator) in the style of Anonymized Local Privacy Figure 1: the ground
  truth and the privatized estimate over the time of day, the 99% and 95% bounds as bands;
  only the busiest stations (by total truth) unless ``--station`` names them;
* ``summary.txt`` (also printed) and ``summary.json``: per (query, estimator) the number of
  (station, epoch) cells, how often each confidence level's bounds cover the truth, the mean
  absolute error, the mean band width per level, epsilon, and what was withheld or had no
  ground truth.

Loading (from any iterable of JSON lines), joining with the truth, the summary and the plots
are functions of their arguments (the plots write the files they are given), testable
without a broker; :func:`run` only wires them to files, topics and the command line.
Matplotlib is imported only when plotting and draws on the non-interactive Agg canvas (no
pyplot, never a window); kafka-python only when a topic is read.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from estimators.registry import REGISTRY
from schemas.estimates import Estimate
from schemas.settings import KafkaSettings
from schemas.wire import GroundTruth, json_safe

__all__ = [
    "DEFAULT_ESTIMATORS",
    "Cell",
    "GroupSummary",
    "LoadedEstimates",
    "LoadedTruth",
    "ReportError",
    "Row",
    "Selection",
    "Series",
    "add_arguments",
    "busiest_stations",
    "format_summary",
    "join",
    "load_estimates",
    "load_truth",
    "plot_series",
    "plot_stations",
    "read_file",
    "read_topic",
    "run",
    "series_for",
    "summarize",
    "summary_json",
    "write_plots",
]

EXIT_OK = 0
EXIT_INPUT = 2
EXIT_BROKER = 3

#: the estimator plotted for each mechanism unless ``--estimator`` says otherwise
DEFAULT_ESTIMATORS: Mapping[str, str] = {name: spec.headline for name, spec in REGISTRY.items()}
OVERLAY_ESTIMATOR = "alp_gls"  # --with-gls: dashed on the plots of queries that publish it (ALP)

FIG_WIDTH_PX = 1200
FIG_HEIGHT_PX = 500
FIG_DPI = 100
MAX_POINTS = 480  # auto thinning: at most this many epochs per plot (a day at 3-minute resolution)
PLOT_LEVELS = (0.99, 0.95)  # bands drawn, widest first

Truth = Mapping[tuple[int, int], int]  # (epoch, station) -> vehicles


class ReportError(Exception):
    """An input problem: reported as one line, with the exit code."""

    def __init__(self, message: str, code: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.code = code


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
                   e.participants, None if e.withheld is None else sys.intern(e.withheld))

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


def _lines(values: Iterable[bytes | str]) -> Iterator[bytes]:
    for v in values:
        b = v.encode() if isinstance(v, str) else v
        b = b.strip()
        if b:
            yield b


def load_estimates(values: Iterable[bytes | str], selection: Selection | None = None) -> LoadedEstimates:
    """Parse estimate records (JSON, one per item), keep the selected ones, and deduplicate by
    (query, version, epoch, station, estimator), the last record winning (a worker that
    restarts may publish an epoch again). Items that are not estimates are counted, not fatal."""
    sel = selection or Selection()
    latest: dict[tuple[str, int, int, int, str], Row] = {}
    starts: dict[tuple[datetime, timedelta | None], datetime] = {}
    read = invalid = duplicates = filtered = 0
    for line in _lines(values):
        read += 1
        try:
            e = Estimate.model_validate_json(line)
        except ValidationError:
            invalid += 1
            continue
        if e not in sel:
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
    return LoadedTruth(truth, len(by_epoch), read, invalid)


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
    cells with truth. ``None`` where there is nothing to average.
    """

    query_id: str
    estimator: str
    mechanism: str
    versions: tuple[int, ...]
    epsilon_by_version: dict[int, float]
    cells: int  # all (station, epoch) cells, withheld included
    withheld: int
    without_truth: int  # published cells with no ground truth
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
        }


def summarize(cells: Iterable[Cell]) -> list[GroupSummary]:
    """One :class:`GroupSummary` per (query, estimator), sorted by both."""
    groups: dict[tuple[str, str], list[Cell]] = defaultdict(list)
    for c in cells:
        groups[(c.row.query_id, c.row.estimator)].append(c)
    return [_summarize_group(qid, name, group) for (qid, name), group in sorted(groups.items())]


def _summarize_group(query_id: str, estimator: str, cells: list[Cell]) -> GroupSummary:
    published = [c for c in cells if c.row.published]
    scored = [c for c in published if c.truth is not None]
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
    return GroupSummary(
        query_id=query_id, estimator=estimator, mechanism=cells[0].row.mechanism,
        versions=tuple(sorted({c.row.query_version for c in cells})),
        epsilon_by_version={c.row.query_version: c.row.epsilon for c in sorted(cells, key=lambda c: c.row.epoch)},
        cells=len(cells), withheld=len(cells) - len(published), without_truth=len(published) - len(scored),
        with_truth=len(scored), stations=len({c.row.station for c in cells}), epochs=len({c.row.epoch for c in cells}),
        first_epoch_start=min(starts), last_epoch_start=max(starts), coverage=coverage, mean_width=width,
        mae=_mean([abs(e) for e in errors]), bias=_mean(errors), rmse=None if mse is None else math.sqrt(mse),
        withheld_reasons=dict(sorted(reasons.items())),
    )


def _f(v: float | None, spec: str = ".2f") -> str:
    return "n/a" if v is None else format(v, spec)


def _level(confidence: float) -> str:
    return f"{100 * confidence:.10g}%"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f}%"


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
        lines.append(f"  without ground truth     {g.without_truth:,}")
        lines.append(f"  compared with the truth  {g.with_truth:,}")
        for lvl in sorted(g.coverage, reverse=True):
            lines.append(f"  {_level(lvl) + ' bounds':<23}  coverage {_pct(g.coverage[lvl]):>6}   "
                         f"mean width {_f(g.mean_width[lvl])}")
        lines.append(f"  error                    MAE {_f(g.mae)}   bias {_f(g.bias, '+.2f')}   RMSE {_f(g.rmse)}")
    if plots:
        lines += ["", f"plots: {len(plots)} PNG files"]
    return "\n".join(lines) + "\n"


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


# --------------------------------------------------------------------------- plots


def busiest_stations(cells: Sequence[Cell], n: int) -> list[int]:
    """The ``n`` stations with the most vehicles over the cells' epochs: by total truth, or by
    total (non-negative) estimate where there is no truth at all; ties by station id."""
    truth_seen: dict[tuple[int, int], int] = {}
    est_total: dict[int, float] = defaultdict(float)
    for c in cells:
        if c.truth is not None:
            truth_seen[(c.row.epoch, c.row.station)] = c.truth  # once per epoch, whatever the estimators
        if c.row.estimate is not None:
            est_total[c.row.station] += max(c.row.estimate, 0.0)
    truth_total: dict[int, int] = defaultdict(int)
    for (_, s), y in truth_seen.items():
        truth_total[s] += y
    stations = {c.row.station for c in cells}
    if truth_total:
        return sorted(stations, key=lambda s: (-truth_total.get(s, 0), s))[:n]
    return sorted(stations, key=lambda s: (-est_total.get(s, 0.0), s))[:n]


@dataclass(frozen=True)
class Series:
    """One station's time series of one estimator of one query, ready to draw.

    ``times`` are the epochs' local wall-clock starts (as published, tz dropped); missing
    values are NaN: a withheld estimate, an epoch without truth, a gap in the epochs."""

    query_id: str
    mechanism: str
    estimator: str
    station: int
    times: list[datetime]
    truth: list[float]
    estimate: list[float]
    bands: dict[float, tuple[list[float], list[float]]]
    epsilons: tuple[float, ...]
    utc_offsets: tuple[str, ...]
    epoch_s: int
    every: int
    cells: int
    withheld: int
    covered: dict[float, tuple[int, int]]  # level -> (hits, cells with truth), over all epochs
    mae: float | None


def _offset(dt: datetime) -> str:
    off = dt.utcoffset() or timedelta(0)
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "\u2212"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _epoch_seconds(rows: Sequence[Row]) -> int:
    for r in rows:
        if r.epoch > 0:
            return max(1, round(r.epoch_start.timestamp() / r.epoch))
    return 30


def series_for(cells: Iterable[Cell], query_id: str, station: int, estimator: str, every: int | None = None,
               levels: Sequence[float] = PLOT_LEVELS) -> Series | None:
    """The series of one (query, station, estimator); ``None`` if there are no cells.
    ``every``: draw every k-th epoch (``None``: thin automatically to at most ``MAX_POINTS``);
    the coverage and error printed on the plot are over every epoch."""
    by_epoch: dict[int, Cell] = {}
    for c in cells:
        r = c.row
        if r.query_id == query_id and r.station == station and r.estimator == estimator:
            old = by_epoch.get(r.epoch)
            if old is None or old.row.query_version < r.query_version:  # overlapping versions: the newest
                by_epoch[r.epoch] = c
    if not by_epoch:
        return None
    ordered = [by_epoch[e] for e in sorted(by_epoch)]
    rows = [c.row for c in ordered]
    span = rows[-1].epoch - rows[0].epoch + 1
    step = every if every and every > 0 else max(1, math.ceil(span / MAX_POINTS))
    nan = float("nan")
    times: list[datetime] = []
    truth: list[float] = []
    est: list[float] = []
    bands: dict[float, tuple[list[float], list[float]]] = {lvl: ([], []) for lvl in levels}
    prev: int | None = None
    for c in ordered:
        r = c.row
        if (r.epoch - rows[0].epoch) % step:
            continue
        if prev is not None and r.epoch - prev > step:  # a gap: break the lines
            times.append(times[-1])
            truth.append(nan)
            est.append(nan)
            for lo, hi in bands.values():
                lo.append(nan)
                hi.append(nan)
        prev = r.epoch
        times.append(r.epoch_start.replace(tzinfo=None))
        truth.append(nan if c.truth is None else float(c.truth))
        est.append(float(r.estimate) if r.published and r.estimate is not None else nan)
        for lvl, (lo, hi) in bands.items():
            b = r.bound(lvl) if r.published else None
            lo.append(nan if b is None else b[0])
            hi.append(nan if b is None else b[1])
    covered: dict[float, tuple[int, int]] = {}
    for lvl in sorted({lvl for r in rows for lvl, _, _ in r.bounds}):
        pairs = [(b, c.truth) for c in ordered if c.row.published and c.truth is not None
                 and (b := c.row.bound(lvl)) is not None]
        covered[lvl] = (sum(1 for b, y in pairs if b[0] <= y <= b[1]), len(pairs))
    errors = [abs(float(c.row.estimate) - c.truth) for c in ordered
              if c.row.published and c.row.estimate is not None and c.truth is not None]
    return Series(
        query_id=query_id, mechanism=rows[0].mechanism, estimator=estimator, station=station, times=times,
        truth=truth, estimate=est, bands={k: v for k, v in bands.items() if any(not math.isnan(x) for x in v[0])},
        epsilons=tuple(sorted({r.epsilon for r in rows})), utc_offsets=tuple(sorted({_offset(r.epoch_start)
                                                                                   for r in rows})),
        epoch_s=_epoch_seconds(rows), every=step, cells=len(rows), withheld=sum(1 for r in rows if not r.published),
        covered=covered, mae=_mean(errors),
    )


def _eps_text(eps: Sequence[float]) -> str:
    return f"{eps[0]:.3g}" if len(eps) == 1 else f"{eps[0]:.3g}\u2013{eps[-1]:.3g}"


def plot_series(series: Series, path: Path, overlay: Series | None = None) -> Path:
    """Draw one Figure-1 style plot (1,200 x 500 px PNG) and return its path."""
    from matplotlib import dates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    mdates: Any = dates  # matplotlib.dates has no annotations

    fig = Figure(figsize=(FIG_WIDTH_PX / FIG_DPI, FIG_HEIGHT_PX / FIG_DPI), dpi=FIG_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = mdates.date2num(series.times)
    color = "#1f5fa8"
    alpha = {0.99: 0.18, 0.95: 0.30}  # the 95% band is drawn over the 99% one: darker where both
    few = len(series.times) <= 60  # a short replay: bounds as boxes per epoch, points marked
    width_days = 0.6 * series.epoch_s * series.every / 86_400
    for lvl in sorted(series.bands, reverse=True):
        lo, hi = series.bands[lvl]
        style: dict[str, Any] = {"color": color, "alpha": alpha.get(lvl, 0.12), "linewidth": 0, "zorder": 1,
                                 "label": f"{_level(lvl)} bounds"}
        if few:
            keep = [i for i in range(len(lo)) if not (math.isnan(lo[i]) or math.isnan(hi[i]))]
            ax.bar([float(x[i]) for i in keep], [hi[i] - lo[i] for i in keep], bottom=[lo[i] for i in keep],
                   width=width_days, **style)
        else:
            ax.fill_between(x, lo, hi, **style)
    marker: dict[str, Any] = {"marker": "o", "markersize": 3.5} if few else {}
    ax.plot(x, series.estimate, color=color, linewidth=0.9, label=f"estimate ({series.estimator})", zorder=3,
            **marker)
    if overlay is not None:
        ax.plot(mdates.date2num(overlay.times), overlay.estimate, color="#d9822b", linewidth=0.9, linestyle="--",
                label=f"estimate ({overlay.estimator})", zorder=3, **marker)
    ax.plot(x, series.truth, color="black", linewidth=1.3, label="ground truth", zorder=4, **marker)

    locator = mdates.AutoDateLocator(minticks=5, maxticks=14)
    ax.xaxis.set_major_locator(locator)
    zone = series.utc_offsets[0] if len(series.utc_offsets) == 1 else "local time"
    days = sorted({t.date() for t in series.times})
    if len(days) == 1:
        short = (series.times[-1] - series.times[0]).total_seconds() < 1200  # ticks may fall within a minute
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if short else "%H:%M"))
        ax.set_xlabel(f"time of day, {days[0].isoformat()} ({zone})")
    else:
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, show_offset=False))
        ax.set_xlabel(f"time ({days[0].isoformat()} .. {days[-1].isoformat()}, {zone})")
    half_days = series.epoch_s * series.every / 2 / 86_400
    ax.set_xlim(float(x[0]) - half_days, float(x[-1]) + half_days)
    ax.set_ylabel(f"vehicles per {series.epoch_s} s epoch")
    ax.grid(True, color="#e3e3e3", linewidth=0.6, zorder=0)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(y=0.04)
    handles, labels = ax.get_legend_handles_labels()
    rank = {"ground truth": 0, f"estimate ({series.estimator})": 1}  # then the overlay, then the bounds
    order = sorted(range(len(labels)), key=lambda i: (rank.get(labels[i], 2 if labels[i].startswith("est") else 3),
                                                      labels[i]))
    fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center", ncols=5,
               frameon=False, fontsize=10)

    fig.suptitle(f"Station {series.station} \u2014 query {series.query_id} ({series.mechanism}), "
                 f"estimator {series.estimator}, \u03b5 = {_eps_text(series.epsilons)} per epoch",
                 fontsize=13, fontweight="bold")
    ax.set_title(_facts(series), fontsize=10, color="#444444")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIG_DPI, format="png")
    return path


def _facts(series: Series) -> str:
    """The subtitle: coverage over every epoch (not only those drawn), error, what is missing."""
    facts = []
    shown = [(lvl, *series.covered[lvl]) for lvl in sorted(series.covered, reverse=True) if series.covered[lvl][1]]
    if shown:
        cov = ", ".join(f"{_level(lvl)} bounds {hits / n:.1%}" for lvl, hits, n in shown)
        facts.append(f"truth covered by {cov} of {shown[0][2]:,} epochs")
    if series.mae is not None:
        facts.append(f"MAE {series.mae:.1f}")
    if series.withheld:
        facts.append(f"{series.withheld:,} withheld")
    if series.every > 1:
        facts.append(f"one epoch in {series.every} drawn")
    return " \u00b7 ".join(facts) if facts else "no ground truth"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "_"


def plot_stations(cells: Sequence[Cell], chosen: Iterable[int] | None, n: int) -> list[int]:
    """The stations to plot: those chosen (if any, in the data), else the ``n`` busiest."""
    present = {c.row.station for c in cells}
    if chosen:
        return sorted(set(chosen) & present)
    return busiest_stations(cells, n)


def write_plots(cells: Sequence[Cell], out_dir: Path, stations: Sequence[int], *,
                estimators: Iterable[str] = (), with_gls: bool = False, every: int | None = None) -> list[Path]:
    """One PNG per (query, station, estimator drawn): ``estimators`` if given, else the
    mechanism's headline estimator (:data:`DEFAULT_ESTIMATORS`, or every estimator of a query
    that has none of those). ``with_gls`` overlays ``alp_gls`` (dashed) on ALP plots."""
    chosen = set(estimators)
    present: dict[str, set[str]] = defaultdict(set)
    mechanism: dict[str, str] = {}
    for c in cells:
        present[c.row.query_id].add(c.row.estimator)
        mechanism[c.row.query_id] = c.row.mechanism
    wanted = set(stations)
    by_station: dict[tuple[str, int], list[Cell]] = defaultdict(list)
    for c in cells:
        if c.row.station in wanted:
            by_station[(c.row.query_id, c.row.station)].append(c)
    written: list[Path] = []
    for qid in sorted(present):
        if chosen:
            names = sorted(present[qid] & chosen)
        else:
            default = DEFAULT_ESTIMATORS.get(mechanism[qid])
            names = [default] if default in present[qid] else sorted(present[qid])
        for station in stations:
            group = by_station.get((qid, station), [])
            for name in names:
                s = series_for(group, qid, station, name, every)
                if s is None or all(math.isnan(x) for x in s.truth + s.estimate):
                    continue
                overlay = None
                if with_gls and name != OVERLAY_ESTIMATOR and OVERLAY_ESTIMATOR in present[qid]:
                    overlay = series_for(group, qid, station, OVERLAY_ESTIMATOR, s.every)
                path = out_dir / f"{_safe(qid)}_{station}_{name}.png"
                written.append(plot_series(s, path, overlay))
    return written


# --------------------------------------------------------------------------- inputs


def read_file(path: str) -> Iterator[bytes]:
    """The lines of a JSON-lines file (``-``: standard input), read as they are consumed. A
    missing or unreadable file is a :class:`ReportError` (exit 2) at once, not when read."""
    if path == "-":
        return iter(sys.stdin.buffer)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _file_lines(path)


def _file_lines(path: str) -> Iterator[bytes]:
    try:
        with open(path, "rb") as fh:
            yield from fh
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from exc


def read_topic(settings: KafkaSettings, topic: str, idle_timeout_s: float = 3.0, hint: str = "") -> Iterator[bytes]:
    """Every record value of ``topic``, from the beginning until the consumer has reached every
    partition's high-water mark (as returned with fetched data: the embedded broker's end
    offsets are wrong) or nothing arrived for ``idle_timeout_s``. A generator: the consumer is
    created when reading starts and closed when it ends; ``hint`` is added to "no such topic"."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from schemas.kafka_io import BrokerUnavailable, connect

    try:
        consumer = connect("consumer", settings, KafkaConsumer, group_id=None, enable_auto_commit=False,
                           max_partition_fetch_bytes=16 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024)
    except BrokerUnavailable as exc:
        raise ReportError(str(exc), EXIT_BROKER) from exc
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise ReportError(f"topic {topic!r} does not exist on {settings.bootstrap_servers}{hint}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        last_data = time.monotonic()
        while time.monotonic() - last_data < idle_timeout_s:
            got = consumer.poll(timeout_ms=300, max_records=50_000)
            for records in got.values():
                for rec in records:
                    if rec.value is not None:
                        yield rec.value
            if any(got.values()):
                last_data = time.monotonic()
            if all((m := consumer.highwater(tp)) is not None and consumer.position(tp) >= m for tp in tps):
                break
    except KafkaError as exc:
        raise ReportError(f"cannot read topic {topic!r}: {exc}", EXIT_BROKER) from exc
    finally:
        consumer.close()


# --------------------------------------------------------------------------- command line


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected station ids (integers, comma-separated), got {text!r}") from exc


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from exc
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .settings_cli import add_settings_flags

    src = parser.add_argument_group("inputs")
    one = src.add_mutually_exclusive_group(required=True)
    one.add_argument("--from-topic", action="store_true",
                     help="read the estimates topic (and, unless --truth/--no-truth, the truth topic) from the "
                          "beginning until it is quiet")
    one.add_argument("--estimates", metavar="FILE",
                     help="saved estimates, one JSON per line (ptt subscribe --json); - for stdin")
    src.add_argument("--estimates-topic", default="ptt.estimates", help="estimates topic (default ptt.estimates)")
    src.add_argument("--truth", metavar="FILE",
                     help="ground truth, one GroundTruth JSON per line. Without it: the truth topic with "
                          "--from-topic or an explicit --truth-topic, else none")
    src.add_argument("--no-truth", action="store_true",
                     help="no ground truth (a real deployment): no coverage or error, only widths and counts")
    src.add_argument("--idle-timeout", type=float, default=3.0, metavar="SECONDS",
                     help="stop reading a topic after this many seconds without data (default 3)")
    sel = parser.add_argument_group("selection")
    sel.add_argument("--query", type=_names, action="append", default=[], metavar="ID",
                     help="only these query ids (repeatable or comma-separated)")
    sel.add_argument("--station", type=_ints, action="append", default=[], metavar="ID[,ID...]",
                     help="only these stations (repeatable or comma-separated); all of them are plotted")
    sel.add_argument("--estimator", type=_names, action="append", default=[], metavar="NAME",
                     help="only these estimators (repeatable or comma-separated); they are the ones plotted")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("report"), metavar="DIR",
                     help="output directory (default ./report)")
    out.add_argument("--stations", type=_positive, default=6, metavar="N",
                     help="plot the N busiest stations by total truth (default 6; 0: no plots)")
    out.add_argument("--every", type=_positive, default=0, metavar="K",
                     help=f"draw every k-th epoch (default 0: automatic, at most {MAX_POINTS} points per plot)")
    out.add_argument("--with-gls", action="store_true", help="overlay alp_gls (dashed) on the ALP plots")
    kafka = parser.add_argument_group("broker (with --from-topic or for the truth topic)")
    add_settings_flags(kafka, KafkaSettings,  # type: ignore[arg-type]
                       skip=frozenset({"reports_topic", "queries_topic", "partitions"}))


def _flatten(lists: Sequence[Sequence[Any]]) -> list[Any]:
    return [x for xs in lists for x in xs]


def _settings(args: argparse.Namespace) -> KafkaSettings:
    from .settings_cli import settings_from_args

    try:
        return settings_from_args(KafkaSettings, args)
    except ValidationError as exc:
        raise ReportError(f"invalid broker settings: {exc.errors()[0].get('msg', exc)}") from exc


def _truth_source(args: argparse.Namespace) -> str:
    """'file', 'topic' or 'none': --truth FILE; --no-truth; the topic with --from-topic or an
    explicit --truth-topic; else none (a saved estimates file alone)."""
    if args.truth and args.no_truth:
        raise ReportError("give --truth FILE or --no-truth, not both")
    if args.truth:
        return "file"
    if args.no_truth:
        return "none"
    return "topic" if args.from_topic or getattr(args, "truth_topic", None) else "none"


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ReportError as exc:
        print(f"ptt report: error: {exc}", file=sys.stderr)
        return exc.code


def _run(args: argparse.Namespace) -> int:
    selection = Selection(frozenset(_flatten(args.query)), frozenset(_flatten(args.station)),
                          frozenset(_flatten(args.estimator)))
    truth_source = _truth_source(args)
    settings = _settings(args) if args.from_topic or truth_source == "topic" else None
    truth_lines = read_file(args.truth) if truth_source == "file" else None  # checked before the long read
    raw: Iterable[bytes]
    if settings is not None and args.from_topic:
        raw = read_topic(settings, args.estimates_topic, args.idle_timeout)
        where = f"topic {args.estimates_topic!r}"
    else:
        raw = read_file(args.estimates)
        where = args.estimates
    loaded = load_estimates(raw, selection)
    if not loaded.rows:
        why = (f"{loaded.read:,} records read, {loaded.invalid:,} unreadable, "
               f"{loaded.filtered_out:,} filtered out (filters: {selection.describe()})")
        raise ReportError(f"no matching estimates in {where} ({why})")
    truth: LoadedTruth | None = None
    needed = {r.station for r in loaded.rows}
    if truth_lines is not None:
        truth = load_truth(truth_lines, needed)
    elif settings is not None and truth_source == "topic":
        hint = " (give --truth FILE, or --no-truth to report without ground truth)"
        truth = load_truth(read_topic(settings, settings.truth_topic, args.idle_timeout, hint), needed)
    cells = join(loaded.rows, truth.truth if truth else {})
    groups = summarize(cells)
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        stations = plot_stations(cells, selection.stations, args.stations)
        plots = write_plots(cells, out, stations, estimators=selection.estimators, with_gls=args.with_gls,
                            every=args.every or None)
        text = format_summary(groups, loaded, truth, plots)
        (out / "summary.txt").write_text(text)
        doc = summary_json(groups, loaded, truth, plots)
        (out / "summary.json").write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise ReportError(f"cannot write to {out}: {exc.strerror or exc}") from exc
    print(text, end="")
    print(f"wrote {len(plots)} plots, summary.txt and summary.json to {out}")
    return EXIT_OK
