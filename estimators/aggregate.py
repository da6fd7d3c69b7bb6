"""Exact privacy of the aggregate release: per (query, version, epoch, round), only counts.

What the analyst sees when the shuffler releases counts instead of a permuted list: for a
per-sensor mechanism, each station's count of each report; for a station-valued one, the
histogram over values. Both are post-processings of the permuted list, so the clone bound of
:mod:`estimators.shuffle` holds for them; this module computes the privacy of the counts
themselves, which is much smaller.

**Per-sensor binary mechanisms** (symmetric unary RR, two-coin RR, each round of the
fresh-sample variant): each device answers about every station with independent coins, so a
station's count of "1" reports is an independent sum over the devices. Neighbouring datasets
differ in one vehicle: at station a versus at station b (two stations change), or at a versus
at no station (one changes). At a station, the target's answer is ``Bern(p1)`` versus
``Bern(p0)`` (``p1 = P(1 | Yes)``, ``p0 = P(1 | No)``) added to the count of the other
``m = n - 1`` devices, ``k`` of which the adversary may put at the station::

    X_k = Bin(k, p1) + Bin(m - k, p0),   P(c) = p1 f_k(c-1) + (1-p1) f_k(c),
                                         Q(c) = p0 f_k(c-1) + (1-p0) f_k(c)

(the other stations' counts are identically distributed under both and cancel). No single
``k`` is the worst everywhere (near eps = 0 it is ``k ~ m/2``, in the tails ``k = 0`` or
``m``), so :func:`station_profiles` computes the hockey-stick curve ``delta_k(eps)`` of every
``k = 0..m`` exactly on a grid of eps (negative eps included: that is the reverse direction)
and takes the pointwise maximum. :func:`connect_the_dots` turns that curve into one discrete
PLD whose curve is its linear interpolation in ``e^eps`` (Doroshenko, Ghazi, Kamath, Kumar
and Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss
Distributions", PETS 2022): a curve convex in ``e^eps`` lies below its chords, so the PLD
dominates every ``k`` at every eps, and a pair dominating at every eps (of both signs)
dominates under composition. The move a -> b composes station a's (``p1`` vs ``p0``) and
station b's (``p0`` vs ``p1``) worst cases, each taken independently (``k_a + k_b <= m`` is
relaxed: a valid, slightly pessimistic bound); "at a vs at none" is a post-processing of it.

Binomial mass outside each window (at most ~1e-17 a side; the exact missing mass of each row) and an FFT round-off
allowance of 1e-12 per curve are counted at infinite loss.

**Other mechanisms**: three report values per station (ALP's 2-D count ``(C0, C1)``) and k-ary
RR's histogram are in :mod:`estimators.aggregate_multi` (built on :func:`hockey_rows`,
:func:`connect_the_dots` and :func:`covering_ks` here). Sampling Privacy's rounds share one die:
no per-round accounting; :meth:`registry.MechanismSpec.aggregate_plds` returns ``None`` there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ._types import FloatArray
from .shuffle import Pld, compose

__all__ = ["BLANKET_NOTE", "EXACT_NOTE", "FALLBACK_NOTE", "StationCurves", "binary_rates", "compose_epoch",
           "connect_the_dots", "count_window", "covering_ks", "default_stride", "epoch_plds", "epsilon_of",
           "hockey_rows", "loss_grid", "station_pld", "station_profiles"]

EXACT_NOTE = "exact: the counts' privacy-loss distribution, worst case over the other devices' data"
#: k-ary RR's histogram: one PLD through the privacy blanket
BLANKET_NOTE = "the histogram's privacy-loss distribution through the privacy blanket: an upper bound"
FALLBACK_NOTE = ("the clone bound of the permuted release (valid for the counts by post-processing); "
                 "no exact accounting of this mechanism's counts yet")

_Z = 8.0  # binomial window half-width in standard deviations
_FFT_SLACK = 1e-12  # added to every curve value: dominates the FFT's round-off
_BATCH = 256
_SPREAD = 6.0  # the eps grid's sinh spacing
_EXACT_PRODUCT = 1 << 20  # compose_epoch: two PLDs composed exactly up to this many pairs of losses
_EPOCH_STEP = 1e-6  # compose_epoch: more PLDs on a grid this fine (each loss rounded up by less)
_EPOCH_GRID = 1 << 23  # ... unless their losses span more than this many such steps (then coarser)


def binary_rates(table: FloatArray) -> tuple[float, float] | None:
    """``(p1, p0)``: P(report 1 | Yes), P(report 1 | No) of a binary table; None otherwise."""
    tab = np.asarray(table, dtype=np.float64)
    if tab.shape != (2, 2):
        return None
    return float(tab[1, 1]), float(tab[0, 1])


def count_window(trials: int, p: float) -> tuple[int, int]:
    """A count window ``[lo, hi]`` leaving out at most ~1e-17 of Bin(trials, p) on each side
    (8 sd, widened where the binomial is skewed: a small mean has a heavy right tail)."""
    from scipy.stats import binom
    mean, sd = trials * p, math.sqrt(trials * p * (1 - p))
    z = _Z
    while True:
        lo, hi = max(0, math.floor(mean - z * sd) - 1), min(trials, math.ceil(mean + z * sd) + 1)
        if (lo == 0 or binom.cdf(lo - 1, trials, p) <= 1e-17) and (hi == trials or binom.sf(hi, trials, p) <= 1e-17):
            return lo, hi
        z *= 1.5


def _binom_block(first: int, count: int, p: float) -> tuple[int, FloatArray]:
    """Rows ``i = 0..count-1``: the pmf of Bin(first + i, p) on one common window starting at
    the returned count, built by the recursion ``b_{t+1}(c) = (1-p) b_t(c) + p b_t(c-1)`` from
    the first row (positive weights: no cancellation). Mass the window cuts off is simply
    missing, so ``1 - row.sum()`` is (up to round-off) exactly what a row leaves out."""
    from scipy.stats import binom
    lo, _ = count_window(first, p)
    _, hi = count_window(first + count - 1, p)
    x = np.arange(lo, hi + 1)
    rows = np.empty((count, x.size))
    row = np.asarray(binom.pmf(x, first, p), dtype=np.float64)
    for i in range(count):
        rows[i] = row
        if i + 1 < count:
            nxt = (1 - p) * row
            nxt[1:] += p * row[:-1]
            row = nxt
    return lo, rows


def _windows(trials: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_window` of every entry of ``trials`` at once (the same windows, one scipy call per
    widening instead of two per row)."""
    from scipy.stats import binom
    t = np.asarray(trials, dtype=np.int64)
    mean, sd = t * p, np.sqrt(t * p * (1 - p))
    lo, hi = np.zeros(t.size, dtype=np.int64), np.zeros(t.size, dtype=np.int64)
    todo, z = np.arange(t.size), _Z
    while todo.size:
        tt, mu, s = t[todo], mean[todo], sd[todo]
        lo_t = np.maximum(0, np.floor(mu - z * s).astype(np.int64) - 1)
        hi_t = np.minimum(tt, np.ceil(mu + z * s).astype(np.int64) + 1)
        ok = ((lo_t == 0) | (binom.cdf(lo_t - 1, tt, p) <= 1e-17)) & ((hi_t == tt) | (binom.sf(hi_t, tt, p) <= 1e-17))
        lo[todo[ok]], hi[todo[ok]] = lo_t[ok], hi_t[ok]
        todo, z = todo[~ok], z * 1.5
    return lo, hi


def _binom_rows(trials: np.ndarray, p: float) -> FloatArray:
    """Row ``i``: the pmf of Bin(trials[i], p) on its own :func:`_window` (left-aligned, zero
    beyond it), as ``_binom_block(trials[i], 1, p)`` would give, in one vectorized call."""
    from scipy.stats import binom
    lo, hi = _windows(trials, p)
    x = lo[:, None] + np.arange(int((hi - lo).max()) + 1)[None, :]
    rows = np.asarray(binom.pmf(x, np.asarray(trials)[:, None], p), dtype=np.float64)
    rows[x > hi[:, None]] = 0.0
    return rows


@dataclass(frozen=True)
class StationCurves:
    """``delta(eps)`` on ``eps`` for one station, worst over k: ``forward`` = the target's answer
    Bern(p1) vs Bern(p0), ``backward`` = Bern(p0) vs Bern(p1); ``worst_k_*`` the k attaining it."""

    eps: FloatArray
    forward: FloatArray
    backward: FloatArray
    worst_k_forward: np.ndarray
    worst_k_backward: np.ndarray


def _grid(p1: float, p0: float, points: int) -> FloatArray:
    return loss_grid(max(abs(math.log(p1 / p0)), abs(math.log((1 - p1) / (1 - p0)))), points)


def loss_grid(e: float, points: int) -> FloatArray:
    """``points`` eps from ``-e`` to ``e`` (``e`` the largest |loss|), dense near 0 where an
    epoch's losses lie (sinh spacing: steps ~1e-4 there, ~0.02 near ``e``), 0 included."""
    t = np.linspace(-1.0, 1.0, points)
    g = e * np.sinh(_SPREAD * t) / math.sinh(_SPREAD)
    g[0], g[-1] = -e, e
    return g


def hockey_rows(pp: FloatArray, qq: FloatArray, eps: FloatArray, tail: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Per row of ``(pp, qq)`` (two distributions over the same outputs, one pair per row), the
    exact hockey-stick curves ``delta(eps_j)`` of (pp, qq) and of (qq, pp) at the grid points
    ``eps``, plus ``tail`` (per row: mass not enumerated, counted at infinite loss).

    Exact at the grid points: every loss binned to the grid point at or above it, and
    ``delta(eps_j) = sum over losses > eps_j of (num - e^eps_j den)`` only needs which losses
    exceed ``eps_j``. Outputs where one side is 0 are left out (callers never produce them
    inside their windows: every mechanism here has all report probabilities > 0)."""
    points = eps.size
    x = np.exp(eps)
    rows = pp.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = np.log(pp / qq)
    live = (pp > 0) & (qq > 0) & np.isfinite(loss)
    out = []
    for sign in (1.0, -1.0):
        num, den = (pp, qq) if sign > 0 else (qq, pp)
        lv = np.clip(sign * loss, eps[0], eps[-1])
        # bin j: eps[j-1] < L <= eps[j]; delta(eps_j) = sum over bins > j of (num - x_j den)
        idx = np.searchsorted(eps, lv, side="left")
        flat = (idx + points * np.arange(rows)[:, None])[live]
        sn = np.bincount(flat, weights=num[live], minlength=rows * points).reshape(rows, points)
        sd = np.bincount(flat, weights=den[live], minlength=rows * points).reshape(rows, points)
        above_n = np.cumsum(sn[:, ::-1], axis=1)[:, ::-1]
        above_d = np.cumsum(sd[:, ::-1], axis=1)[:, ::-1]
        gt_n = np.concatenate([above_n[:, 1:], np.zeros((rows, 1))], axis=1)
        gt_d = np.concatenate([above_d[:, 1:], np.zeros((rows, 1))], axis=1)
        out.append(np.maximum(gt_n - x[None, :] * gt_d, 0.0) + np.asarray(tail)[:, None])
    return out[0], out[1]


def station_profiles(m: int, p1: float, p0: float, ks: np.ndarray | None = None,
                     points: int = 501) -> StationCurves:
    """The exact hockey-stick curves of one station's count for every ``k`` in ``ks`` (default:
    all of ``0..m``) on ``points`` eps from ``-E`` to ``E`` (``E`` the largest |loss|), and
    their pointwise maxima. Exact at the grid points (every loss binned to the grid point at or
    above it, and ``delta(eps_j)`` only needs which losses exceed ``eps_j``)."""
    import scipy.fft as sfft
    if not (0 < p0 < 1 and 0 < p1 < 1) or abs(p0 - p1) < 1e-12:
        raise ValueError("a binary answer with 0 < p0 != p1 < 1 is needed")
    eps = _grid(p1, p0, points)
    all_k = np.arange(m + 1) if ks is None else np.asarray(ks, dtype=np.int64)
    fwd = np.full(points, -np.inf)
    bwd = np.full(points, -np.inf)
    kf = np.zeros(points, dtype=np.int64)
    kb = np.zeros(points, dtype=np.int64)
    for start in range(0, all_k.size, _BATCH):
        k = all_k[start:start + _BATCH]
        if ks is None:  # consecutive k: the rows come from the recursion
            _, a = _binom_block(int(k[0]), k.size, p1)
            _, b_rev = _binom_block(m - int(k[-1]), k.size, p0)
            b = b_rev[::-1]
        else:  # an arbitrary set of k: one row each, padded to a common width (offsets do not matter)
            a = _binom_rows(k, p1)
            b = _binom_rows(m - k, p0)
        tail = np.clip(1.0 - a.sum(axis=1), 0.0, None) + np.clip(1.0 - b.sum(axis=1), 0.0, None) + _FFT_SLACK
        size = a.shape[1] + b.shape[1]  # the convolution plus one more count (the target's bit)
        nfft = sfft.next_fast_len(size, real=True)
        f = sfft.irfft(sfft.rfft(a, nfft, axis=1) * sfft.rfft(b, nfft, axis=1), nfft, axis=1)[:, :size]
        f[:, -1] = 0.0
        f = np.clip(f, 0.0, None)
        shifted = np.concatenate([np.zeros((f.shape[0], 1)), f[:, :-1]], axis=1)
        pp = p1 * shifted + (1 - p1) * f
        qq = p0 * shifted + (1 - p0) * f
        for curve, target, who in zip(hockey_rows(pp, qq, eps, tail), (fwd, bwd), (kf, kb), strict=True):
            best = curve.argmax(axis=0)
            val = curve[best, np.arange(points)]
            better = val > target
            target[better] = val[better]
            who[better] = k[best[better]]
    return StationCurves(eps, np.minimum(fwd, 1.0), np.minimum(bwd, 1.0), kf, kb)


def connect_the_dots(eps: FloatArray, delta: FloatArray) -> Pld:
    """The discrete PLD on the points ``eps`` whose hockey-stick curve interpolates
    ``delta(eps)`` linearly in ``e^eps`` (and is ``delta(eps[-1])`` above, a line through
    (0, 1) below). Given a curve convex in ``e^eps`` with ``delta(eps[-1])`` the true value at
    the largest loss, it dominates the curve everywhere (Doroshenko et al., PETS 2022). A curve
    raised by an allowance at every point (so it tends to above 1 on the left) keeps its values
    from the smallest loss on and follows the chord from (0, 1) left of it (at most the allowance
    under them, above any true curve): the PLD stays a probability, its infinite-loss mass the
    allowance.

    The curve of Bern(0.8) vs Bern(0.2), a single station with nobody else, is reproduced:

    >>> e = np.linspace(-math.log(4), math.log(4), 5)
    >>> d = np.array([max(0.8 - math.exp(t) * 0.2, 0) + max(0.2 - math.exp(t) * 0.8, 0) for t in e])
    >>> pld = connect_the_dots(e, d)
    >>> [round(pld.delta(float(t)), 9) == round(float(v), 9) for t, v in zip(e, d)]
    [True, True, True, True, True]

    Bern(0.55) vs Bern(0.45) (losses +-0.2) on a grid from -9.2, with 1e-12 added everywhere:
    a probability, 1e-12 at infinite loss (joining (0, 1) to the leftmost point put 1e-12 / e^-9.2
    there: ~1e-8), the values kept from the smallest loss on and at most 1e-12 under them left of it:

    >>> e = np.linspace(-9.2, 9.2, 9)
    >>> d = np.array([max(0.55 - math.exp(t) * 0.45, 0) + max(0.45 - math.exp(t) * 0.55, 0) for t in e]) + 1e-12
    >>> pld = connect_the_dots(e, d)
    >>> float(pld.infinity_mass), bool(abs(pld.mass.sum() + pld.infinity_mass - 1) < 1e-15), float(pld.loss[0])
    (1e-12, True, -2.3)
    >>> all(abs(pld.delta(float(t)) - v) <= 1e-15 for t, v in zip(e, d) if t >= pld.loss[0])
    True
    >>> all(0 <= v - pld.delta(float(t)) <= 1e-12 for t, v in zip(e, d) if t < pld.loss[0])
    True
    """
    x = np.exp(np.asarray(eps, dtype=np.float64))
    d = np.asarray(delta, dtype=np.float64)
    slopes = np.diff(d) / np.diff(x)  # s_1..s_K
    s0 = (d[0] - 1.0) / x[0]  # the line to (0, 1)
    s = np.concatenate([[s0], slopes, [0.0]])  # s_0..s_{K+1}
    # convex by raising the curve, never lowering it: each slope at most every slope right of it
    # (the PLD is built from its right end, so a steeper slope lifts every value left of it; a
    # round-off bend in a max of convex curves costs nothing measurable). Raising slopes instead
    # lowered a bent curve below its values (by up to 4e-8 at random 1e-9 bends). At the left
    # end: the callers' allowance for what they left out (counted at infinite loss) is in every
    # value, so the curve tends to slightly above 1 there and the line to (0, 1) is not the
    # steepest; it becomes the first segment's slope, every grid value is kept, and the excess
    # mass comes off the smallest losses (_trim): left of them the curve is the chord from
    # (0, 1), at most the excess under the values there and above any true curve (convex, at
    # most 1). Raising the first slopes to the line instead lost (allowance / x[0]) of mass to
    # infinity: 1.3e-8 per station at eps[0] = -9.8, over a day's delta after 80 compositions.
    s = np.minimum.accumulate(s[::-1])[::-1]
    mass = np.clip(x * np.diff(s), 0.0, None)
    infinity = float(d[-1])
    total = float(mass.sum()) + infinity
    if total < 1.0:
        infinity += 1.0 - total  # pessimistic: missing mass at infinite loss
    else:
        _trim(mass, total - 1.0)
    keep = mass > 0
    return Pld(np.asarray(eps, dtype=np.float64)[keep], mass[keep], min(1.0, infinity))


def _trim(mass: FloatArray, excess: float) -> None:
    """Take ``excess`` off ``mass`` from its smallest losses up (in place)."""
    for j in np.flatnonzero(mass):
        take = min(excess, float(mass[j]))
        mass[j] -= take
        excess -= take
        if excess <= 0.0:
            return


def covering_ks(m: int, stride: int) -> tuple[int, np.ndarray]:
    """``(m', ks)``: ``m' = m - (stride - 1)`` other devices and the ``k`` to search among them,
    such that every ``k = 0..m`` among ``m`` is covered by a post-processing.

    Removing ``j = stride - 1`` of the other devices is a post-processing in reverse: the
    release with ``m`` others, ``k`` of them at the station, is the release with ``m'`` others,
    ``k'`` at the station, plus ``k - k'`` independent Bern(p1) and ``j - (k - k')``
    Bern(p0) counts (the adversary knows those devices' data). That needs ``k - j <= k' <= k``
    and ``k' <= m'``: ``k' = stride * floor(k / stride)``, or ``m'`` for ``k > m'``. So the
    curves at (m', ks) dominate every k at m.

    >>> covering_ks(10, 3)
    (8, array([0, 3, 6, 8]))
    """
    if stride <= 1 or m < stride:
        return m, np.arange(m + 1)
    mm = m - (stride - 1)
    return mm, np.unique(np.concatenate([np.arange(0, mm + 1, stride), [mm]]))


def default_stride(m: int) -> int:
    """At most ~512 curves per station: the shuffle counted ~0.2% smaller at the papers' scale."""
    return max(1, m // 512)


@lru_cache(maxsize=32)
def station_pld(m: int, p1: float, p0: float, points: int = 501, stride: int | None = None) -> tuple[Pld, Pld]:
    """(forward, backward) dominating PLDs of one station's count among ``m`` other devices,
    worst over every ``k = 0..m`` (searched through :func:`covering_ks`, ``stride`` defaulting
    to :func:`default_stride`; ``stride = 1``: every k itself)."""
    mm, ks = covering_ks(m, default_stride(m) if stride is None else stride)
    c = station_profiles(mm, p1, p0, None if ks.size == mm + 1 else ks, points)
    return connect_the_dots(c.eps, c.forward), connect_the_dots(c.eps, c.backward)


def epoch_plds(tables: tuple[FloatArray, ...], n: int, stride: int | None = None) -> list[Pld] | None:
    """Per round with a binary per-station answer: station a's and station b's PLDs (a move
    changes both; composing them is the epoch). None when some round is not binary (then the
    caller uses the clone bound)."""
    out: list[Pld] = []
    for t in tables:
        rates = binary_rates(t)
        if rates is None:
            return None
        p1, p0 = rates
        if abs(p1 - p0) < 1e-12:
            continue  # the answer does not depend on the truth: it leaks nothing
        fwd, bwd = station_pld(max(n - 1, 0), p1, p0, stride=stride)
        out.extend([fwd, bwd])
    return out


def compose_epoch(plds: list[Pld]) -> Pld:
    """One epoch's PLDs (e.g. the two stations a move changes) composed without the day's grid.

    Two PLDs are composed exactly (every pair of losses summed, the masses multiplied: at most
    ~500 x 500 points) while the product of their supports is at most :data:`_EXACT_PRODUCT`;
    more are composed on a grid of step :data:`_EPOCH_STEP` (every loss rounded up: the losses
    grow by less than ``len(plds) * 1e-6``, where the day's grid, sized for 2,880 epochs, would
    add up to 0.005 to a single epoch's). Both dominate the composition of the inputs.

    >>> p = Pld(np.array([-0.5, 0.5]), np.array([0.4, 0.6]), 0.0)
    >>> c = compose_epoch([p, p])
    >>> c.loss.tolist(), [round(float(x), 2) for x in c.mass]
    ([-1.0, 0.0, 0.0, 1.0], [0.16, 0.24, 0.24, 0.36])
    """
    if not plds:
        raise ValueError("nothing to compose")
    if len(plds) == 1:
        return plds[0]
    if len(plds) == 2 and plds[0].loss.size * plds[1].loss.size <= _EXACT_PRODUCT:
        a, b = plds
        loss = (a.loss[:, None] + b.loss[None, :]).ravel()
        mass = (a.mass[:, None] * b.mass[None, :]).ravel()
        order = np.argsort(loss, kind="stable")
        infinity = 1.0 - (1.0 - a.infinity_mass) * (1.0 - b.infinity_mass)
        return Pld(loss[order], mass[order], min(1.0, infinity))
    span = sum(float(p.loss[-1] - p.loss[0]) for p in plds)
    return compose(plds, 1, step=max(_EPOCH_STEP, span / _EPOCH_GRID))


def epsilon_of(plds: list[Pld], times: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``times`` repetitions of the PLDs composed (0 if there are none);
    one epoch (``times = 1``) by :func:`compose_epoch`, a day on :func:`shuffle.grid_step`'s grid."""
    if not plds:
        return 0.0
    if times == 1:
        return compose_epoch(plds).epsilon(delta)
    return compose(plds, times).epsilon(delta)
