"""Unbiased linear count estimators with exact variances and confidence bounds.

Every estimator in the papers is linear in the per-round report counts of one station:

    estimate = sum_{r,o} w[r, o] * C[r, o]  -  N * mu_No

Per vehicle, ``X = sum_r w[r, report_r]`` is a function of its die roll and truth, so its
mean, variance and range under "Yes" and "No" follow exactly from the mechanism's table
(:class:`StationView`). Weights are normalized so ``mu_Yes - mu_No = 1``, hence

    E[estimate]   = Yes                                   (unbiased)
    Var[estimate] = N * var_No + Yes * (var_Yes - var_No)  (= alpha + beta * Yes)

with the rounds' correlation (Sampling Privacy's one die per epoch) taken into account.

Confidence bounds (docs/statistics.md, "Estimators"):

* **score** (Wilson-type): ``{Y in [0, N] : (est - Y)^2 <= z^2 Var(Y)}``, a quadratic in Y;
  valid at zero and small counts, where the variance depends strongly on Y. Estimates that
  live on a lattice (a scaled binomial) get a continuity correction of half a step.
* **plug-in**: ``est +- z sqrt(Var(max(est, 0)))``; shown for contrast, under-covers at
  small counts.
* **hoeffding** (distribution-free, Gaboardi's lecture notes): each vehicle's ``X`` lies in a range ``R``;
  ``P(|est - Y| >= t) <= 2 exp(-2 t^2 / sum R_i^2)``, solved for Y the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from ._types import BoolArray, FloatArray, IntArray
from .mechanisms import ALP_BOTTOM, ALP_YES, Mechanism

__all__ = [
    "Bound",
    "LinearEstimator",
    "StationView",
    "alp_estimators",
    "count_estimator",
    "fresh_difference",
    "gls",
    "mean_of",
    "quadratic_interval",
    "rr_estimator",
    "sp_difference",
    "station_counts",
    "station_view",
]


@dataclass(frozen=True, eq=False)
class StationView:
    """What one station's estimator sees of a mechanism.

    ``latent[s, t, f]``: P(face f | truth t) for station s, t = 0 (No) or 1 (Yes).
    ``outputs[r, s, t, f]``: the report in round r, in the view's output alphabet.
    A size-1 station axis broadcasts over all stations.

    Station-valued mechanisms are reduced to "is the report this station?" (outputs 0/1)
    with "Yes" = truth s and "No" = truth 0 (no station); every other "No" truth gives the
    same distribution of the reduced report (checked by a unit test).
    """

    latent: FloatArray
    outputs: IntArray
    n_outputs: int
    n_stations: int

    @property
    def n_rounds(self) -> int:
        return int(self.outputs.shape[0])


def station_view(mech: Mechanism, stations: Sequence[int] | IntArray | None = None) -> StationView:
    """The per-station view of ``mech`` (stations 1..V for station-valued mechanisms)."""
    if mech.station_valued:
        v = mech.n_truths - 1
        st = np.arange(1, v + 1, dtype=np.int64) if stations is None else np.asarray(stations, dtype=np.int64)
        if st.size == 0 or st.min() < 1 or st.max() > v:
            raise ValueError(f"stations must lie in 1..{v}")
        faces = np.arange(mech.n_faces, dtype=np.int64)[None, None, :]
        truths = np.stack([np.zeros_like(st), st], axis=1)[:, :, None]  # (S, 2, 1)
        outputs = np.stack([
            np.broadcast_to(mech.emit(r, faces, truths) == st[:, None, None], (st.size, 2, mech.n_faces))
            for r in range(mech.n_rounds)
        ]).astype(np.int64)
        full = mech.latent_full()
        latent = full[truths[:, :, 0]]  # (S, 2, F)
        return StationView(latent=latent, outputs=outputs, n_outputs=2, n_stations=int(st.size))
    if mech.n_truths != 2:
        raise ValueError(f"{mech.name}: not binary and not station-valued")
    faces = np.arange(mech.n_faces, dtype=np.int64)[None, :]
    truths = np.array([[0], [1]], dtype=np.int64)
    outputs = np.stack([np.broadcast_to(mech.emit(r, faces, truths), (2, mech.n_faces))
                        for r in range(mech.n_rounds)])[:, None, :, :]
    return StationView(latent=mech.latent_full()[None, :, :], outputs=outputs.astype(np.int64),
                       n_outputs=mech.n_outputs, n_stations=1)


def station_counts(mech: Mechanism, round_counts: IntArray,
                   stations: Sequence[int] | IntArray | None = None) -> IntArray:
    """Per-station counts ``(S, R, 2)`` of a station-valued mechanism's round counts ``(R, O)``
    (``(k, S, R, 2)`` of ``(k, R, O)``: k epochs at once).

    Column 1 is the number of reports naming the station, column 0 all the others.
    """
    rc = np.asarray(round_counts, dtype=np.int64)
    v = mech.n_truths - 1
    st = np.arange(1, v + 1, dtype=np.int64) if stations is None else np.asarray(stations, dtype=np.int64)
    hits = np.swapaxes(rc[..., st], -1, -2)  # (..., S, R)
    totals = rc.sum(axis=-1)[..., None, :]
    return np.stack([totals - hits, hits], axis=-1)


@dataclass(frozen=True)
class Bound:
    confidence: float
    lower: FloatArray
    upper: FloatArray


def quadratic_interval(est: FloatArray, alpha: FloatArray, beta: FloatArray, k: float | FloatArray,
                       n: FloatArray, slack: float | FloatArray = 0.0) -> tuple[FloatArray, FloatArray]:
    """``{Y in [0, n] : |est - Y| <= slack + sqrt(k (alpha + beta Y))}``.

    ``slack`` is a continuity correction (half a lattice step). The upper end is the larger
    root of ``(est + slack - Y)^2 = k (alpha + beta Y)`` (at least ``est + slack``), the lower
    end the smaller root around ``est - slack`` (at most ``est - slack``). If no Y in [0, n]
    qualifies -- the data are inconsistent with every admissible count at this level -- the
    bound collapses to the admissible point closest to the set.
    """
    est, alpha, beta, n, slack = np.broadcast_arrays(
        *(np.asarray(x, dtype=np.float64) for x in (est, alpha, beta, n, slack)))

    def roots(centre: FloatArray) -> tuple[FloatArray, FloatArray]:
        b = 2.0 * centre + k * beta
        disc = b * b - 4.0 * (centre * centre - k * alpha)
        root = np.sqrt(np.maximum(disc, 0.0))
        ok = disc >= 0
        return np.where(ok, (b - root) / 2.0, np.inf), np.where(ok, (b + root) / 2.0, -np.inf)

    lo_root, _ = roots(est - slack)
    _, hi_root = roots(est + slack)
    lo = np.minimum(est - slack, lo_root)
    hi = np.maximum(est + slack, hi_root)
    return np.clip(lo, 0.0, n), np.clip(hi, 0.0, n)


@lru_cache(maxsize=64)
def _z2(confidence: float) -> float:
    from scipy.stats import norm
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(norm.ppf(0.5 + confidence / 2.0) ** 2)


@dataclass(frozen=True, eq=False)
class LinearEstimator:
    """``estimate = sum w * C - N * mu_No`` for each station of a view (see module doc)."""

    name: str
    view: StationView
    weights: FloatArray  # (S or 1, R, O), normalized: mu_Yes - mu_No = 1

    @classmethod
    def from_raw(cls, name: str, view: StationView, raw: FloatArray) -> LinearEstimator:
        raw = np.asarray(raw, dtype=np.float64)
        if raw.ndim == 2:
            raw = raw[None]
        probe = cls(name, view, raw)
        gap = probe._raw_moments[0][:, 1] - probe._raw_moments[0][:, 0]
        if np.any(np.abs(gap) < 1e-15):
            raise ValueError(f"{name}: the statistic does not depend on the truth")
        return cls(name, view, raw / gap[:, None, None])

    @classmethod
    def stacked(cls, name: str, parts: Iterable[LinearEstimator]) -> LinearEstimator:
        """One estimator over the stations of several estimators (chunks of stations) that
        keeps only their per-station moments and lattice steps: O(S) memory instead of the
        O(S x faces) contribution table. ``parts`` is consumed one at a time, so only one
        chunk's view is alive at once. ``covariance_with`` is not available on it."""
        weights, moments, steps, view = [], [], [], None
        for p in parts:
            weights.append(np.broadcast_to(p.weights, (p.mean.shape[0], *p.weights.shape[1:])).copy())
            moments.append(p._raw_moments)
            steps.append(p.lattice_step)
            view = view or StationView(p.view.latent[:1], p.view.outputs[:, :1], p.view.n_outputs, 1)
        if view is None:
            raise ValueError(f"{name}: no stations")
        est = cls(name, view, np.concatenate(weights))
        est.__dict__["_raw_moments"] = tuple(np.concatenate([m[i] for m in moments]) for i in range(3))
        est.__dict__["lattice_step"] = np.concatenate(steps)  # fill the cached properties directly
        return est

    # -- exact per-vehicle moments -----------------------------------------------------
    @cached_property
    def contributions(self) -> FloatArray:
        """``X[s, t, f]``: a vehicle's contribution to the statistic."""
        v = self.view
        s = max(self.weights.shape[0], v.outputs.shape[1])
        x = np.zeros((s, 2, v.latent.shape[2]))
        for r in range(v.n_rounds):
            w_r = np.broadcast_to(self.weights[:, r, :], (s, v.n_outputs))
            out_r = np.broadcast_to(v.outputs[r], (s, 2, v.latent.shape[2])).reshape(s, -1)
            x += np.take_along_axis(w_r, out_r, axis=1).reshape(s, 2, -1)
        return x

    @cached_property
    def _raw_moments(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        x = self.contributions
        p = np.broadcast_to(self.view.latent, x.shape)
        mean = (p * x).sum(axis=2)
        var = (p * (x - mean[:, :, None]) ** 2).sum(axis=2)
        support = p > 0
        rng = np.where(support, x, -np.inf).max(axis=2) - np.where(support, x, np.inf).min(axis=2)
        return mean, var, rng

    @property
    def mean(self) -> FloatArray:
        """``(S, 2)``: per-vehicle mean contribution under No (col 0) and Yes (col 1)."""
        return self._raw_moments[0]

    @property
    def var(self) -> FloatArray:
        return self._raw_moments[1]

    @property
    def range(self) -> FloatArray:
        return self._raw_moments[2]

    def covariance_with(self, other: LinearEstimator) -> FloatArray:
        """``(S, 2)``: per-vehicle Cov(X_self, X_other) under No and Yes."""
        xa, xb = np.broadcast_arrays(self.contributions, other.contributions)
        p = np.broadcast_to(self.view.latent, xa.shape)
        ma = (p * xa).sum(axis=2, keepdims=True)
        mb = (p * xb).sum(axis=2, keepdims=True)
        out: FloatArray = (p * (xa - ma) * (xb - mb)).sum(axis=2)
        return out

    # -- estimates ----------------------------------------------------------------------
    def estimate(self, counts: IntArray | FloatArray, n: float | FloatArray) -> FloatArray:
        """Unbiased estimate per station from counts ``(S, R, O)`` and population ``N``; or,
        for k epochs at once, counts ``(k, S, R, O)`` and ``N`` of shape ``(k, 1)`` give
        ``(k, S)`` (every other method broadcasts the same way)."""
        c = np.asarray(counts, dtype=np.float64)
        if c.ndim not in (3, 4) or c.shape[-2:] != self.weights.shape[1:]:
            want = f"(S, {self.weights.shape[1]}, {self.weights.shape[2]})"
            raise ValueError(f"{self.name}: counts must have shape {want}, got {c.shape}")
        stat = (c * self.weights).sum(axis=(-2, -1))
        out: FloatArray = stat - np.asarray(n, dtype=np.float64) * self.mean[:, 0]
        return out

    def variance(self, yes: float | FloatArray, n: float | FloatArray) -> FloatArray:
        """Exact variance of the estimate when ``yes`` of ``n`` vehicles are at the station."""
        alpha, beta = self.variance_coefficients(n)
        out: FloatArray = alpha + beta * np.asarray(yes, dtype=np.float64)
        return out

    def variance_coefficients(self, n: float | FloatArray) -> tuple[FloatArray, FloatArray]:
        """``(alpha, beta)`` with ``Var = alpha + beta * Yes``."""
        nn = np.asarray(n, dtype=np.float64)
        return nn * self.var[:, 0], self.var[:, 1] - self.var[:, 0] + 0.0 * nn

    @cached_property
    def lattice_step(self) -> FloatArray:
        """``(S,)``: spacing of the lattice the estimate lives on, 0 if it has none.

        A vehicle's contribution takes a few values; if all their differences are integer
        multiples of one step ``d`` (Sampling Privacy: ``1/pis``), every estimate is a
        multiple of ``d`` plus a constant. Values that are incommensurate (the ALP average)
        make the estimate effectively continuous: step 0.
        """
        x = self.contributions
        p = np.broadcast_to(self.view.latent, x.shape)
        steps = np.zeros(x.shape[0])
        for s in range(x.shape[0]):
            vals = np.unique(np.round(x[s][p[s] > 0], 12))
            diffs = np.diff(vals)
            if diffs.size == 0:
                continue
            d = float(diffs.min())
            ratios = (vals - vals[0]) / d
            if np.allclose(ratios, np.round(ratios), atol=1e-9):
                steps[s] = d
        return steps

    def score_interval(self, est: FloatArray, n: float | FloatArray,
                       confidence: float) -> tuple[FloatArray, FloatArray]:
        """Score interval with a continuity correction of half the lattice step:
        ``|est - Y| <= step/2 + z sd(Y)``. Without it a lattice estimate (a scaled binomial, as
        Sampling Privacy's) under-covers at small counts (93.1% at Yes = 5 at 95%)."""
        alpha, beta = self.variance_coefficients(n)
        return quadratic_interval(est, alpha, beta, _z2(confidence), np.asarray(n, dtype=np.float64),
                                  slack=self.lattice_step / 2.0)

    def consistent(self, est: FloatArray, n: float | FloatArray, confidence: float = 1 - 1e-9) -> BoolArray:
        """Per station: is there any admissible count ``Y in [0, n]`` whose score interval at
        ``confidence`` contains ``est``? False means the reports are impossible for the declared
        population (e.g. forged participants, injected reports) at false-alarm rate
        ``1 - confidence`` per station (a normal approximation: exact enough far in the tail
        only for large counts, so keep the level extreme).

        ``h(Y) = max(|est - Y| - step/2, 0)^2 - z^2 (alpha + beta Y)`` is convex in Y and
        piecewise quadratic; its minimum over ``[0, n]`` is at one of its kinks or stationary
        points (``est -+ step/2``, ``est -+ step/2 + z^2 beta / 2``) clipped to the interval.

        >>> import estimators as E
        >>> rr = E.rr_estimator(E.two_coin_rr(0.8, 0.2), stations=[1])
        >>> rr.consistent(np.array([50.0, -4949.0]), 1000).tolist()  # -4949: forged participants
        [True, False]
        """
        alpha, beta = self.variance_coefficients(n)
        k = _z2(confidence)
        e, a, b, nn, slack = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in
                                                    (est, alpha, beta, n, self.lattice_step / 2.0)))

        def h(y: FloatArray) -> FloatArray:
            gap = np.maximum(np.abs(e - y) - slack, 0.0)
            out: FloatArray = gap * gap - k * np.maximum(a + b * y, 0.0)
            return out

        shift = k * b / 2.0
        candidates = (e - slack, e + slack, e - slack + shift, e + slack + shift, np.zeros_like(e), nn)
        best = np.min([h(np.clip(c, 0.0, nn)) for c in candidates], axis=0)
        ok: BoolArray = best <= 1e-9 * (1.0 + nn)
        return ok

    def plugin_interval(self, est: FloatArray, n: float | FloatArray,
                        confidence: float) -> tuple[FloatArray, FloatArray]:
        sd = np.sqrt(np.maximum(self.variance(np.maximum(est, 0.0), n), 0.0))
        z = np.sqrt(_z2(confidence))
        return est - z * sd, est + z * sd

    def hoeffding_interval(self, est: FloatArray, n: float | FloatArray,
                           confidence: float) -> tuple[FloatArray, FloatArray]:
        """Distribution-free bound (Gaboardi's lecture notes Chernoff/Hoeffding argument, generalized)."""
        nn = np.asarray(n, dtype=np.float64)
        r2 = self.range**2
        k = np.log(2.0 / (1.0 - confidence)) / 2.0
        return quadratic_interval(est, nn * r2[:, 0], r2[:, 1] - r2[:, 0], k, nn)

    def bounds(self, est: FloatArray, n: float | FloatArray, confidences: Sequence[float] = (0.95, 0.99),
               method: str = "score") -> list[Bound]:
        fn = {"score": self.score_interval, "plugin": self.plugin_interval,
              "hoeffding": self.hoeffding_interval}[method]
        return [Bound(c, *fn(est, n, c)) for c in confidences]


def count_estimator(name: str, view: StationView, output: int, round_: int = 0) -> LinearEstimator:
    """Estimate Yes from the count of one report value in one round."""
    raw = np.zeros((1, view.n_rounds, view.n_outputs))
    raw[0, round_, output] = 1.0
    return LinearEstimator.from_raw(name, view, raw)


def mean_of(name: str, a: LinearEstimator, b: LinearEstimator) -> LinearEstimator:
    """The plain average (a + b) / 2 of two estimators of the same view."""
    wa, wb = np.broadcast_arrays(a.weights, b.weights)
    return LinearEstimator(name, a.view, (wa + wb) / 2.0)


def gls(name: str, a: LinearEstimator, b: LinearEstimator, design_yes: float | FloatArray = 0.0,
        design_n: float | FloatArray = 1.0) -> LinearEstimator:
    """Best linear unbiased combination ``lam * a + (1 - lam) * b``.

    The weights minimize the exact variance at the design point (``design_yes`` of
    ``design_n`` vehicles). With the design fixed before the data are seen (a plan, or the
    previous epoch's estimate) the result stays exactly linear and unbiased, and its
    variance at the design point is never above that of a, b or their average. The
    default design ``Yes = 0`` is the noise-dominated regime ALP is built for.
    """
    y = np.asarray(design_yes, dtype=np.float64)
    nn = np.asarray(design_n, dtype=np.float64)
    va = nn * a.var[:, 0] + y * (a.var[:, 1] - a.var[:, 0])
    vb = nn * b.var[:, 0] + y * (b.var[:, 1] - b.var[:, 0])
    cab = a.covariance_with(b)
    c = nn * cab[:, 0] + y * (cab[:, 1] - cab[:, 0])
    denom = va + vb - 2.0 * c
    lam = np.where(denom > 0, (vb - c) / np.where(denom > 0, denom, 1.0), 0.5)
    wa, wb = np.broadcast_arrays(a.weights, b.weights)
    lam_b = np.broadcast_to(np.asarray(lam, dtype=np.float64).reshape(-1, 1, 1), wa.shape)
    return LinearEstimator(name, a.view, lam_b * wa + (1.0 - lam_b) * wb)


_CHUNK_CELLS = 500_000  # stations x faces per chunk of a station-valued view (bounds the peak memory)


def _per_station(name: str, mech: Mechanism, stations: Sequence[int] | IntArray | None,
                 raw: FloatArray) -> LinearEstimator:
    """Build a station-valued estimator in chunks of stations when the view would be large."""
    st = np.arange(1, mech.n_truths, dtype=np.int64) if stations is None else np.asarray(stations, dtype=np.int64)
    chunk = max(1, _CHUNK_CELLS // (2 * mech.n_faces))
    if st.size <= chunk:
        return LinearEstimator.from_raw(name, station_view(mech, st), raw)
    parts = (LinearEstimator.from_raw(name, station_view(mech, st[i:i + chunk]), raw)
             for i in range(0, st.size, chunk))
    return LinearEstimator.stacked(name, parts)


def sp_difference(mech: Mechanism, stations: Sequence[int] | IntArray | None = None) -> LinearEstimator:
    """Sampling Privacy difference estimator (Differential Privacy by Sampling eqs. 11, 16):
    ``(C_v,round2 - C_v,round1) / pis``."""
    if mech.n_rounds != 2 or not mech.station_valued:
        raise ValueError("sp_difference needs a two-round Sampling Privacy mechanism")
    raw = np.zeros((1, 2, 2))
    raw[0, 1, 1], raw[0, 0, 1] = 1.0, -1.0
    return _per_station("sp_difference", mech, stations, raw)


def rr_estimator(mech: Mechanism, stations: Sequence[int] | IntArray | None = None,
                 name: str = "rr") -> LinearEstimator:
    """Randomized-response estimator: ``(C_1 - P(1|No) N) / (P(1|Yes) - P(1|No))``;
    for two-coin RR this is ``(C_1 - (1 - pi1) pi2 N) / pi1``. Station-valued (k-ary RR):
    per station, ``C_1`` counts the reports naming it. ``name``: the estimator's name (the
    registry's ``krr`` calls it ``krr``)."""
    if mech.station_valued:
        raw = np.zeros((1, 1, 2))
        raw[0, 0, 1] = 1.0
        return _per_station(name, mech, stations, raw)
    return count_estimator(name, station_view(mech), ALP_YES)


def fresh_difference(mech: Mechanism) -> LinearEstimator:
    """Fresh-sample estimator (Towards Scaling Privacy Strength): ``(C_round1 - C_round2 - N (pisNo1 - pisNo2)) /
    (pisYes1 - pisYes2 - (pisNo1 - pisNo2))`` -- the poster's formula when pisNo1 = pisNo2."""
    raw = np.zeros((1, 2, 2))
    raw[0, 0, 1], raw[0, 1, 1] = 1.0, -1.0
    return LinearEstimator.from_raw("fresh_difference", station_view(mech), raw)


def alp_estimators(mech: Mechanism, design_yes: float = 0.0, design_n: float = 1.0) -> dict[str, LinearEstimator]:
    """Anonymized Local Privacy estimators (Anonymized Local Privacy §V-E).

    * ``alp_yhat``: Lemma 1, from the count of "Yes" reports;
    * ``alp_bottom``: Lemma 2, from the count of ⊥ reports;
    * ``alp_average``: ``(Y_hat + ⊥_hat) / 2``. Definition 5 of the paper prints
      ``(Y_hat - ⊥_hat) / 2``; both lemmas estimate Yes, so that expression has expectation
      zero -- a sign slip, corrected here;
    * ``alp_gls``: the best linear unbiased combination of the two (see :func:`gls`).
    """
    view = station_view(mech)
    yhat = count_estimator("alp_yhat", view, ALP_YES)
    bottom = count_estimator("alp_bottom", view, ALP_BOTTOM)
    return {
        "alp_yhat": yhat,
        "alp_bottom": bottom,
        "alp_average": mean_of("alp_average", yhat, bottom),
        "alp_gls": gls("alp_gls", yhat, bottom, design_yes, design_n),
    }
