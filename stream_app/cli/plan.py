"""``ptt plan``: what a query costs (epsilon per epoch and per day) and how accurate it can be;
``ptt plan compare`` sets the mechanisms side by side at one epsilon."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from estimators import planning
from estimators.budget import check_day_cap, check_span
from schemas.wire import json_safe

from .base import param
from .errors import EXIT_USAGE

__all__ = ["COMPARE", "add_parser", "run"]

COMPARE = "compare"  # `ptt plan compare`: every mechanism at one epsilon, not a mechanism
FLEET = "fleet"  # `ptt plan fleet`: a vehicle's day across every default query


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else ("n/a" if math.isnan(v) else f"{v:.6g}")
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="what a query will cost (epsilon) and how good its answers can be",
                       description="Per-epoch and per-day epsilon and the accuracy of the headline estimator.")
    p.add_argument("mechanism", choices=[*planning.MECHANISMS, COMPARE, FLEET],
                   help="the mechanism to plan; `compare`: SP, ALP, k-ary RR, OUE and OLH side by side at "
                        "the same --epsilon (--json: a list with one object per mechanism); `fleet`: a vehicle's "
                        "day across every default query (epsilon_day_vehicle)")
    p.add_argument("--release", choices=["aggregate", "permuted"], default="aggregate",
                   help="what the shuffler releases: per-station counts (aggregate, exact accounting where it "
                        "exists, the default) or the permuted reports (permuted, the clone bound)")
    p.add_argument("--day-budget", type=float, default=None, metavar="B",
                   help="a vehicle's whole-day epsilon through the release: choose the parameters with the "
                        "smallest headline sd within it (fleet: B is split across the queries)")
    p.add_argument("--query-mechanisms", default=None, metavar="M1,M2@SPAN[/P]",
                   help="fleet only: the queries a vehicle answers, comma-separated registry names, each optionally "
                        "at a span in seconds and a passage cap (alp,unary,unary@3600 or unary@3600/20; default: "
                        "the registry's default queries, as the demo runs them, at --span)")
    p.add_argument("--epsilon", type=float, default=None, help="compare only: the per-device epsilon per epoch")
    p.add_argument("--daily-budget", type=float, default=None,
                   help="a device's daily budget: print how many epochs of the query it allows")
    p.add_argument("--population", type=int, required=True, help="vehicles reporting per epoch (N)")
    p.add_argument("--expected-yes", type=float, required=True, help="expected true count at the station")
    p.add_argument("--stations", type=int, default=1,
                   help="monitored stations V (station-valued mechanisms report one of V + 1 values)")
    p.add_argument("--param", type=param, action="append", default=[], metavar="NAME=VALUE",
                   help="mechanism parameter, names as in the math reference (repeatable)")
    p.add_argument("--epochs", type=int, default=planning.EPOCHS_PER_DAY, help="epochs composed (default: a day)")
    p.add_argument("--delta", type=float, default=1e-6,
                   help="delta of advanced and optimal composition, and of the shuffled figures")
    p.add_argument("--shuffle-size", type=int, default=None, metavar="N",
                   help="reports mixed per shuffle for epsilon_shuffled (default: --population); the shuffled "
                        "figures assume the shuffler does not collude with the analyst")
    p.add_argument("--span", type=int, default=30, metavar="S",
                   help="seconds one report covers: 30 (one epoch, the default) or a longer span (a multiple of "
                        "30 that divides a day, e.g. 300 or 3600; per-sensor mechanisms only): one report per span "
                        "naming the stations a vehicle passed; --expected-yes is then the span's flow and sd the "
                        "span flow's (fleet: the span of every query that names none)")
    p.add_argument("--max-passages", type=int, default=None, metavar="P",
                   help="the most stations one span report names (default: one per epoch of the span, at most "
                        "--stations); a vehicle that passed more reports a uniformly random P of them")
    p.add_argument("--max-passages-day", type=int, default=None, metavar="M",
                   help="the day cap: the most passages a device names for the query in a day (past M its reports "
                        "name no station, still sent and randomized); the day composes each station's PLDs M times "
                        "each way and the curator's L2 is sqrt(2M) (fleet: of every query that names none)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.mechanism == COMPARE:
        if args.span != 30 or args.max_passages is not None or args.max_passages_day is not None:
            print("ptt plan compare: error: --span, --max-passages and --max-passages-day are for a query's plan",
                  file=sys.stderr)
            return EXIT_USAGE
        return _run_compare(args)
    if args.day_budget is not None and not (math.isfinite(args.day_budget) and args.day_budget > 0):
        print("ptt plan: error: --day-budget must be a positive number", file=sys.stderr)
        return EXIT_USAGE
    try:  # the span first: nothing is computed for one a query cannot have
        if args.mechanism == FLEET:
            check_span(args.span, args.max_passages)
            check_day_cap(args.max_passages_day)
        else:
            planning.check_span_request(args.mechanism, args.span, args.max_passages, args.max_passages_day)
    except planning.PlanError as exc:
        print(f"ptt plan: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.mechanism == FLEET:
        from .plan_fleet import run_fleet

        return run_fleet(args)
    if args.query_mechanisms is not None:
        print("ptt plan: error: --query-mechanisms is for `ptt plan fleet`", file=sys.stderr)
        return EXIT_USAGE
    if args.epsilon is not None:
        print("ptt plan: error: --epsilon is for `ptt plan compare`; a mechanism's epsilon follows from its "
              "parameters (--param)", file=sys.stderr)
        return EXIT_USAGE
    from .working import Working

    try:
        with Working(f"planning {args.mechanism} for {args.population:,} devices over {args.stations:,} station(s)",
                     enabled=None if not args.json else False):
            result = planning.plan(args.mechanism, args.population, args.expected_yes, args.stations,
                                   dict(args.param), epochs=args.epochs, delta=args.delta,
                                   daily_budget=args.daily_budget, shuffle_size=args.shuffle_size,
                                   release=args.release, day_budget=args.day_budget, span_s=args.span,
                                   max_passages=args.max_passages, max_passages_day=args.max_passages_day)
    except planning.PlanError as exc:
        print(f"ptt plan: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(json_safe(result), sort_keys=True))
        return 0
    print(headline(result))
    rows = [(k, _fmt(v)) for k, v in result.items() if k != "warnings"]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for w in result["warnings"]:
        print(f"WARNING: {w}")
    return 0


def headline(r: dict[str, Any]) -> str:
    """The one line that says which epsilon is the guarantee (the other keys are context)."""
    span = int(r.get("span_s", 30))
    if span == 30:
        day, unit = f"{r['epochs']} epochs", "per epoch"
    else:
        day = f"{r['releases']} reports of {span} s, each naming up to {r['max_passages']} stations"
    if r.get("max_passages_day") is not None:
        day += f", at most {r['max_passages_day']} passages named a day"
        unit = f"per {span}-s flow"
    return (f"HEADLINE: epsilon_day_vehicle = {_fmt(r['epsilon_day_vehicle'])} at delta {r['delta']:g}: a vehicle's "
            f"whole day ({day}) of this query through the shuffler's {r['release']} release "
            f"({r['accounting']}); {r['estimator']} sd {_fmt(r['sd'])} {unit}, a trusted curator's at the same "
            f"span and day budget {_fmt(r['central_limit_sd'])} (central_limit_sd). Local, without the shuffler: "
            f"epsilon {_fmt(r['epsilon'])} {'per epoch' if span == 30 else 'per report'}, epsilon_day "
            f"{_fmt(r['epsilon_day'])}.")


def _run_compare(args: argparse.Namespace) -> int:
    from estimators.compare import compare

    if args.epsilon is None:
        print("ptt plan compare: error: --epsilon is required (the per-device epsilon to compare at)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        rows = compare(args.epsilon, args.population, args.expected_yes, args.stations)
    except ValueError as exc:
        print(f"ptt plan compare: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(json_safe(rows), sort_keys=True))
        return 0
    print(f"at epsilon {args.epsilon:g} per device and epoch, N={args.population:,}, expected count "
          f"{args.expected_yes:g}, {args.stations} stations:")
    print(f"{'mechanism':<10} {'epsilon':>8} {'shuffled':>9} {'day shuf.':>9} {'sd':>10} {'95% half-width':>15} "
          f"{'lattice step':>13}")
    keys = ("epsilon", "epsilon_shuffled", "epsilon_day_shuffled", "sd", "halfwidth_95", "lattice_step")
    for r in rows:
        c = [_fmt(r[k]) if r[k] is not None else "n/a" for k in keys]
        print(f"{r['mechanism']:<10} {c[0]:>8} {c[1]:>9} {c[2]:>9} {c[3]:>10} {c[4]:>15} {c[5]:>13}  {r['note']}")
    print(f"shuffled (per epoch, per day of 2,880 epochs, n = {args.population:,}): {rows[0]['shuffle_trust']}")
    for r in rows:
        for w in r["warnings"]:
            print(f"WARNING: {r['mechanism']}: {w}")
    return 0
