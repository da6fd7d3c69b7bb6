"""Privacy of the aggregate release beyond binary answers: three-valued per-sensor reports (ALP)
and k-ary randomized response's histogram.

**Per-sensor, three report values** (ALP: ``0``, ``1``, ``⊥``). Each device answers about every
station independently, so a station's release is the count of each report value among the
``n`` devices: with ``n`` attested, the pair ``(C_a, C_b)`` of the two rarer values (ALP:
``C0, C1``; ``C⊥ = n - C0 - C1``). A move from station a to b changes one draw at a (the
Yes row against the No row) and one at b (No against Yes); the other stations cancel. With
``k`` of the other ``m = n - 1`` devices at the station (Yes) and ``m - k`` elsewhere (No),
the others' counts are ``f_k = Mult(k; yes) * Mult(m - k; no)`` (2-D convolution) and::

    P(c) = yes_a f_k(c - e_a) + yes_b f_k(c - e_b) + yes_c f_k(c),   Q: the same with no_*.

The likelihood ratio depends on both coordinates (the three report values have three
different ratios ``yes_o / no_o``: ALP's 3.5, 1.97, 0.947), so the whole 2-D lattice is
enumerated. As for binary answers (:mod:`estimators.aggregate`), no single ``k`` is the worst
everywhere: :func:`ternary_profiles` computes the exact hockey-stick curve of every ``k``
searched on a grid of eps of both signs and takes the pointwise maximum, the search covers
every ``k = 0..m`` by :func:`aggregate.covering_ks` (removing devices whose data the
adversary knows is a post-processing in reverse: the same argument holds for any number of
report values), and :func:`aggregate.connect_the_dots` turns the curve into a dominating PLD.
Each station's worst ``k`` is taken independently (``k_a + k_b <= m`` relaxed: valid, slightly
pessimistic). The multinomials are cut to rectangles leaving out ~4e-17 each (the exact
missing mass, ``1 - sum``, counted at infinite loss) and the FFT's round-off is dominated by
1e-12 added to every curve.

**k-ary RR's histogram** (one report in ``0..V`` per device; the release is the histogram).
Each device reports its truth w.p. ``pi1`` ("truthful") and else a uniform value (the
*blanket*): ``P(o | t) = pi1 [o = t] + u``, ``u = (1 - pi1) / K``. The likelihood ratio of
the histogram itself is *not* a function of the two affected counts ``(h_x, h_x')`` alone for
every assignment of the other devices' data (a test holds a counterexample: another device
at a third value makes that value's count informative about where the target's report
went). It is once the adversary is also told which other devices answered truthfully
(Balle, Bell, Gascón and Nissim, "The Privacy Blanket of the Shuffle Model", CRYPTO 2019):
subtracting their known reports leaves the target's report among ``B ~ Bin(m, 1 - pi1)``
uniform ones, and the uniform multinomial gives exactly::

    P(H) / Q(H) = (pi1 h_x + u (B + 1)) / (pi1 h_x' + u (B + 1)),

whatever the other devices' data (the worst case over them is attained by construction:
the view does not depend on them). :func:`kary_histogram_pld` is the exact PLD of that view,
the mixture over ``B`` (``B`` is revealed, so the PLDs mix), which dominates the histogram
(a post-processing of the view) for every neighbouring pair ``x -> x'`` (all are alike by
symmetry, and the reverse direction has the same PLD). It is an upper bound, not the
histogram's own worst case: the brute-force tests measure the gap at small n. ``B`` is taken
in at most 64 blocks, each at its smallest ``B`` (more uniform reports are a post-processing:
valid, slightly pessimistic); ``B`` outside its window is counted at infinite loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

import estimators.aggregate as aggregate

from ._types import FloatArray
from .shuffle import Pld

__all__ = ["BINARY_MINORITY_CAP", "PROBE_KS", "TERNARY_N_CAP", "binary_crowd",
           "kary_histogram_pld", "kary_rates", "per_sensor_epoch_plds", "ternary_profiles", "ternary_rows",
           "ternary_station_pld", "ternary_stride", "trinomial"]

Rows = tuple[tuple[float, float, float], tuple[float, float, float]]

PROBE_KS = 5  # ternary_station_pld(probe=True): the assignments of the others it searches
TERNARY_N_CAP = 200_000  # a three-valued station's crowd is accounted at most at this (ALP at 10M: 8.5 min -> 14 s)
BINARY_MINORITY_CAP = 200_000.0  # a binary station's crowd: expected minority answers at most this (binary_crowd)
_SLACK = 1e-12  # added to every curve value: dominates the 2-D FFT's round-off
_NEGLIGIBLE = 1e-20  # lattice points below this (under both rows) are not enumerated
_TAIL = 1e-17  # each marginal's quantile left out of a multinomial's window, a side
_RESTART = 128  # trinomial: the conditional pmf from scipy every this many columns
_BATCH = 32  # ternary profiles: the trinomials of this many k computed together (scipy called once for them)
_BLOCKS = 64  # k-ary RR: at most this many blocks of the blanket size B


def ternary_rows(table: FloatArray) -> Rows | None:
    """``(yes, no)``: the rows of a ``(2, 3)`` per-sensor table (truth No, Yes), its columns
    reordered so that the No row's most likely report (ALP's ``⊥``) comes last; ``None`` for
    another shape or a zero entry (a report impossible under one truth: no finite bound).

    >>> ternary_rows(np.array([[0.001, 0.049, 0.95], [0.0035, 0.0965, 0.9]]))
    ((0.0035, 0.0965, 0.9), (0.001, 0.049, 0.95))
    """
    tab = np.asarray(table, dtype=np.float64)
    if tab.shape != (2, 3) or np.any(tab <= 0):
        return None
    order = np.argsort(tab[0], kind="stable")
    no, yes = tab[0, order], tab[1, order]
    return (float(yes[0]), float(yes[1]), float(yes[2])), (float(no[0]), float(no[1]), float(no[2]))


def _window(trials: int, p: float) -> tuple[int, int]:
    """The counts from the 1e-17 to the 1 - 1e-17 quantile of Bin(trials, p) (exact quantiles: a
    third narrower than sd-based windows for skewed binomials); sd-based if scipy cannot say."""
    lo, hi = _windows(np.array([trials]), p)
    return int(lo[0]), int(hi[0])


def _windows(trials: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_window` of every entry of ``trials``, one scipy call a side for all of them (scipy's
    quantiles are elementwise: the same numbers as one call per entry)."""
    from scipy.stats import binom

    t = np.asarray(trials, dtype=np.int64)
    lo = np.asarray(binom.ppf(_TAIL, t, p), dtype=np.float64)
    hi = t - np.asarray(binom.ppf(_TAIL, t, 1.0 - p), dtype=np.float64)
    out_lo, out_hi = np.empty(t.size, dtype=np.int64), np.empty(t.size, dtype=np.int64)
    for i in range(t.size):
        if not (np.isfinite(lo[i]) and np.isfinite(hi[i])) or lo[i] > hi[i]:
            out_lo[i], out_hi[i] = aggregate.count_window(int(t[i]), p)
        else:
            out_lo[i], out_hi[i] = max(0, int(lo[i])), min(int(t[i]), int(hi[i]))
    return out_lo, out_hi


def trinomial(trials: int, pa: float, pb: float) -> tuple[int, int, FloatArray]:
    """``(lo_a, lo_b, pmf)``: the joint pmf of the counts of two of three outcomes (probabilities
    ``pa``, ``pb``, the rest) in ``trials`` draws on a rectangle starting at ``(lo_a, lo_b)``
    that leaves out at most ~4e-17 (each marginal's exact 1e-17 quantiles a side);
    ``1 - pmf.sum()`` is what it leaves out.

    ``Bin(b; trials, pb) Bin(a; trials - b, pa / (1 - pb))``: the marginal from scipy's binomial
    pmf; the conditional column by column, from scipy's pmf every ``_RESTART`` columns and by the
    recursion ``B_{N+1}(a) = (1-p) B_N(a) + p B_N(a-1)`` in between (positive weights: relative
    error below ~3e-14; what the window cuts off below is simply missing, so every entry is at
    most its true value). A difference of log factorials would lose ~1e-11 at the papers' scale.

    >>> lo_a, lo_b, f = trinomial(2, 0.5, 0.25)
    >>> (lo_a, lo_b), f.round(4).tolist()
    ((0, 0), [[0.0625, 0.125, 0.0625], [0.25, 0.25, 0.0], [0.25, 0.0, 0.0]])
    """
    return _trinomials([trials], pa, pb)[0]


def _trinomials(trials: Sequence[int], pa: float, pb: float) -> list[tuple[int, int, FloatArray]]:
    """:func:`trinomial` of every entry of ``trials``: the same arithmetic, with scipy asked once
    for all the windows, once for all the restart columns and once for all the marginals (its
    quantiles and pmf are elementwise, so the numbers are those of one call each)."""
    from scipy.stats import binom

    t = np.asarray(trials, dtype=np.int64)
    if t.size == 0:
        return []
    lo_a, hi_a = _windows(t, pa)
    lo_b, hi_b = _windows(t, pb)
    p = min(pa / (1.0 - pb), 1.0) if pb < 1.0 else 0.0
    # the conditional is computed on a range of a holding every column's own window (the
    # recursion carries what a column leaves out into the next ones), then cut to lo_a..hi_a
    lo_c = np.minimum(lo_a, _windows(t - hi_b, p)[0])
    hi_c = np.maximum(hi_a, _windows(t - lo_b, p)[1])
    bs = [np.arange(lo_b[i], hi_b[i] + 1) for i in range(t.size)]
    as_ = [np.arange(lo_c[i], hi_c[i] + 1) for i in range(t.size)]
    # b decreasing: N = trials - b grows by one per column; scipy's pmf every _RESTART columns
    restarts = [np.arange(b.size - 1, -1, -_RESTART) for b in bs]
    xs = [np.tile(a, r.size) for a, r in zip(as_, restarts, strict=True)]
    ns = [np.repeat(t[i] - bs[i][r], as_[i].size) for i, r in enumerate(restarts)]
    starts = np.asarray(binom.pmf(np.concatenate(xs), np.concatenate(ns), p), dtype=np.float64)
    marginals = np.asarray(binom.pmf(np.concatenate(bs), np.repeat(t, [b.size for b in bs]), pb), dtype=np.float64)
    out: list[tuple[int, int, FloatArray]] = []
    at_s = at_m = 0
    for i in range(t.size):
        a, b = as_[i], bs[i]
        cond = np.empty((a.size, b.size))
        col = np.zeros(a.size)
        for j in range(b.size - 1, -1, -1):
            if (b.size - 1 - j) % _RESTART == 0:
                col = starts[at_s:at_s + a.size]
                at_s += a.size
            else:
                nxt = (1.0 - p) * col
                nxt[1:] += p * col[:-1]
                col = nxt
            cond[:, j] = col
        cut = slice(int(lo_a[i] - lo_c[i]), int(hi_a[i] - lo_c[i] + 1))
        cond, a = cond[cut], a[cut]
        marginal = marginals[at_m:at_m + b.size]
        at_m += b.size
        out.append((int(lo_a[i]), int(lo_b[i]),
                    np.where(a[:, None] + b[None, :] <= t[i], cond * marginal[None, :], 0.0)))
    return out


def ternary_profiles(m: int, yes: tuple[float, float, float], no: tuple[float, float, float],
                     ks: np.ndarray | None = None, points: int = 501) -> aggregate.StationCurves:
    """The exact hockey-stick curves of one station's counts ``(C_a, C_b)`` for every ``k`` in
    ``ks`` (default: all of ``0..m``) on ``points`` eps from ``-E`` to ``E`` (``E`` the largest
    |loss|), and their pointwise maxima: ``forward`` = the target's report from the ``yes`` row
    against the ``no`` row, ``backward`` the reverse."""
    from scipy.signal import fftconvolve
    e = max(abs(math.log(y / z)) for y, z in zip(yes, no, strict=True))
    if e < 1e-12:
        raise ValueError("the two rows are equal: nothing to account")
    eps = aggregate.loss_grid(e, points)
    all_k = np.arange(m + 1) if ks is None else np.asarray(ks, dtype=np.int64)
    fwd = np.full(points, -np.inf)
    bwd = np.full(points, -np.inf)
    kf = np.zeros(points, dtype=np.int64)
    kb = np.zeros(points, dtype=np.int64)
    ks_all = all_k.tolist()
    for k, (_, _, a), (_, _, b) in zip(ks_all, _batched(ks_all, yes), _batched([m - k for k in ks_all], no),
                                       strict=True):
        tail = max(1.0 - float(a.sum()), 0.0) + max(1.0 - float(b.sum()), 0.0) + _SLACK
        f = np.clip(fftconvolve(a, b), 0.0, None)  # the others' counts (offsets do not matter)
        shape = (f.shape[0] + 1, f.shape[1] + 1)  # the target's report adds one to a count (or none)
        pp, qq = np.zeros(shape), np.zeros(shape)
        for row, out in ((yes, pp), (no, qq)):
            out[:-1, :-1] = row[2] * f  # f(c): the target's report is the third value
            out[1:, :-1] += row[0] * f  # f(c - e_a)
            out[:-1, 1:] += row[1] * f  # f(c - e_b)
        pp, qq = pp.ravel(), qq.ravel()
        keep = (pp > _NEGLIGIBLE) | (qq > _NEGLIGIBLE)  # the rest (< 1e-14 in all) counts at infinite loss
        tail += max(float(pp[~keep].sum()), float(qq[~keep].sum()))
        for curve, target, who in zip(aggregate.hockey_rows(pp[keep][None, :], qq[keep][None, :], eps,
                                                            np.array([tail])), (fwd, bwd), (kf, kb), strict=True):
            better = curve[0] > target
            target[better] = curve[0][better]
            who[better] = k
    return aggregate.StationCurves(eps, np.minimum(fwd, 1.0), np.minimum(bwd, 1.0), kf, kb)


def _batched(trials: list[int], row: tuple[float, float, float]) -> Iterator[tuple[int, int, FloatArray]]:
    """:func:`trinomial` of each entry of ``trials`` in turn, computed :data:`_BATCH` at a time."""
    for start in range(0, len(trials), _BATCH):
        yield from _trinomials(trials[start:start + _BATCH], row[0], row[1])


def ternary_stride(m: int) -> int:
    """At most ~64 curves per station (each a 2-D lattice): at the papers' scale (m = 47,718)
    the search drops 745 devices, 1.6% of the crowd (a valid, slightly looser bound)."""
    return max(1, m // 64)


@lru_cache(maxsize=16)
def ternary_station_pld(m: int, yes: tuple[float, float, float], no: tuple[float, float, float],
                        points: int = 501, stride: int | None = None, probe: bool = False) -> tuple[Pld, Pld]:
    """(forward, backward) dominating PLDs of one station's counts among ``m`` other devices,
    worst over every ``k = 0..m`` (searched through :func:`aggregate.covering_ks`, ``stride``
    defaulting to :func:`ternary_stride`; ``stride = 1``: every k itself).

    ``probe``: the same, worst over only :data:`PROBE_KS` of those ``k`` (evenly spread, both
    ends included): its curves lie under the full search's at every point, so every figure
    composed from it is at most the full one's -- a lower bound that costs a tenth as much (the
    budget search rejects a setting with it, :func:`estimators.fit.fit_budget`)."""
    mm, ks = aggregate.covering_ks(m, ternary_stride(m) if stride is None else stride)
    if probe:
        ks = _probe_ks(ks)
    c = ternary_profiles(mm, yes, no, None if ks.size == mm + 1 else ks, points)
    return aggregate.connect_the_dots(c.eps, c.forward), aggregate.connect_the_dots(c.eps, c.backward)


def _probe_ks(ks: np.ndarray) -> np.ndarray:
    """:data:`PROBE_KS` of ``ks`` (sorted), evenly spread, the first and the last among them.

    >>> _probe_ks(np.arange(0, 65)).tolist(), _probe_ks(np.arange(3)).tolist()
    ([0, 16, 32, 48, 64], [0, 1, 2])
    """
    if ks.size <= PROBE_KS:
        return ks
    return ks[np.unique(np.linspace(0, ks.size - 1, PROBE_KS).round().astype(np.int64))]


def kary_rates(table: FloatArray) -> tuple[int, float] | None:
    """``(K, pi1)`` when ``table`` (truths x reports, ``K x K``) is k-ary randomized response:
    one diagonal value above one off-diagonal value ``u > 0``; ``pi1 = diagonal - u``.

    >>> kary_rates(np.array([[0.6, 0.2, 0.2], [0.2, 0.6, 0.2], [0.2, 0.2, 0.6]]))
    (3, 0.4)
    """
    tab = np.asarray(table, dtype=np.float64)
    if tab.ndim != 2 or tab.shape[0] != tab.shape[1] or tab.shape[0] < 2:
        return None
    k = tab.shape[0]
    diag = np.diag(tab)
    off = tab[~np.eye(k, dtype=bool)]
    d, u = float(diag[0]), float(off[0])
    if not (np.allclose(diag, d, rtol=1e-12, atol=0) and np.allclose(off, u, rtol=1e-12, atol=0)) or u <= 0 or d <= u:
        return None
    return k, round(d - u, 15)


@lru_cache(maxsize=16)
def kary_histogram_pld(k: int, pi1: float, n: int, blocks: int = _BLOCKS) -> Pld:
    """The PLD of k-ary RR's histogram of ``n`` reports over ``k`` values (one device's truth
    ``x`` against ``x'``), through the privacy blanket (module doc): an upper bound for every
    assignment of the other devices' data. ``blocks``: how many blocks of ``B`` at most."""
    from scipy.stats import binom
    if not (k >= 2 and 0 < pi1 < 1 and n >= 1):
        raise ValueError("k-ary RR needs k >= 2, 0 < pi1 < 1 and n >= 1")
    u = (1.0 - pi1) / k
    m = n - 1
    lo, hi = aggregate.count_window(m, 1.0 - pi1)
    bs = np.arange(lo, hi + 1)
    w = np.asarray(binom.pmf(bs, m, 1.0 - pi1), dtype=np.float64)
    infinity = max(1.0 - float(w.sum()), 0.0)
    step = max(1, math.ceil(bs.size / blocks))
    losses: list[FloatArray] = []
    masses: list[FloatArray] = []
    for start in range(0, bs.size, step):
        b0, weight = int(bs[start]), float(w[start:start + step].sum())
        la, lb, g = trinomial(b0, 1.0 / k, 1.0 / k)  # the blanket's counts at x and x'
        infinity += weight * max(1.0 - float(g.sum()), 0.0)
        shape = (g.shape[0] + 1, g.shape[1] + 1)
        ga, gb, gc = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        ga[1:, :-1] = g
        gb[:-1, 1:] = g
        gc[:-1, :-1] = g
        p = (pi1 + u) * ga + u * gb + (k - 2) * u * gc
        hx = np.arange(la, la + shape[0], dtype=np.float64)[:, None]
        hy = np.arange(lb, lb + shape[1], dtype=np.float64)[None, :]
        base = u * (b0 + 1)
        loss = np.log((pi1 * hx + base) / (pi1 * hy + base)) + np.zeros(shape)
        live = p > 0
        losses.append(loss[live])
        masses.append(weight * p[live])
    loss_all = np.concatenate(losses)
    mass_all = np.concatenate(masses)
    order = np.argsort(loss_all, kind="stable")
    return Pld(loss_all[order], mass_all[order], min(1.0, infinity))


def per_sensor_epoch_plds(tables: tuple[FloatArray, ...], n: int, stride: int | None = None,
                          probe: bool = False) -> list[Pld] | None:
    """Per round of a per-sensor mechanism, the two changed stations' PLDs (binary answers:
    :func:`aggregate.station_pld`; three report values: :func:`ternary_station_pld`, ``probe``:
    its lower bound); ``None`` when a round has another shape (then the caller uses the clone
    bound)."""
    out: list[Pld] = []
    m = max(n - 1, 0)
    for t in tables:
        rates = aggregate.binary_rates(t)
        if rates is not None:
            p1, p0 = rates
            if abs(p1 - p0) >= 1e-12:
                out.extend(aggregate.station_pld(binary_crowd(m, p1, p0), p1, p0, stride=stride))
            continue
        rows = ternary_rows(t)
        if rows is None:
            return None
        if max(abs(y - z) for y, z in zip(*rows, strict=True)) >= 1e-12:
            out.extend(ternary_station_pld(min(m, TERNARY_N_CAP), rows[0], rows[1], stride=stride, probe=probe))
    return out


def binary_crowd(m: int, p1: float, p0: float) -> int:
    """The crowd a binary station's PLD is computed among: all ``m`` others while their expected
    minority answers (``m`` times the smallest rate) stay under :data:`BINARY_MINORITY_CAP`, else
    just enough others for that many (at least :data:`TERNARY_N_CAP`). The release among more
    devices is a post-processing of the release among fewer (:func:`aggregate.covering_ks`), so
    the figure stays a valid bound; it loosens only where the minority counts' noise (sd ~450) is
    already far above one device's change, and the binomial windows stay small (a plan at ten
    million devices and q = 0.3 would take ~10 s a PLD).

    >>> binary_crowd(10_047_718, 0.9999, 0.0001), binary_crowd(10_047_718, 0.7, 0.3)
    (10047718, 666666)
    """
    rare = min(p1, p0, 1.0 - p1, 1.0 - p0)
    return int(min(m, max(TERNARY_N_CAP, BINARY_MINORITY_CAP / rare)))
