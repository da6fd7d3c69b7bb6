"""A vehicle's day across every query it answers (``ptt plan fleet``).

A vehicle answers every active query in every epoch, so its day is the composition of every
query's epochs: locally, the sum of the queries' per-epoch epsilons composed optimally over
the day; through the shuffler, the queries' epoch PLDs (:func:`budget.epoch_account`: exact
for the aggregate release where it exists, else the clone bound) composed over the day.

With a day budget ``B`` the budget is split in the Gaussian sense: mu^2 adds under
composition, so each of the ``Q`` queries gets the epsilon of ``mu_B / sqrt(Q)``-GDP at the
same delta (``mu_B``: the mu whose (B, delta) curve point is met), its parameters are chosen
for that share (:func:`budget.fit_budget`), and the chosen queries' PLDs are composed to
check the whole day; if it exceeds ``B`` the shares shrink by the ratio of mu^2 between ``B`` and the
composed day (a little more) and the search repeats from the brackets it has already evaluated. A
query that cannot fit even alone is reported (``fits: false``, the reason) and left out of
the vehicle's day; the others share the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import estimators.budget as budget
import estimators.privacy as privacy

from .mechanisms import Mechanism
from .registry import MechanismSpec, PlanError, default_query_mechanisms, get_spec

__all__ = ["fleet_plan", "share_epsilon", "vehicle_day"]

_FLEET_TOL = 1e-2  # parameter precision of each query's fit (relative): ~1% of sd, a third of the time


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


def _vehicle_day(accounts: list[budget.EpochAccount], epochs: int, delta: float) -> tuple[float, float]:
    """(local, through the release) day epsilon of a vehicle answering every account's query."""
    local_epoch = sum(a.local for a in accounts)
    local = privacy.optimal_composition(local_epoch, epochs, delta) if accounts else 0.0
    if any(math.isinf(a.local) for a in accounts):  # a query with no shuffled bound: the day has none either
        return local, math.inf
    plds = [p for a in accounts for p in a.plds]
    shuffled = min(local, budget.pld_day_epsilon(plds, epochs, delta)) if plds else 0.0
    return local, shuffled


def vehicle_day(queries: Sequence[tuple[MechanismSpec, Mechanism, int]], n: int, release: str = "aggregate",
                epochs: int = 2880, delta: float = 1e-6) -> dict[str, float]:
    """A vehicle's whole day answering every query of ``queries`` (spec, built mechanism, stations)
    in every epoch: ``local`` (what it sends, no shuffler) and ``shuffled`` (through the
    shuffler's ``release`` among ``n`` reports, never above ``local``; ``release = "local"``:
    the local figure only). Infinite where some query has no shuffled bound (Sampling Privacy)."""
    if release == "local":
        epoch = sum(s.report_epsilon(m, v) for s, m, v in queries)  # each query's published epsilon
        local = privacy.optimal_composition(epoch, epochs, delta) if queries else 0.0
        return {"local": local, "shuffled": local}
    accs = [budget.epoch_account(s, m, v, n, release) for s, m, v in queries]
    local, shuffled = _vehicle_day(accs, epochs, delta)
    return {"local": local, "shuffled": shuffled}


def fleet_plan(population: int, expected_yes: float, stations: int, release: str = "aggregate",
               epochs: int = 2880, delta: float = 1e-6, day_budget: float | None = None,
               mechanisms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The per-query figures and the vehicle's day; the keys are the ``plan fleet --json`` contract."""
    if population < 1 or not 0 <= expected_yes <= population or stations < 1:
        raise PlanError("need --population >= 1, 0 <= --expected-yes <= population and --stations >= 1")
    names = mechanisms or default_query_mechanisms()
    queries: dict[str, dict[str, Any]] = {}
    params: dict[str, dict[str, float]] = {n: {} for n in names}
    fitting = list(names)
    factor = 1.0
    if day_budget is not None:
        for name in names:  # a query that cannot fit even the whole budget alone is left out, and said so
            ok, why = budget.can_fit(get_spec(name), stations, population, day_budget, release, epochs, delta)
            if not ok:
                queries[name] = {"fits": False, "budget_share": day_budget, "why": why,
                                 "search": budget.FAMILIES[name].why if name in budget.FAMILIES else ""}
        fitting = [n for n in names if n not in queries]
        for _ in range(8):
            share = factor / max(len(fitting), 1)
            target = share_epsilon(day_budget, share, delta)
            still: list[str] = []
            for name in fitting:
                fit = budget.fit_budget(get_spec(name), stations, population, expected_yes, target, release,
                                        epochs, delta, tol=_FLEET_TOL)
                queries[name] = {"fits": fit["fits"], "budget_share": target, "search": fit["search"]}
                if fit["fits"]:
                    params[name] = fit["params"]
                    still.append(name)
                else:
                    queries[name]["why"] = fit["why"] + f" (its share: {target:.4g})"
            if len(still) < len(fitting):  # re-split among those that fit
                fitting = still
                continue
            accs = [_account(n, params[n], stations, population, release) for n in fitting]
            day = _vehicle_day(accs, epochs, delta)[1]
            if day <= day_budget:
                break
            # the composed day came out at `day`: shrink the shares by the ratio of mu^2 (GDP) that
            # maps it onto the budget, and a little more (the fits round toward the private side)
            factor *= min(0.98, (_mu(day_budget, delta) / _mu(day, delta)) ** 2 * 0.995) if math.isfinite(day) \
                else 0.5
        else:
            raise PlanError("could not split the day budget so that the composed day fits; give a larger one")
    accounts = {}
    for name in fitting:
        spec = get_spec(name)
        mech = spec.build(params[name], stations)
        acc = _account(name, params[name], stations, population, release)
        accounts[name] = acc
        fig = budget.release_figures(acc, epochs, delta)
        sd = budget.headline_sd(spec, mech, expected_yes, population)
        share = 1.0 / len(fitting)
        reference = day_budget if day_budget is not None else fig["epsilon_day_shuffled"]
        queries.setdefault(name, {}).update({
            "fits": True, "params": dict(mech.params), "estimator": spec.headline, "sd": sd,
            "central_limit_sd": (budget.central_limit_sd(reference, delta, epochs, share=share)
                                 if 0 < reference < math.inf else math.nan),
            "epsilon": acc.local, **fig})
    local, shuffled = _vehicle_day(list(accounts.values()), epochs, delta)
    left_out = [n for n in names if n not in accounts]
    return {
        "mechanisms": list(names), "release": release, "population": population, "expected_yes": expected_yes,
        "stations": stations, "epochs": epochs, "delta": delta, "day_budget": day_budget,
        "epsilon_day_vehicle": shuffled, "epsilon_day_vehicle_local": local,
        "headline_epsilon": "epsilon_day_vehicle",
        "split": ("none: every query at its default parameters" if day_budget is None else
                  "mu^2 split equally across the queries that fit (Gaussian-DP shares), each query's parameters "
                  "chosen for its share, the composed day checked against the budget"),
        "left_out": left_out, "queries": queries,
        "central_limit_sd_note": "per query: a trusted curator answering the same queries with Gaussian noise, "
                                 "the day's mu^2 split equally between them",
    }


def _account(name: str, params: dict[str, float], stations: int, population: int,
             release: str) -> budget.EpochAccount:
    spec = get_spec(name)
    return budget.epoch_account(spec, spec.build(params, stations), stations, population, release)
