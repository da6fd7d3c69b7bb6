"""A day's privacy through the shuffler's release, the curator reference, and the parameters
that meet a whole-day budget.

* :func:`epoch_account`: one epoch's dominating PLDs of what the analyst sees -- the exact
  aggregate release (:mod:`estimators.aggregate`) where it exists, else the clone bound of the
  permuted release (valid for the counts too, by post-processing). A vehicle's day composes
  them over the epochs (and, across queries, over every query it answers).
* :func:`central_limit_sd`: the reference point, a trusted curator adding Gaussian noise to
  each epoch's per-station counts. A move changes two stations by one (L2 sensitivity
  sqrt 2); ``T`` releases at noise ``sigma`` are mu-GDP with ``mu = sqrt(T) sqrt(2) / sigma``,
  which is (eps, delta)-DP for ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
  (Dong, Roth and Su, "Gaussian Differential Privacy", Corollary 2.13).
* :func:`fit_budget`: the mechanism's parameters minimising the headline sd within a day
  budget, over the one-parameter family :data:`FAMILIES` documents per mechanism.

>>> round(central_limit_sd(2.5, 1e-6), 1), round(central_limit_sd(4.0, 1e-6), 1), round(central_limit_sd(8.0, 1e-6), 1)
(138.2, 90.6, 49.6)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import estimators.aggregate as aggregate
import estimators.privacy as privacy
import estimators.shuffle as shuffle

from .mechanisms import Mechanism
from .registry import MechanismSpec, PlanError

__all__ = ["FAMILIES", "RELEASES", "EpochAccount", "Family", "central_limit_sd", "pld_day_epsilon", "epoch_account",
           "can_fit", "fit_budget", "gaussian_delta", "headline_sd", "release_figures"]

RELEASES = ("aggregate", "permuted")
NO_BOUND_NOTE = ("no shuffled bound: a report, or the rounds together, can be possible under one truth and "
                 "impossible under another (Sampling Privacy's rounds share one die: the difference of their "
                 "counts is the exact histogram of the devices that drew the sampling face)")
_COARSE = 2  # the search composes on a grid this much coarser (still an upper bound), the result on the fine one


def gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP; ``e^eps Phi(b)`` as ``exp(eps + log Phi(b))``, which is at most
    ``Phi(a)`` <= 1, so a day epsilon past ~709 does not overflow.

    >>> round(gaussian_delta(1.0, 1.0), 6), gaussian_delta(5000.0, 2.0)
    (0.126937, 0.0)
    """
    from scipy.stats import norm
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))


def central_limit_sd(budget: float, delta: float = 1e-6, epochs: int = 2880, share: float = 1.0) -> float:
    """The curator's per-epoch, per-station sd at a whole-day (budget, delta): ``sqrt(T) sqrt(2) / mu``
    with ``delta(budget; mu) = delta``. ``share``: the fraction of mu^2 one query gets when a
    curator answers several (mu^2 adds under composition)."""
    from scipy.optimize import brentq
    if budget <= 0:
        raise PlanError("a day budget must be > 0")
    mu = brentq(lambda m: gaussian_delta(budget, m) - delta, 1e-6, 100.0, xtol=1e-12)
    return math.sqrt(epochs) * math.sqrt(2.0) / (float(mu) * math.sqrt(share))


@dataclass(frozen=True)
class EpochAccount:
    """One epoch's PLDs for ``release``; ``exact``: the aggregate release's own accounting (else the
    clone bound of the permuted release); ``local``: the epoch's local epsilon (a cap)."""

    release: str
    plds: tuple[shuffle.Pld, ...]
    exact: bool
    local: float

    @property
    def note(self) -> str:
        if math.isinf(self.local):
            return NO_BOUND_NOTE
        if self.release == "permuted":
            return "the clone bound of the permuted release"
        return aggregate.EXACT_NOTE if self.exact else aggregate.FALLBACK_NOTE


def epoch_account(spec: MechanismSpec, mech: Mechanism, n_stations: int, n: int, release: str,
                  ratios: tuple[shuffle.VariationRatio, ...] | None = None) -> EpochAccount:
    """``ratios``: ``spec.shuffle_ratios(mech, n_stations)`` when the caller has them already
    (k-ary RR's over 3,220 stations take ~1 s)."""
    if release not in RELEASES:
        raise PlanError(f"unknown release {release!r}; choose {' or '.join(RELEASES)}")
    if ratios is None:
        ratios = spec.shuffle_ratios(mech, n_stations)
    local = sum(v.epsilon0 for v in ratios if v.beta > 0)
    if math.isinf(local):
        return EpochAccount(release, (), False, local)
    if release == "aggregate":
        plds = spec.aggregate_plds(mech, n_stations, n)
        if plds is not None:
            return EpochAccount(release, tuple(plds), True, local)
    return EpochAccount(release, tuple(shuffle.clone_plds(ratios, n)), False, local)


def pld_day_epsilon(plds: list[shuffle.Pld], epochs: int, delta: float, coarse: bool = False) -> float:
    """Epsilon at ``delta`` of ``epochs`` repetitions of ``plds`` (rounded up onto the grid)."""
    if not plds:
        return 0.0
    step = shuffle.grid_step(plds, epochs) * (_COARSE if coarse else 1)
    return shuffle.compose(plds, epochs, step=step).epsilon(delta)


def release_figures(acc: EpochAccount, epochs: int, delta: float) -> dict[str, Any]:
    """``epsilon_shuffled`` / ``epsilon_day_shuffled`` of the release (never above the local
    figures) and how they were accounted."""
    if math.isinf(acc.local):
        return {"release": acc.release, "epsilon_shuffled": math.inf, "epsilon_day_shuffled": math.inf,
                "accounting": acc.note}
    plds = list(acc.plds)
    epoch = plds[0].epsilon(delta) if len(plds) == 1 else aggregate.epsilon_of(plds, 1, delta)
    day = pld_day_epsilon(plds, epochs, delta)
    return {"release": acc.release, "epsilon_shuffled": min(acc.local, epoch),
            "epsilon_day_shuffled": min(privacy.optimal_composition(acc.local, epochs, delta), day),
            "accounting": acc.note}


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
    family searched when no member of this one fits."""

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


FAMILIES: dict[str, Family] = {
    "unary": Family("q", 1e-3, 0.499, True,
                    "bisection on q: a larger q is a post-processing of a smaller one (flip again), so the day "
                    "epsilon decreases in q and the sd increases"),
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
# later search (the fleet re-fitting a smaller share) starts from the tightest known bracket
_DAYS: dict[tuple[Any, ...], dict[float, float]] = {}


def _day_of(spec: MechanismSpec, fam: Family, value: float, n_stations: int, population: int, release: str,
            epochs: int, delta: float) -> float:
    """The (coarse-grid, still upper-bound) day epsilon of the family member ``value``, cached."""
    if len(_DAYS) > 64:
        _DAYS.clear()
    seen = _DAYS.setdefault((spec.name, fam.param, n_stations, population, release, epochs, delta), {})
    if value not in seen:
        mech = spec.build(_params(spec, fam, value), n_stations)
        acc = epoch_account(spec, mech, n_stations, population, release)
        local = privacy.optimal_composition(acc.local, epochs, delta)
        seen[value] = min(local, pld_day_epsilon(list(acc.plds), epochs, delta, coarse=True))
    return seen[value]


def can_fit(spec: MechanismSpec, n_stations: int, population: int, budget_: float, release: str, epochs: int,
            delta: float) -> tuple[bool, str]:
    """Whether the family's most private member fits ``budget_`` alone (one day evaluation)."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        return False, f"{spec.name}: no parameter family to search"
    while fam.fallback is not None:  # the last family holds the most private setting
        fam = fam.fallback
    end = (fam.hi if fam.private_when_larger else fam.lo) if fam.bisect else min(fam.grid)
    d = _day_of(spec, fam, end, n_stations, population, release, epochs, delta)
    if d <= budget_:
        return True, ""
    return False, (f"even its most private setting ({fam.param} = {end:g}) costs {d:.4g} over the day "
                   f"through the {release} release, more than {budget_:g}")


def fit_budget(spec: MechanismSpec, n_stations: int, population: int, expected_yes: float, budget: float,
               release: str, epochs: int, delta: float, tol: float = 1e-3) -> dict[str, Any]:
    """The family member with the smallest headline sd whose day epsilon (the release's, on the
    search's coarse grid: a valid upper bound) is at most ``budget``; ``{"fits": False, ...}``
    when none does. Bisection: Brent's method on the day epsilon, from the tightest bracket
    earlier searches evaluated; the answer is the least private *evaluated* member that fits
    (within ``tol`` of the root), so it fits by construction."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        raise PlanError(f"{spec.name}: no parameter family to search for a day budget (families: "
                        f"{', '.join(FAMILIES)})")
    while True:
        out = _fit_family(spec, fam, n_stations, population, expected_yes, budget, release, epochs, delta, tol)
        if out["fits"] or fam.fallback is None:
            return out
        fam = fam.fallback


def _fit_family(spec: MechanismSpec, fam: Family, n_stations: int, population: int, expected_yes: float,
                budget: float, release: str, epochs: int, delta: float, tol: float) -> dict[str, Any]:
    """:func:`fit_budget` within one family."""
    from scipy.optimize import brentq

    def day_of(value: float) -> float:
        return _day_of(spec, fam, value, n_stations, population, release, epochs, delta)

    tried: list[dict[str, float]] = []
    chosen: float | None = None
    if fam.bisect:
        private_end, loose_end = (fam.hi, fam.lo) if fam.private_when_larger else (fam.lo, fam.hi)
        if day_of(private_end) > budget:
            return {"fits": False, "search": fam.why, "why": f"even {fam.param} = {private_end:g} exceeds the budget"}
        if day_of(loose_end) <= budget:
            chosen = loose_end
        else:
            sign = 1.0 if fam.private_when_larger else -1.0  # sign * value grows toward the private end
            seen = _DAYS[(spec.name, fam.param, n_stations, population, release, epochs, delta)]
            fits = [v for v, d in seen.items() if d <= budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            over = [v for v, d in seen.items() if d > budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            a, b = min(fits, key=lambda v: sign * v), max(over, key=lambda v: sign * v)

            def gap(v: float) -> float:
                d = day_of(v)
                tried.append({fam.param: v, "epsilon_day": d})
                return d - budget

            brentq(gap, a, b, xtol=tol * 0.1, rtol=tol)
            fits = [v for v, d in seen.items() if d <= budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            chosen = min(fits, key=lambda v: sign * v)  # the least private evaluated member that fits
    else:
        best: tuple[float, float] | None = None
        for value in fam.grid:
            try:
                mech = spec.build(_params(spec, fam, value), n_stations)
            except PlanError:
                continue
            d = day_of(value)
            sd = headline_sd(spec, mech, expected_yes, population)
            tried.append({fam.param: value, "epsilon_day": d, "sd": sd})
            if d <= budget and (best is None or sd < best[1]):
                best = (value, sd)
        if best is None:
            return {"fits": False, "search": fam.why, "tried": tried,
                    "why": "no member of the family fits the budget"}
        chosen = best[0]
    params = _params(spec, fam, chosen)
    mech = spec.build(params, n_stations)
    return {"fits": True, "search": fam.why, "params": params, "chosen": {fam.param: chosen},
            "sd": headline_sd(spec, mech, expected_yes, population), "tried": tried}
