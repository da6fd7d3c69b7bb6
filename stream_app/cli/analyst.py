"""``ptt analyst publish/update/list``: manage queries on the compacted queries topic."""

from __future__ import annotations

import argparse
import json
import math
from datetime import datetime
from typing import Any

from estimators.registry import REGISTRY
from estimators.shuffle import TRUST_ASSUMPTION
from schemas.query import MECHANISM_NAMES
from schemas.settings import KafkaSettings
from schemas.wire import json_safe

from ..day_figure import unbounded as _unbounded
from ..day_figure import vehicle_day
from .base import add_settings_flags, param, settings_from_args
from .errors import EXIT_USAGE, CliError

__all__ = ["add_parser", "run", "vehicle_day"]


_LIST_NOTE = (
    "local: what one device's report costs it, per epoch and over a day, whatever happens to the report. "
    "\"{release} release among n\": what the epoch costs a vehicle when a shuffler (ptt shuffler, ptt demo "
    "--via-shuffler) releases {what} of n reports, n = the query's population unless --shuffle-size, rounded down "
    "to 2 significant digits; the worker publishes epsilon_shuffled for the release its shuffler attests at the n "
    "it attests, so it is this figure under --release {release} with the whole population in the shuffle "
    "(--shuffled-day adds the day). Each such figure {assumption}.")
_WHAT = {"aggregate": "only the per-station counts", "permuted": "the reports, permuted"}


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


def add_parser(sub: Any) -> None:
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
        q.add_argument("--param", type=param, action="append", default=[], metavar="NAME=VALUE",
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
        q.set_defaults(func=run)
    ls = asub.add_parser("list", help="list every version of every query, with its privacy figures",
                         description="Every version of every query with a device's epsilon per epoch and per day, "
                                     "and what the epoch's release would cost if shuffled among n reports (n "
                                     "rounded down to 2 significant digits, as the worker publishes it).")
    ls.add_argument("--json", action="store_true",
                    help="one JSON query per line, with a `privacy` object: epsilon per epoch and per day, local "
                         "and if shuffled (the shuffled day always: several seconds per query)")
    ls.add_argument("--shuffle-size", type=int, default=None, metavar="N",
                    help="reports per shuffle for the shuffled figures (default: each query's population)")
    ls.add_argument("--shuffled-day", action="store_true",
                    help="also the day's epsilon if shuffled (a composition over 2,880 epochs: several seconds "
                         "per query, so not by default)")
    ls.add_argument("--release", choices=["aggregate", "permuted", "local"], default="aggregate",
                    help="the release a vehicle's day is accounted for (the last line): the shuffler's aggregate "
                         "(default) or permuted release, or local (no shuffler: the direct path)")
    add_settings_flags(ls, KafkaSettings)
    ls.set_defaults(func=run)


def _privacy(q: Any, asked: int, release: str, day: bool) -> dict[str, Any]:
    """A query's epsilon per epoch and per day, local and for ``release`` among ``asked`` reports
    rounded down to 2 significant digits, the size the worker computes its published
    ``epsilon_shuffled`` at (:func:`stream_app.worker.estimate.round_down_2sig`: one computation per
    rounded size; a bound at fewer reports also holds at more), by the same function
    (:func:`estimators.epoch_epsilon`), so that the two agree. The shuffled day is a composition
    over 2,880 epochs (several seconds): only when ``day``. Infinite figures are null, with why."""
    from estimators import SP_CAVEAT, epoch_epsilon, planning, privacy
    from estimators import vehicle_day as day_of
    from estimators.ledger import report_epsilon_shuffled

    from ..worker.estimate import round_down_2sig

    n = round_down_2sig(asked)
    mech = q.build()
    out: dict[str, Any] = {
        "epsilon": q.epsilon, "span_s": q.span_s,
        "epsilon_day": privacy.day_epsilon([q.epsilon] * (planning.EPOCHS_PER_DAY // q.epochs_per_span)),
        "release": release, "shuffle_size": n, "shuffle_size_asked": asked, "shuffle_trust": TRUST_ASSUMPTION}
    if _unbounded(q):
        out["epsilon_day"] = None
        out["why"] = SP_CAVEAT
    if release == "local":
        return out
    out["epsilon_shuffled"] = (epoch_epsilon(q.spec, mech, q.n_stations, n, release) if q.passages == 1
                               else report_epsilon_shuffled(q.spec, mech, q.n_stations, n, release,
                                                            passages=q.passages))
    if day:
        out["epsilon_day_shuffled"] = day_of([q.accounting], n, release, planning.EPOCHS_PER_DAY)["shuffled"]
    return out


def run(args: argparse.Namespace) -> int:
    from schemas import Query
    from schemas.kafka_io import publish_query, read_queries

    settings = settings_from_args(KafkaSettings, args)
    if args.analyst_command == "list":
        if args.shuffle_size is not None and args.shuffle_size < 1:
            raise CliError("--shuffle-size must be >= 1", code=EXIT_USAGE)
        from estimators import plain_words

        existing = read_queries(settings)
        for q in existing:
            fig = _privacy(q, args.shuffle_size or q.population, args.release, day=args.json or args.shuffled_day)
            if args.json:
                print(json.dumps({**json.loads(q.model_dump_json()), "privacy": json_safe(fig)}), flush=True)
                continue
            local_day = "no bound" if fig["epsilon_day"] is None else f"{fig['epsilon_day']:.4g}"
            shuffled = ""
            if "epsilon_shuffled" in fig:
                value = fig["epsilon_shuffled"]
                shuffled = (f"  {args.release} release among n={fig['shuffle_size']:,}: "
                            + ("no bound" if math.isinf(value) else f"{value:.4g}")
                            + (f" (day {fig['epsilon_day_shuffled']:.4g})" if "epsilon_day_shuffled" in fig else ""))
            print(f"{q.query_id} v{q.version}  {q.mechanism}  {len(q.sensors)} sensors  "
                  f"N={q.population:,}  {q.t_start.isoformat()} .. {q.t_end.isoformat()}  "
                  f"local: epsilon={q.epsilon:.4g} (day {local_day}){shuffled}  by {q.analyst_id}", flush=True)
        if existing and not args.json:
            line, day = vehicle_day(existing, args.release, args.shuffle_size)
            print(line, flush=True)
            print(plain_words(day))  # Sampling Privacy's caveat is in the day's line, once
            if args.release != "local":
                print(_LIST_NOTE.format(release=args.release, what=_WHAT[args.release], assumption=TRUST_ASSUMPTION))
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
