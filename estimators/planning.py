"""What a query will cost and how good its answers can be, before anything runs.

Pure computation behind the ``plan`` command: builds the mechanism from the papers'
parameter names, takes its brute-force and closed-form epsilons, composes them over a day
of epochs, and evaluates the exact standard deviation of the headline estimator at the
expected count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

import estimators.budget as budget
import estimators.figures as figures
import estimators.fit as fitting
import estimators.ledger as ledger
import estimators.privacy as privacy  # the submodule, not through the package (no import cycle)
import estimators.shuffle as shuffle

from .mechanisms import Mechanism
from .registry import REGISTRY, PlanError, get_spec, mechanism_names

__all__ = ["DEFAULTS", "EPOCHS_PER_DAY", "MECHANISMS", "PlanError", "build_mechanism", "check_span_request", "plan",
           "shuffled_figures"]

EPOCHS_PER_DAY = 2880  # 30-second epochs

# The papers' evaluation values (Differential Privacy by Sampling §6 and App. A, Anonymized Local
# Privacy §VII-A), from the registry.
DEFAULTS: dict[str, dict[str, float]] = {name: dict(spec.defaults) for name, spec in REGISTRY.items()}
MECHANISMS = mechanism_names()
USEFUL_RELATIVE_HALFWIDTH = 1.0  # warn when the 95% half-width exceeds the count itself


def build_mechanism(name: str, params: Mapping[str, float], stations: int = 1) -> Mechanism:
    """The mechanism ``name`` with the papers' defaults overridden by ``params``."""
    return get_spec(name).build(params, stations)


def check_span_request(name: str, span_s: int, max_passages: int | None, day_cap: int | None = None) -> None:
    """:class:`PlanError` (one line saying why) for a span a query of ``name`` cannot have: not a
    multiple of 30 s dividing a day, a passage cap outside 1..span/30, or a station-valued
    mechanism (one station per report) over a span longer than 30 s. Nothing is computed.

    >>> check_span_request("krr", 3600, None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estimators.registry.PlanError: krr reports one station per 30-s epoch: a span longer than 30 s needs a per-sensor...
    """
    budget.check_span(span_s, max_passages)
    budget.check_day_cap(day_cap)
    spec = get_spec(name)
    if span_s != budget.EPOCH_S and not spec.per_sensor:
        per_sensor = ", ".join(n for n in MECHANISMS if REGISTRY[n].per_sensor and REGISTRY[n].queryable)
        raise PlanError(f"{name} reports one station per 30-s epoch: a span longer than 30 s needs a per-sensor "
                        f"mechanism ({per_sensor})")


def plan(name: str, population: int, expected_yes: float, stations: int = 1,
         params: Mapping[str, float] | None = None, epochs: int = EPOCHS_PER_DAY,
         delta: float = 1e-6, daily_budget: float | None = None, shuffle_size: int | None = None,
         release: str = "permuted", day_budget: float | None = None, span_s: int = budget.EPOCH_S,
         max_passages: int | None = None, max_passages_day: int | None = None) -> dict[str, Any]:
    """Cost and accuracy of a query; the keys are the ``plan --json`` contract.

    ``span_s``: one report per span (a multiple of 30 s dividing a day) naming up to ``P``
    stations (``max_passages``, default span / 30, at most ``stations``): ``expected_yes`` is then
    the span's expected flow, ``sd`` the span flow's, ``epochs`` still the day's 30-s epochs (its
    ``releases`` = epochs / (span / 30) reports are composed), and ``central_limit_sd`` the
    curator's at the same span, P and budget (:func:`budget.central_limit_sd`).
    ``max_passages_day`` (M): a device names at most M passages of the query a day, so the day
    composes each station's PLDs M times each way (:class:`budget.EpochAccount`) and the curator's
    L2 sensitivity over the day is ``sqrt(2M)``.

    Sampling Privacy at the papers' defaults, 100 of 10,000 vehicles at the station: the
    difference estimator's sd is ``sqrt(Yes (1 - pis) / pis)`` = ``sqrt(100 * 0.55 / 0.45)``:

    >>> p = plan("sp", population=10_000, expected_yes=100)
    >>> round(p["sd"], 3), round(p["halfwidth_95"], 2)  # 1.96 sd
    (11.055, 21.67)
    """
    from scipy.stats import norm
    check_span_request(name, span_s, max_passages, max_passages_day)
    if population < 1:
        raise PlanError("--population must be >= 1")
    if day_budget is not None and not 0 < day_budget < math.inf:
        raise PlanError("--day-budget must be a positive number")
    if shuffle_size is not None and shuffle_size < 1:
        raise PlanError("--shuffle-size must be >= 1")
    if not 0 <= expected_yes <= population:
        raise PlanError("--expected-yes must be between 0 and the population")
    spec = get_spec(name)
    if release not in budget.RELEASES:
        raise PlanError(f"unknown release {release!r}; choose {' or '.join(budget.RELEASES)}")
    if stations < 1:
        raise PlanError("--stations must be >= 1")
    passages = budget.span_passages(span_s, max_passages, stations, max_passages_day)
    releases = budget.releases_in(epochs, span_s)
    differ = releases if max_passages_day is None else min(releases, 2 * max_passages_day)
    fit: dict[str, Any] | None = None
    if day_budget is not None:
        if params:
            raise PlanError("--day-budget chooses the parameters: give no --param with it")
        fit = fitting.fit_budget(spec, stations, shuffle_size or population, expected_yes, day_budget, release,
                                epochs, delta, span_s=span_s, passages=passages, day_cap=max_passages_day)
        if not fit["fits"]:
            raise PlanError(f"{name} cannot meet a day budget of {day_budget:g} through the {release} release: "
                            f"{fit['why']} ({fit['search']})")
        params = fit["params"]
    mech = spec.build(params or {}, stations)
    eps = privacy.mechanism_epsilon(mech)
    epsilon = spec.report_epsilon(mech, stations, passages)
    # one station is enough for a plan; combination weights at the plan's design point
    ests = spec.estimators(mech, stations=np.array([1]), design=(float(expected_yes), float(population)))
    sds = {k: float(np.sqrt(e.variance(expected_yes, population))[0]) for k, e in ests.items()}
    head = spec.headline
    sd = sds[head]
    z95, z99 = float(norm.ppf(0.975)), float(norm.ppf(0.995))
    lo, hi = ests[head].score_interval(np.array([float(expected_yes)]), population, 0.95)
    out: dict[str, Any] = {
        "mechanism": name,
        "params": dict(mech.params),
        "population": population,
        "expected_yes": expected_yes,
        "stations": stations,
        "estimator": head,
        "epsilon": epsilon,
        "epsilon_per_answer": eps.epsilon,
        "epsilon_per_round": list(eps.per_round),
        "epsilon_linked_rounds": eps.epsilon_linked,
        "epsilon_closed_form": spec.closed_form_epsilon(mech),
        "epochs": epochs,
        "span_s": span_s,
        "max_passages": passages,
        "max_passages_day": max_passages_day,
        "releases": releases,
        "delta": delta,
        # with a day cap M at most 2M releases differ between two days of a vehicle
        "epsilon_day_basic": privacy.basic_composition(epsilon, differ),
        "epsilon_day_advanced": (privacy.advanced_composition(epsilon, differ, delta) if epsilon < 500
                                 else math.inf),  # e^eps overflows; basic composition is the figure there
        "sd": sd,
        "sd_by_estimator": sds,
        "halfwidth_95": z95 * sd,
        "halfwidth_99": z99 * sd,
        "lattice_step": float(ests[head].lattice_step[0]),
        "score_interval_95_at_expected": [float(lo[0]), float(hi[0])],
    }
    out["epsilon_day_optimal"] = budget.local_day(epsilon, differ, delta)
    if max_passages_day is not None and spec.per_sensor:  # M moved passages, each a Yes and a No answer
        pair = sum(budget.span_round_epsilons(spec, mech, max(2, stations), 1))
        out["epsilon_day_optimal"] = min(out["epsilon_day_optimal"], budget.local_day(pair, max_passages_day, delta))
    # the guarantee is the smallest valid bound, never a larger one
    out["epsilon_day"] = min(out["epsilon_day_basic"], out["epsilon_day_advanced"], out["epsilon_day_optimal"])
    n = shuffle_size or population
    round_eps = budget.span_round_epsilons(spec, mech, stations, passages) if passages > 1 else [0.0]
    ratios = (budget.span_ratios(spec, mech, stations, passages) if max(round_eps, default=0.0) <= budget.CLONE_MAX
              else None)
    if ratios is not None:
        out.update(shuffled_figures(ratios, n, differ, delta))
    else:  # a span report too revealing to amplify (a round's epsilon above CLONE_MAX): the local figures
        out.update({"shuffle_size": n, "epsilon_shuffled": sum(round_eps),
                    "epsilon_day_shuffled": budget.local_day(sum(round_eps), differ, delta),
                    "shuffle_trust": shuffle.TRUST_ASSUMPTION})
    out["epsilon_day_shuffled_permuted"] = out["epsilon_day_shuffled"]
    out["release"] = release
    if release == "aggregate":
        acc = budget.epoch_account(spec, mech, stations, n, release, ratios if passages == 1 else None,
                                   span_s=span_s, passages=passages, day_cap=max_passages_day)
        out.update(budget.release_figures(acc, epochs, delta))
        # both are valid bounds for the counts (the permuted one by post-processing)
        out["epsilon_day_shuffled"] = min(out["epsilon_day_shuffled"], out["epsilon_day_shuffled_permuted"])
    else:
        out["accounting"] = "the clone bound of the permuted release"
    if passages == 1:  # the one per-epoch figure every other place states too (estimators/figures.py), at this n
        out["epsilon_shuffled"] = figures.epoch_epsilon(spec, mech, stations, n, release, delta)
    # where the shuffled accounting cannot reach delta it would give the local day: say so instead (null)
    clones = (shuffle.clone_plds(ratios, n) if ratios is not None and not math.isinf(out["epsilon_day_shuffled"])
              else [])
    permuted_why = figures.uncertifiable([clones], releases, delta) if clones else None
    if permuted_why is not None:
        out["epsilon_day_shuffled_permuted"] = math.nan
    why = figures.uncertifiable([clones, list(acc.plds) if release == "aggregate" else []], releases, delta)
    if clones and why is not None:
        out["epsilon_day_shuffled"] = math.nan
        out["epsilon_day_shuffled_why"] = why
    if math.isinf(out["epsilon_day_shuffled"]):
        out["accounting"] = budget.NO_BOUND_NOTE
    out["epsilon_day_vehicle"] = out["epsilon_day_shuffled"]
    out["headline_epsilon"] = "epsilon_day_vehicle"
    out["day_budget"] = day_budget
    reference = day_budget if day_budget is not None else out["epsilon_day_vehicle"]
    out["central_limit_sd"] = (budget.central_limit_sd(reference, delta, epochs, span_s=span_s, passages=passages,
                                                       n_stations=stations, day_cap=max_passages_day)
                               if 0 < reference < math.inf else math.nan)  # NaN < x is False: NaN too
    if fit is not None:
        out["budget_search"] = {k: v for k, v in fit.items() if k not in ("params", "fits")}
    if daily_budget is not None:
        out["daily_budget"] = daily_budget
        # what a device's local ledger charges per report (every round; a span's whole report)
        out["epochs_within_budget"] = privacy.epochs_within_budget(
            ledger.report_charge(spec, mech, stations, passages), daily_budget, delta, releases)
    for stat, value in spec.extra_statistics(mech, int(population - expected_yes)).items():
        out[f"crowd_size_{stat}"] = value
    out["warnings"] = _warnings(out)
    return out


def shuffled_figures(ratios: tuple[shuffle.VariationRatio, ...], n: int, epochs: int = EPOCHS_PER_DAY,
                     delta: float = 1e-6) -> dict[str, Any]:
    """The shuffled release's figures beside the local ones (the ``plan --json`` keys): per report
    (an epoch's or a span's, ``ratios``) and over ``epochs`` reports at ``n`` reports per shuffle,
    the trust assumption they rest on, and the variation-ratio figure, which is shown but not
    published (estimators/shuffle.py)."""
    day = shuffle.shuffled_day(ratios, n, epochs, delta)
    return {
        "shuffle_size": n,
        "epsilon_shuffled": day.epsilon,
        "epsilon_day_shuffled": day.epsilon_day,
        "shuffle_trust": shuffle.TRUST_ASSUMPTION,
        "shuffled_variation_ratio_not_a_bound": {
            "epsilon": day.epsilon_variation_ratio, "epsilon_day": day.epsilon_day_variation_ratio,
            "why": "Wang et al.'s variation-ratio pair fails an exact check for reports that can answer "
                   "neither x1 nor x1' (docs/statistics.md); shown for comparison, never published"},
    }


def _warnings(out: Mapping[str, Any]) -> list[str]:
    warnings: list[str] = []
    yes = float(out["expected_yes"])
    if out["halfwidth_95"] > USEFUL_RELATIVE_HALFWIDTH * max(yes, 1.0):
        warnings.append(
            f"not a useful setting: the standard deviation is {out['sd']:.4g} for a true count of {yes:g} "
            f"(95% half-width {out['halfwidth_95']:.4g}); the estimates will be dominated by noise"
        )
    if math.isinf(out["epsilon"]):
        warnings.append("epsilon is infinite: some report is possible under one truth and impossible under another")
    elif out["epsilon"] > 5:
        what = "per-epoch" if out["span_s"] == budget.EPOCH_S else f"per-report (one {out['span_s']}-s span's)"
        warnings.append(f"weak privacy: {what} local epsilon {out['epsilon']:.3g} (> 5)")
    if math.isinf(out["epsilon_linked_rounds"]):
        warnings.append("the two rounds must never be linkable: a linked pair has infinite epsilon")
    return warnings
