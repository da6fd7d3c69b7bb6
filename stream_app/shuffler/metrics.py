"""Prometheus metrics of a shuffler instance, touched only through :class:`ShufflerMonitor`.

Everything counts what a *committed* transaction did (an aborted step is counted as aborted
and nothing else), so a scrape never shows a release that the broker rolled back. Labels stay
bounded and say nothing about a vehicle: the dead-letter or withholding reason (a fixed set of
codes), the transaction outcome. No query, key, partition, offset or device field is a label.

>>> from prometheus_client import CollectorRegistry
>>> m = ShufflerMonitor(CollectorRegistry())
>>> m.on_step(records=5, notes=1, letters=["late"], released=[(30, 4)], withheld=[("below_min_crowd", 1)], held=3)
>>> m.on_abort()
>>> text = m.text().decode()
>>> 'ptt_shuffler_records_total{kind="device_report"} 5.0' in text, 'ptt_shuffler_last_released_epoch 30.0' in text
(True, True)
>>> 'ptt_shuffler_transactions_total{outcome="aborted"} 1.0' in text
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from schemas.wire import SHUFFLER_WITHHELD

__all__ = ["ShufflerMonitor"]

WITHHELD_REASONS = SHUFFLER_WITHHELD  # every reason a shuffler withholds an epoch for, on the wire
DEAD_LETTER_REASONS = ("empty", "bad_encoding", "bad_json_record", "unknown_query", "outside_query_window",
                       "misaligned_span", "outside_open_window", "untrusted_note", "note_from_future",
                       "unexpected_record", "bad_round",
                       "wrong_layout", "out_of_range", "bad_pairs", "slot_full", "late",
                       # enrollment (schemas/enrollment.py): never a device id in a label
                       "unauthenticated", "unknown_device", "bad_mac", "revoked", "duplicate_report", "wrong_partition")


class ShufflerMonitor:
    """The shuffler's counters and gauges in one registry (a fresh one per instance or test)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.records = Counter("ptt_shuffler_records", "Device-topic records read in committed steps, by kind "
                               "(device_report: reports and undecodable records; source_epoch: a replay's notes)",
                               ["kind"], registry=registry)
        self.released_reports = Counter("ptt_shuffler_released_reports", "Device reports released (all rounds)",
                                        registry=registry)
        self.released_epochs = Counter("ptt_shuffler_released_epochs",
                                       "(query version, epoch)s released with markers", registry=registry)
        self.dead_letters = Counter("ptt_shuffler_dead_letters", "Device-topic records dead-lettered, by reason",
                                    ["reason"], registry=registry)
        self.withheld = Counter("ptt_shuffler_withheld_epochs", "(query version, epoch)s withheld, by reason",
                                ["reason"], registry=registry)
        self.below_min_crowd = Counter("ptt_shuffler_below_min_crowd_slots", "Slots (query version, epoch, "
                                       "round) with fewer device reports than min_crowd (their epoch is withheld)",
                                       registry=registry)
        self.transactions = Counter("ptt_shuffler_transactions", "Kafka transactions, by outcome",
                                    ["outcome"], registry=registry)
        self.last_released = Gauge("ptt_shuffler_last_released_epoch", "Newest epoch released (-1: none yet)",
                                   registry=registry)
        self.held = Gauge("ptt_shuffler_held_reports", "Device reports held in open epochs", registry=registry)
        for kind in ("device_report", "source_epoch"):
            self.records.labels(kind).inc(0)
        for reason in DEAD_LETTER_REASONS:
            self.dead_letters.labels(reason).inc(0)
        for reason in WITHHELD_REASONS:
            self.withheld.labels(reason).inc(0)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(outcome).inc(0)
        self.last_released.set(-1)
        self._last = -1

    def on_step(self, records: int, notes: int, letters: Iterable[str], released: Sequence[tuple[int, int]],
                withheld: Sequence[tuple[str, int]], held: int) -> None:
        """A committed step: ``released`` (epoch, reports) per released epoch, ``withheld``
        (reason, slots below min_crowd) per withheld epoch, ``held`` the reports still held."""
        self.transactions.labels("committed").inc()
        self.records.labels("device_report").inc(records)
        self.records.labels("source_epoch").inc(notes)
        for reason in letters:
            self.dead_letters.labels(reason).inc()
        for epoch, reports in released:
            self.released_epochs.inc()
            self.released_reports.inc(reports)
            self._last = max(self._last, epoch)
        self.last_released.set(self._last)
        for reason, slots in withheld:
            self.withheld.labels(reason).inc()
            self.below_min_crowd.inc(slots)
        self.held.set(held)

    def on_abort(self) -> None:
        self.transactions.labels("aborted").inc()

    def text(self) -> bytes:
        """The exposition text (what ``/metrics`` serves)."""
        return generate_latest(self.registry)
