"""Symmetric unary randomized response (the registry's ``unary``): estimator moments and score
bounds by Monte Carlo through the registry's path, and the report epsilon by brute force.

Monte Carlo: ``T`` = 20,000 simulated epochs with a fixed seed per case. The mean is checked
within 5 standard errors (two-sided false-failure 5.7e-7 per check), the variance within 5%
(its relative SE is sqrt(2 / T) = 1.0%: 5 SE, 5.7e-7), the score interval's coverage within
1.5 points of nominal (binomial SE 0.154 points at 95%, 0.070 at 99%: >= 9.7 SE, < 1e-21).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimators import privacy
from estimators.registry import get_spec

T = 20_000


def _estimates(q: float, yes: int, n: int, seed: int) -> tuple[np.ndarray, object]:
    spec = get_spec("unary")
    mech = spec.build({"q": q}, 1)
    rng = np.random.default_rng(seed)
    # the exact tally of one station: Yes vehicles report 1 w.p. 1 - q, No vehicles w.p. q
    ones = rng.binomial(yes, 1 - q, T) + rng.binomial(n - yes, q, T)
    counts = np.zeros((T, 1, 1, 2))
    counts[:, 0, 0, 1], counts[:, 0, 0, 0] = ones, n - ones
    est = spec.estimators(mech)[spec.headline]
    return est.estimate(counts, np.full((T, 1), float(n)))[:, 0], est


@pytest.mark.parametrize(("q", "yes", "n", "seed"), [(0.2, 100, 5_000, 1), (0.1, 5, 2_000, 2), (0.35, 500, 20_000, 3)])
def test_unbiased_with_the_stated_variance(q: float, yes: int, n: int, seed: int) -> None:
    est, lin = _estimates(q, yes, n, seed)
    var = n * q * (1 - q) / (1 - 2 * q) ** 2  # does not depend on Yes
    assert abs(est.mean() - yes) <= 5 * math.sqrt(var / T)
    assert abs(est.var() / var - 1) <= 0.05
    assert float(lin.variance(yes, n)[0]) == pytest.approx(var, rel=1e-12)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("q", "yes", "n", "seed"), [(0.2, 100, 5_000, 4), (0.19, 50, 47_719, 5)])
@pytest.mark.parametrize("level", [0.95, 0.99])
def test_score_bounds_cover(q: float, yes: int, n: int, seed: int, level: float) -> None:
    est, lin = _estimates(q, yes, n, seed)
    lo, hi = lin.score_interval(est[:, None], np.full((T, 1), float(n)), level)  # type: ignore[attr-defined]
    covered = float(np.mean((lo[:, 0] <= yes) & (yes <= hi[:, 0])))
    assert abs(covered - level) <= 0.015


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("q", [0.05, 0.2, 0.4])
def test_report_epsilon_is_two_flips(v: int, q: float) -> None:
    spec = get_spec("unary")
    mech = spec.build({"q": q}, v)
    two = 2 * math.log((1 - q) / q)
    # brute force over the joint table of the whole report vector (every position, every output vector)
    joint = privacy.per_sensor_joint_table(mech.output_table(0), v)
    assert privacy.local_epsilon(joint) == pytest.approx(two, rel=1e-12)
    assert spec.report_epsilon(mech, v) == pytest.approx(two, rel=1e-12)
    assert spec.closed_form_epsilon(mech) == pytest.approx(two / 2, rel=1e-12)


def test_q_out_of_range_is_a_clear_error() -> None:
    from estimators.registry import PlanError

    with pytest.raises(PlanError, match="q must be in"):
        get_spec("unary").build({"q": 0.5}, 3)
