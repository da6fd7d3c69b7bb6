"""Grafana dashboards as code: writes ``deploy/grafana/dashboards/{overview,station}.json``.

    python deploy/grafana/build_dashboards.py          # (re)write the JSON files
    python deploy/grafana/build_dashboards.py --check  # exit 1 if the committed JSON is stale

The JSON files are committed (Grafana provisions them from disk); ``tests/unit/test_deploy.py``
checks that they equal this script's output, so the two cannot drift. Standard library only.

Conventions
* Every panel and target uses the provisioned Prometheus datasource (uid ``prometheus``).
* Counters are summed over workers (each worker counts what it processed). Gauges describing
  "the latest closed epoch" (estimates, bounds, reports, participants) are taken from the worker
  that closed the newest epoch of the query (:func:`newest`): with several workers every one keeps
  the gauges of the last window *it* closed, and only that instance's values are current.
* ``$__rate_interval`` is Grafana's rate window (at least 4 scrape intervals; the datasource sets
  the 5 s scrape interval as ``timeInterval``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["DATASOURCE", "OUT_DIR", "build", "main", "render"]

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "prometheus"}
OUT_DIR = Path(__file__).resolve().parent / "dashboards"
RATE = "[$__rate_interval]"
STATION_UID = "ptt-station"
OVERVIEW_UID = "ptt-overview"
QUERY = 'query=~"$query"'
STATION = 'station="$station"'


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

class Layout:
    """Assigns unique panel ids and flows panels left to right on Grafana's 24-column grid."""

    def __init__(self) -> None:
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def place(self, w: int, h: int) -> tuple[int, dict[str, int]]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        pid = self.next_id
        self.next_id += 1
        return pid, pos


def target(expr: str, legend: str, ref: str = "A") -> dict[str, Any]:
    return {"datasource": dict(DATASOURCE), "editorMode": "code", "expr": expr, "instant": False,
            "legendFormat": legend, "range": True, "refId": ref}


def targets(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def timeseries(layout: Layout, title: str, description: str, tgts: list[dict[str, Any]], unit: str = "short",
               w: int = 12, h: int = 8, overrides: list[dict[str, Any]] | None = None,
               min_zero: bool = True) -> dict[str, Any]:
    pid, pos = layout.place(w, h)
    defaults: dict[str, Any] = {
        "color": {"mode": "palette-classic"},
        "custom": {"axisPlacement": "auto", "drawStyle": "line", "fillOpacity": 0, "lineInterpolation": "linear",
                   "lineWidth": 1, "pointSize": 4, "showPoints": "never", "spanNulls": False,
                   "stacking": {"group": "A", "mode": "none"}},
        "unit": unit,
    }
    if min_zero:
        defaults["min"] = 0
    return {
        "datasource": dict(DATASOURCE), "description": description, "gridPos": pos, "id": pid,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {"legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": tgts, "title": title, "type": "timeseries",
    }


def stat(layout: Layout, title: str, description: str, tgts: list[dict[str, Any]], unit: str = "short",
         w: int = 4, h: int = 4, steps: dict[str, Any] | None = None, decimals: int | None = None) -> dict[str, Any]:
    pid, pos = layout.place(w, h)
    defaults: dict[str, Any] = {"color": {"mode": "thresholds"},
                                "thresholds": steps or thresholds((None, "green")), "unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "datasource": dict(DATASOURCE), "description": description, "gridPos": pos, "id": pid,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"colorMode": "value", "graphMode": "area", "justifyMode": "auto", "orientation": "auto",
                    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "textMode": "auto"},
        "targets": tgts, "title": title, "type": "stat",
    }


def by_name(name: str, *props: tuple[str, Any]) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": pid, "value": value} for pid, value in props]}


def fixed(color: str) -> dict[str, str]:
    return {"fixedColor": color, "mode": "fixed"}


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description,
        "editable": False,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": False, "icon": "external link", "includeVars": False, "keepTime": True,
                   "tags": ["ptt"], "targetBlank": False, "title": "Private traffic telemetry", "type": "dashboards"}],
        "panels": panels,
        "refresh": "5s",
        "schemaVersion": 39,
        "tags": ["ptt"],
        "templating": {"list": variables or []},
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# -- the dashboards ----------------------------------------------------------------------

def overview() -> dict[str, Any]:
    lay = Layout()
    p: list[dict[str, Any]] = []
    # top row: six numbers
    p.append(stat(lay, "Workers", "Stream-app workers Prometheus currently scrapes (one series per instance).",
                  targets(("count(faust_total_events_total)", "workers")), decimals=0))
    p.append(stat(lay, "Reports/s", "Vehicle reports counted per second, all queries, all workers.",
                  targets((per_second("ptt_reports_total"), "reports/s"))))
    p.append(stat(lay, "Max epoch lag", "Newest epoch seen minus newest epoch closed, worst query and worker. "
                  "Above the allowed lateness (2 epochs by default) epochs wait for stragglers.",
                  targets(("max(ptt_epoch_lag_epochs)", "epochs")), decimals=0,
                  steps=thresholds((None, "green"), (3, "orange"), (10, "red"))))
    p.append(stat(lay, "Dead letters", "Records sent to the dead-letter topic since the workers started.",
                  targets(("sum(ptt_dead_letters_total)", "dead letters")), decimals=0,
                  steps=thresholds((None, "green"), (1, "red"))))
    p.append(stat(lay, "Late records", "Records for already-closed epochs (kept out of the estimates) since the "
                  "workers started.", targets(("sum(ptt_late_records_total)", "late")), decimals=0,
                  steps=thresholds((None, "green"), (1, "orange"))))
    p.append(stat(lay, "Suppressed estimates", "Estimates withheld (too few participants, unknown participants "
                  "or an interrupted epoch) since the workers started.",
                  targets(("sum(ptt_suppressed_estimates_total)", "suppressed")), decimals=0,
                  steps=thresholds((None, "green"), (1, "orange"))))
    # time series
    p.append(timeseries(lay, "Reports per closed epoch", "Reports counted in the latest closed epoch, per query "
                        "and round (Sampling Privacy has two rounds), from the worker that closed it.",
                        targets((f"max by (query, round) ({newest('ptt_epoch_reports')})",
                                 "{{query}} round {{round}}"))))
    p.append(timeseries(lay, "Epoch lag", "Newest epoch seen minus newest epoch closed, per query (worst worker).",
                        targets(("max by (query) (ptt_epoch_lag_epochs)", "{{query}}")), unit="none"))
    p.append(timeseries(lay, "Reports/s", "Vehicle reports counted per second, per query.",
                        targets((per_second("ptt_reports_total", "query"), "{{query}}"))))
    p.append(timeseries(lay, "Epochs closed/s by reason", "markers: every producer's end-of-epoch marker arrived; "
                        "watermark: the data moved on past the allowed lateness; wall_clock: live data, grace "
                        "period over.", targets((per_second("ptt_epochs_closed_total", "closed_by"),
                                                 "{{closed_by}}"))))
    p.append(timeseries(lay, "Late records/s", "Records for epochs that were already closed (counted, kept out).",
                        targets((per_second("ptt_late_records_total", "query"), "{{query}}"))))
    p.append(timeseries(lay, "Dead letters/s by reason", "Records the workers could not use, by reason "
                        "(see the dead-letter topic for the records themselves).",
                        targets((per_second("ptt_dead_letters_total", "reason"), "{{reason}}"))))
    p.append(timeseries(lay, "Refused vehicle-epochs/s", "Devices that refused a query (epsilon above their "
                        "limit or a blacklisted sensor), per query.",
                        targets((per_second("ptt_refused_vehicles_total", "query"), "{{query}}"))))
    p.append(timeseries(lay, "Suppressed estimates/s", "Estimates withheld, per query.",
                        targets((per_second("ptt_suppressed_estimates_total", "query"), "{{query}}"))))
    p.append(timeseries(lay, "Withheld epochs by reason", "Epochs closed without estimates in the last 5 minutes, "
                        "per query and reason: conflicting_markers, late (its data came after the watermark "
                        "passed it and its markers never completed it), participants_unknown, interrupted, "
                        "too_few_participants, impossible_counts (counts no population could produce: forged or "
                        "corrupt reports), missing_batches, internal. Anything but too_few_participants deserves a "
                        "look; impossible_counts or conflicting_markers can mean a writer is forging records.",
                        targets(("sum by (query, reason) (increase(ptt_withheld_epochs_total[5m]))",
                                 "{{query}} {{reason}}")), unit="none"))
    p.append(timeseries(lay, "Records/s by kind", "Records read from the reports topic: batches, tallies, single "
                        "reports, end-of-epoch markers.",
                        targets((per_second("ptt_records_total", "kind"), "{{kind}}"))))
    p.append(timeseries(lay, "Participants per closed epoch", "Vehicles that answered in the latest closed epoch, "
                        "per query (0 when every device refused).",
                        targets((f"max by (query) ({newest('ptt_epoch_participants')})", "{{query}}"))))
    p.append(timeseries(lay, "Faust: messages received/s by topic", "Kafka messages the workers consumed.",
                        targets((per_second("faust_messages_received_per_topic_total", "topic"), "{{topic}}"))))
    p.append(timeseries(lay, "Faust: event processing time p99", "99th percentile of the time an agent spends "
                        "on one event, all workers.",
                        targets(("histogram_quantile(0.99, sum by (le) "
                                 f"(rate(faust_events_runtime_seconds_bucket{RATE})))", "p99")), unit="s"))
    return dashboard(OVERVIEW_UID, "PTT overview", "Private traffic telemetry: throughput, epoch closing, late "
                     "and refused data, dead letters.", p)


def _mechanism_panel(lay: Layout, title: str, description: str, mechanism: str, estimator: str,
                     extra_estimators: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    base = (STATION, QUERY, eq("mechanism", mechanism))

    def est(metric: str, name: str, *more: str) -> str:
        return f"max by (query) ({newest(sel(metric, *base, eq('estimator', name), *more))})"

    pairs = [(est("ptt_estimate_vehicles", estimator), "estimate")]
    for level in ("0.95", "0.99"):
        pct = f"{float(level) * 100:g}%"
        conf = eq("confidence", level)
        pairs.append((est("ptt_estimate_lower_vehicles", estimator, conf), f"{pct} lower"))
        pairs.append((est("ptt_estimate_upper_vehicles", estimator, conf), f"{pct} upper"))
    pairs.append((f"max({newest_truth(sel('ptt_ground_truth_vehicles', STATION))})", "ground truth"))
    for name, legend in extra_estimators:
        pairs.append((est("ptt_estimate_vehicles", name), legend))
    blue = fixed("blue")
    overrides = [
        by_name("estimate", ("color", blue), ("custom.lineWidth", 2)),
        by_name("95% upper", ("color", blue), ("custom.lineWidth", 0), ("custom.fillOpacity", 30),
                ("custom.fillBelowTo", "95% lower")),
        by_name("95% lower", ("color", blue), ("custom.lineWidth", 0)),
        by_name("99% upper", ("color", blue), ("custom.lineWidth", 0), ("custom.fillOpacity", 12),
                ("custom.fillBelowTo", "99% lower")),
        by_name("99% lower", ("color", blue), ("custom.lineWidth", 0)),
        by_name("ground truth", ("color", fixed("orange")), ("custom.lineWidth", 2),
                ("custom.lineStyle", {"dash": [10, 10], "fill": "dash"})),
    ]
    for _, legend in extra_estimators:
        overrides.append(by_name(legend, ("color", fixed("purple")), ("custom.lineWidth", 1),
                                 ("custom.lineStyle", {"dash": [0, 10], "fill": "dot"})))
    return timeseries(lay, title, description, targets(*pairs), unit="none", w=24, h=9, overrides=overrides,
                      min_zero=False)


def station() -> dict[str, Any]:
    lay = Layout()
    p: list[dict[str, Any]] = []
    p.append(stat(lay, "Epsilon per epoch", "Local epsilon of the running version of each query (what one "
                  "vehicle's report leaks per epoch, brute force over the mechanism's output table).",
                  targets((f"max by (query, mechanism) ({sel('ptt_query_epsilon', QUERY)})",
                           "{{query}} ({{mechanism}})")), w=8, decimals=3))
    p.append(stat(lay, "ALP crowd size", "Haystack crowd size of the ALP queries: the mean and the lower 1% "
                  "quantile of the number of vehicles whose reports look like a Yes at a station.",
                  targets(*((f"max by (query) ({sel('ptt_query_crowd_size_vehicles', QUERY, eq('statistic', st))})",
                             "{{query}} " + st) for st in ("mean", "p01"))), w=8, decimals=1,
                  steps=thresholds((None, "red"), (5, "orange"), (20, "green"))))
    p.append(stat(lay, "Participants per closed epoch", "Vehicles that answered in the latest closed epoch.",
                  targets((f"max by (query) ({newest(sel('ptt_epoch_participants', QUERY))})", "{{query}}")),
                  w=8, decimals=0))
    common = ("Latest estimate of the station's count with its 95% and 99% score bounds (bands) and the "
              "replayed ground truth (dashed, evaluation only). Estimates are per closed epoch; the truth "
              "gauge follows the newest replayed epoch, so the two can be a few epochs apart while "
              "epochs wait to close.")
    p.append(_mechanism_panel(lay, "Sampling Privacy (sp_difference) - station $station", common, "sp",
                              "sp_difference"))
    p.append(_mechanism_panel(lay, "ALP (alp_average, GLS dotted) - station $station", common, "alp",
                              "alp_average", (("alp_gls", "GLS estimate"),)))
    p.append(_mechanism_panel(lay, "Randomized response (rr) - station $station", common, "rr", "rr"))
    variables = [
        {"current": {}, "datasource": dict(DATASOURCE), "definition": "label_values(ptt_estimate_vehicles, station)",
         "hide": 0, "includeAll": False, "label": "Station", "multi": False, "name": "station", "options": [],
         "query": "label_values(ptt_estimate_vehicles, station)", "refresh": 1, "regex": "", "skipUrlSync": False,
         "sort": 3, "type": "query"},
        {"current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "datasource": dict(DATASOURCE),
         "definition": f"label_values({sel('ptt_estimate_vehicles', STATION)}, query)", "hide": 0,
         "includeAll": True, "label": "Query", "multi": True, "name": "query", "options": [],
         "query": f"label_values({sel('ptt_estimate_vehicles', STATION)}, query)", "refresh": 1, "regex": "",
         "skipUrlSync": False, "sort": 1, "type": "query"},
    ]
    return dashboard(STATION_UID, "PTT station", "Per-station estimates with confidence bands against the "
                     "ground truth, one panel per mechanism; epsilon and ALP crowd size of the queries.",
                     p, variables)


def build() -> dict[str, dict[str, Any]]:
    """File name -> dashboard."""
    return {"overview.json": overview(), "station.json": station()}


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
