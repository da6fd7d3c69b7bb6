"""Per-vehicle sampling and exact tally give the same distribution of counts.

For each mechanism, M replicate epochs are drawn through both paths from the same truth
counts. Checks (false-failure rates under a correct implementation, per assertion):

* every count cell's mean, on both paths, is within 5 SE of the exact mean from the output
  table (two-sided normal tail 5.7e-7);
* every cell's sample variance, on both paths, is within 6 SE of the exact variance
  (SE from the empirical fourth moment; < 1e-6 for near-normal counts);
* a chi-square homogeneity test of the two paths' distributions of the estimator's
  statistic (the quantity that couples the rounds) has p > 1e-4 (false-failure 1e-4);
* for Sampling Privacy, the round difference at a station is Binomial(Yes, pis) exactly:
  chi-square goodness of fit on both paths, p > 1e-4.

About 35 p-value assertions in this module: family-wise false-failure < 4e-3.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import estimators as E
from estimators._types import FloatArray, IntArray
from tests.station_counts import pair_counts

M = 2000  # replicate epochs per path
P_MIN = 1e-4


def _exact_moments(mech: E.Mechanism, truth_counts: IntArray) -> tuple[FloatArray, FloatArray]:
    """Exact mean and variance ``(R, O)`` of per-round counts (multinomial per truth)."""
    means, variances = [], []
    for r in range(mech.n_rounds):
        tab = mech.output_table(r)
        means.append(truth_counts @ tab)
        variances.append(truth_counts @ (tab * (1 - tab)))
    return np.array(means), np.array(variances)


def _check_moments(samples: FloatArray, mean: FloatArray, var: FloatArray, label: str) -> None:
    m = samples.shape[0]
    emp_mean = samples.mean(axis=0)
    emp_var = samples.var(axis=0, ddof=1)
    live = var > 0
    z_mean = np.abs(emp_mean - mean)[live] / np.sqrt(var[live] / m)
    assert np.all(z_mean < 5), f"{label}: mean off by {z_mean.max():.2f} SE"
    assert np.all(emp_var[~live] == 0), f"{label}: a deterministic cell varies"
    centred = samples - emp_mean
    m4 = (centred**4).mean(axis=0)
    se_var = np.sqrt(np.maximum(m4 - emp_var**2, 1e-12) / m)
    z_var = np.abs(emp_var - var)[live] / se_var[live]
    assert np.all(z_var < 6), f"{label}: variance off by {z_var.max():.2f} SE"


def _homogeneity_p(a: IntArray, b: IntArray) -> float:
    """Chi-square test that two integer samples share one distribution (bins pooled to
    an expected count >= 5 per cell)."""
    lo = int(min(a.min(), b.min()))
    hi = int(max(a.max(), b.max()))
    ca = np.bincount(a - lo, minlength=hi - lo + 1)
    cb = np.bincount(b - lo, minlength=hi - lo + 1)
    table = _pool(np.stack([ca, cb]))
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table).pvalue)


def _pool(table: IntArray, min_expected: float = 5.0) -> IntArray:
    """Merge adjacent columns until each column's smaller expected count is >= 5."""
    cols: list[IntArray] = []
    acc = np.zeros(table.shape[0], dtype=np.int64)
    share = table.sum(axis=1) / table.sum()
    for j in range(table.shape[1]):
        acc = acc + table[:, j]
        if (acc.sum() * share).min() >= min_expected:
            cols.append(acc)
            acc = np.zeros_like(acc)
    if acc.sum() and cols:
        cols[-1] = cols[-1] + acc
    elif acc.sum():
        cols.append(acc)
    return np.stack(cols, axis=1)


def _gof_p(sample: IntArray, pmf: FloatArray) -> float:
    """Chi-square goodness of fit of an integer sample to a pmf on 0..len(pmf)-1."""
    observed = np.bincount(sample, minlength=pmf.size)[: pmf.size]
    expected = pmf * sample.size
    order_obs, order_exp = [], []
    acc_o = acc_e = 0.0
    for o, e in zip(observed, expected, strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= 5:
            order_obs.append(acc_o)
            order_exp.append(acc_e)
            acc_o = acc_e = 0.0
    order_obs[-1] += acc_o
    order_exp[-1] += acc_e
    obs, exp = np.array(order_obs), np.array(order_exp)
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def _tally_rounds(mech: E.Mechanism, reports: IntArray) -> IntArray:
    """Per-round counts ``(R, O)`` of per-vehicle reports ``(R, n)``: one bincount per round
    (stage 1 counts a record's values the same way, ``MechanismSpec.accumulate``)."""
    return np.stack([np.bincount(row, minlength=mech.n_outputs) for row in reports]).astype(np.int64)


def _draw_both(mech: E.Mechanism, truth_counts: IntArray, seed: int) -> tuple[IntArray, IntArray]:
    rng_v = np.random.default_rng(seed)
    rng_t = np.random.default_rng(seed + 1)
    truths = np.repeat(np.arange(mech.n_truths), truth_counts)
    per_vehicle = np.stack([_tally_rounds(mech, mech.sample(rng_v, truths)) for _ in range(M)])
    tallied = np.stack([mech.tally(rng_t, truth_counts) for _ in range(M)])
    return per_vehicle, tallied


CASES = {
    "rr": (E.two_coin_rr(0.8, 0.2), [400, 25]),
    "rr_eps": (E.epsilon_rr(1.0), [300, 40]),
    "rr_kary": (E.kary_rr(5, 2.0), [200, 30, 10, 0, 5]),
    "sp_binary": (E.sp_binary(0.275, 0.45), [400, 30]),
    "sp_multi": (E.sampling_privacy(4, 0.45), [300, 40, 12, 0, 3]),
    "sp_multi_nonuniform": (E.sampling_privacy(3, 0.3, [0.4, 0.1, 0.15, 0.05]), [100, 20, 7, 50]),
    "fresh": (E.fresh_sample(), [400, 30]),
    "alp": (E.alp_optimal(pisNo=0.2), [400, 30]),
    "alp_toy2": (E.alp_sampling_noise(0.3, 0.2), [300, 30]),
    "alp_toy34": (E.alp_plausible_deniability(), [300, 30]),
}


def _statistic(name: str, mech: E.Mechanism, counts: IntArray) -> IntArray:
    """The scalar each estimator is built on, per replicate (couples the rounds)."""
    if name.startswith("sp"):
        return counts[:, 1, 1] - counts[:, 0, 1]
    if name == "fresh":
        return counts[:, 0, 1] - counts[:, 1, 1]
    if name.startswith("alp"):
        return counts[:, 0, E.ALP_YES] * 1000 + counts[:, 0, E.ALP_BOTTOM]
    return counts[:, 0, 1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_paths_agree(name: str) -> None:
    mech, tc = CASES[name]
    truth_counts = np.array(tc, dtype=np.int64)
    per_vehicle, tallied = _draw_both(mech, truth_counts, seed=sum(map(ord, name)))
    mean, var = _exact_moments(mech, truth_counts)
    _check_moments(per_vehicle.astype(float), mean, var, f"{name} per-vehicle")
    _check_moments(tallied.astype(float), mean, var, f"{name} tally")
    # every replicate accounts for every vehicle in every round
    assert np.all(per_vehicle.sum(axis=2) == truth_counts.sum())
    assert np.all(tallied.sum(axis=2) == truth_counts.sum())
    if name.startswith("alp"):  # joint (Yes, ⊥) pair: test each margin and the pair's sum
        for col in (E.ALP_YES, E.ALP_BOTTOM, E.ALP_NO):
            assert _homogeneity_p(per_vehicle[:, 0, col], tallied[:, 0, col]) > P_MIN
    else:
        stat_v = _statistic(name, mech, per_vehicle)
        stat_t = _statistic(name, mech, tallied)
        assert _homogeneity_p(stat_v, stat_t) > P_MIN


@pytest.mark.parametrize("name", ["sp_binary", "sp_multi", "sp_multi_nonuniform"])
def test_sp_round_difference_is_binomial(name: str) -> None:
    """C2[v] - C1[v] ~ Binomial(Yes_v, pis) jointly over the rounds, on both paths."""
    mech, tc = CASES[name]
    truth_counts = np.array(tc, dtype=np.int64)
    per_vehicle, tallied = _draw_both(mech, truth_counts, seed=7 + len(name))
    pis = mech.params["pis"]
    for v in range(1, mech.n_truths):
        pmf = stats.binom.pmf(np.arange(truth_counts[v] + 1), truth_counts[v], pis)
        for counts in (per_vehicle, tallied):
            diff = counts[:, 1, v] - counts[:, 0, v]
            assert diff.min() >= 0
            if truth_counts[v] == 0:
                assert np.all(diff == 0)
            else:
                assert _gof_p(diff, pmf) > P_MIN


@pytest.mark.parametrize(("name", "params"), [("alp", {"pisNo": 0.05}), ("rr", {"pi1": 0.8, "pi2": 0.2})],
                         ids=["alp", "rr"])
def test_per_station_sparse_matches_tally(name: str, params: dict[str, float]) -> None:
    """PerStation: sparse per-vehicle reports (counted as the stream app counts them: the
    registry's accumulate and complete) and exact per-station tally agree."""
    v, n = 12, 300
    spec = E.get_spec(name)
    mech = spec.build(params, v)
    (ps,) = spec.per_station(mech, v)
    truths = np.repeat(np.arange(v + 1), [n - 66] + [6] * 3 + [0] * 3 + [8] * 6)[:n]
    yes = np.bincount(truths, minlength=v + 1)[1:]
    rng_v, rng_t = np.random.default_rng(11), np.random.default_rng(12)
    sparse = np.stack([pair_counts(spec, mech, v, [ps.sample_sparse(rng_v, truths)], n)[:, 0, :] for _ in range(M)])
    tallied = np.stack([ps.tally(rng_t, yes, n) for _ in range(M)])
    tab = mech.output_table(0)
    mean = yes[:, None] * tab[1] + (n - yes)[:, None] * tab[0]
    var = yes[:, None] * tab[1] * (1 - tab[1]) + (n - yes)[:, None] * tab[0] * (1 - tab[0])
    _check_moments(sparse.astype(float), mean, var, "sparse")
    _check_moments(tallied.astype(float), mean, var, "tally")
    for s in (0, 3, 6):  # a 6-Yes, an empty and an 8-Yes station
        assert _homogeneity_p(sparse[:, s, 1], tallied[:, s, 1]) > P_MIN


def test_sparse_pairs_are_unique_and_in_range() -> None:
    ps = E.PerStation(E.alp_optimal(pisNo=0.3), 50)
    rng = np.random.default_rng(3)
    truths = rng.integers(0, 51, size=4000)
    rep = ps.sample_sparse(rng, truths)
    pairs = rep.vehicle * 100 + rep.station
    assert np.unique(pairs).size == pairs.size
    assert rep.station.min() >= 1 and rep.station.max() <= 50
    assert set(np.unique(rep.output)) <= {E.ALP_NO, E.ALP_YES}
    with pytest.raises(ValueError, match="truths must lie"):
        ps.sample_sparse(rng, np.array([51]))


def testbernoulli_positions_count_and_uniformity() -> None:
    """Geometric-skip process: count ~ Binomial(size, p); positions uniform (chi-square
    over 20 equal bins). Two assertions at 1e-4 each."""
    from estimators.per_station import bernoulli_positions

    rng = np.random.default_rng(5)
    size, p = 1_000_000, 0.003
    counts = np.array([bernoulli_positions(rng, size, p).size for _ in range(400)])
    z = (counts.mean() - size * p) / np.sqrt(size * p * (1 - p) / counts.size)
    assert abs(z) < 4
    pos = np.concatenate([bernoulli_positions(rng, size, p) for _ in range(50)])
    assert np.all(pos < size) and np.all(pos >= 0)
    hist = np.bincount(pos * 20 // size, minlength=20)
    assert stats.chisquare(hist).pvalue > P_MIN


def test_alias_faces_match_latent() -> None:
    """Die faces drawn by the alias method follow the latent table (chi-square, 1e-4)."""
    mech = E.sampling_privacy(30, 0.2)
    rng = np.random.default_rng(9)
    faces = mech.draw_faces(rng, np.zeros(300_000, dtype=np.int64))
    observed = np.bincount(faces, minlength=mech.n_faces)
    assert stats.chisquare(observed, mech.latent[0] * faces.size).pvalue > P_MIN
    alp = E.alp_optimal(pisNo=0.3)  # truth-dependent die
    for t in (0, 1):
        f = alp.draw_faces(rng, np.full(200_000, t, dtype=np.int64))
        assert stats.chisquare(np.bincount(f, minlength=3), alp.latent[t] * f.size).pvalue > P_MIN


@pytest.mark.parametrize("mech", [E.sampling_privacy(4, 0.45), E.sp_binary(), E.fresh_sample(), E.alp_optimal(),
                                  E.kary_rr(5, 2.0)], ids=["sp", "sp_binary", "fresh", "alp", "kary"])
def test_tally_epochs_is_that_many_independent_tallies(mech: E.Mechanism) -> None:
    """``tally_epochs(k)`` (what the Monte Carlo batteries draw, ``tests/unit/_mc.py``) holds k
    independent epochs of the tally's law: every cell's mean and variance over M epochs within
    5 and 6 SE of the exact ones, and for two rounds the round difference at station 1 (what
    couples the rounds) homogeneous with M separate :meth:`tally` calls (p > 1e-4)."""
    truth = np.arange(1, mech.n_truths + 1, dtype=np.int64) * 40
    batch = mech.tally_epochs(np.random.default_rng(21), truth, M)
    assert batch.shape == (M, mech.n_rounds, mech.n_outputs)
    mean, var = _exact_moments(mech, truth)
    _check_moments(batch.astype(float), mean, var, "tally_epochs")
    if mech.n_rounds == 2:
        rng = np.random.default_rng(22)
        single = np.stack([mech.tally(rng, truth) for _ in range(M)])
        assert _homogeneity_p(batch[:, 1, 1] - batch[:, 0, 1], single[:, 1, 1] - single[:, 0, 1]) > P_MIN


def test_tally_rejects_bad_counts() -> None:
    rng = np.random.default_rng(0)
    mech = E.sampling_privacy(3)
    with pytest.raises(ValueError, match="truth_counts"):
        mech.tally(rng, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="truth_counts"):
        mech.tally(rng, np.array([1, -2, 3, 4]))
    with pytest.raises(ValueError, match="truths must lie"):
        mech.sample(rng, np.array([0, 4]))
    with pytest.raises(ValueError, match="more vehicles at stations"):
        E.PerStation(E.alp_optimal(), 2).tally(rng, np.array([5, 6]), 10)
    with pytest.raises(ValueError, match="yes_counts"):
        E.PerStation(E.alp_optimal(), 2).tally(rng, np.array([5, 11]), 10)


def test_population_scale_tally_is_cheap() -> None:
    """The exact tally handles 10^7 vehicles over 3,220 stations in one call."""
    mech = E.sampling_privacy(3220, 0.45)
    rng = np.random.default_rng(1)
    truth = np.zeros(3221, dtype=np.int64)
    truth[1:] = rng.integers(0, 80, size=3220)
    truth[0] = 10_047_719 - truth[1:].sum()
    counts = mech.tally(rng, truth)
    assert counts.shape == (2, 3221)
    assert np.all(counts.sum(axis=1) == 10_047_719)
    diff = counts[1, 1:] - counts[0, 1:]
    assert np.all(diff >= 0) and np.all(diff <= truth[1:])
