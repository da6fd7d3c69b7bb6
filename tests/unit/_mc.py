"""Monte Carlo helpers shared by the estimator test battery.

Every simulated epoch goes through a mechanism's exact tally path
(:meth:`Mechanism.tally` or :meth:`PerStation.tally`) and the estimators' own
:meth:`LinearEstimator.estimate`; nothing here re-implements a mechanism.

Many independent epochs are drawn cheaply in one of three ways:

* one-round binary mechanisms (two-coin RR, optimal ALP and the two ALP toys): :class:`PerStation` with
  every station holding the same Yes count -- stations are independent, so each station
  is one epoch (chunked so that the stations' Yes counts fit in the fleet);
* station-valued multi-station mechanisms (multi-valued Sampling Privacy, k-ary RR, the
  registry's ``krr`` at its defaults): one
  tally per epoch with one station per tested Yes count -- each station's estimate is a
  draw from its own marginal, which is all a per-station statistic looks at;
* two-round binary mechanisms (binary Sampling Privacy, fresh-sample): one tally per epoch.

The tallies of all epochs of a (case, N, Yes) are drawn in one call,
:meth:`Mechanism.tally_epochs` (the code :meth:`Mechanism.tally` runs for one epoch), and
estimated as one array: the same number of independent epochs as one call per epoch, so
every test keeps its power and its stated false-failure rate.

Seeds are derived from (case, Yes, N, trials, salt) with a stable hash, so every test is
reproducible and independent of the order in which tests run.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

import estimators as E
from estimators._types import FloatArray, IntArray

# ---------------------------------------------------------------------------------------
# The estimator catalogue
# ---------------------------------------------------------------------------------------
KARY_EPS = math.log(21.0)  # the same epsilon as two-coin RR with pi1=0.8, pi2=0.2
MULTI_V = 5  # stations of the multi-valued mechanisms: one per tested Yes count


@dataclass(frozen=True)
class Case:
    """One mechanism and the estimators computed from its counts."""

    key: str
    mech: E.Mechanism
    estimators: dict[str, E.LinearEstimator]
    kind: str  # "per_station" | "multi" | "single"


def _toy_counts(mech: E.Mechanism, what: Sequence[tuple[str, int]]) -> dict[str, E.LinearEstimator]:
    view = E.station_view(mech)
    return {name: E.count_estimator(name, view, out) for name, out in what}


def _build(key: str) -> Case:
    if key == "sp_binary":
        m = E.sp_binary()
        return Case(key, m, {"sp_difference": E.sp_difference(m)}, "single")
    if key == "sp_multi":
        m = E.sampling_privacy(MULTI_V, 0.45)
        return Case(key, m, {"sp_difference": E.sp_difference(m)}, "multi")
    if key == "rr_two_coin":
        m = E.two_coin_rr(0.8, 0.2)
        return Case(key, m, {"rr": E.rr_estimator(m)}, "per_station")
    if key == "rr_kary":
        m = E.kary_rr(MULTI_V + 1, KARY_EPS)
        return Case(key, m, {"rr": E.rr_estimator(m)}, "multi")
    if key == "krr":
        # through the registry, at its defaults: the spec's own mechanism and estimators
        spec = E.get_spec("krr")
        m = spec.build({}, MULTI_V)
        return Case(key, m, spec.estimators(m), "multi")
    if key == "fresh":
        m = E.fresh_sample()
        return Case(key, m, {"fresh_difference": E.fresh_difference(m)}, "single")
    if key == "alp_optimal":
        m = E.alp_optimal()
        return Case(key, m, E.alp_estimators(m), "per_station")
    if key == "alp_sampling_noise":
        # Defaults pisYes = pisNo: the bottom count does not depend on the truth, so only
        # the Yes-count estimator exists (test_estimator_bias checks that it is refused).
        m = E.alp_sampling_noise()
        return Case(key, m, _toy_counts(m, [("yes_count", E.ALP_YES)]), "per_station")
    if key == "alp_sampling_noise_y10":
        # Non-default pisYes = 0.10 only to exercise the toy's bottom-count estimator; its
        # Yes count is the same scaled binomial as at the defaults (see test_coverage).
        m = E.alp_sampling_noise(pisYes=0.10, pisNo=0.05)
        return Case(key, m, _toy_counts(m, [("bottom_count", E.ALP_BOTTOM)]), "per_station")
    if key == "alp_plausible_deniability":
        m = E.alp_plausible_deniability()
        return Case(key, m, _toy_counts(m, [("yes_count", E.ALP_YES),
                                            ("bottom_count", E.ALP_BOTTOM)]), "per_station")
    raise KeyError(key)


CASE_KEYS = (
    "sp_binary",
    "sp_multi",
    "rr_two_coin",
    "rr_kary",
    "krr",
    "fresh",
    "alp_optimal",
    "alp_sampling_noise",
    "alp_sampling_noise_y10",
    "alp_plausible_deniability",
)


@cache
def case(key: str) -> Case:
    return _build(key)


def all_labels() -> list[tuple[str, str]]:
    """Every (case key, estimator name) pair of the battery."""
    return [(k, name) for k in CASE_KEYS for name in case(k).estimators]


# ---------------------------------------------------------------------------------------
# Simulation
# ---------------------------------------------------------------------------------------
def rng_for(*parts: object) -> np.random.Generator:
    """A generator seeded by a stable hash of ``parts`` (not Python's salted ``hash``)."""
    words = [zlib.crc32(repr(p).encode()) for p in parts]
    return np.random.default_rng(np.random.SeedSequence([20240601, *words]))


def _per_station_counts(c: Case, rng: np.random.Generator, yes: int, n: int,
                        trials: int) -> FloatArray:
    """``(trials, 1, O)`` counts: each station of a PerStation tally is one epoch."""
    chunk = trials if yes == 0 else max(1, min(trials, n // yes))
    parts = []
    done = 0
    while done < trials:
        size = min(chunk, trials - done)
        ps = E.PerStation(c.mech, size)
        parts.append(ps.tally(rng, np.full(size, yes, dtype=np.int64), n))
        done += size
    return np.concatenate(parts)[:, None, :].astype(np.float64)


def simulate(key: str, yes_values: Sequence[int], n: int, trials: int,
             salt: str = "") -> dict[str, FloatArray]:
    """Estimates ``(trials, len(yes_values))`` of every estimator of case ``key``.

    Column j holds epochs with ``yes_values[j]`` of ``n`` vehicles at the station.
    """
    return _simulate(key, tuple(int(y) for y in yes_values), int(n), int(trials), salt)


@cache
def _simulate(key: str, yes_values: tuple[int, ...], n: int, trials: int,
              salt: str) -> dict[str, FloatArray]:
    c = case(key)
    rng = rng_for(key, yes_values, n, trials, salt)
    out = {name: np.empty((trials, len(yes_values))) for name in c.estimators}
    if c.kind == "multi":
        yes_arr = np.asarray(yes_values, dtype=np.int64)
        if yes_arr.size != MULTI_V or int(yes_arr.sum()) > n:
            raise ValueError("multi-station cases need one Yes count per station")
        truth = np.concatenate([[n - int(yes_arr.sum())], yes_arr])
        counts = E.station_counts(c.mech, c.mech.tally_epochs(rng, truth, trials))  # (trials, S, R, 2)
        for name, est in c.estimators.items():
            # station j + 1 holds yes_values[j]; its estimator is row j of est
            out[name][:] = est.estimate(counts, n)
        return out
    for j, yes in enumerate(yes_values):
        if c.kind == "per_station":
            counts = _per_station_counts(c, rng, yes, n, trials)
        else:
            truth = np.array([n - yes, yes], dtype=np.int64)
            rounds = c.mech.tally_epochs(rng, truth, trials)  # (trials, R, O)
            # (trials, R, O) read as that many one-station tallies
            counts = (E.station_counts(c.mech, rounds)[:, 0] if c.mech.station_valued else rounds).astype(np.float64)
        for name, est in c.estimators.items():
            out[name][:, j] = est.estimate(counts, n)
    return out


# ---------------------------------------------------------------------------------------
# Exact per-station moments (for the variance test's tolerance)
# ---------------------------------------------------------------------------------------
def station_rows(est: E.LinearEstimator, n_cols: int) -> IntArray:
    """Row of the estimator's per-station arrays for each column of a simulation."""
    if est.mean.shape[0] == 1:
        return np.zeros(n_cols, dtype=np.int64)
    if est.mean.shape[0] != n_cols:
        raise ValueError("multi-station estimator: one column per station expected")
    return np.arange(n_cols, dtype=np.int64)


def exact_variance(est: E.LinearEstimator, yes_values: Sequence[int], n: float) -> FloatArray:
    """Exact variance per column (``est.variance``, the quantity under test)."""
    station_rows(est, len(yes_values))  # shape check
    var = est.variance(np.asarray(yes_values, dtype=np.float64), n)
    out: FloatArray = np.broadcast_to(var, (len(yes_values),)).astype(np.float64)
    return out


def fourth_cumulant(est: E.LinearEstimator, yes_values: Sequence[int], n: float) -> FloatArray:
    """Exact fourth cumulant per column (a sum of independent per-vehicle terms), computed
    from the per-vehicle contributions; used only to size the variance test's tolerance."""
    rows = station_rows(est, len(yes_values))
    x = est.contributions  # (S, 2, F)
    p = np.broadcast_to(est.view.latent, x.shape)
    mean = (p * x).sum(axis=2, keepdims=True)
    m2 = (p * (x - mean) ** 2).sum(axis=2)
    m4 = (p * (x - mean) ** 4).sum(axis=2)
    k4 = (m4 - 3.0 * m2**2)[rows]  # (J, 2)
    yes = np.asarray(yes_values, dtype=np.float64)
    out: FloatArray = (n - yes) * k4[:, 0] + yes * k4[:, 1]
    return out


def coverage(est: E.LinearEstimator, method: str, estimates: FloatArray,
             yes_values: Sequence[int], n: float, confidence: float) -> FloatArray:
    """Per column, the fraction of epochs whose interval contains the true Yes count."""
    fn = {"score": est.score_interval, "plugin": est.plugin_interval,
          "hoeffding": est.hoeffding_interval}[method]
    lo, hi = fn(estimates, n, confidence)
    yes = np.asarray(yes_values, dtype=np.float64)[None, :]
    out: FloatArray = np.mean((lo <= yes) & (yes <= hi), axis=0)
    return out


# ---------------------------------------------------------------------------------------
# Exact coverage of two-point estimators
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TwoPointLaw:
    """A vehicle's contribution takes two values ``x0 < x1`` (or ``x1 < x0``); the estimate
    is ``n * (x0 - mean_no) + (x1 - x0) * C`` with ``C = Bin(Yes, p_yes) + Bin(No, p_no)``
    counting the vehicles that contribute ``x1``."""

    x0: float
    x1: float
    p_yes: float
    p_no: float
    mean_no: float


def two_point_law(est: E.LinearEstimator, row: int = 0) -> TwoPointLaw | None:
    """The law of ``est``'s station ``row`` if its contributions take two values."""
    x = est.contributions[row]
    p = np.broadcast_to(est.view.latent, est.contributions.shape)[row]
    vals = np.unique(np.round(x[p > 0], 12))
    if vals.size != 2:
        return None
    x0, x1 = float(vals[0]), float(vals[1])
    hit = np.isclose(x, x1, rtol=0, atol=1e-9 * max(1.0, abs(x1)))
    p_t = (p * hit).sum(axis=1)
    return TwoPointLaw(x0, x1, float(p_t[1]), float(p_t[0]), float(est.mean[row, 0]))


def count_pmf(law: TwoPointLaw, yes: int, n: int) -> tuple[IntArray, FloatArray]:
    """Exact pmf of ``C`` on the support where it exceeds 1e-40 (truncation < 1e-30)."""
    from scipy.stats import binom

    no = n - yes
    if law.p_no > 0:
        mu, sd = no * law.p_no, math.sqrt(no * law.p_no * (1 - law.p_no))
        lo = max(0, int(mu - 14 * sd - 10))
        hi = min(no, int(mu + 14 * sd + 10))
        k_no = np.arange(lo, hi + 1)
        pmf_no = binom.pmf(k_no, no, law.p_no)
    else:
        lo, pmf_no = 0, np.ones(1)
    pmf_yes = binom.pmf(np.arange(yes + 1), yes, law.p_yes)
    pmf = np.convolve(pmf_yes, pmf_no)
    support = lo + np.arange(pmf.size, dtype=np.int64)
    return support, pmf


def exact_coverage(est: E.LinearEstimator, method: str, yes: int, n: int, confidence: float,
                   row: int = 0) -> float:
    """Exact coverage of ``est``'s interval at station ``row`` (two-point estimators)."""
    law = two_point_law(est, row)
    if law is None:
        raise ValueError(f"{est.name}: not a two-point estimator")
    c, pmf = count_pmf(law, yes, n)
    values = n * (law.x0 - law.mean_no) + (law.x1 - law.x0) * c.astype(np.float64)
    fn = {"score": est.score_interval, "plugin": est.plugin_interval,
          "hoeffding": est.hoeffding_interval}[method]
    s_n = est.mean.shape[0]
    full = np.zeros((values.size, s_n))
    full[:, row] = values
    lo, hi = fn(full, n, confidence)
    covered = (lo[:, row] <= yes) & (yes <= hi[:, row])
    return float(pmf[covered].sum())


# ---------------------------------------------------------------------------------------
# The battery's shared simulation grid
# ---------------------------------------------------------------------------------------
YES_GRID = (0, 1, 5, 50, 500)  # true counts at the station (one station each for "multi")
N_GRID = (10_000, 1_000_000)  # small and large population of reporting vehicles
TRIALS = 20_000  # simulated epochs per (case, N, Yes)

# Cases whose simulation calls Mechanism.tally once per epoch (a few seconds each).
SLOW_CASES = frozenset({"sp_binary", "sp_multi", "rr_kary", "krr", "fresh"})


def battery(key: str, n: int) -> dict[str, FloatArray]:
    """Estimates ``(TRIALS, len(YES_GRID))`` for every estimator of ``key`` at population n
    (cached: the bias and coverage modules share one simulation per (case, N))."""
    return simulate(key, YES_GRID, n, TRIALS)


def case_params() -> list[object]:
    """``pytest.param(key, n)`` for every case and population, slow ones marked."""
    import pytest

    return [pytest.param(k, n, id=f"{k}-N{n:.0e}".replace("+0", ""),
                         marks=[pytest.mark.slow] if k in SLOW_CASES else [])
            for k in CASE_KEYS for n in N_GRID]
