"""The shuffled accounting (estimators/shuffle.py): against the papers' own public code, against
the exact shuffled mechanism at small n, against Google's PLD accountant for the day, and the
bar's day for ALP. Deterministic: no statistics here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom

import estimators.privacy as privacy
import estimators.shuffle as S
from estimators.registry import get_spec

REFERENCE = json.loads((Path(__file__).parent / "data" / "shuffle_reference.json").read_text())


def _generic(eps0: float) -> S.VariationRatio:
    p = math.exp(eps0)
    return S.VariationRatio(p, (p - 1) / (p + 1), p)


# -- against the public reference implementations --------------------------------------------------
@pytest.mark.parametrize("point", REFERENCE["clone"]["points"], ids=lambda p: f"eps0={p['epsilon0']},n={p['n']}")
def test_the_clone_bound_lies_between_the_reference_codes_bounds(point: dict[str, float]) -> None:
    """apple/ml-shuffling-amplification brackets the clone pair's exact epsilon from both sides
    (its lower bound is the binary search's upper end: allow its resolution)."""
    ours = S.dominating_pld(S.clone_pair(point["epsilon0"]), int(point["n"])).epsilon(point["delta"])
    assert point["lower"] - 2 * point["search_resolution"] <= ours <= point["upper"] + 1e-9


@pytest.mark.parametrize("point", REFERENCE["variation_ratio"]["points"],
                         ids=lambda p: f"eps0={p['epsilon0']:.3g},beta={p['beta']:.3g},n={p['n']}")
def test_the_variation_ratio_bound_lies_between_the_reference_codes_bounds(point: dict[str, float]) -> None:
    p = math.exp(point["epsilon0"])
    v = S.VariationRatio(p, point["beta"], p)
    ours = S.dominating_pld(S.variation_ratio_pair(v), int(point["n"])).epsilon(point["delta"])
    assert point["lower"] - 2 * point["search_resolution"] <= ours <= point["upper"] + 1e-9


@pytest.mark.slow
def test_the_reference_brackets_tell_a_wrong_pair_apart() -> None:
    """The bracket tests can fail: a clone probability off by a factor of 1.5, or a beta taken
    as the generic one, lands outside every bracket."""
    for point in REFERENCE["clone"]["points"]:
        good = S.clone_pair(point["epsilon0"])
        for wrong in (dataclasses.replace(good, r=good.r * 1.5), dataclasses.replace(good, r=good.r / 1.5)):
            eps = S.dominating_pld(wrong, int(point["n"])).epsilon(point["delta"])
            assert not point["lower"] - 2 * point["search_resolution"] <= eps <= point["upper"] + 1e-9
    for point in REFERENCE["variation_ratio"]["points"]:
        p = math.exp(point["epsilon0"])
        if abs(point["beta"] - (p - 1) / (p + 1)) < 1e-9:
            continue
        eps = S.dominating_pld(S.variation_ratio_pair(_generic(point["epsilon0"])), int(point["n"])).epsilon(
            point["delta"])
        assert eps > point["upper"]


# -- against the exact shuffled mechanism -------------------------------------------------------------
def _exact_shuffled_delta(table: np.ndarray, x0: int, x1: int, others: tuple[int, ...], eps: float) -> float:
    """delta(eps) of the multiset of n reports of a k-ary table, neighbours differing in the
    first device's truth (x0 vs x1): the histogram's distribution by convolution."""
    def hist_dist(truths: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        dist: dict[tuple[int, ...], float] = {tuple([0] * table.shape[1]): 1.0}
        for t in truths:
            nxt: dict[tuple[int, ...], float] = {}
            for h, w in dist.items():
                for o in range(table.shape[1]):
                    g = list(h)
                    g[o] += 1
                    nxt[tuple(g)] = nxt.get(tuple(g), 0.0) + w * table[t, o]
            dist = nxt
        return dist
    p, q = hist_dist((x0, *others)), hist_dist((x1, *others))
    return sum(max(0.0, w - math.exp(eps) * q.get(h, 0.0)) for h, w in p.items())


def _krr(eps0: float, k: int) -> np.ndarray:
    e = math.exp(eps0)
    table = np.full((k, k), 1 / (e + k - 1))
    np.fill_diagonal(table, e / (e + k - 1))
    return table


@pytest.mark.parametrize("eps0,k", [(1.0, 2), (2.0, 3), (0.7, 4)])
@pytest.mark.parametrize("n", [3, 6])
def test_the_clone_bound_dominates_the_exact_shuffled_mechanism(eps0: float, k: int, n: int) -> None:
    """k-ary randomized response shuffled among n: for every neighbouring pair and every
    composition of the other devices, delta(eps) of the exact shuffled output is at most the
    clone pair's, at every eps on a grid."""
    table = _krr(eps0, k)
    pld = S.dominating_pld(S.clone_pair(eps0), n)
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        for eps in np.linspace(0, eps0, 7):
            assert _exact_shuffled_delta(table, 0, 1, others, float(eps)) <= pld.delta(float(eps)) + 1e-12


def test_the_variation_ratio_bound_fails_the_exact_check_so_it_is_not_published() -> None:
    """Why only the clone bound is published: three-ary RR (eps0 = 2, beta = (e^2-1)/(e^2+2))
    shuffled among 6, the other devices at the target's own truth: the exact delta at
    eps = 1.78 exceeds the variation-ratio pair's several times (the authors' public code
    gives the pair's number). The published epoch figure is the clone bound's."""
    eps0, n, eps = 2.0, 6, 1.78
    table = _krr(eps0, 3)
    v = S.variation_ratio(table)
    assert v.beta == pytest.approx((math.exp(2) - 1) / (math.exp(2) + 2))
    exact = _exact_shuffled_delta(table, 0, 1, (0,) * (n - 1), eps)
    assert exact > 3 * S.dominating_pld(S.variation_ratio_pair(v), n).delta(eps)
    assert exact <= S.dominating_pld(S.clone_pair(eps0), n).delta(eps)
    clone = S.dominating_pld(S.clone_pair(eps0), 5_000).epsilon(1e-6)
    assert S.shuffled_epsilon((v,), 5_000, 1e-6) == pytest.approx(clone)


def test_the_exact_check_catches_a_clone_pair_that_is_too_optimistic() -> None:
    """The exact check can fail: clones three times as likely as Feldman-McMillan-Talwar's
    claim less than the exact mechanism leaks."""
    eps0, k, n = 2.0, 3, 3
    table = _krr(eps0, k)
    good = S.clone_pair(eps0)
    lie = S.dominating_pld(dataclasses.replace(good, r=good.r * 3), n)
    assert any(_exact_shuffled_delta(table, 0, 1, o, eps) > lie.delta(eps) + 1e-9
               for o in itertools.product(range(k), repeat=n - 1) for eps in (0.5, 1.0, 1.5, 1.8))


def test_the_pld_holds_all_the_mass() -> None:
    for pair in (S.clone_pair(1.3), S.variation_ratio_pair(_generic(4.8)), S.variation_ratio_pair(
            S.VariationRatio(3.69, 0.05, 3.69))):
        for n in (1, 2, 50, 47_719):
            d = S.dominating_pld(pair, n)
            assert d.mass.sum() + d.infinity_mass == pytest.approx(1.0, abs=1e-9)
            assert d.infinity_mass < 1e-10  # gammaln's rounding at n ~ 5e4 (relative ~1e-11)
            assert np.all(np.diff(d.loss) >= 0)


@pytest.mark.slow
def test_epsilon_never_grows_with_the_shuffle() -> None:
    v = S.VariationRatio(3.69, 0.05, 3.69)
    eps = [S.shuffled_epsilon((v,), n) for n in (10, 100, 1_000, 10_000, 47_719, 200_000)]
    assert all(a >= b for a, b in itertools.pairwise(eps))
    assert eps[0] <= math.log(3.69) + 1e-12  # never above the local epsilon


@pytest.mark.slow
@pytest.mark.parametrize("eps0,n,delta", [(0.5, 10_000, 1e-6), (1.0, 47_719, 1e-6), (1.3068, 200_000, 1e-8)])
def test_the_numerical_clone_bound_is_below_its_closed_form(eps0: float, n: int, delta: float) -> None:
    """Feldman-McMillan-Talwar's closed form (Thm 3.1) bounds the same pair, more loosely."""
    closed = S.closed_form_clone_epsilon(eps0, n, delta)
    assert closed < eps0  # inside the closed form's regime
    assert S.dominating_pld(S.clone_pair(eps0), n).epsilon(delta) <= closed


def test_one_report_alone_is_not_amplified() -> None:
    """n = 1: the release is the report; delta(eps) = (e^eps0 - e^eps) / (e^eps0 + 1) exactly."""
    pld = S.dominating_pld(S.clone_pair(1.0), 1)
    assert pld.epsilon(1e-6) == pytest.approx(math.log(math.e - 1e-6 * (math.e + 1)), abs=1e-8)


# -- the variation ratio of the project's reports ----------------------------------------------------------
def test_the_sparse_total_variation_is_the_brute_force() -> None:
    rng = np.random.default_rng(7)
    t_n = 400
    tab = np.tile(rng.dirichlet(np.ones(t_n)), (t_n, 1))
    rows = rng.integers(0, t_n, 900)
    cols = rng.integers(0, t_n, 900)
    tab[rows, cols] *= rng.uniform(0.2, 5, 900)
    tab[:, 0] *= rng.uniform(0.5, 2, t_n)  # one dense column
    tab /= tab.sum(axis=1, keepdims=True)
    brute = max(0.5 * float(np.abs(tab[i] - tab).sum(axis=1).max()) for i in range(t_n))
    assert S.variation_ratio(tab).beta == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize("name", ["alp", "rr", "fresh"])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_the_per_sensor_ratio_is_the_brute_force_over_the_report_vector(name: str, v: int) -> None:
    spec = get_spec(name)
    for m in spec.round_mechanisms(spec.build({}, v)):
        joint = privacy.per_sensor_joint_table(m.output_table(0), v)
        brute = S.variation_ratio(joint)
        got = S.per_sensor_variation_ratio(m.output_table(0), v)
        assert got.beta == pytest.approx(brute.beta, rel=1e-12)
        assert got.p == pytest.approx(brute.p, rel=1e-9)


# -- composition over a day ----------------------------------------------------------------------------
def _rr_pld(eps: float) -> S.Pld:
    p = math.exp(eps) / (1 + math.exp(eps))
    return S.Pld(np.array([-eps, eps]), np.array([1 - p, p]), 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("eps,k", [(0.1, 2880), (0.5, 50), (0.01, 2880)])
def test_composition_matches_the_exact_composition_theorem(eps: float, k: int) -> None:
    """A pure eps-DP release's worst case is randomized response (Kairouz-Oh-Viswanath): the
    composed grid never goes below the exact figure and stays within its rounding."""
    exact = privacy.optimal_composition(eps, k, 1e-6)
    step = S.grid_step([_rr_pld(eps)], k)
    got = S.compose([_rr_pld(eps)], k, step).epsilon(1e-6)
    assert exact - 1e-6 <= got <= exact + k * step + 1e-6


def test_the_day_agrees_with_googles_pld_accountant() -> None:
    """ALP's shuffled epoch, composed over 2,880 epochs here and by dp_accounting from the same
    pessimistically rounded PMF: the two agree within 1%."""
    from dp_accounting.pld import pld_pmf, privacy_loss_distribution

    v = get_spec("alp").shuffle_ratios(get_spec("alp").build({}, 3220), 3220)[0]
    epoch = S.dominating_pld(S.variation_ratio_pair(v), 47_719)
    step = 1e-5
    idx = np.ceil(epoch.loss / step - 1e-12).astype(int)
    rounded: dict[int, float] = {}
    for i, m in zip(idx.tolist(), epoch.mass.tolist(), strict=True):
        rounded[i] = rounded.get(i, 0.0) + m
    pmf = pld_pmf.create_pmf(rounded, step, epoch.infinity_mass, pessimistic_estimate=True)
    reference = privacy_loss_distribution.PrivacyLossDistribution(pmf).self_compose(2880).get_epsilon_for_delta(1e-6)
    ours = S.compose([epoch], 2880, step).epsilon(1e-6)
    assert ours == pytest.approx(reference, rel=0.005)


def test_alp_at_the_papers_parameters_is_a_single_digit_day() -> None:
    """The bar: ALP's whole report at 3,220 stations shuffled among the papers' 47,719 vehicles
    costs at most 2.5 over 2,880 epochs at delta = 1e-6 (the clone bound alone)."""
    spec = get_spec("alp")
    mech = spec.build({}, 3220)
    day = S.shuffled_day(spec.shuffle_ratios(mech, 3220), 47_719, 2880, 1e-6)
    assert day.epsilon_day <= 2.5
    assert day.epsilon == pytest.approx(spec.shuffled_epsilon(mech, 3220, 47_719, 1e-6))
    assert day.epsilon < spec.report_epsilon(mech, 3220) / 30


def test_a_truth_independent_round_costs_nothing() -> None:
    """A round whose report does not depend on the truth (beta = 0) adds nothing: the epoch
    costs what its other round costs. (Sampling Privacy's round 1 is such a round, but its
    rounds share one die, so it has no shuffled bound at all: test_privacy_linked_rounds.py.)"""
    spec = get_spec("alp")
    (r2,) = spec.shuffle_ratios(spec.build({}, 20), 20)
    r1 = S.VariationRatio(1.0, 0.0, 1.0)
    assert S.shuffled_epsilon((r1, r2), 5_000) == pytest.approx(S.shuffled_epsilon((r2,), 5_000))
    assert math.isinf(get_spec("sp").shuffled_epsilon(get_spec("sp").build({}, 20), 20, 5_000))


def test_binomial_range_leaves_out_at_most_its_tail() -> None:
    lo, hi, out = S._count_range(47_718, 0.135)
    assert binom.cdf(lo - 1, 47_718, 0.135) <= 1e-17 and binom.sf(hi, 47_718, 0.135) <= 1e-17
    assert out <= 4e-17
