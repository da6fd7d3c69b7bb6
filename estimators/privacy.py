"""Privacy accounting: brute-force local epsilon, the papers' closed forms, amplification,
composition over epochs, Haystack crowd sizes and the device-side query audit.

The brute force is the definition: ``max over outputs o and truths t, t' of
ln(P(o|t) / P(o|t'))`` over a mechanism's output table; infinite where an output is possible
under one truth and impossible under another. The closed forms are kept as separate
functions so the tests can hold them against the brute force and document where a closed
form leaves outputs out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

import numpy as np

from ._types import FloatArray
from .mechanisms import Mechanism

__all__ = [
    "AuditResult",
    "CrowdSize",
    "DayLedger",
    "MechanismEpsilon",
    "advanced_composition",
    "alp_epsilon_closed_form",
    "amplified_epsilon",
    "audit_query",
    "basic_composition",
    "crowd_size",
    "day_epsilon",
    "epochs_within_budget",
    "linked_epsilon",
    "local_epsilon",
    "mechanism_epsilon",
    "optimal_composition",
    "per_sensor_joint_table",
    "per_sensor_report_epsilon",
    "rounds_independent",
    "rr_epsilon_closed_form",
    "sp_binary_epsilon_closed_form",
    "smallest_epsilon",
    "sp_epsilon_closed_form",
]


def local_epsilon(table: FloatArray, chunk: int = 512) -> float:
    """Brute-force local epsilon of an output table ``P(o | t)`` of shape ``(T, O)``."""
    tab = np.asarray(table, dtype=np.float64)
    if tab.ndim != 2:
        raise ValueError("table must be 2-d (truths x outputs)")
    if not np.all(np.isfinite(tab)) or np.any(tab < 0):
        raise ValueError("table entries must be finite, non-negative probabilities")
    col_max = np.full(tab.shape[1], -np.inf)
    col_min = np.full(tab.shape[1], np.inf)
    for i in range(0, tab.shape[0], chunk):
        part = tab[i:i + chunk]
        col_max = np.maximum(col_max, part.max(axis=0))
        col_min = np.minimum(col_min, part.min(axis=0))
    used = col_max > 0
    if np.any(col_min[used] <= 0):
        return math.inf
    if not np.any(used):
        return 0.0
    return float(np.max(np.log(col_max[used]) - np.log(col_min[used])))


@dataclass(frozen=True)
class MechanismEpsilon:
    """Per-epoch epsilons of a mechanism.

    ``epsilon``: the headline -- the largest per-round epsilon, i.e. what one report leaks
    when a vehicle's rounds cannot be linked (the papers' assumption; for Sampling Privacy
    round 1 is truth-independent and this is the round-2 epsilon).
    ``epsilon_linked``: the epsilon of the joint table of all rounds, what an adversary who
    links a vehicle's rounds would face (infinite for Sampling Privacy: 0 -> V' happens only
    for the sampled face).
    """

    epsilon: float
    per_round: tuple[float, ...]
    epsilon_linked: float


def mechanism_epsilon(mech: Mechanism) -> MechanismEpsilon:
    per_round = tuple(local_epsilon(mech.output_table(r)) for r in range(mech.n_rounds))
    linked = per_round[0] if mech.n_rounds == 1 else linked_epsilon(mech)
    return MechanismEpsilon(max(per_round), per_round, linked)


def linked_epsilon(mech: Mechanism) -> float:
    """Brute-force epsilon of the joint report of all rounds, computed sparsely.

    Equal to ``local_epsilon(mech.joint_table())`` but only touches the (truth, face) grid,
    so it also works where the dense joint table (T x O**R) would not fit in memory.
    """
    t_n, o_n = mech.n_truths, mech.n_outputs
    key = np.zeros((t_n, mech.n_faces), dtype=np.int64)
    for r in range(mech.n_rounds):
        key = key * o_n + np.broadcast_to(
            mech.emit(r, np.arange(mech.n_faces, dtype=np.int64)[None, :],
                      np.arange(t_n, dtype=np.int64)[:, None]), key.shape)
    prob = mech.latent_full()
    live = prob > 0
    truth = np.broadcast_to(np.arange(t_n, dtype=np.int64)[:, None], key.shape)[live]
    pair = key[live]
    cell, inverse = np.unique(pair * t_n + truth, return_inverse=True)
    mass = np.bincount(inverse, weights=prob[live])
    cell_pair = cell // t_n
    pairs, per_pair = np.unique(cell_pair, return_inverse=True)
    support = np.bincount(per_pair, minlength=pairs.size)
    if np.any(support < t_n):
        return math.inf
    hi = np.full(pairs.size, -np.inf)
    lo = np.full(pairs.size, np.inf)
    np.maximum.at(hi, per_pair, mass)
    np.minimum.at(lo, per_pair, mass)
    return float(np.max(np.log(hi) - np.log(lo)))


def rounds_independent(mech: Mechanism, atol: float = 1e-12) -> bool:
    """Whether a device's rounds are independent given its truth: ``P(o_1, ..., o_R | t)`` is the
    product of the per-round tables for every truth. Only then are the rounds' separate
    shuffles (or their separate counts) accounted by composing one PLD per round. Sampling
    Privacy's rounds share one die roll: the second round's counts minus the first's are the
    exact histogram of the devices that drew the sampling face, so a station nobody else is
    at shows whether the target is there (delta >= pis at every epsilon), and no per-round
    composition bounds that. Checked truth by truth (stops at the first dependent one).

    >>> from estimators.mechanisms import fresh_sample, sampling_privacy
    >>> rounds_independent(fresh_sample(0.3, 0.1, 0.05, 0.1))
    True
    >>> rounds_independent(sampling_privacy(3, pis=0.2))
    False
    """
    if mech.n_rounds == 1:
        return True
    prob = mech.latent_full()
    faces = np.arange(mech.n_faces, dtype=np.int64)
    o_n = mech.n_outputs
    for t in range(mech.n_truths):
        truth = np.full(faces.shape, t, dtype=np.int64)
        outs = [mech.emit(r, faces, truth) for r in range(mech.n_rounds)]
        key = np.zeros(faces.shape, dtype=np.int64)
        for o in outs:
            key = key * o_n + o
        cells, inverse = np.unique(key, return_inverse=True)
        joint = np.bincount(inverse, weights=prob[t])
        margins = [np.bincount(o, weights=prob[t], minlength=o_n) for o in outs]
        product = np.ones(cells.shape)
        rest = cells.copy()
        for m in reversed(margins):
            product *= m[rest % o_n]
            rest //= o_n
        # equal on the joint's support, and the product puts no mass anywhere else
        if not np.allclose(joint, product, atol=atol) or abs(float(product.sum()) - 1.0) > 1e-9:
            return False
    return True


def per_sensor_report_epsilon(table: FloatArray, n_stations: int, passages: int = 1) -> float:
    """Epsilon of the whole report vector of a binary mechanism asked about each of V sensors.

    The truth is the set of stations a vehicle passed (at most ``passages`` = P of them: one in
    a 30-s epoch, up to one per epoch in a longer span). Neighbouring truths A and B differ in
    ``a = |A \\ B|`` answers flipped Yes -> No and ``b = |B \\ A|`` flipped No -> Yes, with
    ``a, b <= P`` and ``a + b <= V``. With ``up = max_o ln P(o|Yes)/P(o|No)`` and ``down =
    max_o ln P(o|No)/P(o|Yes)`` the worst case is ``a up + b down`` at its largest: for ``V >=
    2P`` that is ``P (up + down)`` (P = 1: "at a" vs "at b"), for ``V = 1`` the per-answer
    epsilon. Equal to ``local_epsilon(per_sensor_joint_table(table, V))`` at P = 1 (the tests
    check it by brute force, and every P against the joint table of sets).

    >>> import numpy as np
    >>> rr = np.array([[0.96, 0.04], [0.16, 0.84]])  # two-coin RR (0.8, 0.2)
    >>> round(per_sensor_report_epsilon(rr, 3), 6)   # ln 126
    4.836282
    >>> round(per_sensor_report_epsilon(rr, 3, passages=2), 6)  # 3 answers flip: 2 x ln 21 + ln 6
    7.880804
    """
    tab = np.asarray(table, dtype=np.float64)
    if tab.shape[0] != 2:
        raise ValueError("a per-sensor mechanism is binary: its table has two rows (No, Yes)")
    if n_stations < 1:
        raise ValueError("n_stations must be >= 1")
    if passages < 1:
        raise ValueError("passages must be >= 1")
    if n_stations == 1:
        return local_epsilon(tab)
    no, yes = tab[0], tab[1]
    used = (no > 0) | (yes > 0)
    if np.any((no[used] == 0) | (yes[used] == 0)):
        return math.inf
    log_ratio = np.log(yes[used]) - np.log(no[used])
    big, small = sorted((float(log_ratio.max()), float((-log_ratio).max())), reverse=True)
    first = min(passages, n_stations)  # the larger direction takes as many flips as it can
    return first * big + min(passages, n_stations - first) * small


def per_sensor_joint_table(table: FloatArray, n_stations: int) -> FloatArray:
    """P(report vector | truth) of a binary mechanism asked about each of V sensors:
    ``(V + 1, O**V)``, truth 0 = at no sensor. For brute-force checks at small V."""
    tab = np.asarray(table, dtype=np.float64)
    o_n = tab.shape[1]
    if o_n**n_stations * (n_stations + 1) > 5_000_000:
        raise ValueError("joint table too large; use per_sensor_report_epsilon")
    rows = []
    for t in range(n_stations + 1):
        joint = np.ones(1)
        for s in range(1, n_stations + 1):
            joint = np.outer(joint, tab[1 if t == s else 0]).ravel()
        rows.append(joint)
    return np.stack(rows)


# -- the papers' closed forms --------------------------------------------------------------
def _log_ratio(num: float, den: float) -> float:
    """``ln(num/den)`` with the limits a likelihood ratio takes: ``+inf`` for x/0, ``-inf`` for
    0/x, and 0 for 0/0 (an output impossible under both truths leaks nothing)."""
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    if num == 0.0:
        return -math.inf
    return math.log(num / den)


def sp_binary_epsilon_closed_form(pi0: float, pis: float) -> float:
    """Seed 000 eqs. 21 and 25: round-2 output 0 and output 1, the larger of the two."""
    eq21 = max(_log_ratio(pi0 + pis, pi0), _log_ratio(pi0, pi0 + pis))
    eq25 = max(_log_ratio(1 - pi0, 1 - pi0 - pis), _log_ratio(1 - pi0 - pis, 1 - pi0))
    return max(eq21, eq25)


def sp_epsilon_closed_form(pi: Iterable[float], pis: float) -> float:
    """Seed 000 eq. 29, maximized over the true value V' (index 0 = no station included)."""
    return max(max(_log_ratio(p + pis, p), _log_ratio(p, p + pis)) for p in pi)


def rr_epsilon_closed_form(pi1: float, pi2: float) -> float:
    """Seed 000 eq. 30: the likelihood ratio of a "Yes" report only.

    The complete epsilon also takes the "No" report, ``(1-(1-pi1)pi2)/((1-pi1)(1-pi2))``,
    which is larger whenever ``pi2 > 1/2``; :func:`local_epsilon` takes both.
    """
    return _log_ratio(pi1 + (1 - pi1) * pi2, (1 - pi1) * pi2)


def alp_epsilon_closed_form(pisYes1: float, pisYes2: float, pi1: float, pi2: float,  # noqa: N803
                            pisNo: float, pi3: float) -> float:  # noqa: N803
    """Seed 004 eqs. 8-11: ``max(eps1, eps2)`` as printed.

    Eq. 8 compares only the "Yes" report (in the Yes/No direction) and the "No" report (in
    the No/Yes direction): it leaves out ⊥ and the reverse directions, so it can be below
    the true epsilon (with the paper's parameters: ln 1.97 = 0.68 printed vs ln 3.5 = 1.25
    from the "No" report in the Yes/No direction).
    """
    eps1 = _log_ratio(pisYes1 * pi1 + pisYes2 * pi2, pisNo * pi3)
    eps2 = _log_ratio(pisNo * (1 - pi3), pisYes1 * (1 - pi1) + pisYes2 * (1 - pi2))
    return max(eps1, eps2)


# -- amplification, composition, crowds ---------------------------------------------------
def amplified_epsilon(epsilon: float, sampling_rate: float) -> float:
    """Seed 003 Theorem 1: an eps-DP step after Bernoulli(beta) sampling is
    ``ln(1 + beta (e^eps - 1))``-DP.

    The theorem is about add/remove-one neighbours: a record that is not sampled leaves no
    trace. It does not shrink a *local* epsilon where a non-sampled owner visibly reports ⊥:
    there the sampling coin is the same under both truths and cancels (the tests show the
    brute force of such a table stays at eps).
    """
    if not 0.0 <= sampling_rate <= 1.0:
        raise ValueError("sampling_rate must be in [0, 1]")
    if math.isinf(epsilon):
        return math.inf if sampling_rate > 0 else 0.0
    return math.log1p(sampling_rate * math.expm1(epsilon))


def basic_composition(epsilon: float, epochs: int) -> float:
    """``T * eps`` over T epochs."""
    return epochs * epsilon


def advanced_composition(epsilon: float, epochs: int, delta: float = 1e-6) -> float:
    """``eps sqrt(2 T ln(1/delta)) + T eps (e^eps - 1)`` (with the stated delta)."""
    if not 0.0 < delta < 1.0:
        raise ValueError("delta must be in (0, 1)")
    if math.isinf(epsilon):
        return math.inf
    return epsilon * math.sqrt(2 * epochs * math.log(1 / delta)) + epochs * epsilon * math.expm1(epsilon)


def optimal_composition(epsilon: float, epochs: int, delta: float = 1e-6) -> float:
    """The exact (tight) epsilon of ``epochs``-fold composition of an ``epsilon``-DP release at
    ``delta`` (Kairouz, Oh and Viswanath, "The Composition Theorem for Differential Privacy").

    The worst case of any pure ``epsilon``-DP mechanism is randomized response: after k rounds
    the privacy loss is ``(k - 2l) eps`` with probability ``C(k, l) p^(k-l) (1-p)^l``,
    ``p = e^eps/(1 + e^eps)``, and the composition is ``(e', delta(e'))``-DP with
    ``delta(e') = E[(1 - e^(e' - loss))_+]``, decreasing in ``e'``: the smallest ``e'`` with
    ``delta(e') <= delta`` is found by bisection. Never above basic or advanced composition
    (a test also holds it against Google's dp_accounting PLD accountant).

    >>> round(optimal_composition(math.log(3), 2880, 1e-6), 1)
    1819.3
    """
    from scipy.special import gammaln

    if not 0.0 < delta < 1.0:
        raise ValueError("delta must be in (0, 1)")
    if epochs < 1:
        return 0.0
    if math.isinf(epsilon) or epsilon <= 0:
        return basic_composition(epsilon, epochs)
    k = epochs
    ls = np.arange(k + 1, dtype=np.float64)
    log_p, log_q = -math.log1p(math.exp(-epsilon)), -math.log1p(math.exp(epsilon))
    weight = np.exp(gammaln(k + 1) - gammaln(ls + 1) - gammaln(k - ls + 1) + (k - ls) * log_p + ls * log_q)
    loss = (k - 2 * ls) * epsilon

    def delta_at(e: float) -> float:
        return float(np.sum(weight * np.maximum(0.0, -np.expm1(np.minimum(e - loss, 0.0)))))

    return smallest_epsilon(delta_at, delta, k * epsilon, 1e-9)  # delta_at(k eps) = 0


def smallest_epsilon(delta_at: Callable[[float], float], delta: float, upper: float, tol: float = 1e-10) -> float:
    """The smallest ``eps`` in ``[0, upper]`` with ``delta_at(eps) <= delta``, by bisection, for
    a ``delta_at`` non-increasing in ``eps`` with ``delta_at(upper) <= delta`` (a privacy
    profile). Returns the upper end of the final bracket: never below the true value.

    >>> round(smallest_epsilon(lambda e: math.exp(-e), 1e-3, 20.0), 6)  # ln 1000
    6.907755
    """
    lo, hi = 0.0, upper
    if delta_at(lo) <= delta:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if delta_at(mid) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo < tol * max(1.0, hi):
            break
    return hi


def day_epsilon(epsilons: Iterable[float], delta: float = 1e-6) -> float:
    """The guarantee of a sequence of per-epoch epsilons at ``delta``: the smallest valid bound
    (basic; advanced for heterogeneous epsilons, ``sqrt(2 ln(1/delta) sum eps^2) + sum eps (e^eps
    - 1)``; and, when all are equal, the optimal composition)."""
    eps = [float(e) for e in epsilons]
    if not eps:
        return 0.0
    if any(math.isinf(e) for e in eps):
        return math.inf
    basic = sum(eps)
    advanced = math.sqrt(2 * math.log(1 / delta) * sum(e * e for e in eps)) + sum(e * math.expm1(e) for e in eps)
    bounds = [basic, advanced]
    if max(eps) - min(eps) < 1e-12:
        bounds.append(optimal_composition(eps[0], len(eps), delta))
    return min(bounds)


@dataclass
class DayLedger:
    """A device's privacy ledger: what it has spent on each local day, composed as
    :func:`day_epsilon`, against a daily budget. A query whose next epoch would take the day
    over the budget is refused (the device answers nothing for it that epoch).

    In the simulation every device of a producer answers the same queries in the same epochs,
    so one ledger per producer stands exactly for each of its devices.

    >>> ledger = DayLedger(budget=3.0)
    >>> [ledger.spend("2026-11-18", 1.0) for _ in range(4)]
    [True, True, True, False]
    >>> round(ledger.total("2026-11-18"), 3)  # at 1e-6, three answers compose to just under 3
    3.0
    """

    budget: float
    delta: float = 1e-6
    spent: dict[str, list[float]] = field(default_factory=dict)

    def would_exceed(self, day: str, epsilon: float) -> bool:
        return day_epsilon([*self.spent.get(day, []), epsilon], self.delta) > self.budget + 1e-12

    def spend(self, day: str, epsilon: float) -> bool:
        """Record one epoch's answer if it fits the budget; False (nothing recorded) if not."""
        if self.would_exceed(day, epsilon):
            return False
        self.spent.setdefault(day, []).append(epsilon)
        return True

    def total(self, day: str) -> float:
        return day_epsilon(self.spent.get(day, []), self.delta)


def epochs_within_budget(epsilon: float, budget: float, delta: float = 1e-6, limit: int = 2880) -> int:
    """How many epochs of a query (each ``epsilon``) a daily ``budget`` allows, up to ``limit``.

    >>> epochs_within_budget(1.0, 10.0)
    10
    """
    if math.isinf(epsilon) or epsilon > budget:
        return 0
    lo, hi = 0, limit  # day_epsilon grows with the number of epochs: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if day_epsilon([epsilon] * mid, delta) <= budget + 1e-12:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class CrowdSize:
    mean: float
    p01: float


def crowd_size(no_count: int, pisNo: float, pi3: float) -> CrowdSize:  # noqa: N803
    """Haystack crowd size (Anonymized Local Privacy §VI-B): "No" owners answering "Yes" for a station,
    ``Binomial(No, pisNo * pi3)``: mean and lower 1% quantile."""
    from scipy.stats import binom
    p = pisNo * pi3
    return CrowdSize(mean=no_count * p, p01=float(binom.ppf(0.01, no_count, p)))


# -- query audit (Anonymized Local Privacy §IV-B) --------------------------------------------------------
@dataclass(frozen=True)
class AuditResult:
    accepted: bool
    reason: str | None


def audit_query(epsilon: float, sensors: Collection[int | str], epsilon_limit: float,
                blacklist: Collection[int | str] = ()) -> AuditResult:
    """A device's decision on a query: refuse it if its per-epoch epsilon is not a finite
    non-negative number, exceeds the device's limit, or if it names a blacklisted sensor.
    Fails closed: an unusable limit refuses every query."""
    if math.isnan(epsilon_limit) or epsilon_limit < 0:
        return AuditResult(False, f"device epsilon limit {epsilon_limit!r} is not usable")
    if not math.isfinite(epsilon) or epsilon < 0:
        return AuditResult(False, f"query epsilon {epsilon!r} is not a finite non-negative number")
    if epsilon > epsilon_limit:
        return AuditResult(False, f"epsilon {epsilon:.4g} exceeds the device limit {epsilon_limit:.4g}")
    banned = sorted({str(s) for s in sensors} & {str(s) for s in blacklist})
    if banned:
        return AuditResult(False, f"query names blacklisted sensor(s): {', '.join(banned)}")
    return AuditResult(True, None)
