"""``ptt shuffler``: the anonymizing shuffler tier (device reports in, permuted batches out)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..shuffler.settings import ShufflerSettings
from .base import add_settings_flags, settings_from_args
from .errors import EXIT_INTERRUPTED

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("shuffler", help="run a shuffler instance: single device reports in, anonymized batches out",
                       description="Read single device reports from the device topic, hold each (query, version, "
                                   "epoch) until its deadline, permute them uniformly at random and release them "
                                   "as columnar batches with end-of-epoch markers on the reports topic (Kafka "
                                   "transactions). Epochs with fewer than --min-crowd reports in a round are "
                                   "withheld. Runs until Ctrl-C or SIGTERM.")
    add_settings_flags(p, ShufflerSettings)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..shuffler.runtime import Shuffler

    settings = settings_from_args(ShufflerSettings, args)
    shuffler = Shuffler(settings)
    shuffler.install_signals()
    print(f"shuffler {settings.instance_index + 1} of {settings.instance_count}: {settings.device_topic} -> "
          f"{settings.reports_topic} (min crowd {settings.min_crowd})", file=sys.stderr, flush=True)
    summary = shuffler.run(signals=False)
    print(summary.line(), flush=True)
    return EXIT_INTERRUPTED
