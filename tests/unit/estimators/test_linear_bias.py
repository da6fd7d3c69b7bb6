"""Every estimator is unbiased and its exact variance is right (Monte Carlo + closed forms).

Estimators under test (``_mc.CASE_KEYS``): ``sp_difference`` for binary and multi-valued
(V = 5) Sampling Privacy; ``rr`` for two-coin (pi1 = 0.8, pi2 = 0.2) and k-ary (k = 6,
eps = ln 21) randomized response; ``krr``, the registry's k-ary RR at its defaults (V = 5,
eps = 1.31); ``fresh_difference``; ``alp_yhat``, ``alp_bottom``,
``alp_average``, ``alp_gls`` of the optimal ALP mechanism (paper parameters); the Yes-count
estimator of the ALP "sampling and noise" toy (its bottom-count estimator does not exist at
the default pisYes = pisNo -- checked below -- so a pisYes = 0.10 variant adds one), and the
Yes- and bottom-count estimators of the "plausible deniability" toy.

Monte Carlo design: ``_mc.TRIALS`` = 20,000 epochs per (estimator, N, Yes) drawn through
the exact tally paths, N in {1e4, 1e6}, Yes in {0, 1, 5, 50, 500}.

* Mean: ``|mean - Yes| <= 5 * sqrt(Var/T)`` with the exact ``estimator.variance``. The
  mean of 20,000 i.i.d. draws is normal to high accuracy, so the false-failure rate is the
  two-sided normal tail at z = 5: 5.7e-7 per check.
* Variance: ``|s^2 - Var| <= 5 * SE(s^2)`` with ``SE(s^2)^2 = 2 Var^2/(T-1) + kappa4/T``
  (chi-square term plus the exact excess-kurtosis correction, kappa4 = the estimate's
  exact fourth cumulant, a sum of per-vehicle cumulants). s^2 over 20,000 draws is normal to
  good accuracy even for the skewed small-count laws: false-failure ~5.7e-7 per check.
* Where the exact variance is 0 (Yes = 0 for Sampling Privacy and the sampling-noise toy)
  every estimate must be exactly 0 (deterministic).

About 14 estimators x 2 N x 5 Yes x 2 statistics = 280 checks: family-wise false-failure
< 2e-4. The closed-form tests below are exact (tolerance 1e-9 relative).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import estimators as E
from tests.unit import _mc

Z = 5.0  # two-sided normal tail 5.7e-7 per check


def _mc_failures(key: str, n: int) -> list[str]:
    sims = _mc.battery(key, n)
    c = _mc.case(key)
    t = _mc.TRIALS
    bad: list[str] = []
    for name, est in c.estimators.items():
        x = sims[name]
        var = _mc.exact_variance(est, _mc.YES_GRID, n)
        k4 = _mc.fourth_cumulant(est, _mc.YES_GRID, n)
        for j, yes in enumerate(_mc.YES_GRID):
            col = x[:, j]
            label = f"{key}/{name} N={n} Yes={yes}"
            if var[j] <= 1e-12:
                if not np.allclose(col, 0.0, atol=1e-9):
                    bad.append(f"{label}: exact variance 0 but estimates vary "
                               f"(range {col.min():.3g}..{col.max():.3g})")
                continue
            z_mean = (col.mean() - yes) / math.sqrt(var[j] / t)
            s2 = col.var(ddof=1)
            se_s2 = math.sqrt(2.0 * var[j] ** 2 / (t - 1) + max(k4[j], -var[j] ** 2) / t)
            z_var = (s2 - var[j]) / se_s2
            if abs(z_mean) > Z:
                bad.append(f"{label}: mean {col.mean():.4g} vs truth {yes} (z={z_mean:.2f})")
            if abs(z_var) > Z:
                bad.append(f"{label}: sample variance {s2:.5g} vs exact {var[j]:.5g} "
                           f"(z={z_var:.2f})")
    return bad


@pytest.mark.parametrize(("key", "n"), _mc.case_params())
def test_unbiased_and_exact_variance_monte_carlo(key: str, n: int) -> None:
    """Mean within 5 SE of the truth and sample variance within 5 SE of
    ``estimator.variance(yes, n)``, for every estimator of the case, Yes in {0,1,5,50,500}.
    False-failure < 5.7e-7 per check (see module docstring)."""
    bad = _mc_failures(key, n)
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------
# Closed forms of MECHANISMS.md: estimators as printed, exact variances
# ---------------------------------------------------------------------------------------
YS = np.array([0.0, 1.0, 5.0, 100.0, 3000.0])
NS = (48_719.0, 1_047_719.0, 10_047_719.0)


def _close(a: object, b: object) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                               rtol=1e-9, atol=1e-9)


def _rr_var(yes: np.ndarray, n: float, p_yes: float, p_no: float) -> np.ndarray:
    out: np.ndarray = (yes * p_yes * (1 - p_yes) + (n - yes) * p_no * (1 - p_no)) / (p_yes - p_no) ** 2
    return out


@pytest.mark.parametrize("mech", [E.sp_binary(), E.sp_binary(0.1, 0.3),
                                  E.sampling_privacy(5, 0.45), E.sampling_privacy(40, 0.2)],
                         ids=lambda m: f"{m.name}-{m.n_truths - 1}")
def test_sp_difference_matches_reference(mech: E.Mechanism) -> None:
    """§2/§3: ``(C_v,r2 - C_v,r1)/pis`` with ``Var = Yes (1 - pis)/pis`` for every N."""
    pis = mech.params["pis"]
    est = E.sp_difference(mech)
    rng = _mc.rng_for("sp-formula", mech.name, mech.n_truths)
    v = mech.n_truths - 1
    truth = np.concatenate([[20_000], rng.integers(0, 300, size=v)])
    counts = E.station_counts(mech, mech.tally(rng, truth))
    _close(est.estimate(counts, truth.sum()), (counts[:, 1, 1] - counts[:, 0, 1]) / pis)
    for n in NS:
        _close(est.variance(YS[:, None], n), np.broadcast_to((YS * (1 - pis) / pis)[:, None], (YS.size, v)))


@pytest.mark.parametrize(("pi1", "pi2"), [(0.8, 0.2), (0.5, 0.5), (0.3, 0.9)])
def test_two_coin_rr_matches_reference(pi1: float, pi2: float) -> None:
    """§1: ``(C1 - (1-pi1) pi2 N)/pi1`` and ``Var = (Yes pY(1-pY) + No pN(1-pN))/pi1^2``."""
    mech = E.two_coin_rr(pi1, pi2)
    est = E.rr_estimator(mech)
    p_yes, p_no = pi1 + (1 - pi1) * pi2, (1 - pi1) * pi2
    counts = np.array([[[9_000, 1_000]], [[4_321, 5_679]]], dtype=np.int64)
    _close(est.estimate(counts, 10_000), (counts[:, 0, 1] - p_no * 10_000) / pi1)
    for n in NS:
        _close(est.variance(YS, n), _rr_var(YS, n, p_yes, p_no))


@pytest.mark.parametrize(("k", "eps"), [(2, 1.0), (6, math.log(21.0)), (50, 2.0)])
def test_kary_rr_matches_reference(k: int, eps: float) -> None:
    """k-ary RR: truth kept w.p. e^eps/(e^eps+k-1); the per-station count estimator has the
    RR variance with pY = e^eps/(e^eps+k-1), pN = 1/(e^eps+k-1)."""
    mech = E.kary_rr(k, eps)
    est = E.rr_estimator(mech)
    p_yes = math.exp(eps) / (math.exp(eps) + k - 1)
    p_no = 1.0 / (math.exp(eps) + k - 1)
    rng = _mc.rng_for("kary-formula", k, eps)
    truth = np.concatenate([[5_000], rng.integers(0, 200, size=k - 1)])
    n = int(truth.sum())
    counts = E.station_counts(mech, mech.tally(rng, truth))
    _close(est.estimate(counts, n), (counts[:, 0, 1] - p_no * n) / (p_yes - p_no))
    for nn in NS:
        _close(est.variance(YS[:, None], nn),
               np.broadcast_to(_rr_var(YS, nn, p_yes, p_no)[:, None], (YS.size, k - 1)))


@pytest.mark.parametrize("params", [(0.5, 0.05, 0.05, 0.05), (0.3, 0.1, 0.05, 0.02)])
def test_fresh_difference_matches_reference(params: tuple[float, float, float, float]) -> None:
    """§4: ``(C_r1 - C_r2 - N (pisNo1 - pisNo2))/(pisYes1 - pisYes2 - (pisNo1 - pisNo2))``;
    rounds use fresh coins, so the variance is the sum of the two rounds' binomial terms."""
    y1, n1, y2, n2 = params
    mech = E.fresh_sample(y1, n1, y2, n2)
    est = E.fresh_difference(mech)
    gap = (y1 - y2) - (n1 - n2)
    counts = np.array([[[9_000, 1_000], [9_500, 500]]], dtype=np.int64)
    _close(est.estimate(counts, 10_000), (1_000 - 500 - 10_000 * (n1 - n2)) / gap)
    v_yes = y1 * (1 - y1) + y2 * (1 - y2)
    v_no = n1 * (1 - n1) + n2 * (1 - n2)
    for n in NS:
        _close(est.variance(YS, n), (YS * v_yes + (n - YS) * v_no) / gap**2)


def _alp_reference(p: dict[str, float], yes: np.ndarray, n: float) -> dict[str, np.ndarray]:
    """§5 of MECHANISMS.md, written out independently of the core."""
    a = p["pisYes1"] * p["pi1"] + p["pisYes2"] * p["pi2"]
    b = p["pisNo"] * p["pi3"]
    q, r = 1 - p["pisYes1"] - p["pisYes2"], 1 - p["pisNo"]
    no = n - yes
    d1, d2 = a - b, q - r
    var_c1 = yes * a * (1 - a) + no * b * (1 - b)
    var_cb = yes * q * (1 - q) + no * r * (1 - r)
    cov = -(yes * a * q + no * b * r)
    vy, vb, c = var_c1 / d1**2, var_cb / d2**2, cov / (d1 * d2)
    return {"alp_yhat": vy, "alp_bottom": vb, "alp_average": (vy + vb + 2 * c) / 4,
            "cov": c}


ALP_PARAMS = [
    {"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.05, "pi3": 0.98},
    {"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.00025, "pi3": 0.98},
    {"pisYes1": 0.2, "pisYes2": 0.1, "pi1": 0.7, "pi2": 0.6, "pisNo": 0.25, "pi3": 0.4},
]


@pytest.mark.parametrize("p", ALP_PARAMS, ids=lambda p: f"pisNo={p['pisNo']}")
def test_alp_estimators_match_reference(p: dict[str, float]) -> None:
    """§5: Lemma 1, Lemma 2, the corrected average ``(Y_hat + B_hat)/2`` (not the printed
    ``(Y_hat - B_hat)/2``), their exact variances and covariance, and the GLS weight
    ``lam = (Vb - C)/(Va + Vb - 2C)`` at its design point."""
    mech = E.alp_optimal(**p)
    a = p["pisYes1"] * p["pi1"] + p["pisYes2"] * p["pi2"]
    b = p["pisNo"] * p["pi3"]
    q, r = 1 - p["pisYes1"] - p["pisYes2"], 1 - p["pisNo"]
    n = 50_000
    counts = np.array([[[1_000, 4_000, 45_000]], [[2_500, 2_500, 45_000]]], dtype=np.int64)
    c1, cb = counts[:, 0, 1].astype(float), counts[:, 0, 2].astype(float)
    yhat, bhat = (c1 - b * n) / (a - b), (cb - r * n) / (q - r)
    for design in [(0.0, 1.0), (100.0, 48_719.0), (500.0, 10_047_719.0)]:
        ests = E.alp_estimators(mech, *design)
        _close(ests["alp_yhat"].estimate(counts, n), yhat)
        _close(ests["alp_bottom"].estimate(counts, n), bhat)
        _close(ests["alp_average"].estimate(counts, n), (yhat + bhat) / 2)
        ref_d = _alp_reference(p, np.array([design[0]]), design[1])
        va, vb, cab = ref_d["alp_yhat"], ref_d["alp_bottom"], ref_d["cov"]
        lam = (vb - cab) / (va + vb - 2 * cab)
        _close(ests["alp_gls"].estimate(counts, n), lam * yhat + (1 - lam) * bhat)
        for nn in NS:
            ref = _alp_reference(p, YS, nn)
            for key in ("alp_yhat", "alp_bottom", "alp_average"):
                _close(ests[key].variance(YS, nn), ref[key])
            gls_ref = lam**2 * ref["alp_yhat"] + (1 - lam) ** 2 * ref["alp_bottom"] \
                + 2 * lam * (1 - lam) * ref["cov"]
            _close(ests["alp_gls"].variance(YS, nn), gls_ref)


def test_alp_toy_count_estimators_match_reference() -> None:
    """Seed 004 eqs. 2-4: count estimators ``(C_o - N P(o|No))/(P(o|Yes) - P(o|No))`` with
    binomial variances; the sampling-noise toy has no bottom-count estimator when
    pisYes = pisNo (the bottom count then does not depend on the truth)."""
    y, nn, p1, p2 = 0.1, 0.05, 0.95, 0.98
    pd = E.alp_plausible_deniability(y, nn, p1, p2)
    sn = E.alp_sampling_noise(0.1, 0.05)
    tables = {
        "pd": (pd, {E.ALP_YES: (y * (p1 + (1 - p1) * p2), nn * (1 - p1) * p2),
                    E.ALP_BOTTOM: (1 - y, 1 - nn)}),
        "sn": (sn, {E.ALP_YES: (0.1, 0.0), E.ALP_BOTTOM: (0.9, 0.95)}),
    }
    counts = np.array([[[300, 700, 9_000]], [[500, 150, 9_350]]], dtype=np.int64)
    n = 10_000
    for _, (mech, outs) in tables.items():
        view = E.station_view(mech)
        for out, (p_yes, p_no) in outs.items():
            est = E.count_estimator("c", view, out)
            _close(est.estimate(counts, n), (counts[:, 0, out] - p_no * n) / (p_yes - p_no))
            for n_ in NS:
                _close(est.variance(YS, n_), _rr_var(YS, n_, p_yes, p_no))
    with pytest.raises(ValueError, match="does not depend on the truth"):
        E.count_estimator("bottom", E.station_view(E.alp_sampling_noise()), E.ALP_BOTTOM)
