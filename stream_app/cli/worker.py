"""``ptt worker``: one stream-app worker (Faust): estimates, dead letters, ``/metrics``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from ..settings import WorkerSettings
from .base import add_settings_flags, settings_from_args
from .errors import EXIT_BROKER_LOST, error_line

if TYPE_CHECKING:
    from schemas.kafka_io import BrokerLost

__all__ = ["add_parser", "exit_broker_lost", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("worker", help="run a stream-app worker (Faust): estimates, dead letters, /metrics",
                       description="Run one worker of the stream app. Start several with the same --app-id to "
                                   "share the work (give each its own --web-port).")
    add_settings_flags(p, WorkerSettings)
    p.set_defaults(func=run)


def exit_broker_lost(lost: BrokerLost) -> NoReturn:
    """The one line and exit code 7, at once: for a worker whose graceful stop outlasts its
    deadline (Faust's producer flush does not end while the broker is gone)."""
    print(error_line("worker", str(lost)), file=sys.stderr, flush=True)
    os._exit(EXIT_BROKER_LOST)


def run(args: argparse.Namespace) -> int:
    from schemas.kafka_io import BrokerUnavailable, probe

    from ..worker.app import run_worker
    from .local_broker import PortInUse, port_free

    settings = settings_from_args(WorkerSettings, args)
    if not port_free(settings.web_port, settings.web_host):
        raise PortInUse(f"the metrics port {settings.web_host}:{settings.web_port} is already in use; give "
                        "another --web-port")
    why = probe(settings.bootstrap_servers, settings.bootstrap_timeout_ms / 1000)
    if why is not None:
        raise BrokerUnavailable(f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}); is it "
                                "running? Start one with `ptt broker`, or set --bootstrap-servers")
    return run_worker(settings, exit_broker_lost)
