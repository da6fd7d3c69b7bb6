"""Coverage of the confidence intervals (MECHANISMS.md §7), by Monte Carlo and exactly.

Every estimator of ``_mc.CASE_KEYS`` is run through ``_mc.TRIALS`` = 20,000 simulated epochs
(exact tally path) per population N in {1e4, 1e6} and true count Yes in {0, 1, 5, 50, 500}.

Requirements checked
--------------------
* score intervals, Yes in {50, 500}: coverage within [nominal - 1.5, nominal + UP] points,
  ``UP`` = 1.5 at 95% and 0.85 at 99% (at 99% a +1.5 tolerance would allow 100.5%, so it
  could never fail: an interval too wide by any factor would pass);
* score intervals, Yes in {50, 500}: not too wide -- the interval with its half-width
  scaled by 0.8 must cover LESS than nominal (a correct interval so scaled covers about
  88% / 96%; one 1.25 times too wide, scaled, covers the nominal level or more);
* score intervals, Yes in {0, 1, 5}: coverage >= nominal - 1.5 points (over-coverage is
  allowed);
* Hoeffding intervals: coverage >= nominal (a theorem, so over-coverage is expected), and
  no wider than Hoeffding's inequality makes them (checked exactly, end point by end point);
* plug-in intervals: shown to under-cover badly at small counts (Sampling Privacy and the
  sampling-noise toy at Yes = 1).

Monte Carlo error and false-failure rates (under a correct implementation)
-------------------------------------------------------------------------
With T = 20,000 epochs the binomial SE of a coverage estimate is 0.154 points at 95% and
0.070 points at 99%. The lower tolerance, 1.5 points, is 9.7 SE (95%) and 21 SE (99%); the
upper one is 9.7 SE (95%) and 12 SE (99%): if the true coverage equals nominal the
false-failure rate is < 1e-21 per check. The true coverages at moderate counts (exact for
the two-point estimators, else the simulation's) lie >= 7.9 SE above the lower limit and,
but for one, >= 5.5 SE below the upper one (exact binomial false-failure <= 3.9e-9 per
check; SP's 99.60% at 99%, Yes = 50: 4e-11). The one: the plausible-deniability toy's Yes
count, 96.05% at 95%, Yes = 50, N = 1e4, 3.3 SE below 96.5% (4.2e-4).
The scaled-interval check: the highest scaled coverage measured is 91.5% (95%, SP at
Yes = 50) and 98.0% (99%, the same), >= 10 SE below nominal: false-failure < 1e-20 per
check.
Hoeffding: true coverage >= nominal, checked as ``MC >= nominal - 5 SE`` (one-sided
2.9e-7 per check). MC-versus-exact agreement: ``|MC - exact| <= 5 SE(exact)`` (5.7e-7).

Exact coverage: for "two-point" estimators (each vehicle contributes one of two values, so
the estimate is an affine function of ``Bin(Yes, p_yes) + Bin(No, p_no)``; all but
``fresh_difference``, ``alp_average`` and ``alp_gls``) the coverage is computed exactly by
summing the pmf over the count's support (truncated at 14 SD, error < 1e-30). These checks
are deterministic: no Monte Carlo error at all.

Measured coverage (%, Monte Carlo, 20,000 epochs each; left N = 1e4, right N = 1e6)
------------------------------------------------------------------------------------
"toy noise" = ALP sampling-and-noise toy (yes: defaults; bot: pisYes = 0.10), "toy pd" =
ALP sampling-and-plausible-deniability toy, "sp (V=5)" = multi-valued Sampling Privacy,
"krr" = the registry's k-ary RR at its defaults (V = 5, epsilon 1.31).
Score intervals include the continuity correction for lattice estimates (SP, toy yes
counts); before it, SP 95% at Yes = 5 covered exactly 93.12%. Exact values for the
two-point estimators agree within 5 SE (tested). Plug-in: SP at Yes = 1 exactly 45.0%,
toy 5.0%. Hoeffding: 100.0% everywhere except SP at Yes = 50/500 (99.4-99.9%).

::

    score 95%       Yes=0     1     5    50   500 |     0     1     5    50   500
    sp_binary     100.0 100.0  98.2  95.4  95.9 | 100.0 100.0  98.0  95.5  95.5
    sp (V=5)      100.0 100.0  98.2  95.5  95.5 | 100.0 100.0  98.3  95.4  95.8
    rr two-coin    97.5  95.5  95.0  95.6  95.4 |  97.6  95.0  94.9  95.3  95.0
    rr k-ary       97.5  95.3  95.2  95.7  95.3 |  97.4  94.9  95.2  94.9  95.3
    krr            97.5  95.2  95.5  95.3  95.4 |  97.5  95.1  94.8  95.3  95.1
    fresh          97.6  95.3  95.6  95.2  95.3 |  97.4  95.2  94.8  94.7  95.0
    alp_yhat       97.5  95.2  94.9  95.2  95.0 |  97.4  94.9  95.0  94.9  95.0
    alp_bottom     97.6  95.5  94.6  95.0  95.4 |  97.4  95.0  94.9  95.1  95.0
    alp_average    97.4  95.1  94.6  94.9  94.9 |  97.4  95.0  94.9  95.0  95.0
    alp_gls        97.5  95.0  94.4  94.9  94.9 |  97.4  95.0  94.9  95.0  95.1
    toy noise yes 100.0  95.0  97.8  98.8  96.9 | 100.0  95.2  97.8  98.9  97.0
    toy noise bot  97.8  95.5  95.1  95.0  95.4 |  97.5  95.1  95.3  94.9  95.0
    toy pd yes     97.4  95.9  96.6  95.8  95.2 |  97.6  95.0  94.9  95.1  95.0
    toy pd bot     97.7  95.5  94.9  95.2  95.2 |  97.4  95.0  95.0  95.0  94.9

    score 99%       Yes=0     1     5    50   500 |     0     1     5    50   500
    sp_binary     100.0 100.0 100.0  99.6  99.2 | 100.0 100.0 100.0  99.6  99.2
    sp (V=5)      100.0 100.0 100.0  99.6  99.2 | 100.0 100.0 100.0  99.6  99.2
    rr two-coin    99.5  99.2  99.1  99.1  99.1 |  99.6  99.0  99.0  99.1  99.0
    rr k-ary       99.4  99.1  99.1  99.2  99.2 |  99.4  98.9  99.1  99.0  99.1
    krr            99.4  99.0  99.1  99.1  99.0 |  99.5  99.0  99.0  99.1  99.0
    fresh          99.5  99.1  99.2  99.1  99.1 |  99.5  99.1  99.0  99.0  99.0
    alp_yhat       99.5  99.1  98.9  98.9  99.1 |  99.5  99.0  98.9  99.1  98.9
    alp_bottom     99.5  99.0  99.0  99.1  99.0 |  99.5  99.0  98.9  99.1  99.0
    alp_average    99.4  99.0  98.8  98.9  99.0 |  99.5  99.0  98.9  99.1  99.0
    alp_gls        99.4  98.9  98.9  99.0  99.0 |  99.5  99.0  99.0  99.0  99.0
    toy noise yes 100.0 100.0  99.9  98.8  99.4 | 100.0 100.0  99.9  98.9  99.4
    toy noise bot  99.4  99.1  99.1  99.0  99.0 |  99.4  99.0  99.0  99.0  98.9
    toy pd yes     99.4  99.1  99.3  99.2  99.0 |  99.5  99.0  99.0  99.1  98.9
    toy pd bot     99.4  99.1  99.1  99.1  98.9 |  99.4  98.9  99.0  99.0  98.8

"""

from __future__ import annotations

import math

import numpy as np
import pytest

import estimators as E
from tests.unit import _mc

LEVELS = (0.95, 0.99)
SMALL = (0, 1, 5)
MODERATE = (50, 500)
TOL = 0.015  # 1.5 percentage points below nominal
UP = {0.95: 0.015, 0.99: 0.0085}  # above nominal: at 99%, 0.85 points (a 0.15% miss rate at least)
SHRINK = 0.8  # the not-too-wide check: the half-width scaled by this

# The sampling-and-noise toy's Yes count is Bin(Yes, 0.05)/0.05: a lattice of step 20 and
# no "No" noise, so coverage jumps with every outcome (at Yes = 50 the outcomes 0..5 hold
# 96.2% of the mass, 1..6 hold 91.7%). The score interval's continuity correction (half a
# step) keeps it from ever under-covering -- without it, 99% covered 95.0% at Yes = 1 and
# 90.25% at Yes = 2 -- at the price of over-covering at moderate counts (exact: 98.8% at
# Yes = 50, 97.0% at Yes = 500, 95% level). Honest-but-wide is the project's choice for a
# lattice this coarse, so this one estimator is held to the one-sided bound at moderate
# counts too; the scaled-interval check holds it to not being too wide at Yes = 500 (at
# Yes = 50 its correct interval, scaled by 0.8, still covers 96.1% at 95%: the outcomes
# 0..5 of Bin(50, 0.05)). Every estimator the issue lists is held to the two-sided band.
COARSE_LATTICE = {("alp_sampling_noise", "yes_count")}


def _off(key: str, name: str, yes: int, c: float, lvl: float) -> bool:
    """True if coverage ``c`` breaks the requirement at this count."""
    if yes in SMALL or (key, name) in COARSE_LATTICE:
        return c < lvl - TOL
    return not lvl - TOL <= c <= lvl + UP[lvl]


def shrunk_coverage(est: E.LinearEstimator, estimates: np.ndarray, yes_values: tuple[int, ...], n: float,
                    confidence: float, factor: float = SHRINK) -> np.ndarray:
    """Per column, the coverage of the interval with its half-width scaled by ``factor``.

    The score interval is ``{Y : |est - Y| <= h(Y)}``; scaled, ``{Y : |est - Y| <= factor *
    h(Y)}``. The true Y lies in the scaled interval of ``est`` exactly when it lies in the
    interval itself of the estimate whose deviation is stretched by ``1 / factor``, ``Y +
    (est - Y) / factor`` -- so this asks the implementation, at its own level, whatever its
    clipping to [0, n] or its asymmetry."""
    yes = np.asarray(yes_values, dtype=np.float64)[None, :]
    stretched = yes + (estimates - yes) / factor
    lo, hi = est.score_interval(stretched, n, confidence)
    out: np.ndarray = np.mean((lo <= yes) & (yes <= hi), axis=0)
    return out


def _se(p: float, t: int = _mc.TRIALS) -> float:
    return math.sqrt(max(p * (1.0 - p), 0.0) / t)


def _cov(key: str, n: int, method: str) -> dict[str, np.ndarray]:
    """``{estimator: (len(LEVELS), len(YES_GRID)) coverage}`` from the shared simulation."""
    sims = _mc.battery(key, n)
    out = {}
    for name, est in _mc.case(key).estimators.items():
        out[name] = np.stack([_mc.coverage(est, method, sims[name], _mc.YES_GRID, n, lvl)
                              for lvl in LEVELS])
    return out


def _col(yes: int) -> int:
    return _mc.YES_GRID.index(yes)


# ---------------------------------------------------------------------------------------
# Score intervals, Monte Carlo
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_score_coverage_moderate_counts(key: str, n: int) -> None:
    """Yes in {50, 500}: coverage in [nominal - 1.5, nominal + UP] points at 95% and 99%
    (UP = 1.5 / 0.85: both sides can fail; rates in the module docstring); one-sided for
    ``COARSE_LATTICE``."""
    bad = []
    for name, cov in _cov(key, n, "score").items():
        for i, lvl in enumerate(LEVELS):
            for yes in MODERATE:
                c = cov[i, _col(yes)]
                if _off(key, name, yes, c, lvl):
                    bad.append(f"{key}/{name} N={n} Yes={yes} {lvl:.0%}: {c:.2%}")
    assert not bad, "score coverage outside [nominal - 1.5, nominal + UP] points:\n" + "\n".join(bad)


@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_score_intervals_are_not_too_wide(key: str, n: int) -> None:
    """Yes in {50, 500}: the score interval with its half-width scaled by 0.8 covers less
    than nominal, at 95% and 99%, every estimator (``COARSE_LATTICE`` at Yes = 500 only).

    A correct normal-approximation interval so scaled covers about P(|Z| <= 0.8 z): 88.3% /
    96.1% (measured: at most 91.5% / 98.0%, Sampling Privacy's lattice at Yes = 50); an
    interval f times too wide covers P(|Z| <= 0.8 f z) scaled, which reaches nominal at
    f = 1.25 (1.5 times too wide: 98.1% / 99.8%; measured >= 97.9% / 99.6%).
    False-failure < 1e-20 per check (>= 10 SE below nominal)."""
    bad = []
    sims = _mc.battery(key, n)
    for name, est in _mc.case(key).estimators.items():
        for lvl in LEVELS:
            cov = shrunk_coverage(est, sims[name], _mc.YES_GRID, n, lvl)
            for yes in MODERATE:
                if (key, name) in COARSE_LATTICE and yes == 50:
                    continue
                c = cov[_col(yes)]
                if c >= lvl:
                    bad.append(f"{key}/{name} N={n} Yes={yes} {lvl:.0%}: scaled by {SHRINK} it covers {c:.2%}")
    assert not bad, "score interval too wide:\n" + "\n".join(bad)


@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_score_coverage_small_counts(key: str, n: int) -> None:
    """Yes in {0, 1, 5}: coverage >= nominal - 1.5 points at 95% and 99% (>= 9.7 SE below
    nominal; false-failure < 1e-21 per check when the true coverage is >= nominal).

    This caught a core bug, since fixed: without a continuity correction the score interval
    of a lattice estimate under-covered (Sampling Privacy 95% at Yes = 5: 93.12% exactly).
    The exact test below is the authoritative one.
    """
    bad = []
    for name, cov in _cov(key, n, "score").items():
        for i, lvl in enumerate(LEVELS):
            for yes in SMALL:
                c = cov[i, _col(yes)]
                if c < lvl - TOL:
                    bad.append(f"{key}/{name} N={n} Yes={yes} {lvl:.0%}: {c:.2%}")
    assert not bad, "score interval under-covers by more than 1.5 points:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------
# Score intervals, exact (two-point estimators)
# ---------------------------------------------------------------------------------------
def _two_point(mark_slow: bool) -> list[object]:
    out = []
    for key in _mc.CASE_KEYS:
        for name, est in _mc.case(key).estimators.items():
            if _mc.two_point_law(est) is not None:
                marks = [pytest.mark.slow] if mark_slow and key in _mc.SLOW_CASES else []
                out.append(pytest.param(key, name, id=f"{key}/{name}", marks=marks))
    return out


TWO_POINT = _two_point(mark_slow=False)  # exact computations only: fast
TWO_POINT_MC = _two_point(mark_slow=True)  # uses the shared simulation


def _row(est: E.LinearEstimator, yes: int) -> int:
    """Row of a multi-station estimator that the shared simulation used for ``yes``."""
    return _col(yes) if est.mean.shape[0] > 1 else 0


@pytest.mark.parametrize(("key", "name"), TWO_POINT)
def test_score_coverage_exact_two_point(key: str, name: str) -> None:
    """Exact coverage, both N, 95% and 99%: >= nominal - 1.5 points at Yes in {0, 1, 5} and
    within [nominal - 1.5, nominal + UP] points at Yes in {50, 500} (one-sided for
    ``COARSE_LATTICE``). Deterministic (no false failures).

    Regression test of a core bug: when the estimate is a scaled binomial with no
    No-population noise -- ``sp_difference`` = Bin(Yes, pis)/pis and the sampling-noise
    toy's Yes count -- a score interval without continuity correction under-covered at
    small counts (SP 95% at Yes = 5: 93.12%, it missed X = 0 and X = 5; toy 99% at Yes = 1:
    95.0%).
    """
    est = _mc.case(key).estimators[name]
    bad = []
    for n in _mc.N_GRID:
        for lvl in LEVELS:
            for yes in SMALL + MODERATE:
                c = _mc.exact_coverage(est, "score", yes, n, lvl, _row(est, yes))
                if _off(key, name, yes, c, lvl):
                    bad.append(f"N={n} Yes={yes} {lvl:.0%}: exact coverage {c:.3%}")
    assert not bad, f"{key}/{name}:\n" + "\n".join(bad)


@pytest.mark.parametrize(("key", "name"), TWO_POINT)
def test_score_coverage_exact_sweep(key: str, name: str) -> None:
    """Beyond the issue's grid: exact coverage >= nominal - 1.5 points for EVERY Yes in
    0..30 (N = 1e4 and 1e6, 95% and 99%). Deterministic.

    Before the continuity correction ``sp_difference`` covered 93.12%, 91.17%, 92.23% at
    Yes = 5, 9, 12 (95%) and the sampling-noise toy's Yes count as little as 85.74% (95%,
    Yes = 3) and 90.25% (99%, Yes = 2).
    """
    est = _mc.case(key).estimators[name]
    worst: dict[tuple[int, float], tuple[float, int]] = {}
    for n in _mc.N_GRID:
        for lvl in LEVELS:
            for yes in range(31):
                c = _mc.exact_coverage(est, "score", yes, n, lvl)
                if (n, lvl) not in worst or c < worst[n, lvl][0]:
                    worst[n, lvl] = (c, yes)
    bad = [f"N={n} {lvl:.0%}: minimum exact coverage {c:.3%} at Yes={y}"
           for (n, lvl), (c, y) in worst.items() if c < lvl - TOL]
    assert not bad, f"{key}/{name}:\n" + "\n".join(bad)


def test_sp_statistic_is_scaled_binomial() -> None:
    """The exact-coverage machinery sees the SP statistic as MECHANISMS.md §2 states it:
    ``(C_r2 - C_r1)/pis`` with ``C_r2 - C_r1 ~ Bin(Yes, pis)`` and no No-population term."""
    for key in ("sp_binary", "sp_multi"):
        law = _mc.two_point_law(_mc.case(key).estimators["sp_difference"])
        assert law is not None
        assert law.p_yes == pytest.approx(0.45) and law.p_no == 0.0
        assert law.x1 - law.x0 == pytest.approx(1 / 0.45) and law.mean_no == 0.0


@pytest.mark.parametrize(("key", "name"), TWO_POINT_MC)
def test_monte_carlo_matches_exact_coverage(key: str, name: str) -> None:
    """The simulated coverage (score and plug-in, both levels, all Yes, both N) agrees with
    the exact coverage: ``|MC - exact| <= 5 SE`` (false-failure 5.7e-7 per check). This
    ties the Monte Carlo harness and the tally path to the exact computation."""
    est = _mc.case(key).estimators[name]
    bad = []
    for n in _mc.N_GRID:
        sims = _mc.battery(key, n)[name]
        for method in ("score", "plugin"):
            for lvl in LEVELS:
                mc = _mc.coverage(est, method, sims, _mc.YES_GRID, n, lvl)
                for j, yes in enumerate(_mc.YES_GRID):
                    ex = _mc.exact_coverage(est, method, yes, n, lvl, _row(est, yes))
                    se = _se(ex)
                    if abs(mc[j] - ex) > 5 * se + 1e-12:
                        bad.append(f"N={n} {method} {lvl:.0%} Yes={yes}: MC {mc[j]:.4f} "
                                   f"exact {ex:.4f}")
    assert not bad, f"{key}/{name}:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------
# Plug-in intervals under-cover at small counts
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_plugin_undercovers_at_small_counts() -> None:
    """Plug-in (``Var(max(est, 0))``) intervals collapse to [0, 0] whenever the estimate is
    0, which for Sampling Privacy at Yes = 1 happens with probability 1 - pis = 0.55.

    Exact plug-in coverage at Yes = 1 (both levels, both N): ``sp_difference`` 45.0%, the
    sampling-noise toy's Yes count 5.0% -- against 95%/99% nominal. At Yes = 5 the toy
    covers 22.6%. Asserted: SP < 50% and toy < 10% at Yes = 1, toy < 30% at Yes = 5 (both
    exact, deterministic, and the 20,000-epoch simulation: thresholds >= 14 SE away from
    the exact values, false-failure < 1e-40). The score interval at the same points covers
    100% (SP) and >= 95% (toy).
    """
    cases = [("sp_binary", "sp_difference", 1, 0.50), ("sp_multi", "sp_difference", 1, 0.50),
             ("alp_sampling_noise", "yes_count", 1, 0.10),
             ("alp_sampling_noise", "yes_count", 5, 0.30)]
    for key, name, yes, limit in cases:
        est = _mc.case(key).estimators[name]
        for n in _mc.N_GRID:
            sims = _mc.battery(key, n)[name]
            for lvl in LEVELS:
                ex = _mc.exact_coverage(est, "plugin", yes, n, lvl, _row(est, yes))
                mc = _mc.coverage(est, "plugin", sims, _mc.YES_GRID, n, lvl)[_col(yes)]
                score = _mc.exact_coverage(est, "score", yes, n, lvl, _row(est, yes))
                assert ex < limit and mc < limit, (key, name, n, lvl, yes, ex, mc)
                assert score >= 0.95, (key, name, n, lvl, yes, score)



# ---------------------------------------------------------------------------------------
# Hoeffding intervals are conservative
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_hoeffding_coverage_at_least_nominal(key: str, n: int) -> None:
    """Distribution-free bound: coverage >= nominal for every estimator (rr, ALP and the
    rest), every Yes, both N, 95% and 99%. Checked as ``MC >= nominal - 5 SE(nominal)``;
    the guarantee makes the false-failure rate <= 2.9e-7 per check. (Observed: >= 99.3%.)

    Over-coverage is the nature of this bound, so coverage cannot show an interval too wide:
    :func:`test_hoeffding_intervals_are_no_wider_than_the_inequality` does."""
    bad = []
    for name, cov in _cov(key, n, "hoeffding").items():
        for i, lvl in enumerate(LEVELS):
            for j, yes in enumerate(_mc.YES_GRID):
                if cov[i, j] < lvl - 5 * _se(lvl):
                    bad.append(f"{key}/{name} N={n} Yes={yes} {lvl:.0%}: {cov[i, j]:.2%}")
    assert not bad, "Hoeffding interval under-covers:\n" + "\n".join(bad)


def _hoeffding_halfwidth(est: E.LinearEstimator, yes: np.ndarray, n: float, confidence: float) -> np.ndarray:
    """Hoeffding's inequality, typed in from the estimator's definition: the estimate is a sum
    of independent per-vehicle contributions, vehicle i's within a range r_i (max - min of
    its contributions over the faces it can roll: r_No for the n - Y No owners, r_Yes for
    the Y Yes owners), so P(|est - Y| >= t) <= 2 exp(-2 t^2 / sum r_i^2) = 1 - confidence at
    t = sqrt(ln(2 / (1 - confidence)) / 2 * ((n - Y) r_No^2 + Y r_Yes^2)).

    ``yes``: ``(T, J)`` candidate counts, column j at the station of the simulation's column j."""
    x = est.contributions  # (station, truth, face)
    support = np.broadcast_to(est.view.latent, x.shape) > 0
    r = np.where(support, x, -np.inf).max(axis=2) - np.where(support, x, np.inf).min(axis=2)  # (station, truth)
    rows = _mc.station_rows(est, yes.shape[1])
    r_no, r_yes = r[rows, 0][None, :], r[rows, 1][None, :]
    k = math.log(2.0 / (1.0 - confidence)) / 2.0
    out: np.ndarray = np.sqrt(k * ((n - yes) * r_no**2 + yes * r_yes**2))
    return out


@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_hoeffding_intervals_are_no_wider_than_the_inequality(key: str, n: int) -> None:
    """Each end point of the Hoeffding interval of every simulated estimate (every
    estimator, every Yes, 95% and 99%) is where Hoeffding's inequality puts it: an upper end
    ``hi`` below n satisfies ``hi - est = t(hi)``, a lower end ``lo`` above 0 ``est - lo =
    t(lo)`` (the interval is ``{Y : |est - Y| <= t(Y)}``), to 1e-6 relative. Deterministic;
    an interval too wide (or too narrow) by any factor fails. An end point at 0 or n is
    clipped, not a root: an estimate consistent with no Y in [0, n] collapses its interval to
    the closest admissible point (krr at its default epsilon: t is only 4.3 sd of the estimate
    at N = 1e6, so about one estimate in 1e5 below -t(0) gets [0, 0])."""
    bad = []
    sims = _mc.battery(key, n)
    for name, est in _mc.case(key).estimators.items():
        e = sims[name]
        for lvl in LEVELS:
            lo, hi = est.hoeffding_interval(e, n, lvl)
            errors = []
            for end, dist in ((hi, hi - e), (lo, e - lo)):
                inner = (end > 0) & (end < n)
                ok = inner & (dist > 0)
                want = _hoeffding_halfwidth(est, end, n, lvl)
                errors.append(np.abs(dist[ok] - want[ok]) / np.maximum(want[ok], 1e-12))
            rel = np.concatenate(errors)
            if rel.size < e.size or float(rel.max()) > 1e-6:  # at least one end point per estimate on average
                bad.append(f"{key}/{name} N={n} {lvl:.0%}: {rel.size} end points checked of {2 * e.size}, "
                           f"worst relative error {float(rel.max()) if rel.size else math.nan:.3g}")
    assert not bad, "Hoeffding interval off the inequality:\n" + "\n".join(bad)
