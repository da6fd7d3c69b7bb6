"""The ``ptt`` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from estimators import planning

__all__ = ["main"]


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


def _json_safe(v: Any) -> Any:
    """Infinity and NaN are not JSON: write them as null (documented in the README)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def _cmd_plan(args: argparse.Namespace) -> int:
    try:
        result = planning.plan(args.mechanism, args.population, args.expected_yes, args.stations,
                               dict(args.param), epochs=args.epochs, delta=args.delta)
    except planning.PlanError as exc:
        print(f"ptt plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_json_safe(result), sort_keys=True))
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
