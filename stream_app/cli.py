"""The ``ptt`` command line: one entry point, one subcommand per job.

Every expected failure is one line on stderr, ``ptt <command>: error: <what>; <how to fix>``,
with one of the exit codes below (the README lists them). Anything unexpected is written with
its traceback to a log file, and the one line printed points to it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from estimators import planning
from schemas.wire import json_safe

__all__ = ["EXIT_CODES", "CliError", "build_parser", "error_line", "main"]

# The exit codes of every command (documented in the README).
EXIT_OK = 0
EXIT_FAILURE = 1  # something unexpected (traceback in the error log), delivery failures, or a helper process failed
EXIT_USAGE = 2  # a bad flag or value
EXIT_BROKER = 3  # the Kafka broker cannot be reached
EXIT_PORT = 4  # a port to listen on is taken
EXIT_INPUT = 5  # an input file is missing, unreadable, or not in a readable compression
EXIT_EMPTY = 6  # the input holds no usable data
EXIT_BROKER_LOST = 7  # the broker was lost mid-run (silent past --broker-loss-timeout-s, or its topics gone)
EXIT_INTERRUPTED = 130  # Ctrl-C (or SIGTERM): what was sent is flushed and marked
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_FAILURE: "unexpected failure (details in the error log named on stderr), records the broker refused, or a "
                  "helper process failed",
    EXIT_USAGE: "bad usage or a bad value",
    EXIT_BROKER: "the Kafka broker cannot be reached",
    EXIT_PORT: "a port to listen on is in use",
    EXIT_INPUT: "an input file is missing, unreadable or in an unreadable compression",
    EXIT_EMPTY: "the input holds no usable data",
    EXIT_BROKER_LOST: "the Kafka broker was lost mid-run (silent for --broker-loss-timeout-s, or its topics gone)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM)",
}
ERROR_LOG = "ptt-error.log"


class CliError(Exception):
    """An expected failure: one line and an exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong; how to get help), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def validation_message(exc: Any) -> str:
    """A pydantic ValidationError as one line naming each flag and its problem (no links)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "invalid value"))
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if loc:
            given = err.get("input")
            got = f" (got {given!r})" if isinstance(given, str | int | float) else ""
            parts.append(f"{_flag(loc[0])}{''.join(f'[{x}]' for x in loc[1:])}: {msg[:1].lower()}{msg[1:]}{got}")
        else:
            parts.append(msg)
    return "; ".join(parts)


def _input_paths(args: argparse.Namespace) -> list[Path]:
    return [Path(p) for p in (getattr(args, n, None) for n in ("pems_raw", "pems_5min", "meta")) if p is not None]


def _error_log(args: argparse.Namespace | None) -> Path:
    out = getattr(args, "out", None) if args is not None and getattr(args, "command", "") == "demo" else None
    return (Path(out) if out is not None else Path.cwd()) / ERROR_LOG


def _write_error_log(command: str, path: Path) -> Path:
    text = f"ptt {command} failed; {' '.join(sys.argv)}\n{traceback.format_exc()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    except OSError:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="ptt-error-", suffix=".log")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return Path(name)


def error_line(command: str, what: str, fix: str = "") -> str:
    """The one line of an expected failure: ``ptt <command>: error: <what>; <fix>``.

    >>> error_line("replay", "cannot read x.txt: no such file", "check the path")
    'ptt replay: error: cannot read x.txt: no such file; check the path'
    """
    what = " ".join(str(what).split())
    return f"ptt {command}: error: {what}{'; ' + fix if fix and fix not in what else ''}"


def _guarded(command: str, fn: Callable[[], int], args: argparse.Namespace | None = None) -> int:
    """Run a command; map every expected failure to one line and its exit code, and anything
    else to one line pointing to a log file with the traceback (exit 1)."""
    from pydantic import ValidationError

    from producers.local_broker import PortInUse
    from producers.replay import EmptyData
    from schemas.kafka_io import BrokerLost, BrokerUnavailable

    def fail(code: int, what: str, fix: str = "") -> int:
        print(error_line(command, what, fix), file=sys.stderr)
        return code

    help_hint = f"see ptt {command} --help"
    try:
        return fn()
    except KeyboardInterrupt:
        print(f"ptt {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as exc:
        return fail(exc.code, str(exc))
    except ValidationError as exc:
        return fail(EXIT_USAGE, validation_message(exc), help_hint)
    except BrokerLost as exc:
        return fail(EXIT_BROKER_LOST, str(exc))
    except BrokerUnavailable as exc:
        return fail(EXIT_BROKER, str(exc))
    except PortInUse as exc:
        return fail(EXIT_PORT, str(exc), "stop what uses it or choose another port")
    except EmptyData as exc:
        return fail(EXIT_EMPTY, str(exc), "check the file (and --day) holds readings")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        name = exc.filename or ""
        return fail(EXIT_INPUT, f"cannot read {name}: {exc.strerror or exc}", "check the path")
    except ValueError as exc:
        inputs = [str(p) for p in _input_paths(args)] + [str(p.absolute()) for p in _input_paths(args)] \
            if args is not None else []
        if any(str(exc).startswith(p) for p in inputs):
            return fail(EXIT_INPUT, str(exc), "give a plain, gzip, bz2, xz or single-member zip PeMS file")
        return fail(EXIT_USAGE, str(exc), help_hint)
    except Exception:  # noqa: BLE001 - the last line of defence: no traceback reaches a user
        log = _write_error_log(command, _error_log(args))
        return fail(EXIT_FAILURE, f"unexpected failure ({sys.exc_info()[1].__class__.__name__}); the details "
                    f"are in {log}", "please include that file when you report it")


def _param(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {value!r} is not a number") from exc


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else ("n/a" if math.isnan(v) else f"{v:.6g}")
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


COMPARE = "compare"  # `ptt plan compare`: every mechanism at one epsilon, not a mechanism


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.mechanism == COMPARE:
        return _cmd_plan_compare(args)
    if args.epsilon is not None:
        print("ptt plan: error: --epsilon is for `ptt plan compare`; a mechanism's epsilon follows from its "
              "parameters (--param)", file=sys.stderr)
        return 2
    try:
        result = planning.plan(args.mechanism, args.population, args.expected_yes, args.stations,
                               dict(args.param), epochs=args.epochs, delta=args.delta,
                               daily_budget=args.daily_budget)
    except planning.PlanError as exc:
        print(f"ptt plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(json_safe(result), sort_keys=True))
        return 0
    rows = [(k, _fmt(v)) for k, v in result.items() if k != "warnings"]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    return 0


def _cmd_plan_compare(args: argparse.Namespace) -> int:
    from estimators.compare import compare

    if args.epsilon is None:
        print("ptt plan compare: error: --epsilon is required (the per-device epsilon to compare at)",
              file=sys.stderr)
        return 2
    try:
        rows = compare(args.epsilon, args.population, args.expected_yes, args.stations)
    except ValueError as exc:
        print(f"ptt plan compare: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(json_safe(rows), sort_keys=True))
        return 0
    print(f"at epsilon {args.epsilon:g} per device and epoch, N={args.population:,}, expected count "
          f"{args.expected_yes:g}, {args.stations} stations:")
    print(f"{'mechanism':<10} {'epsilon':>8} {'sd':>10} {'95% half-width':>15} {'lattice step':>13}")
    for r in rows:
        cells = [_fmt(r[k]) if r[k] is not None else "n/a" for k in ("epsilon", "sd", "halfwidth_95", "lattice_step")]
        print(f"{r['mechanism']:<10} {cells[0]:>8} {cells[1]:>10} {cells[2]:>15} {cells[3]:>13}  {r['note']}")
    for r in rows:
        for w in r["warnings"]:
            print(f"WARNING: {r['mechanism']}: {w}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ptt", description="Private traffic telemetry. Every command validates its flags before "
                                             "it touches the network; exit codes: "
                                             + ", ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + ".")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("plan", help="what a query will cost (epsilon) and how good its answers can be",
                       description="Per-epoch and per-day epsilon and the accuracy of the headline estimator.")
    p.add_argument("mechanism", choices=[*planning.MECHANISMS, COMPARE],
                   help="the mechanism to plan, or `compare`: SP, ALP, k-ary RR, OUE and OLH side by side at "
                        "the same --epsilon (--json: a list with one object per mechanism)")
    p.add_argument("--epsilon", type=float, default=None, help="compare only: the per-device epsilon per epoch")
    p.add_argument("--daily-budget", type=float, default=None,
                   help="a device's daily budget: print how many epochs of the query it allows")
    p.add_argument("--population", type=int, required=True, help="vehicles reporting per epoch (N)")
    p.add_argument("--expected-yes", type=float, required=True, help="expected true count at the station")
    p.add_argument("--stations", type=int, default=1, help="monitored stations V (sp only)")
    p.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                   help="mechanism parameter, names as in the math reference (repeatable)")
    p.add_argument("--epochs", type=int, default=planning.EPOCHS_PER_DAY, help="epochs composed (default: a day)")
    p.add_argument("--delta", type=float, default=1e-6, help="delta of advanced and optimal composition")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)
    _add_replay(sub)
    _add_worker(sub)
    _add_subscribe(sub)
    _add_report(sub)
    _add_analyst(sub)
    _add_synth(sub)
    _add_demo(sub)
    _add_broker(sub)
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


def _add_demo(sub: Any) -> None:
    from .demo_settings import DemoSettings
    from .settings_cli import add_settings_flags

    d = sub.add_parser("demo", help="embedded broker + worker + Prometheus + a replayed day, nothing to configure",
                       description="Start the embedded broker, a stream-app worker and Prometheus, replay the "
                                   "synthetic day (or a PeMS file), and save the estimates, ground truth and a "
                                   "report into --out when it ends (done, --exit-when-done, or Ctrl-C).")
    add_settings_flags(d, DemoSettings)
    d.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .demo_settings import DemoSettings
    from .settings_cli import settings_from_args

    return run_demo(settings_from_args(DemoSettings, args))


def _add_broker(sub: Any) -> None:
    b = sub.add_parser("broker", help="run the embedded Kafka-protocol broker alone, until Ctrl-C",
                       description="Start the embedded broker (memory only: a restart loses every topic) and print "
                                   "the commands that use it.")
    b.add_argument("--port", type=_port, default=None, help="port to listen on (default: a free one)")
    b.add_argument("--log", type=Path, default=None, metavar="FILE", help="write the broker's log here")
    b.set_defaults(func=_cmd_broker)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from exc
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, got {port}")
    return port


def _cmd_broker(args: argparse.Namespace) -> int:
    from producers.local_broker import LocalBroker
    from producers.replay import StopFlag

    from .demo import ptt_command

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


def _add_replay(sub: Any) -> None:
    from producers.settings import ReplaySettings

    from .settings_cli import add_settings_flags

    p = sub.add_parser("replay", help="replay a PeMS traffic day as privatized vehicle reports into Kafka",
                       description="Replay a PeMS day (real files, or the synthetic default) through the fleet's "
                                   "devices into Kafka. Every flag can also be set as a PTT_* environment variable; "
                                   "flags win.")
    add_settings_flags(p, ReplaySettings)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_replay)


def _check_inputs(paths: list[Path]) -> None:
    """Missing or unreadable input files fail before anything else happens."""
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(2, "no such file", str(path))
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory, not a file", str(path))
        with path.open("rb"):
            pass


def replay_summary_lines(summary: Any) -> list[str]:
    """What ``ptt replay`` prints on stdout: data quality, what the broker acknowledged (and,
    when that is less, what was sent), refusals. Also printed when the broker was lost."""
    s = summary
    if (s.reports, s.records) == (s.reports_sent, s.records_sent):
        done = f"{s.reports:,} reports in {s.records:,} records"
    else:
        done = (f"the broker acknowledged {s.reports:,} of {s.reports_sent:,} reports sent ({s.records:,} of "
                f"{s.records_sent:,} records)")
    lines = [f"data: {s.data_quality}",
             f"fleet: {s.fleet_size:,} vehicles; replayed {s.epochs} epochs, {done} in {s.elapsed_s:.1f}s"]
    lines += [f"refused: {n:,} vehicle-epochs of {qid} ({s.refusal_reasons.get(qid, '')})"
              for qid, n in sorted(s.refused.items())]
    return lines


def delivery_failures_message(summary: Any) -> str:
    """What ``ptt replay`` (and ``ptt demo``) say when records could not be delivered (exit 1)."""
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(summary.failure_reasons.items()))
    return (f"{summary.delivery_failures} records could not be delivered{f' ({reasons})' if reasons else ''}; "
            "check the broker's health and replay into fresh topics")


def _cmd_replay(args: argparse.Namespace) -> int:
    from producers.replay import ReplayLost, replay
    from producers.settings import ReplaySettings

    from .settings_cli import settings_from_args

    settings = settings_from_args(ReplaySettings, args)
    _check_inputs(_input_paths(args))
    try:
        summary = replay(settings, progress=not args.quiet)
    except ReplayLost as exc:  # what was acknowledged before the loss, then the one-line error
        print("\n".join(replay_summary_lines(exc.summary)), flush=True)
        raise
    print("\n".join(replay_summary_lines(summary)))
    if summary.delivery_failures:
        raise CliError(delivery_failures_message(summary), EXIT_FAILURE)
    if summary.interrupted:
        print("interrupted: sent data flushed and marked", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def _add_worker(sub: Any) -> None:
    from .settings import WorkerSettings
    from .settings_cli import add_settings_flags

    p = sub.add_parser("worker", help="run a stream-app worker (Faust): estimates, dead letters, /metrics",
                       description="Run one worker of the stream app. Start several with the same --app-id to "
                                   "share the work (give each its own --web-port).")
    add_settings_flags(p, WorkerSettings)
    p.set_defaults(func=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    from producers.local_broker import PortInUse, port_free
    from schemas.kafka_io import probe

    from .app import run_worker
    from .settings import WorkerSettings
    from .settings_cli import settings_from_args

    settings = settings_from_args(WorkerSettings, args)
    if not port_free(settings.web_port, settings.web_host):
        raise PortInUse(f"the metrics port {settings.web_host}:{settings.web_port} is already in use; give "
                        "another --web-port")
    why = probe(settings.bootstrap_servers, settings.bootstrap_timeout_ms / 1000)
    if why is not None:
        from schemas.kafka_io import BrokerUnavailable

        raise BrokerUnavailable(f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}); is it "
                                "running? Start one with `ptt broker`, or set --bootstrap-servers")
    return run_worker(settings)


def _add_subscribe(sub: Any) -> None:
    from schemas.settings import KafkaSettings

    from .settings_cli import add_settings_flags

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
    p.set_defaults(func=_cmd_subscribe)


def _cmd_subscribe(args: argparse.Namespace) -> int:
    from schemas.settings import KafkaSettings

    from .settings_cli import settings_from_args
    from .subscribe import subscribe

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


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="plots (truth vs estimate with bands) and a text summary of a replay",
                       description="Read estimates and ground truth (from the topics or saved JSON lines) and write "
                                   "PNG plots (truth, estimate and its 95%% and 99%% bands over the day) plus a "
                                   "summary.")
    from . import report

    report.add_arguments(p)
    p.set_defaults(func=report.run)


def _when(text: str) -> datetime:
    """An ISO-8601 time with a zone, e.g. 2026-11-18T06:00:00-08:00."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an ISO-8601 time with a zone such as 2026-11-18T06:00:00-08:00, "
                                         f"got {text!r}") from exc
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no zone: add one, e.g. {text}-08:00 or {text}Z")
    return value


def _sensors(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated PeMS station ids, got {text!r}") from exc


def _add_analyst(sub: Any) -> None:
    from estimators.registry import REGISTRY
    from schemas.query import MECHANISM_NAMES
    from schemas.settings import KafkaSettings

    from .settings_cli import add_settings_flags

    p = sub.add_parser("analyst", help="publish, update and list queries on the compacted queries topic")
    asub = p.add_subparsers(dest="analyst_command", required=True, metavar="ACTION")
    for name, helptext in (("publish", "publish a new query (version 1 unless --version)"),
                           ("update", "publish the next version of an existing query, changing what is given")):
        q = asub.add_parser(name, help=helptext)
        q.add_argument("query_id", help="the query's id (letters, digits, - and _)")
        q.add_argument("--analyst", dest="analyst_id", required=(name == "publish"), help="who asks (analyst id)")
        q.add_argument("--mechanism", choices=list(MECHANISM_NAMES), required=(name == "publish"),
                       help="; ".join(f"{n}: {REGISTRY[n].summary}" for n in MECHANISM_NAMES))
        q.add_argument("--sensors", type=_sensors, required=(name == "publish"),
                       help="comma-separated PeMS station ids")
        q.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                       help="mechanism parameter, e.g. pis=0.3 (repeatable)")
        q.add_argument("--population", type=int, required=(name == "publish"),
                       help="N: vehicles asked per epoch (the fleet size)")
        q.add_argument("--t-start", type=_when, required=(name == "publish"),
                       help="when the query starts: ISO-8601 with zone, e.g. 2026-11-18T06:00:00-08:00")
        q.add_argument("--t-end", type=_when, required=(name == "publish"),
                       help="when the query ends: ISO-8601 with zone")
        q.add_argument("--version", type=int, default=None,
                       help="version to publish (default: 1 for publish, the next one for update)")
        add_settings_flags(q, KafkaSettings)
        q.set_defaults(func=_analyst)
    ls = asub.add_parser("list", help="list every version of every query")
    ls.add_argument("--json", action="store_true", help="one JSON query per line")
    add_settings_flags(ls, KafkaSettings)
    ls.set_defaults(func=_analyst)


def _analyst(args: argparse.Namespace) -> int:
    from schemas import Query
    from schemas.kafka_io import publish_query, read_queries
    from schemas.settings import KafkaSettings

    from .settings_cli import settings_from_args

    settings = settings_from_args(KafkaSettings, args)
    if args.analyst_command == "list":
        existing = read_queries(settings)
        for q in existing:
            if args.json:
                print(q.model_dump_json())
            else:
                print(f"{q.query_id} v{q.version}  {q.mechanism}  {len(q.sensors)} sensors  "
                      f"N={q.population:,}  {q.t_start.isoformat()} .. {q.t_end.isoformat()}  "
                      f"epsilon={q.epsilon:.4g}  by {q.analyst_id}")
        return 0
    fields: dict[str, Any] = {k: getattr(args, k) for k in
                              ("analyst_id", "mechanism", "sensors", "population", "t_start", "t_end")
                              if getattr(args, k) is not None}
    if args.param:
        fields["params"] = dict(args.param)
    if args.analyst_command == "publish":  # built and validated before anything is read or sent
        query = Query.model_validate({**fields, "query_id": args.query_id, "version": args.version or 1})
        existing = read_queries(settings)
        same = [q for q in existing if q.query_id == args.query_id]
    else:
        existing = read_queries(settings)
        same = [q for q in existing if q.query_id == args.query_id]
        if not same:
            raise CliError(f"no query {args.query_id!r} to update; publish it first (ptt analyst publish)")
        latest = max(same, key=lambda q: q.version)
        merged = {**latest.model_dump(), **fields, "version": args.version or latest.version + 1}
        if "params" in fields:
            merged["params"] = {**latest.params, **fields["params"]}
        query = Query.model_validate(merged)
    if any(q.version == query.version for q in same):
        raise CliError(f"{query.record_key} exists; versions are immutable: publish a new one (ptt analyst update)")
    publish_query(settings, query)
    print(f"published {query.record_key} (epsilon {query.epsilon:.4g} per epoch)")
    return 0


def _add_synth(sub: Any) -> None:
    p = sub.add_parser("synth", help="write a synthetic PeMS day (Station Raw 30 s + metadata)")
    p.add_argument("out_dir", help="directory to write the day's files into (created if missing)")
    p.add_argument("--stations", type=int, default=16, help="number of stations (default 16)")
    p.add_argument("--seed", type=int, default=2026, help="random seed: the same seed writes the same day")
    p.add_argument("--date", default="2026-11-18", help="the day's date, YYYY-MM-DD (default 2026-11-18)")
    p.add_argument("--weekend", action=argparse.BooleanOptionalAction, default=None,
                   help="weekend traffic shape (default: from the date)")
    p.add_argument("--no-glitches", action="store_true",
                   help="leave out the glitches of real files (stuck lanes, spikes, missing rows)")
    p.set_defaults(func=_cmd_synth)


def _cmd_synth(args: argparse.Namespace) -> int:
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


def _configure_logging(verbose: bool) -> None:
    """Quiet by default: kafka-python's connection warnings are not for a user's terminal."""
    debug = verbose or os.environ.get("PTT_LOG_LEVEL", "").lower() == "debug"
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not debug:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(bool(getattr(args, "verbose", False)))
    command = args.command if args.command != "analyst" else f"analyst {args.analyst_command}"
    code: int = _guarded(command, lambda: int(args.func(args)), args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
