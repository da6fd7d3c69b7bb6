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
* **A day cap** (``day_cap`` = M, ``Query.max_passages_day``): a device names at most M
  passages of the query a day (past M its reports name no station, still sent and randomized).
  Two days of one vehicle then differ in ``a <= M`` answers Yes -> No and ``b <= M`` No -> Yes
  over the whole day, whatever their spans. Under the exact aggregate release of a per-sensor
  mechanism every (span, station) count is independent given the others' data, so the day is
  each round's forward PLD composed M times and its backward PLD M times (a composition with
  more parts dominates one with fewer) -- used where ``2M`` is below the uncapped day's
  ``releases x min(2P, V)`` changed answers, where it is the smaller of the two (the uncapped
  day's extra parts are envelopes that dominate both directions). Otherwise (a station-valued
  mechanism's histogram, or the clone bound of a report) the releases that differ are at most
  ``2M``: the release's PLDs are composed ``min(releases, 2M)`` times. The curator with the same
  bound has L2 sensitivity ``sqrt(2M)`` over the day (:func:`central_limit_sd`).
* :mod:`estimators.fit` chooses the parameters that meet a day budget.

>>> round(central_limit_sd(2.5, 1e-6), 1), round(central_limit_sd(4.0, 1e-6), 1), round(central_limit_sd(8.0, 1e-6), 1)
(138.2, 90.6, 49.6)
>>> [round(central_limit_sd(2.5, 1e-6, span_s=s, passages=s // 30, n_stations=3220), 1) for s in (300, 3600)]
[138.2, 138.2]
>>> round(central_limit_sd(2.5, 1e-6, span_s=3600, passages=20, n_stations=3220), 1)  # a cap of 20 an hour
56.4
>>> [round(central_limit_sd(b, 1e-6, span_s=3600, passages=120, n_stations=3220, day_cap=40), 1) for b in (2.5, 1)]
[16.3, 37.8]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import estimators.aggregate as aggregate
import estimators.privacy as privacy
import estimators.shuffle as shuffle

from ._types import FloatArray
from .mechanisms import Mechanism
from .registry import MechanismSpec, PlanError

__all__ = ["CLONE_MAX", "DAY_S", "EPOCH_S", "RELEASES", "EpochAccount", "central_limit_sd", "check_day_cap",
           "check_span", "day_epsilon_of", "dominating_envelope", "epoch_account", "gaussian_delta", "local_day",
           "pld_day_epsilon", "pure_pld", "release_figures", "releases_in", "span_passages", "span_ratios",
           "span_round_epsilons"]

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


def span_passages(span_s: int, max_passages: int | None, n_stations: int, day_cap: int | None = None) -> int:
    """P: the most stations one span report names (``max_passages``, by default one per epoch of
    the span), never more than the stations (as ``Query.passages``) nor a day cap's M (a report
    past it names fewer).

    >>> span_passages(3600, None, 3220), span_passages(3600, 20, 3220), span_passages(3600, None, 16)
    (120, 20, 16)
    >>> span_passages(3600, None, 3220, day_cap=40)
    40
    """
    check_span(span_s, max_passages)
    return max(1, min(max_passages or span_s // EPOCH_S, n_stations, day_cap or n_stations))


def check_day_cap(day_cap: int | None) -> None:
    """:class:`PlanError` unless ``day_cap`` (the most passages a device names a day) is None or >= 1.

    >>> check_day_cap(40); check_day_cap(None)
    >>> check_day_cap(0)
    Traceback (most recent call last):
    ...
    estimators.registry.PlanError: a day cap (max passages a day) must be at least 1; got 0
    """
    if day_cap is not None and (not isinstance(day_cap, int) or day_cap < 1):
        raise PlanError(f"a day cap (max passages a day) must be at least 1; got {day_cap}")


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
                     span_s: int = EPOCH_S, passages: int = 1, n_stations: int | None = None,
                     day_cap: int | None = None) -> float:
    """The curator's per-release (30-s epoch or span), per-station sd at a whole-day (budget, delta):
    ``sqrt(C) / mu`` with ``delta(budget; mu) = delta`` and ``C`` the answers two days can differ
    in: ``T min(2P, V)``, ``T`` the releases in ``epochs`` 30-s epochs (:func:`releases_in`), ``P`` =
    ``passages`` (``V`` = ``n_stations``, unbounded if None), at most ``2 day_cap`` (L2 sensitivity
    ``sqrt(2M)`` over the day). ``share``: the fraction of mu^2 one query gets when a curator answers
    several (mu^2 adds under composition)."""
    from scipy.optimize import brentq
    if budget <= 0:
        raise PlanError("a day budget must be > 0")
    check_span(span_s)
    check_day_cap(day_cap)
    changed = releases_in(epochs, span_s) * (2 * passages if n_stations is None else min(2 * passages, n_stations))
    if day_cap is not None:
        changed = min(changed, 2 * day_cap)
    mu = brentq(lambda m: gaussian_delta(budget, m) - delta, 1e-6, 100.0, xtol=1e-12)
    return math.sqrt(changed) / (float(mu) * math.sqrt(share))


@dataclass(frozen=True)
class EpochAccount:
    """One release's PLDs for ``release`` (a 30-s epoch's report, or a span report): ``plds[i]``
    composed ``counts[i]`` times (empty ``counts``: once each); ``exact``: the aggregate release's
    own accounting (else the clone bound of the permuted release); ``local``: the release's local
    epsilon, every round composed (a cap, and what a device's local ledger charges).
    ``day_cap`` (M): a device names at most M passages a day (module doc); ``stations``: each
    round's (forward, backward) station PLDs, composed M times each at the cap (exact per-sensor
    accounts); ``pair``: the local epsilon of one passage moved (a Yes and a No answer, every round)."""

    release: str
    plds: tuple[shuffle.Pld, ...]
    exact: bool
    local: float
    counts: tuple[int, ...] = ()
    span_s: int = EPOCH_S
    passages: int = 1
    changed: int = 2
    day_cap: int | None = None
    stations: tuple[shuffle.Pld, ...] = ()
    pair: float = math.inf
    blanket: bool = False  # k-ary RR's histogram: through the privacy blanket (an upper bound), not exact

    def parts(self, releases: int = 1) -> list[tuple[shuffle.Pld, int]]:
        """``(pld, times)`` of ``releases`` releases composed (at most what the day cap allows)."""
        counts = self.counts or (1,) * len(self.plds)
        cap = self.day_cap
        if cap is not None and self.stations and 2 * cap < self.changed * releases:
            return [(p, cap) for p in self.stations]
        differ = releases if cap is None else min(releases, 2 * cap)  # releases that can differ
        return [(p, c * differ) for p, c in zip(self.plds, counts, strict=True) if c]

    def releases(self, epochs: int) -> int:
        """Releases of this query in ``epochs`` 30-s epochs."""
        return releases_in(epochs, self.span_s)

    def local_day(self, releases: int, delta: float) -> float:
        """The local figure of ``releases`` reports: optimal composition of the reports, or with a
        day cap of the releases that can differ (at most 2M) or of M moved passages (``pair``)."""
        if self.day_cap is None:
            return local_day(self.local, releases, delta)
        return min(local_day(self.local, min(releases, 2 * self.day_cap), delta),
                   local_day(self.pair, self.day_cap, delta) if math.isfinite(self.pair) else math.inf)

    @property
    def note(self) -> str:
        if math.isinf(self.local):
            return NO_BOUND_NOTE
        if self.release == "permuted":
            return "the clone bound of the permuted release"
        if not self.exact:
            return aggregate.FALLBACK_NOTE
        return aggregate.BLANKET_NOTE if self.blanket else aggregate.EXACT_NOTE


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
                  passages: int = 1, day_cap: int | None = None, probe: bool = False) -> EpochAccount:
    """The account of one release of a query: a 30-s epoch's report, or (``span_s`` > 30) one
    span report of up to ``passages`` stations (P, capped at ``n_stations``), of a device that
    names at most ``day_cap`` passages a day (None: no cap); module doc. ``probe``: a lower
    bound for a search to reject with, never to publish (:func:`aggregate_multi.ternary_station_pld`).
    ``ratios``: ``spec.shuffle_ratios(mech, n_stations)`` when the caller has them already (k-ary
    RR's over 3,220 stations take ~1 s; used for one-passage reports only).

    Unary RR through the aggregate release: an hourly report (P = 120) composes each station's
    PLD 120 times per release, so 24 hours cost what 2,880 epochs do; a day cap of 40 passages
    composes each 40 times over the whole day:

    >>> from estimators.registry import get_spec
    >>> spec = get_spec("unary"); mech = spec.build({"q": 0.3}, 300)
    >>> hour = epoch_account(spec, mech, 300, 1000, "aggregate", span_s=3600, passages=120)
    >>> hour.counts, [c for _, c in hour.parts(hour.releases(2880))]
    ((120, 120), [2880, 2880])
    >>> capped = epoch_account(spec, mech, 300, 1000, "aggregate", span_s=3600, passages=120, day_cap=40)
    >>> [c for _, c in capped.parts(24)], [c for _, c in capped.parts(1)]  # one hour too: at most 40 each way
    ([40, 40], [40, 40])
    """
    if release not in RELEASES:
        raise PlanError(f"unknown release {release!r}; choose {' or '.join(RELEASES)}")
    check_span(span_s)
    check_day_cap(day_cap)
    if passages < 1:
        raise PlanError("passages must be >= 1")
    if span_s != EPOCH_S and not spec.per_sensor:
        raise PlanError(f"{spec.name} reports one station per epoch: a span longer than {EPOCH_S} s needs a "
                        f"per-sensor mechanism")
    passages = min(passages, n_stations)
    pair = sum(span_round_epsilons(spec, mech, max(2, n_stations), 1)) if spec.per_sensor else math.inf

    def account(plds: tuple[shuffle.Pld, ...], exact: bool, counts: tuple[int, ...] = (),
                stations: tuple[shuffle.Pld, ...] = ()) -> EpochAccount:
        return EpochAccount(release, plds, exact, local, counts, span_s, passages,
                            min(2 * passages, n_stations) if spec.per_sensor else 2, day_cap, stations, pair,
                            blanket=exact and not spec.per_sensor)

    if passages > 1:
        round_eps = span_round_epsilons(spec, mech, n_stations, passages)
        local = sum(round_eps)
    else:
        if ratios is None:
            ratios = spec.shuffle_ratios(mech, n_stations)
        local = sum(v.epsilon0 for v in ratios if v.beta > 0)
    if math.isinf(local):
        return account((), False)
    if release == "aggregate":
        flat = spec.aggregate_plds(mech, n_stations, n, probe=probe)
        if flat is not None:
            if spec.per_sensor:
                plds, counts = _span_parts(flat, n_stations, passages)
                return account(plds, True, counts, tuple(flat))
            return account(tuple(flat), True)
    permuted = _permuted_plds(round_eps, n) if passages > 1 else shuffle.clone_plds(ratios or (), n)
    return account(tuple(permuted), False)


def day_epsilon_of(accounts: list[tuple[EpochAccount, int]], delta: float, coarse: float = 1.0) -> float:
    """Epsilon at ``delta`` of every account composed over its number of releases (``(account,
    releases)``: e.g. a vehicle's day across queries of different spans), on one grid ``coarse``
    times the default step (rounded up: an upper bound). One query, or queries whose parts compose
    equally often, take :func:`shuffle.compose`'s path (the same numbers as a 30-s day's)."""
    parts, step = _day_grid(accounts, coarse)
    if not parts:
        return 0.0
    times = {c for _, c in parts}
    if len(times) == 1:
        return shuffle.compose([p for p, _ in parts], times.pop(), step=step).epsilon(delta)
    return shuffle.compose_counts(parts, step=step).epsilon(delta)


def _day_rounding(accounts: list[tuple[EpochAccount, int]], coarse: float = 1.0) -> float:
    """How far :func:`day_epsilon_of`'s rounding can lift its figure above the exact one: every
    composed loss is rounded up by less than the grid's step, so the composed losses by less
    than (compositions x step). Its figure minus this is a lower bound of the exact epsilon."""
    parts, step = _day_grid(accounts, coarse)
    return sum(c for _, c in parts) * step


def _day_grid(accounts: list[tuple[EpochAccount, int]], coarse: float) -> tuple[list[tuple[shuffle.Pld, int]], float]:
    """The parts :func:`day_epsilon_of` composes and its grid's step (0 without parts)."""
    parts = [pc for acc, r in accounts for pc in acc.parts(r)]
    if not parts:
        return parts, 0.0
    times = {c for _, c in parts}
    if len(times) == 1:
        return parts, shuffle.grid_step([p for p, _ in parts], times.pop()) * coarse
    return parts, shuffle.grid_step_counts(parts) * coarse


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
            "epsilon_day_shuffled": min(acc.local_day(releases, delta), day),
            "accounting": acc.note}
