"""``ptt synth``: write a synthetic PeMS day (Station Raw 30 s + metadata) to disk."""

from __future__ import annotations

import argparse
from typing import Any

from .errors import CliError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("synth", help="write a synthetic PeMS day (Station Raw 30 s + metadata)")
    p.add_argument("out_dir", help="directory to write the day's files into (created if missing)")
    p.add_argument("--stations", type=int, default=16, help="number of stations (default 16)")
    p.add_argument("--seed", type=int, default=2026, help="random seed: the same seed writes the same day")
    p.add_argument("--date", default="2026-11-18", help="the day's date, YYYY-MM-DD (default 2026-11-18)")
    p.add_argument("--weekend", action=argparse.BooleanOptionalAction, default=None,
                   help="weekend traffic shape (default: from the date)")
    p.add_argument("--no-glitches", action="store_true",
                   help="leave out the glitches of real files (stuck lanes, spikes, missing rows)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from datetime import date

    from producers.synthetic import write_synthetic_day

    try:
        day_date = date.fromisoformat(args.date)
    except ValueError as exc:
        raise CliError(f"--date: expected YYYY-MM-DD, got {args.date!r}") from exc
    if args.stations < 1:
        raise CliError(f"--stations must be at least 1, got {args.stations}")
    day = write_synthetic_day(args.out_dir, args.stations, args.seed, day_date, args.weekend,
                              glitches=not args.no_glitches)
    print(f"wrote {day.raw_path} and {day.meta_path} ({len(day.stations)} stations)")
    return 0
