"""``replay``: the whole replay, run by the parent -- its plan built once
(:func:`producers.replay.plan.build_plan`), then its one producer in this process, or
``settings.producers`` producer processes watched until they end (a producer that dies or
loses the broker, or a Ctrl-C, stops them all at one stop epoch), and their totals."""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from typing import Any

from schemas.cap_drops import cap_drop_lines
from schemas.kafka_io import broker_lost

from ..counters import SLOTS, ProducerCounts
from ..pems import TrafficDay
from ..progress import Progress, what_limits
from ..settings import ReplaySettings
from ..stopping import StopFlag, StopPlan, children_ignore_stop_signals
from .plan import ReplayPlan, build_plan
from .producer import REASON_BYTES, child, producer_loop
from .summary import ReplayLost, ReplaySummary

__all__ = ["replay"]


def replay(settings: ReplaySettings, progress: bool = True) -> ReplaySummary:
    """Replay the day with ``settings.producers`` producer processes; returns the totals (and
    writes what a day cap dropped to ``settings.cap_drops_file``, if given)."""
    started = time.time()
    plan, day = build_plan(settings)
    bar = Progress(plan.epochs, progress, speed=plan.settings.speed, limit=what_limits(plan.settings))
    t0 = time.time()
    run = _in_process if plan.settings.producers == 1 else _in_processes
    summary = run(plan, day, bar, t0, started)
    if settings.cap_drops_file is not None:
        settings.cap_drops_file.write_text("\n".join(cap_drop_lines(summary.day_cap_drops)) + "\n")
    return summary


class _Ticks(list[int]):
    """The one producer's shared counters in this process: the progress line follows each
    whole :class:`ProducerCounts` written."""

    def __init__(self, bar: Progress) -> None:
        super().__init__([0] * SLOTS)
        self.bar = bar

    def __setitem__(self, i: Any, v: Any) -> None:
        super().__setitem__(i, v)
        if i == SLOTS - 1:  # a whole ProducerCounts written
            c = ProducerCounts.read(self)
            self.bar.update(c.epochs_done, c.reports, c.failed)


def _in_process(plan: ReplayPlan, day: TrafficDay, bar: Progress, t0: float, started: float) -> ReplaySummary:
    """One producer, in this process (the day already read)."""
    try:
        summary = producer_loop(plan, 0, 1, t0, _Ticks(bar), day)
    except ReplayLost as exc:
        exc.summary.elapsed_s = time.time() - started
        exc.summary.fleet_basis = plan.basis
        raise
    finally:
        bar.close()
    summary.elapsed_s = time.time() - started
    summary.fleet_basis = plan.basis
    return summary


def _in_processes(plan: ReplayPlan, day: TrafficDay, bar: Progress, t0: float, started: float) -> ReplaySummary:
    """``settings.producers`` producer processes, each handed the plan (each reads the day)."""
    n = plan.settings.producers
    ctx = mp.get_context("spawn")
    shared = [ctx.Array("q", SLOTS, lock=False) for _ in range(n)]
    reasons = [ctx.Array("c", REASON_BYTES, lock=False) for _ in range(n)]
    stop_state = ctx.Array("q", 1 + n, lock=False)
    stop_state[0] = -1
    stops = StopPlan(stop_state, ctx.Lock())
    kafka_level = logging.getLogger("kafka").getEffectiveLevel()
    procs = [ctx.Process(target=child, args=(plan, k, n, t0, shared[k], shared, reasons[k], kafka_level, stops),
                         daemon=False) for k in range(n)]
    summary = ReplaySummary(fleet_size=plan.fleet, data_quality=day.quality.summary(), fleet_basis=plan.basis)
    summary.interrupted = _watch(procs, shared, stops, bar, plan.settings)
    end = ProducerCounts.total(shared)
    summary.epochs, summary.reports, summary.records = end.epochs_done, end.reports, end.records
    summary.reports_sent, summary.records_sent = end.sent_reports, end.sent_records
    summary.delivery_failures = end.failed
    if end.refused:
        summary.refused["all queries"] = end.refused
    summary.elapsed_s = time.time() - started
    if end.lost:
        why = next((r.value.decode(errors="replace") for r, c in zip(reasons, shared, strict=True)
                    if ProducerCounts.read(c).lost and r.value), "")
        summary.interrupted = False
        raise ReplayLost(why or str(broker_lost(plan.settings, "a producer process lost it")), summary)
    if any(p.exitcode not in (0, None) for p in procs) and not summary.interrupted:
        raise RuntimeError(f"producer processes failed: exit codes {[p.exitcode for p in procs]}")
    return summary


def _watch(procs: list[Any], shared: list[Any], stops: StopPlan, bar: Progress, settings: ReplaySettings) -> bool:
    """Start the producer processes and follow them until every one has ended; whether they were
    stopped (a Ctrl-C here or in one of them), not ended by one that failed or lost the broker."""
    interrupted = False
    with StopFlag() as stop:
        with children_ignore_stop_signals():
            for p in procs:
                p.start()
        try:
            while any(p.is_alive() for p in procs):
                now = ProducerCounts.total(shared)
                bar.update(now.epochs_done, now.reports, now.failed)
                failed = any(p.exitcode not in (0, None) for p in procs) or bool(now.lost)
                # Ctrl-C (here or in a producer), or a producer died or lost the broker: its peers
                # would wait for it. One stop epoch for all (StopPlan); SIGTERM wakes them to it
                if stop.wait(0.2) or stops.requested or failed:
                    interrupted = not failed
                    stops.request()
                    for p in procs:  # graceful: children treat SIGTERM like the first Ctrl-C
                        if p.is_alive():
                            p.terminate()
                    for p in procs:  # a child's last flush waits at most the loss timeout
                        p.join(timeout=60 + settings.broker_loss_timeout_s)
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
            bar.close()
    return interrupted
