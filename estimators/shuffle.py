"""Amplification by shuffling: the central (epsilon, delta) of a release shuffled among n reports.

(Work in progress: the API below is what the rest of the system calls; the numerical bounds
replace the closed form.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._types import FloatArray

__all__ = ["TRUST_ASSUMPTION", "VariationRatio", "closed_form_clone_epsilon", "epoch_epsilon",
           "per_sensor_variation_ratio", "variation_ratio"]


@dataclass(frozen=True)
class VariationRatio:
    """A randomizer's variation-ratio parameters (Wang et al., "Unified Privacy Amplification by
    Shuffling", Definition of the (p, beta, q) property): ``p = e^eps0``, ``beta`` the largest
    total-variation distance between two truths' output distributions, ``q`` the largest ratio
    against any other device's distribution (``= p`` here)."""

    p: float
    beta: float
    q: float

    @property
    def epsilon0(self) -> float:
        return math.log(self.p)


def variation_ratio(table: FloatArray) -> VariationRatio:
    """(p, beta, q) of an output table ``P(o | t)`` of shape ``(T, O)``."""
    tab = np.asarray(table, dtype=np.float64)
    hi, lo = tab.max(axis=0), tab.min(axis=0)
    used = hi > 0
    p = math.inf if np.any(lo[used] <= 0) else float(np.max(hi[used] / lo[used]))
    beta = max((0.5 * float(np.abs(tab[i] - tab[j]).sum()) for i in range(tab.shape[0]) for j in range(i)), default=0.0)
    return VariationRatio(p, beta, p)


def closed_form_clone_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Feldman, McMillan and Talwar's closed form (valid for eps0 <= ln(n / (16 ln(2/delta))));
    ``epsilon0`` outside that regime."""
    if n < 1 or epsilon0 > math.log(n / (16 * math.log(2 / delta))):
        return epsilon0
    e0 = math.exp(epsilon0)
    return math.log1p((e0 - 1) / (e0 + 1) * (8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n))


def epoch_epsilon(ratios: tuple[VariationRatio, ...], n: int, delta: float = 1e-6) -> float:
    """Central epsilon of one epoch whose rounds (one ratio each) are each shuffled among ``n``
    reports, at ``delta``."""
    return sum(closed_form_clone_epsilon(r.epsilon0, n, delta / len(ratios)) for r in ratios if r.beta > 0)


TRUST_ASSUMPTION = ("assumes the shuffler does not collude with the analyst and mixed each report among "
                    "the n reports of its epoch and round")


def per_sensor_variation_ratio(table: FloatArray, n_stations: int) -> VariationRatio:
    """(p, beta, q) of the whole report vector of a binary mechanism asked about each of V sensors:
    ``p`` from the report epsilon, ``beta`` the larger of a one-answer flip and a two-answer move."""
    from .privacy import per_sensor_report_epsilon

    tab = np.asarray(table, dtype=np.float64)
    no, yes = tab[0], tab[1]
    p = math.exp(per_sensor_report_epsilon(tab, n_stations))
    beta = 0.5 * float(np.abs(yes - no).sum())
    if n_stations >= 2:
        beta = max(beta, 0.5 * float(np.abs(np.outer(yes, no) - np.outer(no, yes)).sum()))
    return VariationRatio(p, beta, p)
