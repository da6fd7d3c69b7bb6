"""How good were the published estimates? Plots and a summary of a replay (``ptt report``).

Inputs are the stream app's estimates (``schemas.estimates.Estimate``) and the replay's ground
truth (``schemas.wire.GroundTruth``), read from their topics or from saved JSON lines (as
written by ``ptt subscribe --json``). Outputs, in ``--out``:

* one PNG per (query, span, estimator) of the flows -- a span query's rows first, then the
  5-minute and hourly rollups of a 30-s query -- with a panel per station (the stations below):
  the estimate, its bands and the span's truth, the sum of its epochs' truth (none, not 0, when
  an epoch of the span has none); the title says what the flows are and what they spend (a
  rollup: the epochs it sums, epsilon per epoch), a panel NOISE-DOMINATED in red;
* one PNG per (query, station, estimator) of the 30-s epochs in the style of Anonymized Local
  Privacy Figure 1: the ground truth and the privatized estimate over the time of day, the 99%
  and 95% bounds as bands; only the busiest stations (by total truth) unless ``--station``
  names them;
* ``summary.txt`` (also printed) and ``summary.json``: first a table of the flows, the span
  queries' first, then the rollups of the 30-s queries (:mod:`.flows`), each with what it is
  good for (per-station traffic, busy stations only, or NOISE-DOMINATED); then per (query,
  span, estimator), in that order and the epochs last, the number of (station, epoch or span)
  cells, how often each confidence level's bounds cover the truth (overall and by truth bin),
  the mean absolute error and bias, the mean band width per level, epsilon, the shuffled
  epsilon (the largest over the epochs that carry one; a rollup's is one epoch's, labelled per
  epoch, with the epochs it sums), and every cell not scored with why (withheld and its code,
  no source data, no truth and why); every record read and not kept is named too (unreadable,
  duplicate, or the filter that left it out).

Loading (from any iterable of JSON lines), joining with the truth and the summary
(:mod:`.summary`) and the plots (:mod:`.plots`, which write the files they are given) are
functions of their arguments, testable without a broker; :func:`write_report` puts them
together. Reading files and topics and the command line are ``stream_app/cli/report.py``.
Matplotlib is imported only when plotting and draws on the non-interactive Agg canvas (no
pyplot, never a window).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from schemas import Query
from schemas.estimates import Estimate

from ..day_figure import day_title, release_of, vehicle_day
from .cap_drops import CapDropError, CapDrops, read_cap_drops
from .flows import KIND_ORDER, NOISE_WORD, flow_rank, flow_what, good_for, span_adjective
from .plots import (
    DEFAULT_ESTIMATORS,
    FIG_HEIGHT_PX,
    FIG_WIDTH_PX,
    FLOW_HEAD_PX,
    FLOW_PANEL_PX,
    MAX_POINTS,
    Series,
    busiest_stations,
    plot_flows,
    plot_series,
    plot_stations,
    series_for,
    write_flow_plots,
    write_plots,
)
from .summary import (
    NO_READING,
    NO_TRUTH_GIVEN,
    NO_TRUTH_RECORD,
    TRUTH_BINS,
    BinScore,
    Cell,
    GroupSummary,
    LoadedEstimates,
    LoadedTruth,
    ReportError,
    Row,
    Selection,
    estimates_of_frames,
    estimates_of_long_table,
    flows_first,
    format_summary,
    join,
    load_estimates,
    load_truth,
    noise_dominated,
    sp_caveat,
    span_words,
    summarize,
    summary_json,
    truth_bin,
    withheld_code,
)

__all__ = [
    "DEFAULT_ESTIMATORS",
    "KIND_ORDER",
    "NOISE_WORD",
    "NO_READING",
    "NO_TRUTH_GIVEN",
    "NO_TRUTH_RECORD",
    "TRUTH_BINS",
    "BinScore",
    "CapDropError",
    "CapDrops",
    "FIG_HEIGHT_PX",
    "FIG_WIDTH_PX",
    "FLOW_HEAD_PX",
    "FLOW_PANEL_PX",
    "MAX_POINTS",
    "Cell",
    "GroupSummary",
    "LoadedEstimates",
    "LoadedTruth",
    "ReportError",
    "Row",
    "Selection",
    "Series",
    "busiest_stations",
    "estimates_of_frames",
    "estimates_of_long_table",
    "flow_rank",
    "flow_what",
    "flows_first",
    "format_summary",
    "good_for",
    "join",
    "load_estimates",
    "load_truth",
    "noise_dominated",
    "plot_flows",
    "sp_caveat",
    "plot_series",
    "plot_stations",
    "read_cap_drops",
    "series_for",
    "span_adjective",
    "span_words",
    "summarize",
    "summary_json",
    "truth_bin",
    "withheld_code",
    "write_flow_plots",
    "write_plots",
    "write_report",
]


def _day_of(queries: Sequence[Query] | None, loaded: LoadedEstimates) -> tuple[dict[str, Any] | None, str]:
    """A vehicle's whole day across ``queries`` for the path the estimates took (none without
    queries), and the plots' title for it."""
    if not queries:
        return None, ""
    release = release_of(r.release for r in loaded.rows if r.withheld is None)  # a withheld row released nothing
    line, epsilon = vehicle_day(list(queries), release)
    return {"line": line, "epsilon": epsilon, "release": release}, day_title(epsilon, release)


def write_report(estimates: Iterable[bytes | str | Estimate], truth: Iterable[bytes | str] | None, out: Path, *,
                 selection: Selection | None = None, where: str = "the estimates", stations: int = 6,
                 every: int | None = None, with_gls: bool = False,
                 before_plots: Callable[[Path], None] | None = None,
                 queries: Sequence[Query] | None = None, plots: bool = True,
                 cap_drops: CapDrops | None = None) -> tuple[str, list[Path]]:
    """Read the estimates (JSON lines; ``where`` names them in errors), then the ground truth
    of their stations (``None``: none), and write ``summary.txt`` and ``summary.json``, then
    the plots of the ``stations`` busiest stations (all of ``selection.stations`` if it names
    some) into ``out`` -- the epochs' per station, the flows' per query and span --, then the
    summary again with the plots named (``plots=False``: the summary only, matplotlib not
    imported). ``before_plots(summary path)`` is called between the two (the plots take about a
    second each): whatever stops the plots (a KeyboardInterrupt it raises, or one from the
    plotting) leaves the summary written. Returns the summary text and the plots written.
    :class:`ReportError` when no estimate matches or ``out`` cannot be written. ``queries`` (the
    queries the run answered): the summary and every plot's title give a vehicle's whole day
    across them, for the path the estimates took (:mod:`stream_app.day_figure`). ``cap_drops``:
    what a day cap dropped (:mod:`.cap_drops`), said after the flows."""
    selection = selection or Selection()
    loaded = load_estimates(estimates, selection)
    if not loaded.rows:
        why = (f"{loaded.read:,} records read, {loaded.invalid:,} unreadable, "
               f"{loaded.filtered_out:,} filtered out (filters: {selection.describe()})")
        raise ReportError(f"no matching estimates in {where} ({why})")
    needed = {r.station for r in loaded.rows}
    loaded_truth = load_truth(truth, needed) if truth is not None else None
    cells = (join(loaded.rows, loaded_truth.truth, loaded_truth.epoch_ids) if loaded_truth is not None
             else join(loaded.rows, None))
    groups = summarize(cells, loaded.own_span)
    day, title = _day_of(queries, loaded)

    def write_summary(plots: list[Path]) -> str:
        text = format_summary(groups, loaded, loaded_truth, plots, day=day, cap_drops=cap_drops)
        (out / "summary.txt").write_text(text)
        doc = summary_json(groups, loaded, loaded_truth, plots, day=day, cap_drops=cap_drops)
        (out / "summary.json").write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return text

    try:
        out.mkdir(parents=True, exist_ok=True)
        text = write_summary([])
        if before_plots is not None and plots:
            before_plots(out / "summary.txt")
        chosen = plot_stations(cells, selection.stations, stations) if plots else []
        drawn: list[Path] = []
        if plots and (stations or selection.stations):  # --stations 0: none; the flows first (span queries first)
            drawn += write_flow_plots(cells, out, chosen, own_span=loaded.own_span, estimators=selection.estimators,
                                      every=every, busiest=stations, day=title)
        drawn += write_plots(cells, out, chosen, estimators=selection.estimators, with_gls=with_gls, every=every,
                             day=title)
        if drawn:
            text = write_summary(drawn)
    except OSError as exc:
        raise ReportError(f"cannot write to {out}: {exc.strerror or exc}") from exc
    return text, drawn
