"""Prometheus metrics of the stream app, all in one registry handed in (a fresh one per test).

Labels stay bounded: query, mechanism, estimator (6), station (thousands at most), confidence,
round, reason. Nothing per vehicle exists to be a label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["StreamMetrics"]


class StreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        est_labels = ["query", "mechanism", "estimator", "station"]
        self.registry = registry
        self.estimate = Gauge("ptt_estimate_vehicles", "Latest published estimate of a station's count",
                              est_labels, registry=registry)
        self.lower = Gauge("ptt_estimate_lower_vehicles", "Lower confidence bound of the latest estimate",
                           [*est_labels, "confidence"], registry=registry)
        self.upper = Gauge("ptt_estimate_upper_vehicles", "Upper confidence bound of the latest estimate",
                           [*est_labels, "confidence"], registry=registry)
        self.truth = Gauge("ptt_ground_truth_vehicles", "Ground truth of the latest replayed epoch (evaluation only)",
                           ["station"], registry=registry)
        self.truth_epoch = Gauge("ptt_ground_truth_epoch", "Epoch of the latest ground truth", registry=registry)
        self.last_closed = Gauge("ptt_last_closed_epoch", "Newest closed epoch", ["query"], registry=registry)
        self.newest_seen = Gauge("ptt_newest_seen_epoch", "Newest epoch seen in reports", ["query"],
                                 registry=registry)
        self.epoch_lag = Gauge("ptt_epoch_lag_epochs", "Newest epoch seen minus newest closed epoch", ["query"],
                               registry=registry)
        self.epoch_reports = Gauge("ptt_epoch_reports", "Reports counted in the latest closed epoch",
                                   ["query", "round"], registry=registry)
        self.epoch_participants = Gauge("ptt_epoch_participants", "Vehicles that answered in the latest closed epoch",
                                        ["query"], registry=registry)
        self.epsilon = Gauge("ptt_query_epsilon", "Per-epoch local epsilon of the running query version",
                             ["query", "mechanism"], registry=registry)
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
        self.closed = Counter("ptt_epochs_closed", "Epochs closed", ["query", "closed_by"], registry=registry)
        self.missing_batches = Counter("ptt_missing_batches", "Batches announced by markers that never arrived",
                                       ["query"], registry=registry)
        self._known: set[str] = set()

    def know_query(self, query: str) -> None:
        """Create a query's counter series at zero, so a healthy system shows 0, not "no data"."""
        if query in self._known:
            return
        self._known.add(query)
        for counter in (self.late, self.duplicates, self.refused, self.suppressed, self.missing_batches,
                        self.reports):
            counter.labels(query).inc(0)

    def know_reasons(self, reasons: tuple[str, ...]) -> None:
        for reason in reasons:
            self.dead_letters.labels(reason).inc(0)
