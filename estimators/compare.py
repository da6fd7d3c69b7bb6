"""Mechanisms side by side at the same per-device epsilon: the equal-epsilon planner.

For a count at one of V stations (``Yes`` of ``N`` vehicles), each mechanism is tuned so that
the epsilon of what one device sends in an epoch equals ``epsilon``, and its estimator's exact
standard deviation, 95% half-width and lattice step are reported:

* ``sp``: Sampling Privacy over V stations with uniform ``pi_v``: the report epsilon is
  ``ln(1 + pis (V + 1)/(1 - pis))``, so ``pis = (e^eps - 1)/(e^eps + V)``; the difference
  estimator lives on a lattice of step ``1/pis``.
* ``alp``: ALP asked about each sensor, the papers' values except ``pisNo``, chosen so that the
  whole report's epsilon is at most ``epsilon`` with the smallest standard deviation.
* ``kary``: generalized randomized response over V + 1 outcomes (none or one of V stations).
* ``oue``: optimized unary encoding; ``olh``: optimized local hashing (Wang et al., "Locally
  Differentially Private Protocols for Frequency Estimation", USENIX Security 2017).

Each row also carries the shuffled figures at ``n = population`` (``epsilon_shuffled``,
``epsilon_day_shuffled``: Feldman-McMillan-Talwar's clone bound, which depends on the report's
epsilon alone, so rows at the same epsilon share them; estimators/shuffle.py).

The frequency oracles (kary, oue, olh) use the exact variance of their unbiased count
estimator, ``Var = N q (1 - q)/(p - q)^2 + Yes (1 - p - q)/(p - q)`` with support
probabilities ``p`` and ``q``; for ``kary`` it equals the statistics core's exact variance of
the same mechanism (a unit test checks it).

>>> rows = {r["mechanism"]: r for r in compare(1.0986, 47719, 100, 3220)}
>>> round(rows["oue"]["sd"], 1), round(rows["sp"]["sd"], 1)
(378.5, 401.3)
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from .linear import alp_estimators, rr_estimator, sp_difference
from .mechanisms import alp_optimal, kary_rr, sampling_privacy
from .privacy import per_sensor_report_epsilon
from .shuffle import TRUST_ASSUMPTION, VariationRatio, shuffled_day

__all__ = ["COMPARED", "compare", "kary_variances", "oracle_variance", "support_probabilities"]

COMPARED = ("sp", "alp", "kary", "oue", "olh")


def support_probabilities(name: str, epsilon: float, k: int) -> tuple[float, float]:
    """``(p, q)`` of a pure-LDP frequency oracle over ``k`` values at ``epsilon``.

    >>> support_probabilities("oue", math.log(3), 10)
    (0.5, 0.25)
    """
    e = math.exp(epsilon)
    if name == "kary":
        return e / (e + k - 1), 1.0 / (e + k - 1)
    if name == "oue":
        return 0.5, 1.0 / (e + 1.0)
    if name == "olh":
        g = max(2, int(round(e)) + 1)
        return e / (e + g - 1), 1.0 / g
    raise ValueError(f"{name!r} is not a frequency oracle")


def oracle_variance(p: float, q: float, n: float, yes: float) -> float:
    """Exact variance of the unbiased count ``(C - n q)/(p - q)`` of a frequency oracle."""
    return n * q * (1 - q) / (p - q) ** 2 + yes * (1 - p - q) / (p - q)


def _row(name: str, epsilon: float, params: dict[str, float], var: float, step: float,
         yes: float, note: str = "") -> dict[str, Any]:
    from scipy.stats import norm

    z95 = float(norm.ppf(0.975))
    sd = math.sqrt(max(var, 0.0))
    warnings = []
    if step > max(yes, 1.0):
        warnings.append(f"the estimate lives on a lattice of step {step:.4g} vehicles, larger than the expected "
                        f"count {yes:g}: single estimates jump in steps of that size")
    if z95 * sd > max(yes, 1.0):
        warnings.append(f"95% half-width {z95 * sd:.4g} exceeds the expected count {yes:g}")
    return {"mechanism": name, "epsilon": epsilon, "params": params, "sd": sd, "halfwidth_95": z95 * sd,
            "lattice_step": step, "note": note, "warnings": warnings}


def _alp(epsilon: float, n: int, yes: float, stations: int) -> dict[str, Any]:
    best: tuple[float, float] | None = None
    for pis_no in np.geomspace(1e-7, 0.5, 600):
        m = alp_optimal(pisNo=float(pis_no))
        if per_sensor_report_epsilon(m.output_table(0), stations) > epsilon + 1e-12:
            continue
        var = float(alp_estimators(m)["alp_average"].variance(yes, n)[0])
        if best is None or var < best[1]:
            best = (float(pis_no), var)
    if best is None:
        return {"mechanism": "alp", "epsilon": epsilon, "params": {}, "sd": None, "halfwidth_95": None,
                "lattice_step": None, "note": "no pisNo in [1e-7, 0.5] reaches this epsilon with the papers' "
                                             "other parameters", "warnings": ["not reachable"]}
    m = alp_optimal(pisNo=best[0])
    eps = per_sensor_report_epsilon(m.output_table(0), stations)
    return _row("alp", eps, dict(m.params), best[1], 0.0, yes,
                "the papers' parameters except pisNo, chosen for the smallest sd within the epsilon")


def compare(epsilon: float, population: int, expected_yes: float, stations: int) -> list[dict[str, Any]]:
    """One row per mechanism of :data:`COMPARED` at the same per-device epsilon."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("--epsilon must be a positive number")
    if population < 1 or stations < 1:
        raise ValueError("--population and --stations must be >= 1")
    if not 0 <= expected_yes <= population:
        raise ValueError("--expected-yes must be between 0 and the population")
    n, yes, v = population, float(expected_yes), stations
    e = math.exp(epsilon)
    pis = (e - 1.0) / (e + v)
    sp = sampling_privacy(v, pis) if v <= 400 else None
    if sp is not None:  # exact, from the core
        est = sp_difference(sp, stations=[1])
        sp_var, sp_step = float(est.variance(yes, n)[0]), float(est.lattice_step[0])
    else:  # the same closed form (MECHANISMS.md §3), without building a V-station table
        sp_var, sp_step = yes * (1 - pis) / pis, 1.0 / pis
    rows = [_row("sp", epsilon, {"pis": pis}, sp_var, sp_step, yes)]
    rows.append(_alp(epsilon, n, yes, v))
    notes = {"kary": "one value of V + 1 per vehicle", "oue": "a V + 1 bit vector per vehicle",
             "olh": "a hash seed and a hashed value per vehicle"}
    for name in ("kary", "oue", "olh"):
        p, q = support_probabilities(name, epsilon, v + 1)
        # (C - n q)/(p - q): one more supporting report moves the estimate by 1/(p - q)
        rows.append(_row(name, epsilon, {"p": p, "q": q}, oracle_variance(p, q, n, yes), 1.0 / (p - q), yes,
                         notes[name]))
    for r in rows:
        r.update(_shuffled(r["epsilon"], n))
    return rows


@lru_cache(maxsize=32)
def _shuffled(epsilon: float, n: int) -> dict[str, Any]:
    if epsilon is None or not math.isfinite(epsilon):
        return {"epsilon_shuffled": None, "epsilon_day_shuffled": None, "shuffle_trust": TRUST_ASSUMPTION}
    p = math.exp(epsilon)
    day = shuffled_day((VariationRatio(p, (p - 1) / (p + 1), p),), n, 2880)
    return {"epsilon_shuffled": day.epsilon, "epsilon_day_shuffled": day.epsilon_day, "shuffle_trust": TRUST_ASSUMPTION}


def kary_variances(epsilon: float, n: int, yes: float, k: int) -> tuple[float, float]:
    """(formula, core) variances of k-ary RR's count estimator: the tests hold them equal."""
    p, q = support_probabilities("kary", epsilon, k)
    core = float(rr_estimator(kary_rr(k, epsilon), stations=[1]).variance(yes, n)[0])
    return oracle_variance(p, q, n, yes), core
