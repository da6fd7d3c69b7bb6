"""What a query will cost and how good its answers can be, before anything runs.

Pure computation behind the ``plan`` command: builds the mechanism from the papers'
parameter names, takes its brute-force and closed-form epsilons, composes them over a day
of epochs, and evaluates the exact standard deviation of the headline estimator at the
expected count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from scipy.stats import norm

from . import linear, mechanisms, privacy
from .mechanisms import Mechanism

__all__ = ["DEFAULTS", "EPOCHS_PER_DAY", "MECHANISMS", "PlanError", "build_mechanism", "plan"]

EPOCHS_PER_DAY = 2880  # 30-second epochs

# The papers' evaluation values (seed 000 §6 and App. A, seed 004 §VII-A); the poster
# (seed 002) gives none for the fresh-sample variant, nor seed 000 for pi0.
DEFAULTS: dict[str, dict[str, float]] = {
    "rr": {"pi1": 0.8, "pi2": 0.2},
    "sp-binary": {"pi0": 0.275, "pis": 0.45},
    "sp": {"pis": 0.45},
    "fresh": {"pisYes1": 0.5, "pisNo1": 0.05, "pisYes2": 0.05, "pisNo2": 0.05},
    "alp": {"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.05, "pi3": 0.98},
}
MECHANISMS = tuple(DEFAULTS)
_OPTIONAL = {"sp": {"pi0"}}
USEFUL_RELATIVE_HALFWIDTH = 1.0  # warn when the 95% half-width exceeds the count itself


class PlanError(ValueError):
    """A plan request that cannot be answered (unknown mechanism or parameter, bad value)."""


def build_mechanism(name: str, params: Mapping[str, float], stations: int = 1) -> Mechanism:
    """The mechanism ``name`` with the papers' defaults overridden by ``params``."""
    if name not in DEFAULTS:
        raise PlanError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}")
    allowed = set(DEFAULTS[name]) | _OPTIONAL.get(name, set())
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise PlanError(f"{name} takes parameters {', '.join(sorted(allowed))}; unknown: {', '.join(unknown)}")
    p = {**DEFAULTS[name], **params}
    try:
        if name == "rr":
            return mechanisms.two_coin_rr(p["pi1"], p["pi2"])
        if name == "sp-binary":
            return mechanisms.sp_binary(p["pi0"], p["pis"])
        if name == "sp":
            if stations < 1:
                raise PlanError("--stations must be >= 1")
            pi = None
            if "pi0" in p:  # baseline face given: the rest split evenly over the stations
                rest = (1.0 - p["pis"] - p["pi0"]) / stations
                pi = [p["pi0"], *([rest] * stations)]
            return mechanisms.sampling_privacy(stations, p["pis"], pi)
        if name == "fresh":
            return mechanisms.fresh_sample(p["pisYes1"], p["pisNo1"], p["pisYes2"], p["pisNo2"])
        return mechanisms.alp_optimal(p["pisYes1"], p["pisYes2"], p["pi1"], p["pi2"], p["pisNo"], p["pi3"])
    except PlanError:
        raise
    except ValueError as exc:
        raise PlanError(str(exc)) from exc


def _closed_form(name: str, mech: Mechanism) -> float:
    p = mech.params
    forms: dict[str, Callable[[], float]] = {
        "rr": lambda: privacy.rr_epsilon_closed_form(p["pi1"], p["pi2"]),
        "sp-binary": lambda: privacy.sp_binary_epsilon_closed_form(p["pi0"], p["pis"]),
        "sp": lambda: privacy.sp_epsilon_closed_form(mech.latent[0, :-1].tolist(), p["pis"]),
        # the poster gives no closed form: each round is a binary RR-like release
        "fresh": lambda: float("nan"),
        "alp": lambda: privacy.alp_epsilon_closed_form(**p),
    }
    return forms[name]()


def _headline(name: str, mech: Mechanism, population: int, yes: float) -> dict[str, linear.LinearEstimator]:
    if name in ("sp", "sp-binary"):
        return {"sp_difference": linear.sp_difference(mech, stations=[1])}
    if name == "rr":
        return {"rr": linear.rr_estimator(mech, stations=[1])}
    if name == "fresh":
        return {"fresh_difference": linear.fresh_difference(mech)}
    return linear.alp_estimators(mech, design_yes=yes, design_n=population)


def plan(name: str, population: int, expected_yes: float, stations: int = 1,
         params: Mapping[str, float] | None = None, epochs: int = EPOCHS_PER_DAY,
         delta: float = 1e-6) -> dict[str, Any]:
    """Cost and accuracy of a query; the keys are the ``plan --json`` contract."""
    if population < 1:
        raise PlanError("--population must be >= 1")
    if not 0 <= expected_yes <= population:
        raise PlanError("--expected-yes must be between 0 and the population")
    mech = build_mechanism(name, params or {}, stations)
    eps = privacy.mechanism_epsilon(mech)
    ests = _headline(name, mech, population, expected_yes)
    sds = {k: float(np.sqrt(e.variance(expected_yes, population))[0]) for k, e in ests.items()}
    head = "alp_average" if name == "alp" else next(iter(ests))
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
        "epsilon": eps.epsilon,
        "epsilon_per_round": list(eps.per_round),
        "epsilon_linked_rounds": eps.epsilon_linked,
        "epsilon_closed_form": _closed_form(name, mech),
        "epochs": epochs,
        "delta": delta,
        "epsilon_day_basic": privacy.basic_composition(eps.epsilon, epochs),
        "epsilon_day_advanced": privacy.advanced_composition(eps.epsilon, epochs, delta),
        "sd": sd,
        "halfwidth_95": z95 * sd,
        "halfwidth_99": z99 * sd,
        "score_interval_95_at_expected": [float(lo[0]), float(hi[0])],
    }
    if name == "alp":
        out["sd_components"] = {"yhat": sds["alp_yhat"], "bottom": sds["alp_bottom"],
                                "average": sds["alp_average"], "gls": sds["alp_gls"]}
        crowd = privacy.crowd_size(int(population - expected_yes), mech.params["pisNo"], mech.params["pi3"])
        out["crowd_size_mean"] = crowd.mean
        out["crowd_size_p01"] = crowd.p01
    out["warnings"] = _warnings(out)
    return out


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
        warnings.append(f"weak privacy: per-epoch epsilon {out['epsilon']:.3g} (> 5)")
    if math.isinf(out["epsilon_linked_rounds"]):
        warnings.append("the two rounds must never be linkable: a linked pair has infinite epsilon")
    return warnings
