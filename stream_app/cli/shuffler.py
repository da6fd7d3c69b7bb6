"""``ptt shuffler``: the anonymizing shuffler tier (device reports in, their counts or permuted batches out)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from schemas.enrollment import EnrollmentError

from ..shuffler.settings import ShufflerSettings
from .base import add_settings_flags, settings_from_args
from .errors import EXIT_BROKER_LOST, EXIT_HELPER, EXIT_INTERRUPTED, CliError, error_line

if TYPE_CHECKING:
    from schemas.kafka_io import BrokerLost

__all__ = ["add_parser", "exit_broker_lost", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("shuffler", help="run a shuffler instance: single device reports in, anonymized batches out",
                       description="Read single device reports from the device topic, hold each (query, version, "
                                   "epoch) until its deadline and release, with end-of-epoch markers on the reports "
                                   "topic (Kafka transactions), only their counts (--release aggregate, the "
                                   "default: one exact-tally batch per round) or the reports permuted uniformly at "
                                   "random (--release permuted: columnar batches); the worker's estimates are the "
                                   "same. Epochs with fewer than --min-crowd reports in a round are withheld. Runs "
                                   "until Ctrl-C or SIGTERM.")
    add_settings_flags(p, ShufflerSettings)
    p.set_defaults(func=run)


def exit_broker_lost(lost: BrokerLost) -> NoReturn:
    """The one line and exit code 7, at once: for a shuffler whose stop outlasts its grace (a
    Kafka call that waits for the gone broker)."""
    print(error_line("shuffler", str(lost)), file=sys.stderr, flush=True)
    os._exit(EXIT_BROKER_LOST)


GC_THRESHOLDS = (100_000, 20, 100)  # CPython's default (700, 10, 10)


def quiet_gc() -> None:
    """The cyclic garbage collector at :data:`GC_THRESHOLDS`, what was allocated so far frozen
    out of its scans. An epoch's device reports are held until it is released: an hour's span at
    10M vehicles is millions of objects alive at once, and at the default thresholds full
    collections scan them again and again (a synthetic intake of 5M records held: 106 full
    collections, 1.87 us a record against 0.59 here, 0.49 without the collector). Nothing the
    shuffler holds is cyclic garbage it depends on freeing soon; the collector still runs.

    >>> import gc
    >>> before = gc.get_threshold(); quiet_gc(); gc.get_threshold()
    (100000, 20, 100)
    >>> gc.set_threshold(*before); gc.unfreeze()
    """
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()


def run(args: argparse.Namespace) -> int:
    from ..shuffler.runtime import Shuffler
    from .local_broker import PortInUse, port_free

    settings = settings_from_args(ShufflerSettings, args)
    try:
        settings.enrollment()  # the secret is read and checked before anything touches the network
    except EnrollmentError as exc:
        raise CliError(str(exc)) from exc
    if settings.metrics_port and not port_free(settings.metrics_port, settings.metrics_host):
        raise PortInUse(f"the metrics port {settings.metrics_host}:{settings.metrics_port} is already in use; give "
                        "another --metrics-port (every shuffler instance on a host needs its own), or 0")
    if settings.http_port:
        if settings.http_port == settings.metrics_port:
            raise CliError(f"--http-port and --metrics-port are both {settings.http_port}; give them different ports")
        if not port_free(settings.http_port, settings.http_host):
            raise PortInUse(f"the HTTP port {settings.http_host}:{settings.http_port} is already in use; give "
                            "another --http-port")
    shuffler = Shuffler(settings, exit_lost=exit_broker_lost)
    shuffler.install_signals()
    quiet_gc()
    door = None
    if settings.http_port:  # the door in a process of its own, started before the shuffler connects
        from ..shuffler.door_process import DoorProcess

        door = DoorProcess(settings, on_exit=lambda why: shuffler.stop())
        door.start()
    served = (f", /metrics on {settings.metrics_host}:{settings.metrics_port}" if settings.metrics_port else "")
    served += (f", devices POST http://{settings.http_host}:{settings.http_port}/v1/reports" if door else "")
    print(f"shuffler {settings.instance_index + 1} of {settings.instance_count}: {settings.device_topic} -> "
          f"{settings.reports_topic} ({settings.release} release, min crowd {settings.min_crowd}{served})",
          file=sys.stderr, flush=True)
    try:
        summary = shuffler.run(signals=False)
    finally:
        if door is not None:
            print(door.stop(), flush=True)
    print(summary.line(), flush=True)
    if door is not None and door.failure is not None:
        raise CliError(door.failure, EXIT_HELPER)
    return EXIT_INTERRUPTED
