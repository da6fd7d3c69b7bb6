"""Prometheus metrics of the stream app, touched only through :class:`StreamMonitor`.

All metrics live in one registry handed in (a fresh one per test). The per-station series
(estimates, bounds, ground truth: up to ~100k at 3,220 stations) are not ``Gauge.set()``
calls: :class:`StationArrays` keeps the latest arrays and renders them at scrape time (a
custom collector); the worker's ``/metrics`` page writes their text itself
(:meth:`StationArrays.expose`, once per change of the arrays, not per scrape): rendered by
prometheus_client, 3,220 stations' ~97k series took ~2 s per scrape, the worker's event loop
blocked meanwhile (tests/benchmarks/bench_scale.py, ``metrics_scrape``). Labels stay bounded:
query, mechanism, estimator, station (thousands at most), confidence, round, reason, and the
day figure's release and state (:mod:`stream_app.worker.day_metric`). Nothing per vehicle exists to be a label.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString as _go_float

from estimators import SP_CAVEAT
from schemas.epochs import spans_epochs

from .day_metric import STATES as DAY_STATES
from .estimate import WITHHELD_CODES, EpochResult
from .windows import SHUFFLE_NULL_CODES

__all__ = ["StationArrays", "StreamMonitor"]

EST_LABELS = ["query", "mechanism", "estimator", "station"]


@dataclass
class _Latest:
    stations: list[str]
    estimate: npt.NDArray[np.float64]
    lower: npt.NDArray[np.float64]  # (C, V)
    upper: npt.NDArray[np.float64]
    confidences: list[str]


class StationArrays(Collector):
    """Latest per-station arrays, rendered as gauges when Prometheus scrapes: the epochs'
    estimates and bounds, and (``span`` label) the headline estimator's latest rollups."""

    def __init__(self) -> None:
        self._latest: dict[tuple[str, ...], _Latest] = {}  # (query, mechanism, estimator)
        self._rollups: dict[tuple[str, ...], _Latest] = {}  # (query, mechanism, estimator, span)
        self._truth: tuple[list[str], list[float]] | None = None
        self._text: bytes | None = None  # the families' exposition text, until the arrays change
        self._apart = False  # expose(): the registry's own rendering leaves these families out

    def set_estimates(self, query: str, mechanism: str, estimator: str, stations: Sequence[int],
                      estimate: npt.NDArray[np.float64], lower: npt.NDArray[np.float64],
                      upper: npt.NDArray[np.float64], confidences: Sequence[float], span_s: int | None = None,
                      blank: frozenset[int] = frozenset()) -> None:
        """The latest estimates of an epoch, or (``span_s``) of a flow over that span (a rollup,
        or a span query's estimate); ``blank``: station indices (1..V) published without a
        number, left out (no series rather than a NaN or a stale one)."""
        if blank:
            keep = np.array([i + 1 not in blank for i in range(len(stations))], dtype=bool)
            stations = [s for s, k in zip(stations, keep.tolist(), strict=True) if k]
            estimate, lower, upper = estimate[keep], lower[:, keep], upper[:, keep]
        key, into = ((query, mechanism, estimator), self._latest) if span_s is None else (
            (query, mechanism, estimator, str(span_s)), self._rollups)
        into[key] = _Latest([str(s) for s in stations], estimate.copy(), lower.copy(), upper.copy(),
                            [f"{c:g}" for c in confidences])
        self._text = None

    def set_truth(self, stations: Sequence[int], flows: Sequence[float]) -> None:
        """Latest ground truth; a NaN flow (no truth for that cell) is left out, not shown as 0."""
        keep = [(str(s), float(f)) for s, f in zip(stations, flows, strict=True) if not math.isnan(f)]
        self._truth = ([s for s, _ in keep], [f for _, f in keep])
        self._text = None

    def describe(self) -> Iterator[Metric]:
        """The families' names (no samples): lets a scrape that asks for other metrics by name
        (``/metrics?name[]=...``) skip rendering ~100k per-station series."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        est = GaugeMetricFamily("ptt_estimate_vehicles", "Latest published estimate of a station's count",
                                labels=EST_LABELS)
        low = GaugeMetricFamily("ptt_estimate_lower_vehicles", "Lower confidence bound of the latest estimate",
                                labels=[*EST_LABELS, "confidence"])
        up = GaugeMetricFamily("ptt_estimate_upper_vehicles", "Upper confidence bound of the latest estimate",
                               labels=[*EST_LABELS, "confidence"])
        truth = GaugeMetricFamily("ptt_ground_truth_vehicles",
                                  "Ground truth of the latest replayed epoch (evaluation only; absent where the "
                                  "source has no reading)", labels=["station"])
        r_est = GaugeMetricFamily("ptt_rollup_vehicles", "Latest published flow of a station over span_s seconds: a "
                                  "rollup of a 30-s query (the sum of its epochs; the headline estimator) or a span "
                                  "query's estimate (every estimator); absent where a rollup had no source data",
                                  labels=[*EST_LABELS, "span_s"])
        r_low = GaugeMetricFamily("ptt_rollup_lower_vehicles", "Lower confidence bound of the latest flow",
                                  labels=[*EST_LABELS, "span_s", "confidence"])
        r_up = GaugeMetricFamily("ptt_rollup_upper_vehicles", "Upper confidence bound of the latest flow",
                                 labels=[*EST_LABELS, "span_s", "confidence"])
        return est, low, up, truth, r_est, r_low, r_up

    def _groups(self, fams: tuple[GaugeMetricFamily, ...]
                ) -> Iterator[tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                                    dict[tuple[str, ...], _Latest]]]:
        est, low, up, _, r_est, r_low, r_up = fams
        yield est, low, up, self._latest
        yield r_est, r_low, r_up, self._rollups

    def collect(self) -> Iterator[Metric]:
        if self._apart:
            return
        fams = self._families()
        for est, low, up, latest in self._groups(fams):
            for key, a in sorted(latest.items()):
                head = list(key[:3]) + [s for s in key[3:]]
                for s, x in zip(a.stations, a.estimate.tolist(), strict=True):
                    est.add_metric([*head[:3], s, *head[3:]], x)
                for j, c in enumerate(a.confidences):
                    for s, lo, hi in zip(a.stations, a.lower[j].tolist(), a.upper[j].tolist(), strict=True):
                        low.add_metric([*head[:3], s, *head[3:], c], lo)
                        up.add_metric([*head[:3], s, *head[3:], c], hi)
        truth = fams[3]
        if self._truth is not None:
            for s, f in zip(*self._truth, strict=True):
                truth.add_metric([s], f)
        yield from fams

    def expose(self, registry: CollectorRegistry) -> bytes:
        """The whole registry in Prometheus' text format, as ``generate_latest(registry)`` gives
        it, except that this collector's families come last and are written here from the
        arrays (cached until they change). Called on the event loop only (not thread-safe)."""
        self._apart = True
        try:
            head = generate_latest(registry)
        finally:
            self._apart = False
        if self._text is None:
            self._text = self._render()
        return head + self._text

    def _render(self) -> bytes:
        fams = self._families()
        out: dict[str, list[str]] = {f.name: [] for f in fams}
        for est, low, up, latest in self._groups(fams):
            for key, a in sorted(latest.items()):
                q, m, e = key[:3]
                common = f'query="{_esc(q)}",mechanism="{_esc(m)}",estimator="{_esc(e)}",station="'
                span = "".join(f',span_s="{_esc(x)}"' for x in key[3:])
                out[est.name] += [f'{est.name}{{{common}{s}"{span}}} {_fmt(x)}\n'
                                  for s, x in zip(a.stations, a.estimate.tolist(), strict=True)]
                for j, c in enumerate(a.confidences):
                    for fam, arr in ((low, a.lower), (up, a.upper)):
                        out[fam.name] += [f'{fam.name}{{{common}{s}"{span},confidence="{_esc(c)}"}} {_fmt(x)}\n'
                                          for s, x in zip(a.stations, arr[j].tolist(), strict=True)]
        truth = fams[3]
        if self._truth is not None:
            out[truth.name] += [f'{truth.name}{{station="{s}"}} {_fmt(f)}\n'
                                for s, f in zip(*self._truth, strict=True)]
        parts: list[str] = []
        for fam in fams:
            doc = fam.documentation.replace("\\", r"\\").replace("\n", r"\n")
            parts += [f"# HELP {fam.name} {doc}\n# TYPE {fam.name} gauge\n", *out[fam.name]]
        return "".join(parts).encode()


def _fmt(value: float) -> str:
    """A sample value as prometheus_client writes it (``+Inf``, ``NaN``, Go's exponents)."""
    return str(_go_float(value))  # type: ignore[no-untyped-call]


def _esc(value: str) -> str:
    """A label value escaped as Prometheus' text format wants it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class StreamMonitor:
    """Every metric of the stream app; the app calls its hooks and never a metric directly."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.arrays = StationArrays()
        registry.register(self.arrays)
        self.truth_epoch = Gauge("ptt_ground_truth_epoch", "Epoch of the latest ground truth", registry=registry)
        self.last_closed = Gauge("ptt_last_closed_epoch", "Newest closed epoch", ["query"], registry=registry)
        self.newest_seen = Gauge("ptt_newest_seen_epoch", "Newest epoch seen in reports", ["query"], registry=registry)
        self.epoch_lag = Gauge("ptt_epoch_lag_epochs", "Newest epoch seen minus newest closed epoch", ["query"],
                               registry=registry)
        self.epoch_reports = Gauge("ptt_epoch_reports", "Reports counted in the latest closed epoch",
                                   ["query", "round"], registry=registry)
        self.epoch_participants = Gauge("ptt_epoch_participants", "Vehicles that answered in the latest closed epoch",
                                        ["query"], registry=registry)
        self.epsilon = Gauge("ptt_query_epsilon", "Per-epoch epsilon of a device's whole report for the running "
                             f"query version, local (no shuffler). {SP_CAVEAT}.", ["query", "mechanism"],
                             registry=registry)
        self.epsilon_shuffled = Gauge(
            "ptt_query_epsilon_shuffled", "Central epsilon of the latest closed epoch's release (the one its "
            "shuffler attests: aggregate or permuted) given the smallest shuffle that fed it, rounded down to 2 "
            "significant digits (assumes the shuffler does not collude with the analyst and mixed each report "
            "among the n reports of its epoch and round); no series while the epoch's producers attest no shuffle, "
            "nor for Sampling Privacy (no shuffled bound)",
            ["query", "mechanism"], registry=registry)
        self.shuffle_null = Counter("ptt_epsilon_shuffled_null_epochs", "Closed epochs published without a shuffled "
                                    "epsilon, by reason (not_attested, exceeds_released)", ["query", "reason"],
                                    registry=registry)
        self.crowd = Gauge("ptt_query_crowd_size_vehicles", "Haystack crowd size of an ALP query (mean, p01)",
                           ["query", "statistic"], registry=registry)
        self.records = Counter("ptt_records", "Records read from the reports topic", ["kind"], registry=registry)
        self.reports = Counter("ptt_reports", "Vehicle reports counted", ["query"], registry=registry)
        self.late = Counter("ptt_late_records", "Records for already-closed epochs, kept out", ["query"],
                            registry=registry)
        self.duplicates = Counter("ptt_duplicate_records", "Duplicate deliveries counted once", ["query"],
                                  registry=registry)
        self.dead_letters = Counter("ptt_dead_letters", "Records sent to the dead-letter topic", ["reason"],
                                    registry=registry)
        self.refused = Counter("ptt_refused_vehicles", "Vehicle-epochs whose device refused the query", ["query"],
                               registry=registry)
        self.suppressed = Counter("ptt_suppressed_estimates", "Estimates withheld", ["query"], registry=registry)
        self.no_source_data = Counter("ptt_no_source_data_estimates", "Estimates of stations whose replayed source "
                                      "had no reading (no truth to hold them against): epochs' and rollups' rows",
                                      ["query"], registry=registry)
        self.withheld_epochs = Counter("ptt_withheld_epochs", "Epochs withheld, by reason", ["query", "reason"],
                                       registry=registry)
        self.closed = Counter("ptt_epochs_closed", "Epochs closed", ["query", "closed_by"], registry=registry)
        self.missing_batches = Counter("ptt_missing_batches", "Batches announced by markers that never arrived",
                                       ["query"], registry=registry)
        self.close_latency = Histogram(
            "ptt_close_latency_seconds", "From a stage-2 batch that closes epochs to their estimates being "
            "acknowledged by the broker", registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0))
        self.rollups = Counter("ptt_rollups", "Rollups published (sums of span_s seconds of epochs)",
                               ["query", "span_s"], registry=registry)
        self.rollups_withheld = Counter("ptt_withheld_rollups", "Rollups withheld, by the code of their first "
                                        "withheld epoch", ["query", "span_s", "reason"], registry=registry)
        self.last_rollup = Gauge("ptt_last_rollup_epoch", "First epoch of the newest published rollup",
                                 ["query", "span_s"], registry=registry)
        self._day_gauges(registry)
        self._known: set[str] = set()
        self._newest: dict[str, int] = {}
        self._closed_upto: dict[str, int] = {}

    def _day_gauges(self, registry: CollectorRegistry) -> None:
        """A vehicle's whole day across every running query (:mod:`stream_app.worker.day_metric`)."""
        self.day_epsilon = Gauge(
            "ptt_vehicle_day_epsilon", "A vehicle's whole-day epsilon at delta 1e-06 across every running query "
            "(the newest version of each; one without a whole-day bound, Sampling Privacy's, left out), for the "
            "release its published epochs took: the shuffler's (aggregate or permuted) when the newest epoch of "
            "every query attests it, at the n of ptt_vehicle_day_shuffle_size, else local (no shuffler); the "
            "figure of the demo's banner, ptt analyst list and summary.txt. No series while none is computed for "
            "the running queries and release (ptt_vehicle_day_epsilon_state says why)", ["release"],
            registry=registry)
        self.day_shuffle_size = Gauge(
            "ptt_vehicle_day_shuffle_size", "Reports per shuffle the shuffled day figure is computed at: the "
            "smallest population of the running queries, rounded down to 2 significant digits (no series for "
            "local)", ["release"], registry=registry)
        self.day_queries = Gauge("ptt_vehicle_day_query_version", "Version of each query counted in "
                                 "ptt_vehicle_day_epsilon", ["query"], registry=registry)
        self.day_state = Gauge(
            "ptt_vehicle_day_epsilon_state", "1 for what ptt_vehicle_day_epsilon shows now: no_queries, no_epochs "
            "(none published yet: the release is not known), computing (a change of the running queries or of "
            "the release), ready, no_bound (no running query has a whole-day bound), failed", ["state"],
            registry=registry)
        self.day_seconds = Gauge("ptt_vehicle_day_compute_seconds", "Wall time the last vehicle-day figure took "
                                 "to compute (in a child process, off the worker's event loop)", registry=registry)

    # -- hooks ------------------------------------------------------------------------------
    def know_query(self, query: str) -> None:
        """Create a query's counter series at zero, so a healthy system shows 0, not "no data"."""
        if query in self._known:
            return
        self._known.add(query)
        for counter in (self.late, self.duplicates, self.refused, self.suppressed, self.missing_batches,
                        self.reports, self.no_source_data):
            counter.labels(query).inc(0)
        for code in WITHHELD_CODES:
            self.withheld_epochs.labels(query, code).inc(0)
        for code in SHUFFLE_NULL_CODES:
            self.shuffle_null.labels(query, code).inc(0)

    def know_reasons(self, reasons: Sequence[str]) -> None:
        for reason in reasons:
            self.dead_letters.labels(reason).inc(0)

    def on_record(self, kind: str) -> None:
        self.records.labels(kind).inc()

    def on_dead_letter(self, reason: str) -> None:
        self.dead_letters.labels(reason).inc()

    def on_window_updates(self, reports: dict[str, int], late: dict[str, int], duplicates: dict[str, int],
                          newest: dict[str, int]) -> None:
        for q in {*reports, *late, *duplicates, *newest}:
            self.know_query(q)
        for q, n in reports.items():
            self.reports.labels(q).inc(n)
        for q, n in late.items():
            self.late.labels(q).inc(n)
        for q, n in duplicates.items():
            self.duplicates.labels(q).inc(n)
        for q, e in newest.items():
            self._newest[q] = max(self._newest.get(q, e), e)
            self.newest_seen.labels(q).set(self._newest[q])

    def on_epoch_closed(self, r: EpochResult) -> None:
        q = r.query
        qid = q.query_id
        self.know_query(qid)
        if r.retracted:  # the epoch was counted when it closed; only its withdrawal is new
            self.suppressed.labels(qid).inc(r.n_records())
            self.withheld_epochs.labels(qid, r.withheld_code or "internal").inc()
            return
        self.closed.labels(qid, r.closed_by).inc()
        if r.no_source_data:
            self.no_source_data.labels(qid).inc(len(r.no_source_data) * len(q.spec.estimator_names))
        self.refused.labels(qid).inc(r.refused)
        if r.missing_batches:
            self.missing_batches.labels(qid).inc(r.missing_batches)
        self._closed_upto[qid] = max(self._closed_upto.get(qid, r.epoch), r.epoch)
        self.last_closed.labels(qid).set(self._closed_upto[qid])
        self.epoch_lag.labels(qid).set(self._newest.get(qid, r.epoch) - self._closed_upto[qid])
        for rnd, n in enumerate(r.round_reports):
            self.epoch_reports.labels(qid, str(rnd)).set(n)
        self.epoch_participants.labels(qid).set(r.participants)
        self.epsilon.labels(qid, q.mechanism).set(q.epsilon)
        if r.epsilon_shuffled is not None:
            self.epsilon_shuffled.labels(qid, q.mechanism).set(r.epsilon_shuffled)
        else:  # not attested (or infinite): no number, rather than a stale one
            with contextlib.suppress(KeyError):
                self.epsilon_shuffled.remove(qid, q.mechanism)
        if r.shuffle_null is not None:
            self.shuffle_null.labels(qid, r.shuffle_null).inc()
        for stat, value in r.extra.items():
            self.crowd.labels(qid, stat).set(value)
        if r.withheld is not None:
            self.suppressed.labels(qid).inc(r.n_records())
            self.withheld_epochs.labels(qid, r.withheld_code or "internal").inc()
            return
        flow = r.span_s if spans_epochs(r.span_s) else None  # a span query's: the flows' series (span_s label)
        for name, v in r.values.items():
            self.arrays.set_estimates(qid, q.mechanism, name, q.sensors, v.estimate, v.lower, v.upper,
                                      r.confidences, span_s=flow, blank=r.blank)

    def on_rollup(self, r: EpochResult) -> None:
        """A rollup (:mod:`stream_app.worker.rollups`) decided or withdrawn: counted by span; a published
        one's headline estimates and bounds become the station series with the ``span_s`` label."""
        q = r.query
        qid, span = q.query_id, str(r.span_s)
        self.know_query(qid)
        if r.no_source_data and not r.retracted:  # rows flagged no_source_data, as an epoch's are counted
            self.no_source_data.labels(qid).inc(len(r.no_source_data) * len(q.spec.estimator_names))
        if r.withheld is not None:
            self.rollups_withheld.labels(qid, span, r.withheld_code or "internal").inc()
            return
        self.rollups.labels(qid, span).inc()
        self.last_rollup.labels(qid, span).set(r.epoch)
        v = r.values.get(q.spec.headline)
        if v is not None:
            self.arrays.set_estimates(qid, q.mechanism, q.spec.headline, q.sensors, v.estimate, v.lower, v.upper,
                                      r.confidences, span_s=r.span_s, blank=r.blank)

    def on_epochs_published(self, seconds: float) -> None:
        self.close_latency.observe(seconds)

    def on_truth(self, epoch: int, stations: Sequence[int], flows: Sequence[float]) -> None:
        self.arrays.set_truth(stations, flows)
        self.truth_epoch.set(epoch)

    def on_vehicle_day(self, state: str, release: str = "", epsilon: float | None = None,
                       shuffle_size: int | None = None, counted: Sequence[tuple[str, int]] = (),
                       seconds: float | None = None) -> None:
        """What the day figure is now (:data:`stream_app.worker.day_metric.STATES`): the figure, once
        computed; in any other state no series (no number rather than a stale one)."""
        for s in DAY_STATES:
            self.day_state.labels(s).set(int(s == state))
        for gauge in (self.day_epsilon, self.day_shuffle_size, self.day_queries):
            gauge.clear()
        if epsilon is not None:
            self.day_epsilon.labels(release).set(epsilon)
            if shuffle_size is not None:
                self.day_shuffle_size.labels(release).set(shuffle_size)
            for query, version in counted:
                self.day_queries.labels(query).set(version)
        if seconds is not None:
            self.day_seconds.set(seconds)
