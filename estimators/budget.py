"""A day's privacy through the shuffler's release, the curator reference, and the parameters
that meet a whole-day budget.

* :func:`epoch_account`: the dominating PLDs of one release of what the analyst sees -- one
  30-s epoch's report, or one span report (``span_s`` > 30: a device names the up to
  ``passages`` = P stations it passed in the span) -- through the exact aggregate release
  (:mod:`estimators.aggregate`) where it exists, else the clone bound of the permuted release
  (valid for the counts too, by post-processing). A vehicle's day composes them over the day's
  ``86,400 / span_s`` releases (and, across queries, over every query it answers):
  :func:`day_epsilon_of`.
* **A span report** (Query.span_s, Query.passages): between two span truths (two sets of at
  most P stations) ``a <= P`` answers flip Yes -> No and ``b <= P`` No -> Yes, ``a + b <= V``.
  The release's counts at the changed stations are independent (each device answers each
  station with its own coins), so its PLD is station a's "forward" PLD (Yes against No, worst
  case over the others' data, :func:`aggregate_multi.per_sensor_epoch_plds`) composed ``a``
  times and the "backward" one ``b`` times. For ``V >= 2P`` the worst split is ``a = b = P``
  (a composition with more parts dominates one with fewer), so a day of ``86,400 / span_s``
  releases composes each station PLD ``P x 86,400 / span_s`` times: at P = span / 30 the
  same 2,880 x 2 as the 30-s query's day, the same figure. For ``V < 2P`` every split has
  ``a, b >= V - P``; the other ``2P - V`` parts are either direction, so they are charged a PLD
  whose hockey-stick curve is the larger of the two at every eps (connect-the-dots, valid under
  composition): a bound over every split, tight when the two directions agree (unary RR).
* :func:`central_limit_sd`: the reference point, a trusted curator adding Gaussian noise to
  each release's per-station counts. A move changes at most ``min(2P, V)`` stations by one (L2
  sensitivity ``sqrt(min(2P, V))``, P = 1 for 30-s epochs); ``T`` releases at noise ``sigma`` are
  mu-GDP with ``mu = sqrt(T) sqrt(min(2P, V)) / sigma``, which is (eps, delta)-DP for
  ``delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (Dong, Roth and Su,
  "Gaussian Differential Privacy", Corollary 2.13). At P = span / 30 s, ``T min(2P, V)`` is
  5,760 for every span (V >= 2P): the curator's sd per span is the 30-s figure.
* :func:`fit_budget`: the mechanism's parameters minimising the headline sd within a day
  budget, over the one-parameter family :data:`FAMILIES` documents per mechanism.

>>> round(central_limit_sd(2.5, 1e-6), 1), round(central_limit_sd(4.0, 1e-6), 1), round(central_limit_sd(8.0, 1e-6), 1)
(138.2, 90.6, 49.6)
>>> [round(central_limit_sd(2.5, 1e-6, span_s=s, passages=s // 30, n_stations=3220), 1) for s in (300, 3600)]
[138.2, 138.2]
>>> round(central_limit_sd(2.5, 1e-6, span_s=3600, passages=20, n_stations=3220), 1)  # a cap of 20 an hour
56.4
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import estimators.aggregate as aggregate
import estimators.privacy as privacy
import estimators.shuffle as shuffle

from ._types import FloatArray
from .mechanisms import Mechanism
from .registry import MechanismSpec, PlanError

__all__ = ["CLONE_MAX", "DAY_S", "EPOCH_S", "FAMILIES", "RELEASES", "EpochAccount", "Family", "can_fit",
           "central_limit_sd", "check_span", "day_epsilon_of", "dominating_envelope", "epoch_account", "fit_budget",
           "gaussian_delta", "headline_sd", "local_day", "pld_day_epsilon", "pure_pld", "release_figures",
           "releases_in", "span_passages", "span_ratios", "span_round_epsilons"]

RELEASES = ("aggregate", "permuted")
NO_BOUND_NOTE = ("no shuffled bound: a report, or the rounds together, can be possible under one truth and "
                 "impossible under another (Sampling Privacy's rounds share one die: the difference of their "
                 "counts is the exact histogram of the devices that drew the sampling face)")
_COARSE = 2  # the search composes on a grid this much coarser (still an upper bound), the result on the fine one
EPOCH_S = 30  # the epoch clock (schemas.epochs.EPOCH_S)
DAY_S = 86_400
_ENVELOPE_POINTS = 4001  # eps grid of dominating_envelope (sinh-spaced, both signs)


def check_span(span_s: int, max_passages: int | None = None) -> None:
    """:class:`PlanError` (one line saying why) unless ``span_s`` is a multiple of 30 that divides a
    day and ``max_passages`` (if given) is between 1 and the span's epochs.

    >>> check_span(3600, 20)
    >>> check_span(45)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estimators.registry.PlanError: a span must be a multiple of 30 s that divides a day (86400 s)...; got 45
    """
    if not (isinstance(span_s, int) and EPOCH_S <= span_s <= DAY_S and span_s % EPOCH_S == 0
            and DAY_S % span_s == 0):
        raise PlanError(f"a span must be a multiple of {EPOCH_S} s that divides a day ({DAY_S} s), e.g. 300 or "
                        f"3600; got {span_s}")
    if max_passages is not None and not 1 <= max_passages <= span_s // EPOCH_S:
        raise PlanError(f"max passages must be between 1 and the span's {span_s // EPOCH_S} epoch(s) (a vehicle "
                        f"passes at most one station per epoch); got {max_passages}")


def span_passages(span_s: int, max_passages: int | None, n_stations: int) -> int:
    """P: the most stations one span report names (``max_passages``, by default one per epoch of
    the span), never more than the stations (as ``Query.passages``).

    >>> span_passages(3600, None, 3220), span_passages(3600, 20, 3220), span_passages(3600, None, 16)
    (120, 20, 16)
    """
    check_span(span_s, max_passages)
    return max(1, min(max_passages or span_s // EPOCH_S, n_stations))


def releases_in(epochs: int, span_s: int = EPOCH_S) -> int:
    """Span releases in ``epochs`` 30-s epochs (a started span counts whole).

    >>> releases_in(2880, 3600), releases_in(2880, 30), releases_in(100, 3600)
    (24, 2880, 1)
    """
    per = span_s // EPOCH_S
    return -(-int(epochs) // per)


def gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of mu-GDP; ``e^eps Phi(b)`` as ``exp(eps + log Phi(b))``, which is at most
    ``Phi(a)`` <= 1, so a day epsilon past ~709 does not overflow.

    >>> round(gaussian_delta(1.0, 1.0), 6), gaussian_delta(5000.0, 2.0)
    (0.126937, 0.0)
    """
    from scipy.stats import norm
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)))


def central_limit_sd(budget: float, delta: float = 1e-6, epochs: int = 2880, share: float = 1.0,
                     span_s: int = EPOCH_S, passages: int = 1, n_stations: int | None = None) -> float:
    """The curator's per-release (30-s epoch or span), per-station sd at a whole-day (budget, delta):
    ``sqrt(T min(2P, V)) / mu`` with ``delta(budget; mu) = delta``, ``T`` the releases in ``epochs``
    30-s epochs (:func:`releases_in`), ``P`` = ``passages`` (``V`` = ``n_stations``, unbounded if
    None). ``share``: the fraction of mu^2 one query gets when a curator answers several (mu^2
    adds under composition)."""
    from scipy.optimize import brentq
    if budget <= 0:
        raise PlanError("a day budget must be > 0")
    check_span(span_s)
    changed = 2 * passages if n_stations is None else min(2 * passages, n_stations)
    mu = brentq(lambda m: gaussian_delta(budget, m) - delta, 1e-6, 100.0, xtol=1e-12)
    return math.sqrt(releases_in(epochs, span_s) * changed) / (float(mu) * math.sqrt(share))


@dataclass(frozen=True)
class EpochAccount:
    """One release's PLDs for ``release`` (a 30-s epoch's report, or a span report): ``plds[i]``
    composed ``counts[i]`` times (empty ``counts``: once each); ``exact``: the aggregate release's
    own accounting (else the clone bound of the permuted release); ``local``: the release's local
    epsilon, every round composed (a cap, and what a device's local ledger charges)."""

    release: str
    plds: tuple[shuffle.Pld, ...]
    exact: bool
    local: float
    counts: tuple[int, ...] = ()
    span_s: int = EPOCH_S
    passages: int = 1

    def parts(self, releases: int = 1) -> list[tuple[shuffle.Pld, int]]:
        """``(pld, times)`` of ``releases`` releases composed."""
        counts = self.counts or (1,) * len(self.plds)
        return [(p, c * releases) for p, c in zip(self.plds, counts, strict=True) if c]

    def releases(self, epochs: int) -> int:
        """Releases of this query in ``epochs`` 30-s epochs."""
        return releases_in(epochs, self.span_s)

    @property
    def note(self) -> str:
        if math.isinf(self.local):
            return NO_BOUND_NOTE
        if self.release == "permuted":
            return "the clone bound of the permuted release"
        return aggregate.EXACT_NOTE if self.exact else aggregate.FALLBACK_NOTE


# a span report's epsilon above this is charged its pure-DP PLD, not the clone bound: at 47,719 devices the
# clone bound of one report is the local epsilon from 10 on (a day of 288: 1,402 against 2,880 at 10, 4,032
# against 4,032 at 14), and composing it on a grid takes 2 s at 10, 30 s at 14 and > 3 GB at 28
CLONE_MAX = 10.0
_BASIC_ABOVE = 500.0  # optimal composition of a larger epsilon is basic composition (and would overflow)


def local_day(epsilon: float, releases: int, delta: float) -> float:
    """The local figure of ``releases`` reports of ``epsilon`` each: optimal composition (basic
    above an epsilon of 500, where the two agree and the optimal one's arithmetic overflows).

    >>> round(local_day(0.5, 100, 1e-6), 2), local_day(1000.0, 24, 1e-6)  # optimal: below 100 x 0.5
    (33.32, 24000.0)
    """
    if releases < 1:
        return 0.0
    if epsilon > _BASIC_ABOVE:
        return privacy.basic_composition(epsilon, releases)
    return privacy.optimal_composition(epsilon, releases, delta)


def span_round_epsilons(spec: MechanismSpec, mech: Mechanism, n_stations: int, passages: int) -> list[float]:
    """Per round whose answer depends on the truth, the epsilon of a span report of up to
    ``passages`` stations (:func:`privacy.per_sensor_report_epsilon`)."""
    if not spec.per_sensor:
        raise PlanError(f"{spec.name} reports one station per epoch: it has no span report of {passages} passages")
    out = []
    for m in spec.round_mechanisms(mech):
        table = m.output_table(0)
        if np.allclose(table[0], table[1], rtol=0.0, atol=1e-12):
            continue  # the answer does not depend on the truth: it leaks nothing
        out.append(privacy.per_sensor_report_epsilon(table, n_stations, passages))
    return out


def span_ratios(spec: MechanismSpec, mech: Mechanism, n_stations: int,
                passages: int = 1) -> tuple[shuffle.VariationRatio, ...]:
    """Per round, the variation-ratio parameters of a span report of up to ``passages`` stations
    (``passages = 1``: :meth:`MechanismSpec.shuffle_ratios`). ``p``: the round's span-report
    epsilon (:func:`span_round_epsilons`), all the clone bound uses; ``beta``: an upper bound of
    the total variation (``passages`` two-answer moves, at most ``(p-1)/(p+1)``).
    :class:`PlanError` for a report epsilon above 700 (``e^eps`` overflows; no amplification)."""
    if passages == 1:
        return spec.shuffle_ratios(mech, n_stations)
    out = []
    for m, eps in zip([m for m in spec.round_mechanisms(mech)
                       if not np.allclose(m.output_table(0)[0], m.output_table(0)[1], rtol=0.0, atol=1e-12)],
                      span_round_epsilons(spec, mech, n_stations, passages), strict=True):
        if eps > 700:
            raise PlanError(f"a span report's epsilon of {eps:.4g} has no variation ratio (e^eps overflows)")
        base = shuffle.per_sensor_variation_ratio(m.output_table(0), n_stations)
        p = math.exp(eps)
        out.append(shuffle.VariationRatio(p, min(passages * base.beta, (p - 1) / (p + 1)), p))
    return tuple(out)


def pure_pld(epsilon: float) -> shuffle.Pld:
    """A PLD dominating every epsilon-DP release: all its mass at loss ``epsilon`` (``delta(e) = (1 -
    e^(e - epsilon))_+``, at least randomized response's at every e of both signs, and RR dominates
    every epsilon-DP mechanism: Kairouz, Oh and Viswanath). Composed, it is basic composition.

    >>> pld = pure_pld(2.0)
    >>> round(pld.epsilon(1e-6), 4), round(shuffle.compose([pld], 3).epsilon(1e-6), 4)
    (2.0, 6.0)
    """
    return shuffle.Pld(np.array([float(epsilon)]), np.array([1.0]), 0.0)


def _permuted_plds(round_eps: list[float], n: int) -> list[shuffle.Pld]:
    """The clone bound of each round's span report (its pure-DP PLD above :data:`CLONE_MAX`)."""
    out = []
    for eps in round_eps:
        if eps > CLONE_MAX:
            out.append(pure_pld(eps))
        else:
            p = math.exp(eps)
            out.extend(shuffle.clone_plds((shuffle.VariationRatio(p, (p - 1) / (p + 1), p),), n))
    return out


def _curve(pld: shuffle.Pld, eps: FloatArray) -> FloatArray:
    """``pld.delta`` at every point of ``eps`` at once, plus 1e-12 (dominates the round-off):
    ``sum over L > eps of m - e^eps sum over L > eps of m e^-L`` (shifted by the smallest loss)."""
    loss, mass = pld.loss, pld.mass
    low = float(loss[0])
    tail_m = np.concatenate([np.cumsum(mass[::-1])[::-1], [0.0]])
    tail_w = np.concatenate([np.cumsum((mass * np.exp(low - loss))[::-1])[::-1], [0.0]])
    i = np.searchsorted(loss, eps, side="right")
    out: FloatArray = np.clip(tail_m[i] - np.exp(eps - low) * tail_w[i], 0.0, None) + pld.infinity_mass + 1e-12
    return out


def dominating_envelope(plds: list[shuffle.Pld], points: int = _ENVELOPE_POINTS) -> shuffle.Pld:
    """A PLD whose hockey-stick curve is at least each of ``plds``' at every eps of both signs (their
    pointwise maximum on a grid, interpolated by connect-the-dots: Doroshenko et al., PETS 2022),
    so it dominates each of them under composition.

    >>> from estimators.aggregate import station_pld
    >>> fwd, bwd = station_pld(99, 0.9, 0.05)
    >>> env = dominating_envelope([fwd, bwd])
    >>> all(env.delta(e) >= max(fwd.delta(e), bwd.delta(e)) - 1e-12 for e in (-0.5, 0.0, 0.3, 1.0, 2.0))
    True
    """
    top = max(max(abs(float(p.loss[0])), abs(float(p.loss[-1]))) for p in plds)
    eps = aggregate.loss_grid(max(top, 1e-9), points)
    curve = np.max([_curve(p, eps) for p in plds], axis=0)
    return aggregate.connect_the_dots(eps, np.minimum(curve, 1.0))


def _span_parts(flat: list[shuffle.Pld], n_stations: int, passages: int) -> tuple[tuple[shuffle.Pld, ...],
                                                                                  tuple[int, ...]]:
    """A span release's parts from one epoch's per-round (forward, backward) station PLDs (module doc)."""
    if passages == 1:
        return tuple(flat), ()
    changed = min(2 * passages, n_stations)
    each = changed - passages  # every split a + b = changed, a, b <= P, has a, b >= changed - P
    either = changed - 2 * each  # 2P - V parts of either direction (0 when V >= 2P)
    plds: list[shuffle.Pld] = []
    counts: list[int] = []
    for fwd, bwd in zip(flat[0::2], flat[1::2], strict=True):
        plds += [fwd, bwd]
        counts += [each, each]
        if either:
            plds.append(_envelope_cached(fwd, bwd))
            counts.append(either)
    return tuple(plds), tuple(counts)


_ENVELOPES: dict[tuple[int, int], tuple[shuffle.Pld, shuffle.Pld, shuffle.Pld]] = {}


def _envelope_cached(fwd: shuffle.Pld, bwd: shuffle.Pld) -> shuffle.Pld:
    """:func:`dominating_envelope` of a station's two PLDs, remembered while they are alive (the
    station PLDs are themselves cached per crowd and rates)."""
    hit = _ENVELOPES.get((id(fwd), id(bwd)))
    if hit is not None and hit[0] is fwd and hit[1] is bwd:
        return hit[2]
    if len(_ENVELOPES) > 64:
        _ENVELOPES.clear()
    env = dominating_envelope([fwd, bwd])
    _ENVELOPES[(id(fwd), id(bwd))] = (fwd, bwd, env)
    return env


def epoch_account(spec: MechanismSpec, mech: Mechanism, n_stations: int, n: int, release: str,
                  ratios: tuple[shuffle.VariationRatio, ...] | None = None, span_s: int = EPOCH_S,
                  passages: int = 1) -> EpochAccount:
    """The account of one release of a query: a 30-s epoch's report, or (``span_s`` > 30) one
    span report of up to ``passages`` stations (P, capped at ``n_stations``); module doc.
    ``ratios``: ``spec.shuffle_ratios(mech, n_stations)`` when the caller has them already (k-ary
    RR's over 3,220 stations take ~1 s; used for one-passage reports only).

    Unary RR through the aggregate release: an hourly report (P = 120) composes each station's
    PLD 120 times per release, so 24 hours cost what 2,880 epochs do:

    >>> from estimators.registry import get_spec
    >>> spec = get_spec("unary"); mech = spec.build({"q": 0.3}, 300)
    >>> hour = epoch_account(spec, mech, 300, 1000, "aggregate", span_s=3600, passages=120)
    >>> hour.counts, [c for _, c in hour.parts(hour.releases(2880))]
    ((120, 120), [2880, 2880])
    """
    if release not in RELEASES:
        raise PlanError(f"unknown release {release!r}; choose {' or '.join(RELEASES)}")
    check_span(span_s)
    if passages < 1:
        raise PlanError("passages must be >= 1")
    if span_s != EPOCH_S and not spec.per_sensor:
        raise PlanError(f"{spec.name} reports one station per epoch: a span longer than {EPOCH_S} s needs a "
                        f"per-sensor mechanism")
    passages = min(passages, n_stations)
    if passages > 1:
        round_eps = span_round_epsilons(spec, mech, n_stations, passages)
        local = sum(round_eps)
    else:
        if ratios is None:
            ratios = spec.shuffle_ratios(mech, n_stations)
        local = sum(v.epsilon0 for v in ratios if v.beta > 0)
    if math.isinf(local):
        return EpochAccount(release, (), False, local, (), span_s, passages)
    if release == "aggregate":
        flat = spec.aggregate_plds(mech, n_stations, n)
        if flat is not None:
            if spec.per_sensor:
                plds, counts = _span_parts(flat, n_stations, passages)
            else:
                plds, counts = tuple(flat), ()
            return EpochAccount(release, plds, True, local, counts, span_s, passages)
    permuted = _permuted_plds(round_eps, n) if passages > 1 else shuffle.clone_plds(ratios or (), n)
    return EpochAccount(release, tuple(permuted), False, local, (), span_s, passages)


def day_epsilon_of(accounts: list[tuple[EpochAccount, int]], delta: float, coarse: float = 1.0) -> float:
    """Epsilon at ``delta`` of every account composed over its number of releases (``(account,
    releases)``: e.g. a vehicle's day across queries of different spans), on one grid ``coarse``
    times the default step (rounded up: an upper bound). One query, or queries whose parts compose
    equally often, take :func:`shuffle.compose`'s path (the same numbers as a 30-s day's)."""
    parts = [pc for acc, r in accounts for pc in acc.parts(r)]
    if not parts:
        return 0.0
    times = {c for _, c in parts}
    if len(times) == 1:
        t = times.pop()
        plds = [p for p, _ in parts]
        return shuffle.compose(plds, t, step=shuffle.grid_step(plds, t) * coarse).epsilon(delta)
    return shuffle.compose_counts(parts, step=shuffle.grid_step_counts(parts) * coarse).epsilon(delta)


def pld_day_epsilon(plds: list[shuffle.Pld], epochs: int, delta: float, coarse: bool = False) -> float:
    """Epsilon at ``delta`` of ``epochs`` repetitions of ``plds`` (rounded up onto the grid)."""
    if not plds:
        return 0.0
    step = shuffle.grid_step(plds, epochs) * (_COARSE if coarse else 1)
    return shuffle.compose(plds, epochs, step=step).epsilon(delta)


def release_figures(acc: EpochAccount, epochs: int, delta: float) -> dict[str, Any]:
    """``epsilon_shuffled`` (one release: an epoch's or a span's report) / ``epsilon_day_shuffled``
    (its releases in ``epochs`` 30-s epochs) of the release (never above the local figures) and
    how they were accounted."""
    if math.isinf(acc.local):
        return {"release": acc.release, "epsilon_shuffled": math.inf, "epsilon_day_shuffled": math.inf,
                "accounting": acc.note}
    plds = list(acc.plds)
    if acc.counts:  # a span report: its stations' PLDs, each composed its number of times
        epoch = day_epsilon_of([(acc, 1)], delta)
    else:
        epoch = plds[0].epsilon(delta) if len(plds) == 1 else aggregate.epsilon_of(plds, 1, delta)
    releases = acc.releases(epochs)
    day = day_epsilon_of([(acc, releases)], delta)
    return {"release": acc.release, "epsilon_shuffled": min(acc.local, epoch),
            "epsilon_day_shuffled": min(local_day(acc.local, releases, delta), day),
            "accounting": acc.note}


def headline_sd(spec: MechanismSpec, mech: Mechanism, expected_yes: float, population: int) -> float:
    ests = spec.estimators(mech, stations=np.array([1]), design=(float(expected_yes), float(population)))
    return float(np.sqrt(ests[spec.headline].variance(expected_yes, population))[0])


def _alp_mix(defaults: Mapping[str, float], lam: float) -> dict[str, float]:
    """ALP's parameters whose Yes row is ``(1 - lam) Yes + lam No`` of the defaults' table: with
    probability ``lam`` a device reports a fresh draw of a No vehicle's answer, a
    truth-independent post-processing (``lam = 0``: the papers' values; ``lam = 1``: no signal).
    The No row (``pisNo``, ``pi3``) is unchanged.

    >>> p = _alp_mix({"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.05, "pi3": 0.98}, 0.5)
    >>> round(p["pisYes1"], 6), round(p["pi1"], 6), round(p["pisYes2"], 6)
    (0.05, 0.965, 0.025)
    """
    d = dict(defaults)
    y1 = (1 - lam) * d["pisYes1"] + lam * d["pisNo"]
    pi1 = ((1 - lam) * d["pisYes1"] * d["pi1"] + lam * d["pisNo"] * d["pi3"]) / y1
    return {**d, "pisYes1": y1, "pi1": pi1, "pisYes2": (1 - lam) * d["pisYes2"]}


@dataclass(frozen=True)
class Family:
    """A one-parameter family searched for a day budget: ``param`` from ``lo`` to ``hi`` with the
    others at ``fixed`` (else the defaults), or ``to_params(defaults, value)`` when given.
    ``bisect``: the day epsilon is monotone in ``param`` (decreasing if
    ``private_when_larger``), so bisection finds the least private setting that fits;
    otherwise the ``grid`` is scanned and the smallest sd that fits wins. ``fallback``: the
    family searched when no member of this one fits."""

    param: str
    lo: float
    hi: float
    private_when_larger: bool
    why: str
    fixed: Mapping[str, float] = field(default_factory=dict)
    bisect: bool = True
    grid: tuple[float, ...] = ()
    to_params: Callable[[Mapping[str, float], float], dict[str, float]] | None = None
    fallback: Family | None = None  # searched when no member of this one fits


FAMILIES: dict[str, Family] = {
    "unary": Family("q", 1e-3, 0.499, True,
                    "bisection on q: a larger q is a post-processing of a smaller one (flip again), so the day "
                    "epsilon decreases in q and the sd increases"),
    "rr": Family("pi1", 1e-3, 0.999, False,
                 "pi2 = 1/2 (then two-coin RR is symmetric unary RR with q = (1 - pi1)/2), bisection on pi1",
                 fixed={"pi2": 0.5}),
    "krr": Family("epsilon", 1e-3, 12.0, False,
                  "bisection on the per-report epsilon (a smaller one is a post-processing of a larger one)"),
    "sp": Family("pis", 1e-4, 0.999, False, "bisection on pis (the truthful face's probability), pi0 as default"),
    # ALP: its sampling rates are the accuracy knob (through the aggregate release's exact
    # accounting the papers' s = 0.05 costs 0.33 a day; s = 0.45 about 2.4, sd 246), so the grid
    # over s goes first; when even the smallest s exceeds the budget, mixing its Yes row toward
    # its No row (a post-processing) takes the papers' setting further
    "alp": Family("s", 0.0, 0.0, False,
                  "a grid over the sampling rates pisYes1 = pisYes2 = pisNo = s, the rest at the papers' values",
                  bisect=False, grid=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.45, 0.49),
                  to_params=lambda d, v: {**d, "pisYes1": v, "pisYes2": v, "pisNo": v},
                  fallback=Family("mix", 0.0, 0.99, True,
                                  "bisection on mix: the Yes row mixed toward the No row (a device answers as a "
                                  "No vehicle w.p. mix), a truth-independent post-processing of the papers' "
                                  "mechanism, nested in mix", to_params=_alp_mix)),
}


def _params(spec: MechanismSpec, fam: Family, value: float) -> dict[str, float]:
    if fam.to_params is not None:
        return fam.to_params(spec.defaults, value)
    return {**fam.fixed, fam.param: value}


# the day epsilons evaluated so far, per (mechanism, stations, n, release, epochs, delta): a
# later search (the fleet re-fitting a smaller share) starts from the tightest known bracket
_DAYS: dict[tuple[Any, ...], dict[float, float]] = {}


def _day_of(spec: MechanismSpec, fam: Family, value: float, n_stations: int, population: int, release: str,
            epochs: int, delta: float, span_s: int = EPOCH_S, passages: int = 1) -> float:
    """The (coarse-grid, still upper-bound) day epsilon of the family member ``value``, cached."""
    if len(_DAYS) > 64:
        _DAYS.clear()
    seen = _DAYS.setdefault(_key(spec, fam, n_stations, population, release, epochs, delta, span_s, passages), {})
    if value not in seen:
        mech = spec.build(_params(spec, fam, value), n_stations)
        acc = epoch_account(spec, mech, n_stations, population, release, span_s=span_s, passages=passages)
        local = local_day(acc.local, acc.releases(epochs), delta)
        seen[value] = min(local, day_epsilon_of([(acc, acc.releases(epochs))], delta, coarse=_COARSE))
    return seen[value]


def _key(spec: MechanismSpec, fam: Family, n_stations: int, population: int, release: str, epochs: int,
         delta: float, span_s: int, passages: int) -> tuple[Any, ...]:
    return (spec.name, fam.param, n_stations, population, release, epochs, delta, span_s,
            min(passages, n_stations))


def can_fit(spec: MechanismSpec, n_stations: int, population: int, budget_: float, release: str, epochs: int,
            delta: float, span_s: int = EPOCH_S, passages: int = 1) -> tuple[bool, str]:
    """Whether the family's most private member fits ``budget_`` alone (one day evaluation)."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        return False, f"{spec.name}: no parameter family to search"
    while fam.fallback is not None:  # the last family holds the most private setting
        fam = fam.fallback
    end = (fam.hi if fam.private_when_larger else fam.lo) if fam.bisect else min(fam.grid)
    d = _day_of(spec, fam, end, n_stations, population, release, epochs, delta, span_s, passages)
    if d <= budget_:
        return True, ""
    return False, (f"even its most private setting ({fam.param} = {end:g}) costs {d:.4g} over the day "
                   f"through the {release} release, more than {budget_:g}")


def fit_budget(spec: MechanismSpec, n_stations: int, population: int, expected_yes: float, budget: float,
               release: str, epochs: int, delta: float, tol: float = 1e-3, span_s: int = EPOCH_S,
               passages: int = 1) -> dict[str, Any]:
    """The family member with the smallest headline sd whose day epsilon (the release's, on the
    search's coarse grid: a valid upper bound) is at most ``budget``; ``{"fits": False, ...}``
    when none does. Bisection: Brent's method on the day epsilon, from the tightest bracket
    earlier searches evaluated; the answer is the least private *evaluated* member that fits
    (within ``tol`` of the root), so it fits by construction. ``span_s``, ``passages``: the
    query's span report (:func:`epoch_account`); ``epochs`` stays the 30-s epochs of the day."""
    fam = FAMILIES.get(spec.name)
    if fam is None:
        raise PlanError(f"{spec.name}: no parameter family to search for a day budget (families: "
                        f"{', '.join(FAMILIES)})")
    while True:
        out = _fit_family(spec, fam, n_stations, population, expected_yes, budget, release, epochs, delta, tol,
                          span_s, passages)
        if out["fits"] or fam.fallback is None:
            return out
        fam = fam.fallback


def _fit_family(spec: MechanismSpec, fam: Family, n_stations: int, population: int, expected_yes: float,
                budget: float, release: str, epochs: int, delta: float, tol: float, span_s: int = EPOCH_S,
                passages: int = 1) -> dict[str, Any]:
    """:func:`fit_budget` within one family."""
    from scipy.optimize import brentq

    def day_of(value: float) -> float:
        return _day_of(spec, fam, value, n_stations, population, release, epochs, delta, span_s, passages)

    tried: list[dict[str, float]] = []
    chosen: float | None = None
    if fam.bisect:
        private_end, loose_end = (fam.hi, fam.lo) if fam.private_when_larger else (fam.lo, fam.hi)
        if day_of(private_end) > budget:
            return {"fits": False, "search": fam.why, "why": f"even {fam.param} = {private_end:g} exceeds the budget"}
        if day_of(loose_end) <= budget:
            chosen = loose_end
        else:
            sign = 1.0 if fam.private_when_larger else -1.0  # sign * value grows toward the private end
            seen = _DAYS[_key(spec, fam, n_stations, population, release, epochs, delta, span_s, passages)]
            fits = [v for v, d in seen.items() if d <= budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            over = [v for v, d in seen.items() if d > budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            a, b = min(fits, key=lambda v: sign * v), max(over, key=lambda v: sign * v)

            def gap(v: float) -> float:
                d = day_of(v)
                tried.append({fam.param: v, "epsilon_day": d})
                return d - budget

            brentq(gap, a, b, xtol=tol * 0.1, rtol=tol)
            fits = [v for v, d in seen.items() if d <= budget and sign * (v - private_end) <= 0
                    and sign * (v - loose_end) >= 0]
            chosen = min(fits, key=lambda v: sign * v)  # the least private evaluated member that fits
    else:
        best: tuple[float, float] | None = None
        for value in fam.grid:
            try:
                mech = spec.build(_params(spec, fam, value), n_stations)
            except PlanError:
                continue
            d = day_of(value)
            sd = headline_sd(spec, mech, expected_yes, population)
            tried.append({fam.param: value, "epsilon_day": d, "sd": sd})
            if d <= budget and (best is None or sd < best[1]):
                best = (value, sd)
        if best is None:
            return {"fits": False, "search": fam.why, "tried": tried,
                    "why": "no member of the family fits the budget"}
        chosen = best[0]
    params = _params(spec, fam, chosen)
    mech = spec.build(params, n_stations)
    return {"fits": True, "search": fam.why, "params": params, "chosen": {fam.param: chosen},
            "sd": headline_sd(spec, mech, expected_yes, population), "tried": tried}
