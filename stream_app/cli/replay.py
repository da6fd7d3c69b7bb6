"""``ptt replay``: a traffic day (synthetic or PeMS files) as privatized reports into Kafka."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from producers.settings import ReplaySettings

from .base import add_settings_flags, settings_from_args
from .errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, CliError, input_paths

__all__ = ["add_parser", "check_inputs", "delivery_failures_message", "replay_summary_lines", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay a PeMS traffic day as privatized vehicle reports into Kafka",
                       description="Replay a PeMS day (real files, or the synthetic default) through the fleet's "
                                   "devices into Kafka. Every flag can also be set as a PTT_* environment variable; "
                                   "flags win.")
    add_settings_flags(p, ReplaySettings)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def check_inputs(paths: list[Path]) -> None:
    """Missing or unreadable input files fail before anything else happens."""
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(2, "no such file", str(path))
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory, not a file", str(path))
        with path.open("rb"):
            pass


def replay_summary_lines(summary: Any, drops_file: Path | None = None) -> list[str]:
    """What ``ptt replay`` prints on stdout: data quality, what the broker acknowledged (and,
    when that is less, what was sent), refusals, what a day cap dropped (every station and span
    of it: ``drops_file``). Also printed when the broker was lost."""
    from schemas.cap_drops import largest_cap_drop
    from schemas.epochs import epoch_start

    s = summary
    if (s.reports, s.records) == (s.reports_sent, s.records_sent):
        done = f"{s.reports:,} reports in {s.records:,} records"
    else:
        done = (f"the broker acknowledged {s.reports:,} of {s.reports_sent:,} reports sent ({s.records:,} of "
                f"{s.records_sent:,} records)")
    basis = f" (at least {s.fleet_basis})" if s.fleet_basis else ""
    lines = [f"data: {s.data_quality}",
             f"fleet: {s.fleet_size:,} vehicles{basis}; replayed {s.epochs} epochs, {done} in {s.elapsed_s:.1f}s"]
    lines += [f"refused: {n:,} vehicle-epochs of {qid} ({s.refusal_reasons.get(qid, '')})"
              for qid, n in sorted(s.refused.items())]
    lines += [f"spans: {n:,} of {qid} reported, {s.spans_skipped.get(qid, 0):,} not "
              f"(covered only in part), {s.passages_dropped.get(qid, 0):,} passages over the "
              f"query's cap dropped" for qid, n in sorted(s.spans_sent.items())]
    lines += [f"spans: none of {qid} reported ({n:,} covered only in part: {s.span_skip_reasons.get(qid, '')})"
              for qid, n in sorted(s.spans_skipped.items()) if qid not in s.spans_sent]
    for qid, spans in sorted(getattr(s, "day_cap_drops", {}).items()):
        cells, most, station, epoch = largest_cap_drop(spans)
        lines.append(f"day cap of {qid} (a simulation diagnostic, not published): passages dropped in {cells:,} "
                     f"station-spans, the most {most:,} at station {station} in the span from "
                     f"{epoch_start(epoch):%H:%M}" + (f"; every station and span: {drops_file}" if drops_file else ""))
    if getattr(s, "vehicle_day", None) is not None:
        d = s.vehicle_day
        drops = ", ".join(f"{m}: {share:.1%}" for m, share in sorted(d.dropped_share.items()))
        lines.append(f"vehicle days (trip fleet, a simulation diagnostic): passages per vehicle mean {d.mean:.1f}, p50 "
                     f"{d.p50:g}, p90 {d.p90:g}, p99 {d.p99:g}, max {d.max:,}; a day cap of M passages drops ({drops})")
    return lines


def delivery_failures_message(summary: Any) -> str:
    """What ``ptt replay`` (and ``ptt demo``) say when records could not be delivered (exit 1)."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary.failure_reasons.items()))
    return (f"{summary.delivery_failures} records could not be delivered{f' ({reasons})' if reasons else ''}; "
            "check the broker's health and replay into fresh topics")


def run(args: argparse.Namespace) -> int:
    from producers.replay import ReplayLost, replay
    from schemas.enrollment import EnrollmentError

    settings = settings_from_args(ReplaySettings, args)
    check_inputs(input_paths(args))
    try:
        if settings.via_shuffler:
            settings.enrollment()  # the secret is read and checked before anything touches the network
        summary = replay(settings, progress=not args.quiet)
    except EnrollmentError as exc:
        raise CliError(str(exc)) from exc
    except ReplayLost as exc:  # what was acknowledged before the loss, then the one-line error
        print("\n".join(replay_summary_lines(exc.summary)), flush=True)
        raise
    print("\n".join(replay_summary_lines(summary, settings.cap_drops_file)))
    if summary.delivery_failures:
        raise CliError(delivery_failures_message(summary), EXIT_FAILURE)
    if summary.interrupted:
        print("interrupted: sent data flushed and marked", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK
