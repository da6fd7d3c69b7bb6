"""The ``ptt`` command line: one entry point, one subcommand per job, one module per command.

This package is the composition root: only its modules build and run the producers, the
embedded broker (:mod:`.local_broker`), the worker and the reports. Each command module has
``add_parser(sub)`` and ``run(args)``; :mod:`.base` holds what they share (flags generated
from the settings classes), :mod:`.errors` the exit codes and the one line of an expected
failure: ``ptt <command>: error: <what>; <how to fix>``. Anything unexpected is written with
its traceback to a log file, and the one line printed points to it.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from schemas.connection import client_logs

from . import analyst, broker, demo, plan, replay, report, shuffler, subscribe, synth, worker
from .base import Parser
from .errors import EXIT_CODES, guarded

__all__ = ["build_parser", "main"]

# in the order of `ptt --help`
COMMANDS = (plan, replay, shuffler, worker, subscribe, report, analyst, synth, demo, broker)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ptt", description="Private traffic telemetry. Every command validates its flags before "
                                            "it touches the network; exit codes: "
                                            + ", ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    for leaf in _leaves(parser):
        if not any("--verbose" in a.option_strings for a in leaf._actions):
            leaf.add_argument("--verbose", action="store_true",
                              help="show the Kafka client's warnings and debug logs (also PTT_LOG_LEVEL=debug)")
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser that runs a command (the subcommands' subcommands included)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for a in subs for child in dict.fromkeys(a.choices.values()) for leaf in _leaves(child)]


def _configure_logging(verbose: bool) -> None:
    """Quiet by default: kafka-python's connection warnings are not for a user's terminal."""
    debug = verbose or os.environ.get("PTT_LOG_LEVEL", "").lower() == "debug"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not debug:
        client_logs(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(bool(getattr(args, "verbose", False)))
    command = args.command if args.command != "analyst" else f"analyst {args.analyst_command}"
    code: int = guarded(command, lambda: int(args.func(args)), args)
    return code
