"""``ptt broker``: the embedded Kafka-protocol broker alone, until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .base import ptt_command
from .errors import EXIT_FAILURE, EXIT_OK, CliError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    b = sub.add_parser("broker", help="run the embedded Kafka-protocol broker alone, until Ctrl-C",
                       description="Start the embedded broker (memory only: a restart loses every topic) and print "
                                   "the commands that use it.")
    b.add_argument("--port", type=_port, default=None, help="port to listen on (default: a free one)")
    b.add_argument("--log", type=Path, default=None, metavar="FILE", help="write the broker's log here")
    b.set_defaults(func=run)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from exc
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {port}")
    return port


def run(args: argparse.Namespace) -> int:
    from producers.stopping import StopFlag

    from .local_broker import LocalBroker

    ptt = ptt_command()
    with LocalBroker(port=args.port, log_path=args.log, own_group=True) as broker, \
            StopFlag(notice=False) as stop:  # it stops at once
        flag = f"--bootstrap-servers {broker.bootstrap}"
        print(f"broker    {broker.bootstrap} (embedded, memory only; Ctrl-C stops it)")
        print(f"replay    {ptt} replay {flag}")
        print(f"worker    {ptt} worker {flag}")
        print(f"subscribe {ptt} subscribe {flag}")
        print(f"analyst   {ptt} analyst list {flag}", flush=True)
        while not stop.wait(0.5):
            if not broker.running:
                raise CliError("the broker exited" + (f"; see {args.log}" if args.log else ""), EXIT_FAILURE)
    print("broker stopped", file=sys.stderr)
    return EXIT_OK
