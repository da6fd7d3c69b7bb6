"""Grafana dashboards as code: writes ``deploy/grafana/dashboards/{overview,station}.json``.

    python deploy/grafana/build_dashboards.py          # (re)write the JSON files
    python deploy/grafana/build_dashboards.py --check  # exit 1 if the committed JSON is stale

Built with Grafana's own typed Python SDK, ``grafana-foundation-sdk`` (the ``dev`` extra of
pyproject.toml; its builders follow Grafana's dashboard schema, version 11.2 like the
compose file's Grafana). The JSON files are committed (Grafana provisions them from disk);
``tests/unit/project/test_deploy.py`` checks that they equal this script's output, so the two cannot
drift.

Conventions
* Every panel and target uses the provisioned Prometheus datasource (uid ``prometheus``).
* Counters are summed over workers (each worker counts what it processed). Gauges describing
  "the latest closed epoch" (estimates, bounds, reports, participants) are taken from the worker
  that closed the newest epoch of the query (:func:`newest`): with several workers every one keeps
  the gauges of the last window *it* closed, and only that instance's values are current.
* ``$__rate_interval`` is Grafana's rate window (at least 4 scrape intervals; the datasource sets
  the 5 s scrape interval as ``timeInterval``).
* Nothing here names a mechanism: the station dashboard has one panel per mechanism the
  registry (``estimators/registry.py``) marks as a default query, with its title, headline
  estimator and overlay; the crowd-size panel shows the mechanisms with extra statistics.
* Panels flow left to right on Grafana's 24-column grid (the SDK's own placement) and are
  numbered in the order they are added.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models.prometheus import QueryEditorMode

from estimators.registry import REGISTRY, MechanismSpec, default_query_mechanisms, get_spec

__all__ = ["DATASOURCE", "OUT_DIR", "build", "main", "render"]

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="prometheus")
OUT_DIR = Path(__file__).resolve().parent / "dashboards"
RATE = "[$__rate_interval]"
STATION_UID = "ptt-station"
OVERVIEW_UID = "ptt-overview"
QUERY = 'query=~"$query"'
STATION = 'station="$station"'
CONFIDENCES = ("0.95", "0.99")  # the worker's default confidence levels: one band each
Target = cogbuilder.Builder[cogvariants.Dataquery]


# -- PromQL helpers ----------------------------------------------------------------------

def newest(selector: str) -> str:
    """Keep the series of ``selector`` from the worker that closed the newest epoch of each query."""
    return (f"{selector} and on (instance, query) "
            f"(ptt_last_closed_epoch == on (query) group_left max by (query) (ptt_last_closed_epoch))")


def newest_truth(selector: str) -> str:
    """Ground truth from the worker that read the newest truth record (the truth topic has one
    partition; after a rebalance the previous reader keeps its stale gauges)."""
    return f"{selector} and on (instance) (ptt_ground_truth_epoch == scalar(max(ptt_ground_truth_epoch)))"


def sel(metric: str, *matchers: str) -> str:
    """``metric{m1, m2}``: a selector from label matchers written as PromQL (``'station="$station"'``)."""
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def per_second(counter: str, by: str | None = None) -> str:
    inner = f"rate({counter}{RATE})"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


# -- panel builders ----------------------------------------------------------------------

def targets(*pairs: tuple[str, str]) -> list[Target]:
    """One range query per ``(expr, legend)``, reference ids A, B, ..."""
    return [prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).range()
            .editor_mode(QueryEditorMode.CODE).datasource(DATASOURCE) for i, (expr, legend) in enumerate(pairs)]


def thresholds(*steps: tuple[float | None, str]) -> dashboard_builders.ThresholdsConfig:
    return dashboard_builders.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps(
        [models.Threshold(value=value, color=color) for value, color in steps])


def fixed(color: str) -> models.FieldColor:
    return models.FieldColor(mode=models.FieldColorModeId.FIXED, fixed_color=color)


def prop(name: str, value: object) -> models.DynamicConfigValue:
    return models.DynamicConfigValue(id_val=name, value=value)


def timeseries_panel(panel_id: int, title: str, description: str, tgts: list[Target],
                     unit: str = "short", w: int = 12, h: int = 8, min_zero: bool = True) -> timeseries.Panel:
    panel = (timeseries.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE)
             .span(w).height(h).targets(tgts).unit(unit)
             .color_scheme(dashboard_builders.FieldColor().mode(models.FieldColorModeId.PALETTE_CLASSIC))
             .axis_placement(common.AxisPlacement.AUTO).draw_style(common.GraphDrawStyle.LINE).fill_opacity(0)
             .line_interpolation(common.LineInterpolation.LINEAR).line_width(1).point_size(4)
             .show_points(common.VisibilityMode.NEVER).span_nulls(False)
             .stacking(common_builders.StackingConfig().group("A").mode(common.StackingMode.NONE))
             .legend(common_builders.VizLegendOptions().calcs([]).display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.NONE)))
    return panel.min(0) if min_zero else panel


def stat_panel(panel_id: int, title: str, description: str, tgts: list[Target], unit: str = "short",
               w: int = 4, h: int = 4, steps: dashboard_builders.ThresholdsConfig | None = None,
               decimals: int | None = None) -> stat.Panel:
    panel = (stat.Panel().id(panel_id).title(title).description(description).datasource(DATASOURCE)
             .span(w).height(h).targets(tgts).unit(unit)
             .color_scheme(dashboard_builders.FieldColor().mode(models.FieldColorModeId.THRESHOLDS))
             .thresholds(steps or thresholds((None, "green")))
             .color_mode(common.BigValueColorMode.VALUE).graph_mode(common.BigValueGraphMode.AREA)
             .justify_mode(common.BigValueJustifyMode.AUTO).orientation(common.VizOrientation.AUTO)
             .text_mode(common.BigValueTextMode.AUTO)
             .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)))
    return panel.decimals(decimals) if decimals is not None else panel


def dashboard(uid: str, title: str, description: str) -> dashboard_builders.Dashboard:
    """An empty read-only dashboard with the project's conventions (30 minutes, 5 s refresh,
    shared crosshair, a link to the other ``ptt`` dashboards)."""
    return (dashboard_builders.Dashboard(title).uid(uid).description(description).readonly()
            .tooltip(models.DashboardCursorSync.CROSSHAIR).tags(["ptt"]).refresh("5s").time("now-30m", "now")
            .timezone("browser").week_start("").fiscal_year_start_month(0).version(1).variables([])
            .annotation(dashboard_builders.AnnotationQuery().name("Annotations & Alerts").built_in(1).enable(True)
                        .hide(True).icon_color("rgba(0, 211, 255, 1)").type("dashboard")
                        .datasource(models.DataSourceRef(type_val="grafana", uid="-- Grafana --")))
            .link(dashboard_builders.DashboardLink("Private traffic telemetry")
                  .type(models.DashboardLinkType.DASHBOARDS).tags(["ptt"]).icon("external link").as_dropdown(False)
                  .include_vars(False).keep_time(True)
                  .target_blank(False)))


# -- the dashboards ----------------------------------------------------------------------

def _multi_round() -> str:
    """``"A, B and C have 2 rounds"``: the registered mechanisms with more than one round."""
    by_rounds: dict[int, list[str]] = {}
    for s in REGISTRY.values():
        if s.n_rounds > 1:
            by_rounds.setdefault(s.n_rounds, []).append(s.title or s.name)
    return "; ".join(f"{' and '.join([', '.join(t[:-1]), t[-1]] if len(t) > 1 else t)} "
                     f"{'have' if len(t) > 1 else 'has'} {n} rounds" for n, t in sorted(by_rounds.items()))


def overview() -> dashboard_builders.Dashboard:
    ids = itertools.count(1)
    board = dashboard(OVERVIEW_UID, "PTT overview", "Private traffic telemetry: throughput, epoch closing, late "
                      "and refused data, dead letters.")
    # top row: six numbers
    for panel in (
        stat_panel(next(ids), "Workers", "Stream-app workers Prometheus currently scrapes (one series per instance).",
                   targets(("count(faust_total_events_total)", "workers")), decimals=0),
        stat_panel(next(ids), "Reports/s", "Vehicle reports counted per second, all queries, all workers.",
                   targets((per_second("ptt_reports_total"), "reports/s"))),
        stat_panel(next(ids), "Max epoch lag", "Newest epoch seen minus newest epoch closed, worst query and "
                   "worker. Above the allowed lateness (2 epochs by default) epochs wait for stragglers.",
                   targets(("max(ptt_epoch_lag_epochs)", "epochs")), decimals=0,
                   steps=thresholds((None, "green"), (3, "orange"), (10, "red"))),
        stat_panel(next(ids), "Dead letters", "Records sent to the dead-letter topic since the workers started.",
                   targets(("sum(ptt_dead_letters_total)", "dead letters")), decimals=0,
                   steps=thresholds((None, "green"), (1, "red"))),
        stat_panel(next(ids), "Late records", "Records for already-closed epochs (kept out of the estimates) since "
                   "the workers started.", targets(("sum(ptt_late_records_total)", "late")), decimals=0,
                   steps=thresholds((None, "green"), (1, "orange"))),
        stat_panel(next(ids), "Suppressed estimates", "Estimates withheld (too few participants, unknown "
                   "participants or an interrupted epoch) since the workers started.",
                   targets(("sum(ptt_suppressed_estimates_total)", "suppressed")), decimals=0,
                   steps=thresholds((None, "green"), (1, "orange"))),
        # time series
        timeseries_panel(next(ids), "Reports per closed epoch", "Reports counted in the latest closed epoch, per "
                         f"query and round ({_multi_round()}), from the worker "
                         "that closed it.", targets((f"max by (query, round) ({newest('ptt_epoch_reports')})",
                                                     "{{query}} round {{round}}"))),
        timeseries_panel(next(ids), "Epoch lag", "Newest epoch seen minus newest epoch closed, per query (worst "
                         "worker).", targets(("max by (query) (ptt_epoch_lag_epochs)", "{{query}}")), unit="none"),
        timeseries_panel(next(ids), "Reports/s", "Vehicle reports counted per second, per query.",
                         targets((per_second("ptt_reports_total", "query"), "{{query}}"))),
        timeseries_panel(next(ids), "Epochs closed/s by reason", "markers: every producer's end-of-epoch marker "
                         "arrived; watermark: the data moved on past the allowed lateness; wall_clock: live data, "
                         "grace period over.", targets((per_second("ptt_epochs_closed_total", "closed_by"),
                                                        "{{closed_by}}"))),
        timeseries_panel(next(ids), "Late records/s", "Records for epochs that were already closed (counted, kept "
                         "out).", targets((per_second("ptt_late_records_total", "query"), "{{query}}"))),
        timeseries_panel(next(ids), "Dead letters/s by reason", "Records the workers could not use, by reason "
                         "(see the dead-letter topic for the records themselves).",
                         targets((per_second("ptt_dead_letters_total", "reason"), "{{reason}}"))),
        timeseries_panel(next(ids), "Refused vehicle-epochs/s", "Devices that refused a query (epsilon above "
                         "their limit or a blacklisted sensor), per query.",
                         targets((per_second("ptt_refused_vehicles_total", "query"), "{{query}}"))),
        timeseries_panel(next(ids), "Suppressed estimates/s", "Estimates withheld, per query.",
                         targets((per_second("ptt_suppressed_estimates_total", "query"), "{{query}}"))),
        timeseries_panel(next(ids), "Withheld epochs by reason", "Epochs closed without estimates in the last 5 "
                         "minutes, per query and reason: conflicting_markers, late (its data came after the "
                         "watermark passed it and its markers never completed it), participants_unknown, "
                         "missing_markers (a producer's marker for some partition never came), interrupted, "
                         "no_reports and below_min_crowd (the shuffler withheld it: nobody reported, or too "
                         "small a crowd), notes_refused (the shuffler refused source notes that could have opened "
                         "it: unsigned, badly signed or from the future), release_mismatch (the query fixes "
                         "another release than the shuffler's), too_few_participants, impossible_counts "
                         "(counts no population could produce: forged or corrupt reports), missing_batches, "
                         "internal. Anything but too_few_participants, no_reports and below_min_crowd deserves a "
                         "look; impossible_counts or conflicting_markers can mean a writer is forging records.",
                         targets(("sum by (query, reason) (increase(ptt_withheld_epochs_total[5m]))",
                                  "{{query}} {{reason}}")), unit="none"),
        timeseries_panel(next(ids), "Records/s by kind", "Records read from the reports topic: batches, tallies, "
                         "single reports, end-of-epoch markers.",
                         targets((per_second("ptt_records_total", "kind"), "{{kind}}"))),
        timeseries_panel(next(ids), "Participants per closed epoch", "Vehicles that answered in the latest closed "
                         "epoch, per query (0 when every device refused).",
                         targets((f"max by (query) ({newest('ptt_epoch_participants')})", "{{query}}"))),
        timeseries_panel(next(ids), "Faust: messages received/s by topic", "Kafka messages the workers consumed.",
                         targets((per_second("faust_messages_received_per_topic_total", "topic"), "{{topic}}"))),
        timeseries_panel(next(ids), "Faust: event processing time p99", "99th percentile of the time an agent "
                         "spends on one event, all workers.",
                         targets(("histogram_quantile(0.99, sum by (le) "
                                  f"(rate(faust_events_runtime_seconds_bucket{RATE})))", "p99")), unit="s"),
    ):
        board.with_panel(panel)
    return board


def mechanism_panel(panel_id: int, name: str, spec: MechanismSpec, description: str) -> timeseries.Panel:
    """The station's estimate by ``spec``'s headline estimator with its bands (one per
    confidence level), the ground truth, and the spec's overlay estimator dotted."""
    base = (STATION, QUERY, eq("mechanism", name))

    def est(metric: str, estimator: str, *more: str) -> str:
        return f"max by (query) ({newest(sel(metric, *base, eq('estimator', estimator), *more))})"

    pairs = [(est("ptt_estimate_vehicles", spec.headline), "estimate")]
    for level in CONFIDENCES:
        pct = f"{float(level) * 100:g}%"
        pairs.append((est("ptt_estimate_lower_vehicles", spec.headline, eq("confidence", level)), f"{pct} lower"))
        pairs.append((est("ptt_estimate_upper_vehicles", spec.headline, eq("confidence", level)), f"{pct} upper"))
    pairs.append((f"max({newest_truth(sel('ptt_ground_truth_vehicles', STATION))})", "ground truth"))
    shown = spec.headline
    if spec.overlay is not None:
        estimator, label = spec.overlay
        pairs.append((est("ptt_estimate_vehicles", estimator), f"{label} estimate"))
        shown += f", {label} dotted"
    blue = fixed("blue")
    panel = (timeseries_panel(panel_id, f"{spec.title or name} ({shown}) - station $station", description,
                              targets(*pairs), unit="none", w=24, h=9, min_zero=False)
             .override_by_name("estimate", [prop("color", blue), prop("custom.lineWidth", 2)]))
    for level, opacity in zip(CONFIDENCES, (30, 12), strict=True):
        pct = f"{float(level) * 100:g}%"
        panel.override_by_name(f"{pct} upper", [prop("color", blue), prop("custom.lineWidth", 0),
                                                prop("custom.fillOpacity", opacity),
                                                prop("custom.fillBelowTo", f"{pct} lower")])
        panel.override_by_name(f"{pct} lower", [prop("color", blue), prop("custom.lineWidth", 0)])
    panel.override_by_name("ground truth", [prop("color", fixed("orange")), prop("custom.lineWidth", 2),
                                            prop("custom.lineStyle", common.LineStyle(fill="dash", dash=[10, 10]))])
    if spec.overlay is not None:
        panel.override_by_name(f"{spec.overlay[1]} estimate", [
            prop("color", fixed("purple")), prop("custom.lineWidth", 1),
            prop("custom.lineStyle", common.LineStyle(fill="dot", dash=[0, 10]))])
    return panel


def newest_rollup(selector: str) -> str:
    """As :func:`newest`, for the rollups: the worker that published the newest rollup of each
    query and span."""
    return (f"{selector} and on (instance, query, span_s) (ptt_last_rollup_epoch == on (query, span_s) "
            f"group_left max by (query, span_s) (ptt_last_rollup_epoch))")


def flows_panel(panel_id: int) -> timeseries.Panel:
    """The station's latest flows over ``$span`` seconds by each query's headline estimator,
    with the 95% bounds as thin lines: repeated once per span the workers publish (the
    ``span`` variable, every value selected by default), so each span has its own panel."""
    base = (STATION, QUERY, 'span_s=~"$span"')  # one value in a repeated panel

    def latest(metric: str, *more: str) -> str:
        return f"max by (query) ({newest_rollup(sel(metric, *base, *more))})"

    level = CONFIDENCES[0]
    pct = f"{float(level) * 100:g}%"
    pairs = [(latest("ptt_rollup_vehicles"), "{{query}}"),
             (latest("ptt_rollup_lower_vehicles", eq("confidence", level)), "{{query}} " + pct + " lower"),
             (latest("ptt_rollup_upper_vehicles", eq("confidence", level)), "{{query}} " + pct + " upper")]
    return (timeseries_panel(
        panel_id, "Flows over $span s - station $station",
        "The station's latest published flow over the span (300 s: 5 minutes, 3600 s: an hour, or a span query's "
        "span), by each query's headline estimator, with its 95% score bounds (thin dashed lines); one panel per "
        "span. A 30-s query's flow is its rollup, the sum of its per-epoch estimates over the span: the noise grows "
        "as the square root of the span while the flow grows with it. A span query's flow comes from one report "
        "per device per span, so its noise is added once per span. The ground truth of a flow (the sum of its "
        "epochs' truth) is in ptt report's flows plots and summary.",
        targets(*pairs), unit="none", w=24, h=8, min_zero=False)
        .repeat("span").repeat_direction("v")
        .override_by_regexp(f".* {pct} (lower|upper)", [
            prop("custom.lineWidth", 1), prop("custom.lineStyle", common.LineStyle(fill="dash", dash=[4, 4]))]))


def _crowds() -> Iterator[MechanismSpec]:
    """The mechanisms whose queries publish extra statistics (the crowd-size gauge)."""
    return (s for s in REGISTRY.values() if s.extra_names and s.default_query)


def station() -> dashboard_builders.Dashboard:
    ids = itertools.count(1)
    crowd_titles = " and ".join(s.title or s.name for s in _crowds())
    board = dashboard(STATION_UID, "PTT station", "Per-station estimates with confidence bands against the "
                      f"ground truth, one panel per mechanism; epsilon and {crowd_titles} crowd size of the queries.")
    board.with_panel(stat_panel(
        next(ids), "Epsilon per epoch", "Local epsilon of the running version of each query (what one vehicle's "
        "report leaks per epoch, brute force over the mechanism's output table).",
        targets((f"max by (query, mechanism) ({sel('ptt_query_epsilon', QUERY)})", "{{query}} ({{mechanism}})")),
        w=4, decimals=3))
    board.with_panel(stat_panel(
        next(ids), "Shuffled epsilon per epoch", "Central epsilon of the latest closed epoch's release given the "
        "smallest shuffle that fed it, at the worker's PTT_SHUFFLE_DELTA: it assumes the shuffler does not collude "
        "with the analyst and mixed each report among the n reports of its epoch and round. No value while the "
        "epoch's producers attest no shuffle size (the direct replay).",
        targets((f"max by (query, mechanism) ({sel('ptt_query_epsilon_shuffled', QUERY)})",
                 "{{query}} ({{mechanism}})")),
        w=4, decimals=3))
    board.with_panel(stat_panel(
        next(ids), "A vehicle's day (epsilon)", "A vehicle's privacy loss over a whole day across every running "
        "query (the newest version of each; Sampling Privacy, which has no whole-day bound, left out) at delta "
        "1e-6: the figure of the demo's banner, ptt analyst list and summary.txt, computed by the worker "
        "(stream_app/worker/day_metric.py). Labelled with the release it holds for: the shuffler's (aggregate or "
        "permuted, among the n of ptt_vehicle_day_shuffle_size) when the newest epoch of every query attests "
        "it, else local (no shuffler). No value while none is computed for the running queries and release: "
        "before any epoch is published, and for tens of seconds after the queries change "
        "(ptt_vehicle_day_epsilon_state says which).",
        targets(("max by (release) (ptt_vehicle_day_epsilon)", "{{release}}")), w=4, decimals=3,
        steps=thresholds((None, "green"), (1, "yellow"), (3, "orange"), (10, "red"))).no_value("none yet"))
    for spec in _crowds():
        board.with_panel(stat_panel(
            next(ids), f"{spec.title or spec.name} crowd size", f"Haystack crowd size of the {spec.title or spec.name} "
            "queries: the mean and the lower 1% quantile of the number of vehicles whose reports look like a Yes "
            "at a station.",
            targets(*((f"max by (query) ({sel('ptt_query_crowd_size_vehicles', QUERY, eq('statistic', st))})",
                       "{{query}} " + st) for st in spec.extra_names)),
            w=8, decimals=1, steps=thresholds((None, "red"), (5, "orange"), (20, "green"))))
    board.with_panel(stat_panel(
        next(ids), "Participants per closed epoch", "Vehicles that answered in the latest closed epoch.",
        targets((f"max by (query) ({newest(sel('ptt_epoch_participants', QUERY))})", "{{query}}")), w=4,
        decimals=0))
    common_text = ("Latest estimate of the station's count with its 95% and 99% score bounds (bands) and the "
                   "replayed ground truth (dashed, evaluation only). Estimates are per closed epoch; the truth "
                   "gauge follows the newest replayed epoch, so the two can be a few epochs apart while "
                   "epochs wait to close.")
    for name in default_query_mechanisms():  # a panel for a mechanism no query runs would stay empty
        board.with_panel(mechanism_panel(next(ids), name, get_spec(name), common_text))
    board.with_panel(flows_panel(next(ids)))
    board.with_variable(
        dashboard_builders.QueryVariable("station").label("Station").datasource(DATASOURCE)
        .query("label_values(ptt_estimate_vehicles, station)").refresh(models.VariableRefresh.ON_DASHBOARD_LOAD)
        .sort(models.VariableSort.NUMERICAL_ASC).include_all(False).multi(False).regex("")
        .hide(models.VariableHide.DONT_HIDE))
    board.with_variable(
        dashboard_builders.QueryVariable("query").label("Query").datasource(DATASOURCE)
        .query(f"label_values({sel('ptt_estimate_vehicles', STATION)}, query)")
        .current(models.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .refresh(models.VariableRefresh.ON_DASHBOARD_LOAD).sort(models.VariableSort.ALPHABETICAL_ASC)
        .include_all(True).multi(True).regex("").hide(models.VariableHide.DONT_HIDE))
    board.with_variable(
        dashboard_builders.QueryVariable("span").label("Flow span (s)").datasource(DATASOURCE)
        .query("label_values(ptt_rollup_vehicles, span_s)")
        .current(models.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .refresh(models.VariableRefresh.ON_DASHBOARD_LOAD).sort(models.VariableSort.NUMERICAL_ASC)
        .include_all(True).multi(True).regex("").hide(models.VariableHide.DONT_HIDE))
    return board


def build() -> dict[str, models.Dashboard]:
    """File name -> dashboard."""
    return {"overview.json": overview().build(), "station.json": station().build()}


def render(board: models.Dashboard) -> str:
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    stale = []
    for name, board in build().items():
        path = args.out / name
        text = render(board)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {', '.join(stale)} (run python deploy/grafana/build_dashboards.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
