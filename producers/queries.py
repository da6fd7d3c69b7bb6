"""The replay's default queries: one per mechanism of ``--query-mechanisms`` over every station
of the day, a span query's parameters planned for its day budget (``ptt plan fleet``)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from estimators import default_query_mechanisms
from schemas import Query
from schemas.epochs import spans_epochs

from .pems import TrafficDay, epoch_start

__all__ = ["SHIPPED_PLANS", "default_queries", "planned_day_params", "planned_flow_params"]

#: the plans of the demo's default settings, shipped so a first run need not plan for minutes
#: (``ptt plan fleet ... --day-budget``; tests/unit/project/test_quoted_figures.py checks that
#: each is what the planner chooses now); checked against its budget before use, as a cache is
SHIPPED_PLANS = Path(__file__).with_name("plans.json")


def default_queries(day: TrafficDay, population: int, mechanisms: tuple[str, ...] | None = None,
                    flow_day_budget: float = 1.0, day_budget: float | None = None,
                    plan_cache: Path | None = None) -> list[Query]:
    """The demo's queries over all the day's stations, one per mechanism (default: those the
    registry marks as default queries, ALP and symmetric unary RR; ``ReplaySettings.mechanisms``
    chooses others), valid for the whole day. A 30-s query (``MECH``, id ``MECH-day``) runs at the
    mechanism's default parameters; a span query (``MECH@SPAN[/P[/M]]``, id e.g. ``unary-hour``)
    at the parameters ``ptt plan fleet`` chooses for it alone at a day of ``flow_day_budget``
    (:func:`planned_flow_params`), with its day cap M (``max_passages_day``) if it names one.
    With ``day_budget``, every query (30-s ones too) runs at the parameters ``ptt plan fleet
    --day-budget`` chooses for them together (:func:`planned_day_params`): a vehicle's whole day
    across all of them then costs at most ``day_budget`` through the shuffler's aggregate release
    (at the crowd the worker accounts with: ``population`` rounded down to 2 significant digits)."""
    from estimators.fleet import parse_fleet_queries, round_down_2sig

    sensors = tuple(int(s) for s in day.stations)
    t0, t1 = epoch_start(int(day.epochs[0])), epoch_start(int(day.epochs[-1]) + 1)
    common: dict[str, Any] = {"analyst_id": "demo", "version": 1, "sensors": sensors, "population": population,
                              "t_start": t0, "t_end": t1}
    out = []
    names = ",".join(mechanisms or default_query_mechanisms())
    together = (planned_day_params(names, round_down_2sig(population), len(sensors), day_budget, plan_cache)
                if day_budget is not None else {})
    for q in parse_fleet_queries(names):
        if not spans_epochs(q.span_s):
            out.append(Query(query_id=f"{q.mechanism}-day", mechanism=q.mechanism, params=together.get(q.label, {}),
                             **common))
            continue
        span = {300: "5min", 900: "15min", 3600: "hour", 86_400: "whole-day"}.get(q.span_s, f"{q.span_s}s")
        params = together.get(q.label) or planned_flow_params(q.mechanism, q.span_s, q.max_passages, population,
                                                              len(sensors), flow_day_budget, q.max_passages_day)
        out.append(Query(query_id=f"{q.mechanism}-{span}", mechanism=q.mechanism, params=params, span_s=q.span_s,
                         max_passages=q.max_passages, max_passages_day=q.max_passages_day, **common))
    return out


def planned_day_params(mechanisms: str, population: int, stations: int, day_budget: float,
                       cache: Path | None = None) -> dict[str, dict[str, float]]:
    """Each query's parameters, by label, as ``ptt plan fleet --query-mechanisms MECHANISMS
    --population POPULATION --stations STATIONS --day-budget B`` chooses them together through the
    shuffler's aggregate release (a minute or two at the papers' fleet on a busy machine:
    remembered per setting, and in ``cache``, a folder, across runs -- a remembered plan is
    used only if its composed day still fits the budget; the plans of the demo's defaults are
    shipped, :data:`SHIPPED_PLANS`). That check composes the day again (17 CPU-s for the
    README's demo at n = 120,000), so ``cache`` also remembers each check that passed, per
    setting, parameters and accounting code (:func:`_fitting`). :class:`~estimators.PlanError`
    when a query cannot fit, saying which and why."""
    key = (mechanisms, population, stations, day_budget)
    path = cache / ("day-plan-" + hashlib.sha256(repr(key).encode()).hexdigest()[:16] + ".json") if cache else None
    for kept in (_read_plans(path), _read_plans(SHIPPED_PLANS)):
        params = _fitting(kept, key, cache)
        if params is not None:
            return params
    params = _planned_day_params(*key)
    if path is not None:
        _write_atomic(path, json.dumps({"key": list(key), "params": params}))
    return params


def _read_plans(path: Path | None) -> list[Any]:
    """The plans a file keeps (a cache entry, or the shipped list); none if it is absent or unreadable."""
    if path is None or not path.is_file():
        return []
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return kept if isinstance(kept, list) else [kept]


def _fitting(kept: list[Any], key: tuple[str, int, int, float], stamps: Path | None = None
             ) -> dict[str, dict[str, float]] | None:
    """The parameters of the plan in ``kept`` made for ``key``, if its composed day still fits
    the budget (a cache can be stale or tampered with: every kept plan is checked again) -- or
    if ``stamps``, a folder, holds the stamp of that check passing for these parameters under
    this accounting code (:func:`_accounting`; written when the check passes). A stamp is
    trusted as the cache folder is: whoever can write one can change the code too."""
    from estimators.fleet import parse_fleet_queries, planned_day

    for plan in kept:
        try:
            if plan["key"] != list(key):
                continue
            params = {str(k): {str(p): float(v) for p, v in d.items()} for k, d in plan["params"].items()}
            what = json.dumps([list(key), params, _accounting()], sort_keys=True)
            stamp = stamps / f"day-fits-{hashlib.sha256(what.encode()).hexdigest()[:24]}" if stamps else None
            if stamp is not None and stamp.is_file():
                return params
            if planned_day(parse_fleet_queries(key[0]), params, key[1], key[2]) <= key[3]:
                if stamp is not None:
                    _write_atomic(stamp, what)
                return params
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # planned again
    return None


@functools.cache
def _accounting() -> str:
    """A digest of the accounting code -- the estimators package's sources -- so a remembered
    check holds only for the code that made it (~2 ms, once a process)."""
    import estimators

    h = hashlib.sha256()
    for source in sorted(Path(estimators.__file__).parent.glob("*.py")):
        h.update(source.name.encode() + b"\0" + source.read_bytes())
    return h.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` under a temporary name, then renamed (a reader never sees half); a
    folder that cannot be written is left as it is."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


@functools.lru_cache(maxsize=8)
def _planned_day_params(mechanisms: str, population: int, stations: int,
                        day_budget: float) -> dict[str, dict[str, float]]:
    from estimators import PlanError
    from estimators.fleet import fleet_plan, parse_fleet_queries

    plan = fleet_plan(population, min(population, 100), stations, queries=parse_fleet_queries(mechanisms),
                      day_budget=day_budget)
    if plan["left_out"]:
        why = "; ".join(f"{k}: {plan['queries'][k].get('why', 'does not fit')}" for k in plan["left_out"])
        raise PlanError(f"a whole day of {day_budget:g} cannot hold every query ({why}); give a larger day budget "
                        "or fewer queries")
    return {k: {p: float(v) for p, v in q["params"].items()} for k, q in plan["queries"].items()}


@functools.lru_cache(maxsize=32)
def planned_flow_params(mechanism: str, span_s: int, max_passages: int | None, population: int, stations: int,
                        day_budget: float, max_passages_day: int | None = None) -> dict[str, float]:
    """The parameters ``ptt plan fleet --query-mechanisms MECH@SPAN[/P[/M]] --day-budget B`` chooses
    for a span query alone through the shuffler's aggregate release at this crowd and station
    count (seconds of planning: remembered per setting)."""
    from estimators.fleet import FleetQuery, fleet_plan

    q = FleetQuery(mechanism, span_s, max_passages, max_passages_day)
    plan = fleet_plan(population, min(population, 100), stations, queries=[q], day_budget=day_budget)
    return {k: float(v) for k, v in plan["queries"][q.label]["params"].items()}
