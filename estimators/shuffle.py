"""Amplification by shuffling: the central (epsilon, delta) of reports shuffled among n.

Model (Anonymized Local Privacy's premise made exact): every device applies its local
randomizer to its own truth; a shuffler that does not collude with the analyst releases the
reports of one (query, epoch, round) uniformly permuted, with nothing else attached. Two
upper bounds on what that release leaks about one device are computed here, each from an
explicit *dominating pair* of distributions whose privacy-loss distribution (PLD) is
enumerated exactly:

* **Clones** -- Feldman, McMillan and Talwar, "Hiding Among the Clones: A Simple and Nearly
  Optimal Analysis of Privacy Amplification by Shuffling" (FOCS 2021), Theorem 3.2: for any
  eps0-LDP randomizer, each of the other ``n - 1`` devices is a clone of the target's report
  under ``x1`` or under ``x1'`` with probability ``e^-eps0 / 2`` each; the target itself
  reports "as x1" w.p. ``e^eps0 / (e^eps0 + 1)``. Generic in eps0.
* **Variation ratio** -- Wang et al., "Unified Privacy Amplification by Shuffling for
  Arbitrary eps-LDP Mechanisms" (VLDB 2024), the (p, beta, q) reduction: a randomizer with
  ``p = e^eps0``, total variation ``beta`` between two truths' output distributions and
  ratio ``q`` against any other truth is dominated by the same pair with clone probability
  ``r = alpha p / q`` per side, ``alpha = beta / (p - 1)``, and the target reporting "as x1"
  w.p. ``alpha p``, "as x1'" w.p. ``alpha`` and "neither" otherwise. ``beta`` comes from the
  mechanism's own output table, which is what makes k-ary mechanisms over thousands of
  stations and ALP (mostly "No" answers) amplify far more than eps0 alone says.

Observing the counts ``(a, b)`` of x1- and x1'-type reports, the pair is::

    P(a, b) = alpha p P0(a-1, b) + alpha P0(a, b-1) + (1 - alpha - alpha p) P0(a, b)
    Q(a, b) = alpha P0(a-1, b) + alpha p P0(a, b-1) + (1 - alpha - alpha p) P0(a, b)

with ``P0`` the multinomial of the other ``n - 1`` devices over (x1-clone, x1'-clone,
other) = ``(r, r, 1 - 2r)``. :func:`dominating_pld` enumerates it on a rectangle that holds
all but ~1e-16 of the mass; whatever is not enumerated counts as infinite loss (delta), so the
result stays an upper bound. The pair is symmetric (swap a and b), so the PLD of (Q, P) is
the same and one direction suffices.

A release is (eps, delta(eps))-DP with ``delta(eps) = E_P[(1 - e^(eps - L))_+]`` over the
PLD; a day of epochs is the convolution of the epochs' PLDs (:func:`compose`), discretized
pessimistically (every loss rounded up onto the grid, tails cut into the infinite-loss mass
or onto the grid's first point), so the day's epsilon is never below the true one.

**Which figure is published.** Only the clone bound (never above the local figure). The
variation-ratio figure is computed and shown beside it (``ptt plan``), but it is *not* a
valid bound for the reports this system sends: where the target can answer "neither"
(``1 - alpha - alpha p > 0``, the case of every mechanism here: ALP, two-coin RR over the
report vector, Sampling Privacy, k-ary RR with k >= 3) the exact shuffled mechanism leaks
more than the pair claims. Three-ary RR at eps0 = 2 shuffled among 50: at eps = 1.78 the
exact delta is 5.2e-6 and the pair's (and the authors' public code's) is 1.2e-8
(tests/unit/estimators/test_shuffle.py holds the counterexample). The clone bound passes the
same exact check everywhere it was tried.

Adding devices to a shuffle is a post-processing of the pair (an independent extra count
on both sides), so epsilon never grows with ``n``: a shuffle size rounded down, or capped at
:data:`N_CAP` for the computation, still gives a valid bound.

>>> alp = VariationRatio(p=3.6944, beta=0.050075, q=3.6944)   # ALP's report at 3,220 stations
>>> round(shuffled_epsilon((alp,), 47_719, 1e-6), 4)               # local: ln 3.6944 = 1.3068
0.034
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ._types import FloatArray
from .privacy import optimal_composition, per_sensor_report_epsilon, smallest_epsilon

__all__ = [
    "N_CAP",
    "Pair",
    "TRUST_ASSUMPTION",
    "Pld",
    "ShuffledDay",
    "VariationRatio",
    "clone_pair",
    "clone_plds",
    "closed_form_clone_epsilon",
    "compose",
    "compose_counts",
    "dominating_pld",
    "grid_step",
    "grid_step_counts",
    "shuffled_epsilon",
    "per_sensor_variation_ratio",
    "shuffled_day",
    "variation_ratio",
    "variation_ratio_pair",
]

TRUST_ASSUMPTION = ("assumes the shuffler does not collude with the analyst and mixed each report among "
                    "the n reports of its epoch and round")

# Shuffles larger than this are computed at this size: a valid (looser) bound, since epsilon
# never grows with n; keeps the enumeration at a few million points (~8 million at eps0 = 0.5).
N_CAP = 200_000
_TAIL = 1e-17  # binomial tail left out of the enumeration on each side (counted as delta)


@dataclass(frozen=True)
class VariationRatio:
    """A randomizer's variation-ratio parameters (Wang et al., the (p, beta, q) property):
    ``p = e^eps0``, ``beta`` the largest total-variation distance between two truths' output
    distributions, ``q`` the largest ratio against any truth's distribution (``= p`` when the
    other devices' truths range over the same set)."""

    p: float
    beta: float
    q: float

    @property
    def epsilon0(self) -> float:
        return math.log(self.p)


def variation_ratio(table: FloatArray) -> VariationRatio:
    """(p, beta, q) of an output table ``P(o | t)`` of shape ``(T, O)``.

    Three-ary randomized response at eps0 = ln 3: beta = (e^eps0 - 1) / (e^eps0 + k - 1) = 2/5

    >>> v = variation_ratio(np.array([[.6, .2, .2], [.2, .6, .2], [.2, .2, .6]]))
    >>> round(v.p, 6), round(v.beta, 6)
    (3.0, 0.4)
    """
    tab = np.asarray(table, dtype=np.float64)
    hi, lo = tab.max(axis=0), tab.min(axis=0)
    used = hi > 0
    p = math.inf if np.any(lo[used] <= 0) else float(np.max(hi[used] / lo[used]))
    beta = _max_total_variation(tab)
    return VariationRatio(p, beta, p)


def _max_total_variation(tab: FloatArray) -> float:
    """``max_{i,j} 1/2 sum_o |tab[i,o] - tab[j,o]|``, exactly.

    Small tables: directly. Station-valued tables over thousands of stations are a common
    background row (each column's median) plus a few deviations per row; then
    ``2 TV(i, j) = S_i + S_j - sum_o (|D_io| + |D_jo| - |D_io - D_jo|)`` over the columns where
    both deviate, which touches only those columns.
    """
    t_n, o_n = tab.shape
    if t_n * t_n * o_n <= 20_000_000:
        return 0.5 * float(np.abs(tab[:, None, :] - tab[None, :, :]).sum(axis=2).max())
    dev = tab - np.median(tab, axis=0)
    nz = dev != 0
    if int(nz.sum()) > 20 * t_n + 4 * t_n * 8:  # not sparse: chunked brute force
        chunk = max(1, 20_000_000 // (t_n * o_n))
        return 0.5 * max(float(np.abs(tab[i:i + chunk, None, :] - tab[None, :, :]).sum(axis=2).max())
                         for i in range(0, t_n, chunk))
    size = np.abs(dev).sum(axis=1)
    both = np.add.outer(size, size)
    for o in np.nonzero(nz.any(axis=0))[0]:
        rows = np.nonzero(nz[:, o])[0]
        d = dev[rows, o]
        both[np.ix_(rows, rows)] -= np.abs(d)[:, None] + np.abs(d)[None, :] - np.abs(d[:, None] - d[None, :])
    np.fill_diagonal(both, 0.0)
    return 0.5 * float(both.max())


def per_sensor_variation_ratio(table: FloatArray, n_stations: int) -> VariationRatio:
    """(p, beta, q) of the whole report vector of a binary mechanism asked about each of V
    sensors: ``p`` from the report epsilon, ``beta`` the larger of a one-answer flip (at a
    station vs at none) and a two-answer move (at a vs at b): the vectors' other answers are
    identically distributed and cancel in the total variation.

    >>> rr = np.array([[0.96, 0.04], [0.16, 0.84]])  # two-coin RR (0.8, 0.2)
    >>> v = per_sensor_variation_ratio(rr, 3)
    >>> round(math.log(v.p), 4), round(v.beta, 4)
    (4.8363, 0.8)
    """
    tab = np.asarray(table, dtype=np.float64)
    no, yes = tab[0], tab[1]
    p = math.exp(per_sensor_report_epsilon(tab, n_stations))
    beta = 0.5 * float(np.abs(yes - no).sum())
    if n_stations >= 2:
        beta = max(beta, 0.5 * float(np.abs(np.outer(yes, no) - np.outer(no, yes)).sum()))
    return VariationRatio(p, beta, p)


# -- the dominating pair and its privacy-loss distribution ------------------------------------
@dataclass(frozen=True)
class Pld:
    """A privacy-loss distribution: losses ``L = ln P/Q`` with their P-mass, plus the P-mass at
    +infinity (never below what was left out). ``loss`` is sorted ascending."""

    loss: FloatArray
    mass: FloatArray
    infinity_mass: float

    def delta(self, epsilon: float) -> float:
        """``E_P[(1 - e^(eps - L))_+]`` + the infinite-loss mass."""
        i = int(np.searchsorted(self.loss, epsilon, side="right"))
        tail_l, tail_m = self.loss[i:], self.mass[i:]
        return float(np.sum(tail_m * -np.expm1(epsilon - tail_l))) + self.infinity_mass

    def epsilon(self, delta: float) -> float:
        """The smallest ``eps >= 0`` with ``delta(eps) <= delta`` (inf if none)."""
        if not 0.0 < delta < 1.0:
            raise ValueError("delta must be in (0, 1)")
        if self.infinity_mass > delta:
            return math.inf
        # delta(max loss) = the infinite-loss mass <= delta
        return smallest_epsilon(self.delta, delta, max(float(self.loss[-1]), 0.0))


@dataclass(frozen=True)
class Pair:
    """The dominating pair's parameters: ``x1 = alpha p``, ``x1' = alpha`` for the target, clone
    probability ``r`` per side for each of the other ``n - 1`` devices."""

    p: float
    alpha: float
    r: float


def clone_pair(epsilon0: float) -> Pair:
    """Feldman, McMillan and Talwar's clones (Theorem 3.2): generic in eps0."""
    e0 = math.exp(epsilon0)
    return Pair(p=e0, alpha=1.0 / (e0 + 1.0), r=math.exp(-epsilon0) / 2.0)


def variation_ratio_pair(v: VariationRatio) -> Pair:
    """Wang et al.'s variation-ratio reduction: ``alpha = beta/(p-1)``, ``r = alpha p / q``."""
    alpha = v.beta / (v.p - 1.0)
    return Pair(p=v.p, alpha=alpha, r=alpha * v.p / v.q)


def _count_range(m: int, r: float) -> tuple[int, int, float]:
    """A range of Bin(m, r) holding all but ``_TAIL`` per side (widened until it does), and the
    mass it leaves out for both counts, exactly (union bound)."""
    from scipy.stats import binom
    if m == 0:
        return 0, 0, 0.0
    mean, sd = m * r, math.sqrt(m * r * (1 - r))
    z = 9.0
    while True:
        lo = max(0, int(math.floor(mean - z * sd)) - 1)
        hi = min(m, int(math.ceil(mean + z * sd)) + 1)
        below, above = float(binom.cdf(lo - 1, m, r)), float(binom.sf(hi, m, r))
        if (below <= _TAIL and above <= _TAIL) or (lo == 0 and hi == m):
            return lo, hi, 2 * (below + above)
        z *= 1.5


def dominating_pld(pair: Pair, n: int) -> Pld:
    """The exact PLD of the pair for a shuffle of ``n`` reports (``n`` capped at :data:`N_CAP`).

    The clone counts of the other devices are enumerated on a rectangle holding all but
    ``_TAIL`` of each side's binomial; the rest is infinite loss.

    >>> d = dominating_pld(clone_pair(1.0), 1000)
    >>> bool(abs(d.mass.sum() + d.infinity_mass - 1) < 1e-9)
    True
    """
    from scipy.special import gammaln
    if n < 1:
        raise ValueError("a shuffle holds at least one report")
    n = min(int(n), N_CAP)
    p, alpha, r = pair.p, pair.alpha, pair.r
    gamma = 1.0 - alpha - alpha * p
    if not (0 < r <= 0.5 and alpha > 0 and gamma > -1e-12):
        raise ValueError(f"not a valid dominating pair: {pair}")
    gamma = max(gamma, 0.0)
    m = n - 1  # the other devices
    lo, hi, left_out = _count_range(m, r)
    k = np.arange(lo, hi + 2, dtype=np.float64)  # a count includes the target's own report
    a, b = k[:, None], k[None, :]
    log_r, log_o = math.log(r), (math.log1p(-2 * r) if r < 0.5 else -math.inf)
    # gammaln(i + 1) for every count i = 0..m + 1, looked up below: the same numbers as calling
    # gammaln on the grids (whose entries are these integers), at a fraction of the cost
    log_fact = gammaln(np.arange(m + 2, dtype=np.float64) + 1)

    def lgamma1(v: FloatArray) -> FloatArray:
        out: FloatArray = log_fact[v.astype(np.int64)]
        return out

    def log_p0(x: FloatArray, y: FloatArray) -> FloatArray:
        rest = m - x - y
        ok = (x >= 0) & (y >= 0) & (rest >= 0)
        xs, ys, rs = np.where(ok, x, 0), np.where(ok, y, 0), np.where(ok, rest, 0)
        with np.errstate(invalid="ignore"):
            other = np.where(rs > 0, rs * log_o, 0.0)
        out = gammaln(m + 1) - lgamma1(xs) - lgamma1(ys) - lgamma1(rs) + (xs + ys) * log_r + other
        return np.where(ok, out, -np.inf)

    la, lb, l0 = log_p0(a - 1, b), log_p0(a, b - 1), log_p0(a, b)
    with np.errstate(divide="ignore"):
        lg = math.log(gamma) if gamma > 0 else -math.inf
        log_p = np.logaddexp(np.logaddexp(math.log(alpha * p) + la, math.log(alpha) + lb), lg + l0)
        log_q = np.logaddexp(np.logaddexp(math.log(alpha) + la, math.log(alpha * p) + lb), lg + l0)
    live = np.isfinite(log_p)
    loss = log_p[live] - log_q[live]
    mass = np.exp(log_p[live])
    order = np.argsort(loss, kind="stable")
    loss, mass = loss[order], mass[order]
    infinity = max(left_out, 1.0 - float(mass.sum()), 0.0)
    return Pld(loss, mass, infinity)


def _epoch_plds(ratios: tuple[VariationRatio, ...], n: int,
                with_variation_ratio: bool = True) -> tuple[list[Pld], list[Pld]]:
    """Per round with a truth-dependent report: the clone PLD and the variation-ratio PLD."""
    clones: list[Pld] = []
    varratio: list[Pld] = []
    for v in ratios:
        if v.beta <= 0:
            continue  # the report does not depend on the truth: it leaks nothing
        if math.isinf(v.p):
            raise ValueError("a report possible under one truth and impossible under another: no amplification")
        clones.append(_cached_pld(clone_pair(v.epsilon0), n))
        if with_variation_ratio:
            varratio.append(_cached_pld(variation_ratio_pair(v), n))
    return clones, varratio


@lru_cache(maxsize=4)  # a PLD is ~30 MB at n = 47,719: keep the few a plan or an epoch reuses
def _cached_pld(pair: Pair, n: int) -> Pld:
    return dominating_pld(pair, n)


def clone_plds(ratios: tuple[VariationRatio, ...], n: int) -> list[Pld]:
    """Per round with a truth-dependent report, the clone bound's PLD (cached)."""
    return _epoch_plds(ratios, n, with_variation_ratio=False)[0]


def shuffled_epsilon(ratios: tuple[VariationRatio, ...], n: int, delta: float = 1e-6) -> float:
    """The published central epsilon at ``delta`` of one epoch whose rounds (one ratio each) are
    each shuffled among ``n`` reports: the clone bound (rounds composed), never above the local
    epsilon; infinite when a round's local epsilon is. (The variation-ratio figure is computed
    by :func:`shuffled_day` but not published: see the module doc.)"""
    if any(math.isinf(v.p) and v.beta > 0 for v in ratios):
        return math.inf
    local = sum(v.epsilon0 for v in ratios if v.beta > 0)
    clones, _ = _epoch_plds(ratios, n, with_variation_ratio=False)
    if not clones:
        return 0.0
    one = clones[0] if len(clones) == 1 else compose(clones, 1)
    return min(local, one.epsilon(delta))


# -- composition over a day ------------------------------------------------------------------
@dataclass(frozen=True)
class _Grid:
    """A PLD on the grid ``(offset + i) * step``: P-mass per point, plus infinite-loss mass."""

    offset: int
    probs: FloatArray
    infinity_mass: float


def _on_grid(pld: Pld, step: float) -> _Grid:
    """Pessimistic discretization: each loss is rounded UP to the grid."""
    idx = np.ceil(pld.loss / step).astype(np.int64)
    off = int(idx.min())
    probs = np.bincount(idx - off, weights=pld.mass).astype(np.float64)
    return _Grid(off, probs, pld.infinity_mass)


def _truncate(g: _Grid, tail: float) -> _Grid:
    """Cut the tails: the upper one is counted at +infinity, the lower one moves up onto the
    first kept point (both pessimistic). The cut points come from running sums from each end;
    the masses moved are summed exactly (pairwise), so no mass is lost to a running sum's
    rounding (~1e-13 over millions of points, far above the tail itself)."""
    probs = g.probs
    lo = int(np.searchsorted(np.cumsum(probs), tail / 2, side="right"))
    hi = probs.size - 1 - int(np.searchsorted(np.cumsum(probs[::-1]), tail / 2, side="right"))
    hi = max(hi, lo)
    kept = probs[lo:hi + 1].copy()
    kept[0] += float(probs[:lo].sum())
    upper = float(probs[hi + 1:].sum())
    return _Grid(g.offset + lo, kept, g.infinity_mass + upper)


def _fftconvolve(x: FloatArray, y: FloatArray) -> FloatArray:
    """``scipy.signal.fftconvolve(x, y)`` of two 1-D float arrays, the same transforms in the
    same order (bit-identical), but ``x`` is transformed once when ``y is x`` (a squaring: a
    third of the FFTs of a day's composition)."""
    import scipy.fft as sfft
    size = x.size + y.size - 1
    shape = [sfft.next_fast_len(size, True)]
    fx = sfft.rfftn(x, shape, axes=[0])
    fy = fx if y is x else sfft.rfftn(y, shape, axes=[0])
    out: FloatArray = sfft.irfftn(fx * fy, shape, axes=[0])[:size].copy()
    return out


def _convolve(x: _Grid, y: _Grid, tail: float) -> _Grid:
    probs = np.clip(_fftconvolve(x.probs, y.probs), 0.0, None)
    inf = 1.0 - (1.0 - x.infinity_mass) * (1.0 - y.infinity_mass)
    return _truncate(_Grid(x.offset + y.offset, probs, inf), tail)


_GRID_POINTS = 1 << 21


def _times(result: _Grid | None, power: _Grid, k: int, tail: float) -> _Grid | None:
    """``result`` convolved with ``power`` composed ``k`` times (square and multiply; ``result``
    None: nothing yet)."""
    while k:
        if k & 1:
            result = power if result is None else _convolve(result, power, tail)
        k >>= 1
        if k:
            power = _convolve(power, power, tail)
    return result


def grid_step(plds: list[Pld], times: int) -> float:
    """A grid fine enough that the pessimistic rounding adds at most 0.005 to the composed
    losses, coarsened (still pessimistic, a little looser) when the composed distribution
    would need more than ~2 million points: its width is taken as 10 standard deviations
    either side, plus one unit's range."""
    count = times * len(plds)
    var = sum(float(np.sum(p.mass * p.loss**2) - np.sum(p.mass * p.loss) ** 2) for p in plds)
    span = sum(float(p.loss[-1] - p.loss[0]) for p in plds)
    width = 20.0 * math.sqrt(max(var, 0.0) * times) + 2.0 * span
    return max(0.005 / count, width / _GRID_POINTS)


def compose(plds: list[Pld], times: int, step: float | None = None, tail: float = 1e-15) -> Pld:
    """The PLD of ``times`` repetitions of the sequence ``plds`` (e.g. the rounds of an epoch,
    over a day's epochs), by FFT convolution on a grid of ``step`` (default:
    :func:`grid_step`). Every loss is rounded up, so the result dominates the true one."""
    if step is None:
        step = grid_step(plds, times)
    grids = [_truncate(_on_grid(p, step), tail) for p in plds]
    unit = grids[0]
    for g in grids[1:]:
        unit = _convolve(unit, g, tail)
    result = _times(None, unit, times, tail)
    if result is None:
        raise ValueError("compose needs times >= 1")
    keep = result.probs > 0
    loss = (result.offset + np.nonzero(keep)[0]) * step
    return Pld(loss.astype(np.float64), result.probs[keep], min(1.0, result.infinity_mass))


def grid_step_counts(parts: list[tuple[Pld, int]]) -> float:
    """:func:`grid_step`'s rule for each ``(pld, count)`` composed ``count`` times:
    ``grid_step(plds, t) == grid_step_counts([(p, t) for p in plds])``."""
    count = sum(c for _, c in parts)
    var = sum(c * (float(np.sum(p.mass * p.loss**2) - np.sum(p.mass * p.loss) ** 2)) for p, c in parts)
    span = sum(float(p.loss[-1] - p.loss[0]) for p, _ in parts)
    return max(0.005 / count, (20.0 * math.sqrt(max(var, 0.0)) + 2.0 * span) / _GRID_POINTS)


def compose_counts(parts: list[tuple[Pld, int]], step: float | None = None, tail: float = 1e-15) -> Pld:
    """The PLD of each ``(pld, count)`` of ``parts`` composed ``count`` times, all together (e.g. a
    day of span reports: a station's PLD once per changed station and release, per query), on
    one grid of ``step`` (default: :func:`grid_step`'s rule over the whole composition), every
    loss rounded up once. ``compose(plds, t)`` is ``compose_counts([(p, t) for p in plds])``.

    >>> a = Pld(np.array([-0.1, 0.2]), np.array([0.4, 0.6]), 0.0)
    >>> one, two = compose([a], 6).delta(0.5), compose_counts([(a, 2), (a, 4)]).delta(0.5)
    >>> bool(abs(one - two) < 1e-12)
    True
    """
    parts = [(p, int(c)) for p, c in parts if c]
    if not parts or any(c < 0 for _, c in parts):
        raise ValueError("compose_counts needs at least one part and counts >= 0")
    if step is None:
        step = grid_step_counts(parts)
    result: _Grid | None = None
    for pld, times in parts:
        result = _times(result, _truncate(_on_grid(pld, step), tail), times, tail)
    if result is None:  # every count was 0 (removed above): unreachable
        raise ValueError("compose_counts needs a positive count")
    keep = result.probs > 0
    loss = (result.offset + np.nonzero(keep)[0]) * step
    return Pld(loss.astype(np.float64), result.probs[keep], min(1.0, result.infinity_mass))


@dataclass(frozen=True)
class ShuffledDay:
    """Per epoch and over a day: the published central epsilon (``epsilon``, ``epsilon_day``:
    the clone bound, never above the local figure) and, beside it, the variation-ratio
    figure, which is not published (module doc)."""

    n: int
    delta: float
    epochs: int
    epsilon: float
    epsilon_day: float
    epsilon_variation_ratio: float
    epsilon_day_variation_ratio: float


@lru_cache(maxsize=64)  # pure and small: a plan, its text twin and the tests ask for the same day again
def shuffled_day(ratios: tuple[VariationRatio, ...], n: int, epochs: int, delta: float = 1e-6) -> ShuffledDay:
    """The epoch's and the day's central epsilon at ``delta`` (the day: the epochs' PLDs
    composed, never above the local day's optimal composition)."""
    if any(math.isinf(v.p) and v.beta > 0 for v in ratios):
        return ShuffledDay(n, delta, epochs, math.inf, math.inf, math.inf, math.inf)
    clones, varratio = _epoch_plds(ratios, n)
    if not clones:
        return ShuffledDay(n, delta, epochs, 0.0, 0.0, 0.0, 0.0)
    local = sum(v.epsilon0 for v in ratios if v.beta > 0)
    per_epoch = [(compose(p, 1) if len(p) > 1 else p[0]).epsilon(delta) for p in (clones, varratio)]
    per_day = [compose(p, epochs).epsilon(delta) for p in (clones, varratio)]
    return ShuffledDay(n, delta, epochs, min(local, per_epoch[0]),
                       min(optimal_composition(local, epochs, delta), per_day[0]), per_epoch[1], per_day[1])


def closed_form_clone_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """Feldman, McMillan and Talwar's closed form (Theorem 3.1; for eps0 <= ln(n / (16 ln(2/delta))),
    else ``epsilon0``): looser than the numerical bounds; a cross-check.

    >>> round(closed_form_clone_epsilon(1.0, 100_000, 1e-6), 4)
    0.0726
    """
    if n < 1 or epsilon0 > math.log(n / (16 * math.log(2 / delta))):
        return epsilon0
    e0 = math.exp(epsilon0)
    return math.log1p((e0 - 1) / (e0 + 1) * (8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n))
