"""The parameters that meet a whole-day budget: one-parameter families searched per mechanism.

:func:`fit_budget` chooses the member with the smallest headline sd whose day epsilon (the
release's, :mod:`estimators.budget`) is within the budget; :func:`can_fit` asks whether even the
most private member fits. A query's span, passages and day cap (``day_cap``: the most
passages a device names a day, :meth:`budget.EpochAccount.parts`) are the account's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .budget import _COARSE, EPOCH_S, _day_rounding, day_epsilon_of, epoch_account
from .mechanisms import Mechanism
from .registry import MechanismSpec, PlanError

__all__ = ["FAMILIES", "Family", "can_fit", "fit_budget", "headline_sd"]


def headline_sd(spec: MechanismSpec, mech: Mechanism, expected_yes: float, population: int) -> float:
    ests = spec.estimators(mech, stations=np.array([1]), design=(float(expected_yes), float(population)))
    return float(np.sqrt(ests[spec.headline].variance(expected_yes, population))[0])


def _alp_mix(defaults: Mapping[str, float], lam: float) -> dict[str, float]:
    """ALP's parameters whose Yes row is ``(1 - lam) Yes + lam No`` of the defaults' table: with
    probability ``lam`` a device reports a fresh draw of a No vehicle's answer, a
    truth-independent post-processing (``lam = 0``: the papers' values; ``lam = 1``: no signal).
    The No row (``pisNo``, ``pi3``) is unchanged.

    >>> p = _alp_mix({"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.05, "pi3": 0.98}, 0.5)
    >>> round(p["pisYes1"], 6), round(p["pi1"], 6), round(p["pisYes2"], 6)
    (0.05, 0.965, 0.025)
    """
    d = dict(defaults)
    y1 = (1 - lam) * d["pisYes1"] + lam * d["pisNo"]
    pi1 = ((1 - lam) * d["pisYes1"] * d["pi1"] + lam * d["pisNo"] * d["pi3"]) / y1
    return {**d, "pisYes1": y1, "pi1": pi1, "pisYes2": (1 - lam) * d["pisYes2"]}


@dataclass(frozen=True)
class Family:
    """A one-parameter family searched for a day budget: ``param`` from ``lo`` to ``hi`` with the
    others at ``fixed`` (else the defaults), or ``to_params(defaults, value)`` when given.
    ``bisect``: the day epsilon is monotone in ``param`` (decreasing if
    ``private_when_larger``), so bisection finds the least private setting that fits;
    otherwise the ``grid`` is scanned and the smallest sd that fits wins. ``fallback``: the
    family searched when no member of this one fits. ``per_device``: the loose end is at least
    ``per_device / population`` (a flip probability far below one flip per crowd is never the
    answer, and its huge losses composed over a day cost minutes and gigabytes)."""

    param: str
    lo: float
    hi: float
    private_when_larger: bool
    why: str
    fixed: Mapping[str, float] = field(default_factory=dict)
    bisect: bool = True
    grid: tuple[float, ...] = ()
    to_params: Callable[[Mapping[str, float], float], dict[str, float]] | None = None
    fallback: Family | None = None  # searched when no member of this one fits
    per_device: float = 0.0

    def ends(self, population: int) -> tuple[float, float]:
        """``(private end, loose end)`` of the bisection at ``population`` devices."""
        lo = max(self.lo, min(self.per_device / max(population, 1), self.hi / 2)) if self.private_when_larger \
            else self.lo
        return (self.hi, lo) if self.private_when_larger else (self.lo, self.hi)


FAMILIES: dict[str, Family] = {
    "unary": Family("q", 1e-6, 0.499, True,
                    "bisection on q (from 10 flips per crowd): a larger q is a post-processing of a smaller one "
                    "(flip again), so the day epsilon decreases in q and the sd increases", per_device=10.0),
    "rr": Family("pi1", 1e-3, 0.999, False,
                 "pi2 = 1/2 (then two-coin RR is symmetric unary RR with q = (1 - pi1)/2), bisection on pi1",
                 fixed={"pi2": 0.5}),
    "krr": Family("epsilon", 1e-3, 12.0, False,
                  "bisection on the per-report epsilon (a smaller one is a post-processing of a larger one)"),
    "sp": Family("pis", 1e-4, 0.999, False, "bisection on pis (the truthful face's probability), pi0 as default"),
    # ALP: its sampling rates are the accuracy knob (through the aggregate release's exact
    # accounting the papers' s = 0.05 costs 0.33 a day; s = 0.45 about 2.4, sd 246), so the grid
    # over s goes first; when even the smallest s exceeds the budget, mixing its Yes row toward
    # its No row (a post-processing) takes the papers' setting further
    "alp": Family("s", 0.0, 0.0, False,
                  "a grid over the sampling rates pisYes1 = pisYes2 = pisNo = s, the rest at the papers' values",
                  bisect=False, grid=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.45, 0.49),
                  to_params=lambda d, v: {**d, "pisYes1": v, "pisYes2": v, "pisNo": v},
                  fallback=Family("mix", 0.0, 0.99, True,
                                  "bisection on mix: the Yes row mixed toward the No row (a device answers as a "
                                  "No vehicle w.p. mix), a truth-independent post-processing of the papers' "
                                  "mechanism, nested in mix", to_params=_alp_mix)),
}


def _params(spec: MechanismSpec, fam: Family, value: float) -> dict[str, float]:
    if fam.to_params is not None:
        return fam.to_params(spec.defaults, value)
    return {**fam.fixed, fam.param: value}


# the day epsilons evaluated so far, per (mechanism, stations, n, release, epochs, delta): a
# cache of values only; which brackets a search starts from is its caller's (``History``)
_DAYS: dict[tuple[Any, ...], dict[float, float]] = {}

History = dict[tuple[Any, ...], dict[float, float]]
"""The day epsilons one planning run's searches evaluated, per :func:`_key`: a later search of the
run (the fleet re-fitting a smaller share) starts from the tightest bracket they give. Owned by
the run, so what a search chooses depends on its arguments and that run alone, never on what
else ran in the process."""


def _day_of(spec: MechanismSpec, fam: Family, value: float, n_stations: int, population: int, release: str,
            epochs: int, delta: float, span_s: int = EPOCH_S, passages: int = 1,
            day_cap: int | None = None) -> float:
    """The (coarse-grid, still upper-bound) day epsilon of the family member ``value``, cached."""
    if len(_DAYS) > 64:
        _DAYS.clear()
    seen = _DAYS.setdefault(_key(spec, fam, n_stations, population, release, epochs, delta, span_s, passages,
                                 day_cap), {})
    if value not in seen:
        seen[value] = _account_day(spec, fam, value, n_stations, population, release, epochs, delta, span_s,
                                   passages, day_cap)
    return seen[value]


_PROBES: dict[tuple[Any, ...], dict[float, float]] = {}


def _probe_of(spec: MechanismSpec, fam: Family, value: float, n_stations: int, population: int, release: str,
              epochs: int, delta: float, span_s: int = EPOCH_S, passages: int = 1,
              day_cap: int | None = None) -> float:
    """A lower bound of :func:`_day_of` (its full figure when known), cached: the same composition
    of a probe account, whose station PLDs lie under the full account's (:func:`epoch_account`'s
    ``probe``; where there is nothing to probe, the full account itself)."""
    key = _key(spec, fam, n_stations, population, release, epochs, delta, span_s, passages, day_cap)
    known = _DAYS.get(key, {}).get(value)
    if known is not None:
        return known
    if len(_PROBES) > 64:
        _PROBES.clear()
    seen = _PROBES.setdefault(key, {})
    if value not in seen:
        seen[value] = _account_day(spec, fam, value, n_stations, population, release, epochs, delta, span_s,
                                   passages, day_cap, probe=True)
    return seen[value]


def _account_day(spec: MechanismSpec, fam: Family, value: float, n_stations: int, population: int, release: str,
                 epochs: int, delta: float, span_s: int = EPOCH_S, passages: int = 1, day_cap: int | None = None,
                 probe: bool = False) -> float:
    """The member's day (uncached): the cheaper of its local day and its release's composed on the
    coarse grid (rounded up). ``probe``: the probe account's, less what its grid's rounding can add:
    in exact arithmetic the probe's day is at most the full one, and the full one rounds up, so
    this is at most :func:`_day_of` whatever the two grids."""
    mech = spec.build(_params(spec, fam, value), n_stations)
    acc = epoch_account(spec, mech, n_stations, population, release, span_s=span_s, passages=passages,
                        day_cap=day_cap, probe=probe)
    parts = [(acc, acc.releases(epochs))]
    shuffled = day_epsilon_of(parts, delta, coarse=_COARSE) - (_day_rounding(parts, coarse=_COARSE) if probe else 0.0)
    return min(acc.local_day(acc.releases(epochs), delta), shuffled)


def _key(spec: MechanismSpec, fam: Family, n_stations: int, population: int, release: str, epochs: int,
         delta: float, span_s: int, passages: int, day_cap: int | None = None) -> tuple[Any, ...]:
    return (spec.name, fam.param, n_stations, population, release, epochs, delta, span_s,
            min(passages, n_stations), day_cap)


def can_fit(spec: MechanismSpec, n_stations: int, population: int, budget_: float, release: str, epochs: int,
            delta: float, span_s: int = EPOCH_S, passages: int = 1, day_cap: int | None = None) -> tuple[bool, str]:
    """Whether the family's most private member fits ``budget_`` alone (one day evaluation)."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        return False, f"{spec.name}: no parameter family to search"
    while fam.fallback is not None:  # the last family holds the most private setting
        fam = fam.fallback
    end = (fam.hi if fam.private_when_larger else fam.lo) if fam.bisect else min(fam.grid)
    d = _day_of(spec, fam, end, n_stations, population, release, epochs, delta, span_s, passages, day_cap)
    if d <= budget_:
        return True, ""
    return False, (f"even its most private setting ({fam.param} = {end:g}) costs {d:.4g} over the day "
                   f"through the {release} release, more than {budget_:g}")


def fit_budget(spec: MechanismSpec, n_stations: int, population: int, expected_yes: float, budget: float,
               release: str, epochs: int, delta: float, tol: float = 1e-3, span_s: int = EPOCH_S,
               passages: int = 1, day_cap: int | None = None, history: History | None = None) -> dict[str, Any]:
    """The family member with the smallest headline sd whose day epsilon (the release's, on the
    search's coarse grid: a valid upper bound) is at most ``budget``; ``{"fits": False, ...}``
    when none does. Bisection: Brent's method on the day epsilon, from the tightest bracket
    ``history``'s earlier searches evaluated (:data:`History`; none given: the family's ends); the
    answer is the least private *evaluated* member that fits
    (within ``tol`` of the root), so it fits by construction. ``span_s``, ``passages``, ``day_cap``:
    the query's span report and day cap (:func:`epoch_account`); ``epochs`` stays the 30-s epochs
    of the day."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        raise PlanError(f"{spec.name}: no parameter family to search for a day budget (families: "
                        f"{', '.join(FAMILIES)})")
    while True:
        out = _fit_family(spec, fam, n_stations, population, expected_yes, budget, release, epochs, delta, tol,
                          span_s, passages, day_cap, {} if history is None else history)
        if out["fits"] or fam.fallback is None:
            return out
        fam = fam.fallback


def _fit_family(spec: MechanismSpec, fam: Family, n_stations: int, population: int, expected_yes: float,
                budget: float, release: str, epochs: int, delta: float, tol: float, span_s: int,
                passages: int, day_cap: int | None, history: History) -> dict[str, Any]:
    """:func:`fit_budget` within one family."""
    where = _Where(n_stations, population, release, epochs, delta, span_s, passages, day_cap)
    tried: list[dict[str, float]] = []
    if fam.bisect:
        chosen, why = _bisect(spec, fam, where, budget, tol, tried, history.setdefault(_key(spec, fam, *where), {}))
        if chosen is None:
            return {"fits": False, "search": fam.why, "why": why}
    else:
        chosen, why = _scan(spec, fam, where, expected_yes, budget, tried)
        if chosen is None:
            return {"fits": False, "search": fam.why, "tried": tried, "why": why}
    params = _params(spec, fam, chosen)
    mech = spec.build(params, n_stations)
    return {"fits": True, "search": fam.why, "params": params, "chosen": {fam.param: chosen},
            "sd": headline_sd(spec, mech, expected_yes, population), "tried": tried}


class _Where(NamedTuple):
    """What a search's day figures are of, besides the member: :func:`_day_of`'s other arguments."""

    n_stations: int
    population: int
    release: str
    epochs: int
    delta: float
    span_s: int
    passages: int
    day_cap: int | None


def _bisect(spec: MechanismSpec, fam: Family, where: _Where, budget: float, tol: float,
            tried: list[dict[str, float]], seen: dict[float, float]) -> tuple[float | None, str]:
    """A bisection family's least private member that fits (None and why when none does):
    Brent's method on the day epsilon from the tightest bracket in ``seen`` (the days this
    planning run evaluated so far, :data:`History`; every day this search evaluates is added)."""
    from scipy.optimize import brentq

    def day(v: float) -> float:
        seen[v] = _day_of(spec, fam, v, *where)
        return seen[v]

    private_end, loose_end = fam.ends(where.population)
    if day(private_end) > budget:
        return None, f"even {fam.param} = {private_end:g} exceeds the budget"
    if day(loose_end) <= budget:
        return loose_end, ""
    sign = 1.0 if fam.private_when_larger else -1.0  # sign * value grows toward the private end

    def inside(fit: bool) -> list[float]:
        return [v for v, d in seen.items() if (d <= budget) == fit and sign * (v - private_end) <= 0
                and sign * (v - loose_end) >= 0]

    a, b = min(inside(True), key=lambda v: sign * v), max(inside(False), key=lambda v: sign * v)

    def gap(v: float) -> float:
        d = day(v)
        tried.append({fam.param: v, "epsilon_day": d})
        return d - budget

    if a > 0 and b > 0:
        # on log(value) to a relative tolerance: the bracket spans decades (unary's q from 1e-6
        # to 0.5), and an absolute tolerance of 1e-4 stopped q at 5.8e-5 when 2.8e-5 fitted
        # (10 million devices at a day of 2.5)
        la, lb = math.log(a), math.log(b)  # the ends themselves, not exp(log(a)): their days are known
        brentq(lambda u: gap(a if u == la else b if u == lb else math.exp(u)), la, lb, xtol=tol)
    else:
        brentq(gap, a, b, xtol=tol * 0.1, rtol=tol)
    return min(inside(True), key=lambda v: sign * v), ""  # the least private evaluated member that fits


def _scan(spec: MechanismSpec, fam: Family, where: _Where, expected_yes: float, budget: float,
          tried: list[dict[str, float]]) -> tuple[float | None, str]:
    """A grid family's member of least sd that fits (None and why when none does): the sds
    first (cheap), then the days (a composition each) in order of sd, up to the first that fits
    -- the same choice as trying them all. A member whose probe (a lower bound of its day, a
    tenth of the cost) is past the budget cannot fit: skipped."""
    sds: list[tuple[float, float]] = []
    for value in fam.grid:
        try:
            mech = spec.build(_params(spec, fam, value), where.n_stations)
        except PlanError:
            continue
        sds.append((headline_sd(spec, mech, expected_yes, where.population), value))
    for sd, value in sorted(sds):
        at_least = _probe_of(spec, fam, value, *where)
        if at_least > budget:
            tried.append({fam.param: value, "epsilon_day_at_least": at_least, "sd": sd})
            continue
        d = _day_of(spec, fam, value, *where)
        tried.append({fam.param: value, "epsilon_day": d, "sd": sd})
        if d <= budget:
            return value, ""
    return None, "no member of the family fits the budget"

