"""``ptt subscribe``: tail the estimates topic as a table or JSON lines, or keep the estimate
frames in an Arrow IPC or Parquet file (``--arrow``/``--parquet FILE``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from schemas.settings import KafkaSettings

from .base import add_settings_flags, settings_from_args
from .errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CliError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    from ..subscribe import NEGATIVE_NOTE

    p = sub.add_parser("subscribe", help="tail the estimates topic (a table, or JSON lines)",
                       description="Tail the estimates: one line per closed (query, epoch) with the sum of its "
                                   "station estimates per estimator, a rollup on its own line marked '5-min sum' "
                                   "or '60-min sum' (--rows: every estimate, grouped per query and "
                                   "epoch; --flows: one line per flow, the span queries' flows first, then the "
                                   "5-minute and hourly rollups of 30-s queries, each with its 95% bounds, and a line "
                                   "per group saying what it is and what it is good for; --json: one JSON estimate "
                                   "per line as it comes). "
                                   f"Note: {NEGATIVE_NOTE}.")
    p.add_argument("--topic", default="ptt.estimates", help="estimates topic (default ptt.estimates)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="one JSON estimate per line")
    out.add_argument("--rows", action="store_true",
                     help="every estimate as a table row, printed per closed (query, epoch), by estimator and station")
    out.add_argument("--flows", action="store_true",
                     help="one line per flow (a span query's row, or a 5-minute or hourly rollup of a 30-s query) "
                          "with its 95%% bounds and sd, NOISE-DOMINATED when the sd is at least half the flow, per "
                          "(query, span, epoch) by station after a line saying what the group is and what it is good "
                          "for; the span queries' flows first (a rollup waits for the span queries' flows of its "
                          "hour); the headline estimator's unless --estimator")
    out.add_argument("--arrow", type=Path, default=None, metavar="FILE",
                     help="keep the estimate frames (--frames-topic) in an Arrow IPC file, one row per query, "
                          "epoch, station and estimator")
    out.add_argument("--parquet", type=Path, default=None, metavar="FILE",
                     help="as --arrow, in a Parquet file")
    p.add_argument("--frames-topic", default="ptt.estimate-frames",
                   help="estimate frames topic read by --arrow/--parquet (default ptt.estimate-frames)")
    p.add_argument("--from-beginning", action="store_true",
                   help="start at the topic's first estimate instead of only new ones")
    p.add_argument("--query", default=None, metavar="ID", help="only estimates of this query id (e.g. sp-day)")
    p.add_argument("--station", type=int, default=None, metavar="ID", help="only this PeMS station id")
    p.add_argument("--estimator", default=None, metavar="NAME",
                   help="only this estimator (sp_difference, alp_average, alp_yhat, alp_bottom, alp_gls, rr)")
    p.add_argument("--idle-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds without data (default: run until Ctrl-C)")
    add_settings_flags(p, KafkaSettings)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..subscribe import subscribe

    settings = settings_from_args(KafkaSettings, args)
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        raise CliError(f"--idle-timeout must be positive, got {args.idle_timeout:g}; leave it out to run until "
                       "Ctrl-C")
    if args.arrow is not None or args.parquet is not None:
        return _keep(settings, args)
    from ..subscribe import MissingTopic

    try:
        subscribe(settings, args.topic, json_lines=args.json, rows=args.rows, flows=args.flows,
                  from_beginning=args.from_beginning,
                  query=args.query, station=args.station, estimator=args.estimator,
                  idle_timeout_s=args.idle_timeout)
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:  # `ptt subscribe | head`: the reader has what it wanted
        _quiet_stdout()
        return EXIT_OK
    except MissingTopic as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return EXIT_OK


def _interrupted() -> int:
    """Ctrl-C, the normal end of a subscription: a line saying so on stderr, exit code 130."""
    with contextlib.suppress(OSError, ValueError):
        print("ptt subscribe: stopped (Ctrl-C)", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the exit's flush into the closed pipe would fail again."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


def _keep(settings: KafkaSettings, args: argparse.Namespace) -> int:
    from ..subscribe import MissingTopic, keep_frames

    path: Path = args.arrow if args.arrow is not None else args.parquet
    if not path.parent.is_dir():
        raise CliError(f"cannot write {path}: {path.parent} is not a directory; create it or name another file")
    try:
        keep_frames(settings, args.frames_topic, path, "arrow" if args.arrow is not None else "parquet",
                    from_beginning=args.from_beginning, query=args.query, station=args.station,
                    estimator=args.estimator, idle_timeout_s=args.idle_timeout)
    except KeyboardInterrupt:  # the file is closed and readable (keep_frames said what it wrote)
        return _interrupted()
    except MissingTopic as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    return EXIT_OK
