"""``ptt plan fleet``: a vehicle's whole day across every default query (or ``--query-mechanisms``,
each ``MECH[@SPAN[/P[/M]]]``: ``alp,unary,unary@3600`` is ALP and unary RR every 30 s and unary RR
hourly; ``unary@3600//40`` at most 40 passages a day), locally and through the shuffler's release;
with ``--day-budget`` each query's parameters chosen for its share, and each query's curator at
exactly that share."""

from __future__ import annotations

import argparse
import json
import sys

from estimators.fleet import fleet_plan, parse_fleet_queries
from estimators.registry import PlanError, default_query_mechanisms
from schemas.wire import json_safe

from .errors import EXIT_USAGE

__all__ = ["run_fleet"]


def _f(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def run_fleet(args: argparse.Namespace) -> int:
    if args.param or args.epsilon is not None or args.shuffle_size is not None:
        print("ptt plan fleet: error: --param, --epsilon and --shuffle-size are for a single mechanism",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        text = args.query_mechanisms if args.query_mechanisms is not None else ",".join(default_query_mechanisms())
        queries = parse_fleet_queries(text, args.span, args.max_passages, args.max_passages_day)
        from .working import Working

        with Working(f"planning {len(queries)} queries for {args.population:,} devices over {args.stations:,} "
                     "station(s)", enabled=None if not args.json else False):
            r = fleet_plan(args.population, args.expected_yes, args.stations, release=args.release,
                           epochs=args.epochs, delta=args.delta, day_budget=args.day_budget, queries=queries)
    except (PlanError, ValueError) as exc:
        print(f"ptt plan fleet: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(json_safe(r), sort_keys=True))
        return 0
    print(f"HEADLINE: epsilon_day_vehicle = {_f(r['epsilon_day_vehicle'])} at delta {r['delta']:g}: a vehicle's "
          f"whole day answering {', '.join(n for n in r['mechanisms'] if n not in r['left_out'])} through the "
          f"shuffler's {r['release']} release (locally, without the shuffler: {_f(r['epsilon_day_vehicle_local'])})")
    if r["day_budget"] is not None:
        print(f"day budget {r['day_budget']:g}: {r['split']}")
    width = max(8, *(len(n) for n in r["queries"]))
    print(f"{'query':<{width}} {'span':>6} {'P':>4} {'M/day':>5} {'sd':>9} {'curator sd':>11} {'at budget':>10} "
          f"{'eps/report':>10} {'day alone':>10}  parameters / accounting")
    for name, q in r["queries"].items():
        if not q["fits"]:
            print(f"{name:<{width}} CANNOT FIT its share ({_f(q['budget_share'])}): {q['why']}; left out of the day")
            continue
        params = ", ".join(f"{k}={_f(v)}" for k, v in q["params"].items())
        day_cap = "-" if q["max_passages_day"] is None else q["max_passages_day"]
        print(f"{name:<{width}} {q['span_s']:>6} {q['max_passages']:>4} {day_cap:>5} {_f(q['sd']):>9} "
              f"{_f(q['central_limit_sd']):>11} {_f(q['curator_budget']):>10} {_f(q['epsilon_shuffled']):>10} "
              f"{_f(q['epsilon_day_shuffled']):>10}  {params}; {q['accounting']}")
    print(r["central_limit_sd_note"])
    return 0
