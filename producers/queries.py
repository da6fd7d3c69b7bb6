"""The replay's default queries: one per mechanism of ``--query-mechanisms`` over every station
of the day, a span query's parameters planned for its day budget (``ptt plan fleet``)."""

from __future__ import annotations

import functools
from typing import Any

from estimators import default_query_mechanisms
from schemas import Query
from schemas.epochs import EPOCH_S

from .pems import TrafficDay, epoch_start

__all__ = ["default_queries", "planned_flow_params"]


def default_queries(day: TrafficDay, population: int, mechanisms: tuple[str, ...] | None = None,
                    flow_day_budget: float = 1.0) -> list[Query]:
    """The demo's queries over all the day's stations, one per mechanism (default: those the
    registry marks as default queries, ALP and symmetric unary RR; ``ReplaySettings.mechanisms``
    chooses others), valid for the whole day. A 30-s query (``MECH``, id ``MECH-day``) runs at the
    mechanism's default parameters; a span query (``MECH@SPAN[/P[/M]]``, id e.g. ``unary-hour``)
    at the parameters ``ptt plan fleet`` chooses for it alone at a day of ``flow_day_budget``
    (:func:`planned_flow_params`), with its day cap M (``max_passages_day``) if it names one."""
    from estimators.fleet import parse_fleet_queries

    sensors = tuple(int(s) for s in day.stations)
    t0, t1 = epoch_start(int(day.epochs[0])), epoch_start(int(day.epochs[-1]) + 1)
    common: dict[str, Any] = {"analyst_id": "demo", "version": 1, "sensors": sensors, "population": population,
                              "t_start": t0, "t_end": t1}
    out = []
    for q in parse_fleet_queries(",".join(mechanisms or default_query_mechanisms())):
        if q.span_s == EPOCH_S:
            out.append(Query(query_id=f"{q.mechanism}-day", mechanism=q.mechanism, **common))
            continue
        span = {300: "5min", 900: "15min", 3600: "hour", 86_400: "whole-day"}.get(q.span_s, f"{q.span_s}s")
        params = planned_flow_params(q.mechanism, q.span_s, q.max_passages, population, len(sensors), flow_day_budget,
                                     q.max_passages_day)
        out.append(Query(query_id=f"{q.mechanism}-{span}", mechanism=q.mechanism, params=params, span_s=q.span_s,
                         max_passages=q.max_passages, max_passages_day=q.max_passages_day, **common))
    return out


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
