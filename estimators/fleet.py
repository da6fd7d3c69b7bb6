"""A vehicle's day across every query it answers (``ptt plan fleet``).

A vehicle answers every active query once per release (a 30-s epoch, or a span: one report
naming up to P stations), so its day is the composition of every query's releases: locally, the
queries' report epsilons (every round) composed over the day; through the shuffler, the
queries' release PLDs (:func:`budget.epoch_account`: exact for the aggregate release where it
exists, else the clone bound) each composed over its releases (:func:`budget.day_epsilon_of`).
Queries of different spans mix: a 30-s live query composes 2,880 times, an hourly one 24.

Queries are named ``MECH[@SPAN[/P[/M]]]`` (:func:`parse_fleet_queries`): ``alp,unary,unary@3600``
plans ALP and unary RR every 30 s and unary RR hourly (P = 120 passages an hour by default;
``unary@3600/20``: at most 20; ``unary@3600/20/40`` or ``unary@3600//40``: and at most M = 40
passages a day, the device's day cap, :class:`budget.EpochAccount`).

With a day budget ``B`` the budget is split in the Gaussian sense: mu^2 adds under
composition, so each of the ``Q`` queries gets the epsilon of ``mu_B / sqrt(Q)``-GDP at the
same delta (``mu_B``: the mu whose (B, delta) curve point is met), its parameters are chosen
for that share (:func:`estimators.fit.fit_budget`), and the chosen queries' PLDs are composed to
check the whole day; if it exceeds ``B`` the shares shrink by the ratio of mu^2 between ``B`` and the
composed day (a little more) and the search repeats from the brackets it has already evaluated. A
query that cannot fit even alone is reported (``fits: false``, the reason) and left out of
the vehicle's day; the others share the budget.

Each query's ``central_limit_sd`` is a trusted curator's at exactly the budget that query got
(its share, ``budget_share``; without a day budget, its own day alone), at its span, P and
stations (:func:`budget.central_limit_sd`), so a query's sd is compared like with like.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import estimators.budget as budget
import estimators.fit as fitting
import estimators.privacy as privacy
from estimators.ledger import report_charge

from .mechanisms import Mechanism
from .planning import check_span_request
from .registry import MechanismSpec, PlanError, default_query_mechanisms, get_spec, mechanism_names

__all__ = ["FleetQuery", "fleet_plan", "parse_fleet_queries", "planned_day", "round_down_2sig", "share_epsilon",
           "vehicle_day"]

_FLEET_TOL = 1e-2  # parameter precision of each query's fit (relative): ~1% of sd, a third of the time
_QUERY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*(?:@\s*(\d+)\s*(?:/\s*(\d*)\s*(?:/\s*(\d+)\s*)?)?)?$")


@dataclass(frozen=True)
class FleetQuery:
    """One query of a fleet plan: its mechanism, span (seconds), passage cap per report (None: span
    / 30) and day cap (the most passages a device names a day; None: no cap)."""

    mechanism: str
    span_s: int = budget.EPOCH_S
    max_passages: int | None = None
    max_passages_day: int | None = None

    @property
    def label(self) -> str:
        """How the plan names it: ``unary``, ``unary@3600``, ``unary@3600/20``, ``unary@3600//40``."""
        if self.span_s == budget.EPOCH_S and self.max_passages is None and self.max_passages_day is None:
            return self.mechanism
        cap = "" if self.max_passages is None else f"/{self.max_passages}"
        day = "" if self.max_passages_day is None else f"{cap or '/'}/{self.max_passages_day}"
        return f"{self.mechanism}@{self.span_s}{day or cap}"

    def passages(self, n_stations: int) -> int:
        return budget.span_passages(self.span_s, self.max_passages, n_stations, self.max_passages_day)


def parse_fleet_queries(text: str, span_s: int = budget.EPOCH_S, max_passages: int | None = None,
                        max_passages_day: int | None = None) -> tuple[FleetQuery, ...]:
    """``MECH[@SPAN[/P[/M]]]``, comma-separated (a query without ``@SPAN`` takes ``span_s`` and
    ``max_passages``; one without ``/M`` takes ``max_passages_day``), checked: registry names,
    spans a query can have, no query twice.

    >>> [q.label for q in parse_fleet_queries("alp, unary, unary@3600, unary@3600/20, unary@300//40")]
    ['alp', 'unary', 'unary@3600', 'unary@3600/20', 'unary@300//40']
    >>> [q.label for q in parse_fleet_queries("alp, unary@3600/20", max_passages_day=40)]
    ['alp@30//40', 'unary@3600/20/40']
    >>> parse_fleet_queries("krr@300")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estimators.registry.PlanError: krr@300: krr reports one station per 30-s epoch: a span longer than 30 s needs...
    """
    known = mechanism_names(queryable_only=True)
    out: list[FleetQuery] = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _QUERY.match(part)
        if m is None or (m.group(3) == "" and m.group(4) is None):
            raise PlanError(f"{part.strip()!r}: name a query as MECH, MECH@SPAN, MECH@SPAN/P or MECH@SPAN/P/M "
                            f"(e.g. unary@3600/20, or unary@3600//40 for at most 40 passages a day)")
        name = m.group(1)
        if name not in known:
            raise PlanError(f"unknown query mechanism {name!r}; choose from {', '.join(known)}")
        day = max_passages_day if m.group(4) is None else int(m.group(4))
        q = (FleetQuery(name, span_s, max_passages, day) if m.group(2) is None else
             FleetQuery(name, int(m.group(2)), int(m.group(3)) if m.group(3) else None, day))
        try:
            check_span_request(name, q.span_s, q.max_passages, q.max_passages_day)
        except PlanError as exc:
            raise PlanError(f"{part.strip()}: {exc}") from exc
        out.append(q)
    if not out:
        raise PlanError(f"name at least one query ({', '.join(known)})")
    labels = [q.label for q in out]
    if len(set(labels)) < len(labels):
        raise PlanError("a query is named twice")
    return tuple(out)


def round_down_2sig(n: int) -> int:
    """``n`` rounded DOWN to two significant digits (the shuffled epsilon's cache key).

    >>> [round_down_2sig(n) for n in (1, 99, 100, 123, 999, 12_345, 1_000_001)]
    [1, 99, 100, 120, 990, 12000, 1000000]
    """
    if n < 100:
        return n
    step = int(10 ** (len(str(n)) - 2))
    return n // step * step


def share_epsilon(total: float, share: float, delta: float) -> float:
    """The epsilon at ``delta`` of a ``sqrt(share) mu``-GDP mechanism, ``mu`` meeting (total, delta).

    >>> round(share_epsilon(2.5, 1.0, 1e-6), 6)
    2.5
    """
    from scipy.optimize import brentq
    mu_i = _mu(total, delta) * math.sqrt(share)
    return float(brentq(lambda e: budget.gaussian_delta(e, mu_i) - delta, 1e-9, 200.0, xtol=1e-12))


def _mu(epsilon: float, delta: float) -> float:
    """The mu of the mu-GDP curve through (epsilon, delta)."""
    from scipy.optimize import brentq
    return float(brentq(lambda m: budget.gaussian_delta(epsilon, m) - delta, 1e-6, 100.0, xtol=1e-12))


def _local_day(locals_: list[tuple[float, int]], delta: float) -> float:
    """The local day of reports ``(epsilon, releases)`` per query: queries of one span are one
    mechanism per release (their epsilons add; optimal composition), different spans compose as
    a heterogeneous sequence (:func:`privacy.day_epsilon`: basic or advanced)."""
    if not locals_:
        return 0.0
    if len({r for _, r in locals_}) == 1:
        return budget.local_day(sum(e for e, _ in locals_), locals_[0][1], delta)
    if any(math.isinf(e) or e > 500 for e, _ in locals_):
        return sum(e * r for e, r in locals_)
    return privacy.day_epsilon([e for e, r in locals_ for _ in range(r)], delta)


def _local_parts(accounts: list[budget.EpochAccount], charges: list[float], epochs: int,
                 delta: float) -> list[tuple[float, int]]:
    """Each query's local day as ``(epsilon, times)`` pure steps: its reports ``charges`` each,
    or with a day cap the cheaper of its at most 2M differing reports and its M moved passages."""
    out = []
    for a, c in zip(accounts, charges, strict=True):
        r = a.releases(epochs)
        if a.day_cap is None:
            out.append((c, r))
            continue
        options = [(c, min(r, 2 * a.day_cap)), (a.pair, a.day_cap)]
        out.append(min(options, key=lambda o: budget.local_day(o[0], o[1], delta)))
    return out


def _vehicle_day(accounts: list[budget.EpochAccount], epochs: int, delta: float,
                 charges: list[float] | None = None) -> tuple[float, float]:
    """(local, through the release) day epsilon of a vehicle answering every account's query
    (``charges``: each query's local charge per report, default the account's own)."""
    local = _local_day(_local_parts(accounts, charges or [a.local for a in accounts], epochs, delta), delta)
    if any(math.isinf(a.local) for a in accounts):  # a query with no shuffled bound: the day has none either
        return local, math.inf
    parts = [(a, a.releases(epochs)) for a in accounts if a.plds]
    shuffled = min(local, budget.day_epsilon_of(parts, delta)) if parts else 0.0
    return local, shuffled


QueryTuple = (tuple[MechanismSpec, Mechanism, int] | tuple[MechanismSpec, Mechanism, int, int, int]
              | tuple[MechanismSpec, Mechanism, int, int, int, int | None])


def vehicle_day(queries: Sequence[QueryTuple], n: int, release: str = "aggregate", epochs: int = 2880,
                delta: float = 1e-6) -> dict[str, float]:
    """A vehicle's whole day answering every query of ``queries`` -- ``(spec, built mechanism,
    stations)``, or ``(spec, mechanism, stations, span_s, passages[, day cap])`` for a span query or a
    capped one -- once per
    release: ``local`` (what it sends, no shuffler: every round of every report) and ``shuffled``
    (through the shuffler's ``release`` among ``n`` reports, never above ``local``; ``release =
    "local"``: the local figure only). Infinite where some query has no shuffled bound (Sampling
    Privacy)."""
    full = [(q[0], q[1], q[2], q[3] if len(q) > 3 else budget.EPOCH_S, q[4] if len(q) > 4 else 1,
             q[5] if len(q) > 5 else None) for q in queries]
    charges = [report_charge(s, m, v, min(p, v)) for s, m, v, _, p, _ in full]
    accs = [budget.epoch_account(s, m, v, n, "permuted" if release == "local" else release, span_s=span,
                                 passages=p, day_cap=cap) for s, m, v, span, p, cap in full]
    if release == "local":
        local = _local_day(_local_parts(accs, charges, epochs, delta), delta)
        return {"local": local, "shuffled": local}
    local, shuffled = _vehicle_day(accs, epochs, delta, charges)
    return {"local": local, "shuffled": shuffled}


def fleet_plan(population: int, expected_yes: float, stations: int, release: str = "aggregate",
               epochs: int = 2880, delta: float = 1e-6, day_budget: float | None = None,
               mechanisms: tuple[str, ...] | None = None,
               queries: Sequence[FleetQuery] | None = None) -> dict[str, Any]:
    """The per-query figures and the vehicle's day; the keys are the ``plan fleet --json`` contract.
    ``queries`` (each a mechanism at a span, :class:`FleetQuery`) or ``mechanisms`` (each at 30 s);
    default: the registry's default queries at 30 s. ``queries`` is keyed by each query's label."""
    if population < 1 or not 0 <= expected_yes <= population or stations < 1:
        raise PlanError("need --population >= 1, 0 <= --expected-yes <= population and --stations >= 1")
    if queries is None:
        queries = tuple(FleetQuery(n) for n in (mechanisms or default_query_mechanisms()))
    by = {q.label: q for q in queries}
    if len(by) < len(queries):
        raise PlanError("a query is named twice")
    names = list(by)
    span = {k: (q.span_s, q.passages(stations), q.max_passages_day) for k, q in by.items()}
    out: dict[str, dict[str, Any]] = {}
    params: dict[str, dict[str, float]] = {n: {} for n in names}
    kept = list(names)
    factor = 1.0
    if day_budget is not None:
        for name in names:  # a query that cannot fit even the whole budget alone is left out, and said so
            spec = get_spec(by[name].mechanism)
            ok, why = fitting.can_fit(spec, stations, population, day_budget, release, epochs, delta, *span[name])
            if not ok:
                out[name] = {"fits": False, "budget_share": day_budget, "why": why,
                             "search": fitting.FAMILIES[spec.name].why if spec.name in fitting.FAMILIES else ""}
        kept = [n for n in names if n not in out]
        history: fitting.History = {}  # this plan's searches: each re-fit starts from the last ones' brackets
        for _ in range(8):
            share = factor / max(len(kept), 1)
            target = share_epsilon(day_budget, share, delta)
            still: list[str] = []
            for name in kept:
                fit = fitting.fit_budget(get_spec(by[name].mechanism), stations, population, expected_yes, target,
                                        release, epochs, delta, tol=_FLEET_TOL, span_s=span[name][0],
                                        passages=span[name][1], day_cap=span[name][2], history=history)
                out[name] = {"fits": fit["fits"], "budget_share": target, "search": fit["search"]}
                if fit["fits"]:
                    params[name] = fit["params"]
                    still.append(name)
                else:
                    out[name]["why"] = fit["why"] + f" (its share: {target:.4g})"
            if len(still) < len(kept):  # re-split among those that fit
                kept = still
                continue
            day = planned_day([by[n] for n in kept], params, population, stations, release, epochs, delta)
            if day <= day_budget:
                break
            # the composed day came out at `day`: shrink the shares by the ratio of mu^2 (GDP) that
            # maps it onto the budget, and a little more (the fits round toward the private side)
            factor *= min(0.98, (_mu(day_budget, delta) / _mu(day, delta)) ** 2 * 0.995) if math.isfinite(day) \
                else 0.5
        else:
            raise PlanError("could not split the day budget so that the composed day fits; give a larger one")
    accounts: dict[str, budget.EpochAccount] = {}
    charges: dict[str, float] = {}
    for name in kept:
        q = by[name]
        spec = get_spec(q.mechanism)
        mech = spec.build(params[name], stations)
        acc = _account(q, params[name], stations, population, release)
        accounts[name] = acc
        charges[name] = report_charge(spec, mech, stations, span[name][1])
        fig = budget.release_figures(acc, epochs, delta)
        sd = fitting.headline_sd(spec, mech, expected_yes, population)
        # the curator at exactly the budget this query got: its share of the day budget, or its own day
        reference = out[name]["budget_share"] if day_budget is not None else fig["epsilon_day_shuffled"]
        out.setdefault(name, {}).update({
            "fits": True, "mechanism": q.mechanism, "span_s": q.span_s, "max_passages": span[name][1],
            "max_passages_day": q.max_passages_day,
            "releases": acc.releases(epochs), "params": dict(mech.params), "estimator": spec.headline, "sd": sd,
            "curator_budget": reference,
            "central_limit_sd": (budget.central_limit_sd(reference, delta, epochs, span_s=q.span_s,
                                                         passages=span[name][1], n_stations=stations,
                                                         day_cap=q.max_passages_day)
                                 if 0 < reference < math.inf else math.nan),
            "epsilon": charges[name], **fig})
    local, shuffled = _vehicle_day(list(accounts.values()), epochs, delta, list(charges.values()))
    left_out = [n for n in names if n not in accounts]
    return {
        "mechanisms": names, "release": release, "population": population, "expected_yes": expected_yes,
        "stations": stations, "epochs": epochs, "delta": delta, "day_budget": day_budget,
        "epsilon_day_vehicle": shuffled, "epsilon_day_vehicle_local": local,
        "headline_epsilon": "epsilon_day_vehicle",
        "split": ("none: every query at its default parameters" if day_budget is None else
                  "mu^2 split equally across the queries that fit (Gaussian-DP shares), each query's parameters "
                  "chosen for its share, the composed day checked against the budget"),
        "left_out": left_out, "queries": {n: out[n] for n in names if n in out},
        "central_limit_sd_note": "per query: a trusted curator answering that query alone with Gaussian noise at "
                                 "the same span and passages, at exactly the budget the query got (curator_budget: "
                                 "its share of the day budget, or without one its own day)",
    }


def planned_day(queries: Sequence[FleetQuery], params: Mapping[str, Mapping[str, float]], population: int,
                stations: int, release: str = "aggregate", epochs: int = 2880, delta: float = 1e-6) -> float:
    """A vehicle's whole day through ``release`` across ``queries`` at ``params`` (by label, as
    :func:`fleet_plan` returns them): the figure its day budget is checked against."""
    accounts = [_account(q, dict(params[q.label]), stations, population, release) for q in queries]
    return _vehicle_day(accounts, epochs, delta)[1]


def _account(q: FleetQuery, params: dict[str, float], stations: int, population: int,
             release: str) -> budget.EpochAccount:
    spec = get_spec(q.mechanism)
    return budget.epoch_account(spec, spec.build(params, stations), stations, population, release,
                                span_s=q.span_s, passages=q.passages(stations), day_cap=q.max_passages_day)
