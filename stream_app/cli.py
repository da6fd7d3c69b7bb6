"""The ``ptt`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from estimators import planning
from schemas.wire import json_safe

__all__ = ["build_parser", "main"]

EXIT_BROKER = 3
EXIT_INTERRUPTED = 130


def _guarded(command: str, fn: Callable[[], int]) -> int:
    """Run a command; bad input is one line and exit 2, an unreachable broker exit 3."""
    from schemas.kafka_io import BrokerUnavailable

    try:
        return fn()
    except BrokerUnavailable as exc:
        print(f"ptt {command}: error: {exc}", file=sys.stderr)
        return EXIT_BROKER
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"ptt {command}: error: {exc}", file=sys.stderr)
        return 2


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


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        result = planning.plan(args.mechanism, args.population, args.expected_yes, args.stations,
                               dict(args.param), epochs=args.epochs, delta=args.delta)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ptt", description="Private traffic telemetry.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="what a query will cost (epsilon) and how good its answers can be",
                       description="Per-epoch and per-day epsilon and the accuracy of the headline estimator.")
    p.add_argument("mechanism", choices=planning.MECHANISMS)
    p.add_argument("--population", type=int, required=True, help="vehicles reporting per epoch (N)")
    p.add_argument("--expected-yes", type=float, required=True, help="expected true count at the station")
    p.add_argument("--stations", type=int, default=1, help="monitored stations V (sp only)")
    p.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                   help="mechanism parameter, names as in the math reference (repeatable)")
    p.add_argument("--epochs", type=int, default=planning.EPOCHS_PER_DAY, help="epochs composed (default: a day)")
    p.add_argument("--delta", type=float, default=1e-6, help="delta of advanced composition")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_plan)
    _add_replay(sub)
    _add_worker(sub)
    _add_subscribe(sub)
    _add_report(sub)
    _add_analyst(sub)
    _add_synth(sub)
    d = sub.add_parser("demo", help="embedded broker + replay of the synthetic day, nothing to configure")
    d.add_argument("--speed", type=float, default=120.0, help="x real time (default 120: a day in 12 minutes)")
    d.add_argument("--max-epochs", type=int, default=None, help="stop after this many epochs")
    d.add_argument("--stations", type=int, default=16)
    d.add_argument("--port", type=int, default=None, help="broker port (default: a free one)")
    d.add_argument("--metrics-port", type=int, default=6066)
    d.add_argument("--prometheus-port", type=int, default=9090)
    d.add_argument("--exit-when-done", action="store_true", help="stop after the replay instead of serving on")
    d.set_defaults(func=_cmd_demo)
    return parser


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args.speed, args.max_epochs, args.stations, args.port, args.metrics_port, args.prometheus_port,
                    args.exit_when_done)


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


def _cmd_replay(args: argparse.Namespace) -> int:
    import logging

    from producers.replay import ReplaySummary, replay
    from producers.settings import ReplaySettings

    from .settings_cli import settings_from_args

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: list[ReplaySummary] = []

    def go() -> int:
        result.append(replay(settings_from_args(ReplaySettings, args), progress=not args.quiet))
        return 0

    code = _guarded("replay", go)
    if code:
        return code
    summary = result[0]
    print(f"data: {summary.data_quality}")
    print(f"fleet: {summary.fleet_size:,} vehicles; replayed {summary.epochs} epochs, {summary.reports:,} reports in "
          f"{summary.records:,} records in {summary.elapsed_s:.1f}s")
    for qid, n in sorted(summary.refused.items()):
        print(f"refused: {n:,} vehicle-epochs of {qid} ({summary.refusal_reasons.get(qid, '')})")
    if summary.delivery_failures:
        print(f"ptt replay: {summary.delivery_failures} records could not be delivered", file=sys.stderr)
        return 1
    if summary.interrupted:
        print("interrupted: sent data flushed and marked", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _add_worker(sub: Any) -> None:
    from .settings import WorkerSettings
    from .settings_cli import add_settings_flags

    p = sub.add_parser("worker", help="run a stream-app worker (Faust): estimates, dead letters, /metrics",
                       description="Run one worker of the stream app. Start several with the same --app-id to "
                                   "share the work (give each its own --web-port).")
    add_settings_flags(p, WorkerSettings)
    p.set_defaults(func=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    from .app import run_worker
    from .settings import WorkerSettings
    from .settings_cli import settings_from_args

    return _guarded("worker", lambda: run_worker(settings_from_args(WorkerSettings, args)))


def _add_subscribe(sub: Any) -> None:
    from schemas.settings import KafkaSettings

    from .settings_cli import add_settings_flags

    p = sub.add_parser("subscribe", help="tail the estimates topic (a table, or JSON lines)")
    p.add_argument("--topic", default="ptt.estimates", help="estimates topic (default ptt.estimates)")
    p.add_argument("--json", action="store_true", help="one JSON estimate per line")
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--query", default=None)
    p.add_argument("--station", type=int, default=None)
    p.add_argument("--estimator", default=None)
    p.add_argument("--idle-timeout", type=float, default=None, help="stop after this many seconds without data")
    add_settings_flags(p, KafkaSettings)
    p.set_defaults(func=_cmd_subscribe)


def _cmd_subscribe(args: argparse.Namespace) -> int:
    from schemas.settings import KafkaSettings

    from .settings_cli import settings_from_args
    from .subscribe import subscribe

    def go() -> int:
        subscribe(settings_from_args(KafkaSettings, args), args.topic, json_lines=args.json,
                  from_beginning=args.from_beginning, query=args.query, station=args.station,
                  estimator=args.estimator, idle_timeout_s=args.idle_timeout)
        return 0

    try:
        return _guarded("subscribe", go)
    except KeyboardInterrupt:
        return 0


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="plots (truth vs estimate with bands) and a text summary of a replay",
                       description="Read estimates and ground truth (from the topics or saved JSON lines) and write "
                                   "PNG plots in the style of seed 004 Figure 1 plus a summary.")
    from . import report

    report.add_arguments(p)
    p.set_defaults(func=report.run)


def _add_analyst(sub: Any) -> None:
    from schemas.settings import KafkaSettings

    from .settings_cli import add_settings_flags

    p = sub.add_parser("analyst", help="publish, update and list queries on the compacted queries topic")
    asub = p.add_subparsers(dest="analyst_command", required=True)
    for name, helptext in (("publish", "publish a new query (version 1 unless --version)"),
                           ("update", "publish the next version of an existing query, changing what is given")):
        q = asub.add_parser(name, help=helptext)
        q.add_argument("query_id")
        q.add_argument("--analyst", dest="analyst_id", required=(name == "publish"))
        q.add_argument("--mechanism", choices=["sp", "alp", "rr"], required=(name == "publish"))
        q.add_argument("--sensors", type=lambda t: tuple(int(x) for x in t.split(",") if x.strip()),
                       required=(name == "publish"), help="comma-separated PeMS station ids")
        q.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE")
        q.add_argument("--population", type=int, required=(name == "publish"), help="N rows")
        q.add_argument("--t-start", required=(name == "publish"), help="ISO-8601 with zone")
        q.add_argument("--t-end", required=(name == "publish"), help="ISO-8601 with zone")
        q.add_argument("--version", type=int, default=None)
        add_settings_flags(q, KafkaSettings)
        q.set_defaults(func=_cmd_analyst)
    ls = asub.add_parser("list", help="list every version of every query")
    ls.add_argument("--json", action="store_true")
    add_settings_flags(ls, KafkaSettings)
    ls.set_defaults(func=_cmd_analyst)


def _cmd_analyst(args: argparse.Namespace) -> int:
    return _guarded("analyst", lambda: _analyst(args))


def _analyst(args: argparse.Namespace) -> int:
    from schemas import Query
    from schemas.kafka_io import publish_query, read_queries
    from schemas.settings import KafkaSettings

    from .settings_cli import settings_from_args

    settings = settings_from_args(KafkaSettings, args)
    existing = read_queries(settings)
    if args.analyst_command == "list":
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
    same = [q for q in existing if q.query_id == args.query_id]
    if args.analyst_command == "update":
        if not same:
            print(f"ptt analyst: error: no query {args.query_id!r} to update", file=sys.stderr)
            return 2
        latest = max(same, key=lambda q: q.version)
        merged = {**latest.model_dump(), **fields, "version": args.version or latest.version + 1}
        if "params" in fields:
            merged["params"] = {**latest.params, **fields["params"]}
        query = Query.model_validate(merged)
    else:
        query = Query.model_validate({**fields, "query_id": args.query_id, "version": args.version or 1})
    if any(q.version == query.version for q in same):
        print(f"ptt analyst: error: {query.record_key} exists; versions are immutable", file=sys.stderr)
        return 2
    publish_query(settings, query)
    print(f"published {query.record_key} (epsilon {query.epsilon:.4g} per epoch)")
    return 0


def _add_synth(sub: Any) -> None:
    p = sub.add_parser("synth", help="write a synthetic PeMS day (Station Raw 30 s + metadata)")
    p.add_argument("out_dir")
    p.add_argument("--stations", type=int, default=16)
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--date", default="2026-11-18")
    p.add_argument("--weekend", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--no-glitches", action="store_true")
    p.set_defaults(func=_cmd_synth)


def _cmd_synth(args: argparse.Namespace) -> int:
    from datetime import date

    from producers.synthetic import write_synthetic_day

    try:
        day = write_synthetic_day(args.out_dir, args.stations, args.seed, date.fromisoformat(args.date),
                                  args.weekend, glitches=not args.no_glitches)
    except ValueError as exc:
        print(f"ptt synth: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {day.raw_path} and {day.meta_path} ({len(day.stations)} stations)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
