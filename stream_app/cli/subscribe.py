"""``ptt subscribe``: tail the estimates topic as a table or JSON lines."""

from __future__ import annotations

import argparse
from typing import Any

from schemas.settings import KafkaSettings

from .base import add_settings_flags, settings_from_args
from .errors import EXIT_OK, CliError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("subscribe", help="tail the estimates topic (a table, or JSON lines)")
    p.add_argument("--topic", default="ptt.estimates", help="estimates topic (default ptt.estimates)")
    p.add_argument("--json", action="store_true", help="one JSON estimate per line")
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
    try:
        subscribe(settings, args.topic, json_lines=args.json, from_beginning=args.from_beginning,
                  query=args.query, station=args.station, estimator=args.estimator,
                  idle_timeout_s=args.idle_timeout)
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_OK
