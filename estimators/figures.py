"""The one source of the privacy figures a person reads, and the words that go with them.

Every place that states a query's per-epoch epsilon (``ptt plan``, ``ptt analyst list``, the
demo's start-up, the worker's ``epsilon_shuffled`` in its rows and metrics, the report, the
README and docs/statistics.md, whose quoted figures a test re-runs) gets it from
:func:`epoch_epsilon`, and says which release it is for and at what crowd with :func:`label`:

* ``local``: what one device's report costs it, whatever happens to the report (no shuffler);
* ``permuted``: the shuffler releases the reports permuted among ``n`` (the clone bound);
* ``aggregate``: the shuffler releases only the counts of the ``n`` reports (the counts' own
  accounting, :mod:`estimators.aggregate`, where it exists; never above the permuted figure,
  which holds for the counts too by post-processing).

:func:`plain_words` is the one sentence that says what a vehicle's day figure means, and
:data:`SP_CAVEAT` the one caveat that goes wherever Sampling Privacy's estimates appear.
"""

from __future__ import annotations

import math
from typing import Protocol

import estimators.aggregate as aggregate
import estimators.shuffle as shuffle

from .mechanisms import Mechanism

__all__ = ["FIGURE_RELEASES", "SP_CAVEAT", "Accountable", "epoch_epsilon", "error_mass", "label", "plain_words",
           "scale_word", "uncertifiable"]

FIGURE_RELEASES = ("local", "permuted", "aggregate")

SP_CAVEAT = ("Sampling Privacy: its two rounds share one die, so no shuffled or whole-day bound exists; its local "
             "per-epoch epsilon holds only while a vehicle's two rounds cannot be linked")


class Accountable(Protocol):
    """What :func:`epoch_epsilon` asks of a mechanism's spec (:class:`registry.MechanismSpec`; a
    protocol, so that the registry can call this module without an import cycle)."""

    def report_epsilon(self, mech: Mechanism, n_stations: int, passages: int = 1) -> float: ...

    def shuffle_ratios(self, mech: Mechanism, n_stations: int) -> tuple[shuffle.VariationRatio, ...]: ...

    def aggregate_plds(self, mech: Mechanism, n_stations: int, n: int,
                       stride: int | None = None) -> list[shuffle.Pld] | None: ...


def epoch_epsilon(spec: Accountable, mech: Mechanism, n_stations: int, n: int | None, release: str,
                  delta: float = 1e-6, passages: int = 1) -> float:
    """One epoch's epsilon at ``delta`` of a query for ``release`` among ``n`` reports (``n``
    is not used for ``local``): ``inf`` where no bound exists (Sampling Privacy's shuffled
    releases). The aggregate figure is the smaller of the counts' own accounting (one epoch
    composed exactly, :func:`aggregate.epsilon_of`) and the permuted figure; the permuted one
    is the clone bound, never above the local figure. ``passages`` > 1 (one *span* report of up
    to that many stations, ``Query.passages``): the local figure here; the shuffled ones are
    :func:`estimators.ledger.report_epsilon_shuffled`'s."""
    if release == "local":
        return spec.report_epsilon(mech, n_stations, passages)
    if release not in FIGURE_RELEASES:
        raise ValueError(f"unknown release {release!r}; choose {', '.join(FIGURE_RELEASES)}")
    if n is None or n < 1:
        raise ValueError("a shuffled figure needs the crowd n >= 1")
    if min(passages, n_stations) > 1:
        raise ValueError("a span report's shuffled figure is ledger.report_epsilon_shuffled's (its stations' PLDs "
                         "composed P times each way)")
    ratios = spec.shuffle_ratios(mech, n_stations)
    permuted = shuffle.shuffled_epsilon(ratios, n, delta)
    if math.isinf(permuted):
        return permuted
    candidates = [shuffle.clone_plds(ratios, n)]
    if release == "aggregate":
        plds = spec.aggregate_plds(mech, n_stations, n)
        if plds is not None:
            permuted = min(permuted, aggregate.epsilon_of(plds, 1, delta))
            candidates.append(plds)
    if uncertifiable(candidates, 1, delta) is not None:
        return math.nan  # the local figure, silently, is what the accounting would give: say so instead
    return permuted


def error_mass(plds: list[shuffle.Pld], epochs: int) -> float:
    """What ``epochs`` compositions of ``plds`` count at infinite loss at least: every PLD's
    allowance for mass it left out (binomial windows, FFT round-off), plus 1e-13 for the
    composition's own truncation (1e-15 per convolution). No epsilon exists below this delta.

    >>> import numpy as np
    >>> p = shuffle.Pld(np.array([0.0]), np.array([1.0 - 1e-12]), 1e-12)
    >>> 5.7e-9 < error_mass([p, p], 2880) < 5.8e-9
    True
    """
    log_kept = epochs * sum(math.log1p(-min(p.infinity_mass, 1.0 - 1e-300)) for p in plds)
    return -math.expm1(log_kept) + 1e-13


def uncertifiable(candidates: list[list[shuffle.Pld]], epochs: int, delta: float) -> str | None:
    """Why no shuffled figure can be given at ``delta`` over ``epochs`` (None: it can): every
    accounting of the release (``candidates``: the clone bound's PLDs, the counts' own) counts
    more than ``delta`` at infinite loss, so it would fall back to the local figure."""
    floor = min((error_mass(c, epochs) for c in candidates if c), default=0.0)
    if floor <= delta:
        return None
    return (f"no shuffled figure at delta {delta:g}: the accounting's allowance for what it leaves out (binomial "
            f"windows, FFT round-off, counted at infinite loss) comes to {floor:.2g} over {epochs:,} "
            f"{'epoch' if epochs == 1 else 'epochs'}; give --delta >= {floor:.2g} (the local figure holds at any "
            f"delta)")


def label(epsilon: float | None, release: str, n: int | None = None, delta: float = 1e-6,
          per: str = "epoch") -> str:
    """A figure with what it is for: the release, the crowd ``n`` and ``delta``.

    >>> label(0.0043617, "aggregate", 47_719)
    'epsilon 0.004362 per epoch, aggregate release among n = 47,719 at delta 1e-06'
    >>> label(1.30683, "local")
    'epsilon 1.307 per epoch, local (what a device sends, no shuffler)'
    >>> label(math.inf, "permuted", 890, per="day")
    'no bound per day, permuted release among n = 890 at delta 1e-06'
    """
    value = "no bound" if epsilon is None or math.isinf(epsilon) else f"epsilon {epsilon:.4g}"
    if release == "local":
        return f"{value} per {per}, local (what a device sends, no shuffler)"
    return f"{value} per {per}, {release} release among n = {n:,} at delta {delta:g}"


def scale_word(epsilon_day: float) -> str:
    """Where a day figure sits on the scale :func:`plain_words` states.

    >>> [scale_word(e) for e in (0.33, 2.4, 7.4, 26.0)]
    ['strong', 'what large deployments use', 'weak', 'no meaningful protection']
    """
    if epsilon_day < 1:
        return "strong"
    if epsilon_day <= 3:
        return "what large deployments use"
    if epsilon_day <= 10:
        return "weak"
    return "no meaningful protection"


def plain_words(epsilon_day: float | None = None) -> str:
    """The one sentence that says what a vehicle's day figure means, with the figure's place on
    the scale when it is given.

    >>> plain_words()[:78]
    "What a vehicle's day figure epsilon means: whatever an observer believed about"
    >>> plain_words(0.3252).endswith("here e^0.3252 = 1.38: strong.")
    True
    >>> plain_words(math.inf).endswith("here there is no bound at all.")
    True
    """
    sentence = ("What a vehicle's day figure epsilon means: whatever an observer believed about any yes-or-no fact "
                "of that vehicle's day (was it at this station at 8:00?), seeing every published figure of the day "
                "moves the odds by at most a factor e^epsilon (below 1: strong protection; 1 to 3: what large "
                "deployments use; 3 to 10: weak; above 10: no meaningful protection)")
    if epsilon_day is None:
        return sentence + "."
    if math.isinf(epsilon_day):
        return sentence + "; here there is no bound at all."
    if epsilon_day > 700:
        return sentence + f"; here e^{epsilon_day:.4g} is astronomically large: no meaningful protection."
    return sentence + f"; here e^{epsilon_day:.4g} = {math.exp(epsilon_day):.3g}: {scale_word(epsilon_day)}."
