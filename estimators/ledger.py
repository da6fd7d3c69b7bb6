"""A device's day: what its reports cost, locally or through the shuffler's release.

What one report costs (:func:`report_charge`): every round of it composed -- a two-round
mechanism (the fresh-sample variant) is charged both rounds, not its largest -- and, for a span
query (``span_s`` > 30), the whole span report of up to P stations. A caller charges once per
report: per epoch for a 30-s query, per span for a span query.

:class:`privacy.DayLedger` charges each report its local epsilon (:func:`report_charge`). A device
whose reports go through the shuffler can be charged what the analyst actually sees instead:
:class:`ShuffledDayLedger` charges each report its release's PLD (:func:`accounting.epoch_account`)
at the smallest crowd the shuffler guarantees (its ``min_crowd``: an epoch with fewer reports in
a round is withheld, and adding devices to a release only post-processes it, so the figure
holds whatever arrives). The release is the one the query fixes (``Query.release``: a shuffler
started with another refuses to serve it); a query that fixes none is charged the permuted
release, the weaker one, because a device cannot see which release the shuffler uses (the
aggregate counts are a post-processing of the permuted reports). The day is the composition of
every report of every query (rounded up onto a grid: an upper bound), never above the local
figure for the same reports.

Composing a day's PLDs at every answer would cost a convolution per (query, report). A day's
epsilon only grows with what is answered, so the ledger remembers count vectors known to fit
(every vector below one fits) and known not to (every vector above one does not); an
undecided check gallops ahead (how many more reports of the same queries would still fit) and
stores the answer, so a day costs a few dozen compositions, not thousands.

>>> from estimators.registry import get_spec
>>> spec = get_spec("unary")
>>> mech = spec.build({"q": 0.3}, 4)
>>> ledger = ShuffledDayLedger(budget=3.0, min_crowd=20)
>>> spent = [ledger.spend("2026-11-18", "u", spec, mech, 4, release="aggregate") for _ in range(40)]
>>> 0 < spent.count(True) < 40 and spent == sorted(spent, reverse=True)
True
>>> ledger.total("2026-11-18") <= 3.0
True

A fresh-sample query whose two rounds both depend on the truth costs both (2.944 + 1.558):

>>> fresh = get_spec("fresh")
>>> m = fresh.build({"pisYes2": 0.2}, 4)
>>> round(report_charge(fresh, m, 4), 4), round(fresh.report_epsilon(m, 4), 4)
(4.5026, 2.9444)
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Hashable
from dataclasses import dataclass, field

import estimators.budget as accounting
import estimators.privacy as privacy

from .mechanisms import Mechanism
from .registry import MechanismSpec

__all__ = ["UNPINNED_RELEASE", "ShuffledDayLedger", "charged_release", "report_charge", "report_epsilon_all_rounds",
           "report_epsilon_shuffled"]

UNPINNED_RELEASE = "permuted"  # what a query that fixes no release is charged: the weaker release

Counts = dict[Hashable, int]
_COARSE = 16


_CHARGES: weakref.WeakKeyDictionary[Mechanism, dict[tuple[int, int, int], tuple[MechanismSpec, float]]] = \
    weakref.WeakKeyDictionary()


def report_charge(spec: MechanismSpec, mech: Mechanism, n_stations: int, passages: int = 1) -> float:
    """:func:`report_epsilon_all_rounds`, remembered per mechanism object for as long as it lives
    (a device charges every report; k-ary RR's brute force over 3,220 stations takes ~0.1 s)."""
    per_mech = _CHARGES.setdefault(mech, {})
    hit = per_mech.get((id(spec), n_stations, passages))
    if hit is not None and hit[0] is spec:
        return hit[1]
    value = report_epsilon_all_rounds(spec, mech, n_stations, passages)
    per_mech[(id(spec), n_stations, passages)] = (spec, value)
    return value


def report_epsilon_all_rounds(spec: MechanismSpec, mech: Mechanism, n_stations: int, passages: int = 1) -> float:
    """Local epsilon of one report (an epoch's, or a span's of up to ``passages`` stations) with
    every round composed: what a device's local ledger charges.

    Rounds with independent coins: the epsilon of their joint report, exactly (per-sensor:
    :func:`privacy.per_sensor_report_epsilon` of the rounds' joint table; it is the sum of the
    rounds' figures when their worst reports line up). Rounds that share one die (Sampling
    Privacy): linked, no finite bound exists; the sum of the rounds' epsilons is charged, the
    figure that holds only while a vehicle's rounds cannot be linked (never below the largest
    round's, the published per-epoch figure)."""
    if mech.n_rounds == 1:
        return spec.report_epsilon(mech, n_stations, passages)
    if not privacy.rounds_independent(mech):
        if passages != 1:
            return spec.report_epsilon(mech, n_stations, passages)  # raises: no span report
        return sum(privacy.local_epsilon(mech.output_table(r)) for r in range(mech.n_rounds))
    if spec.per_sensor:
        return privacy.per_sensor_report_epsilon(mech.joint_table(), n_stations, passages)
    if passages != 1:
        return spec.report_epsilon(mech, n_stations, passages)  # raises: no span report
    return privacy.linked_epsilon(mech)


def charged_release(release: str | None) -> str:
    """The release a query is charged for: the one it fixes, else the weaker (permuted).

    >>> charged_release("aggregate"), charged_release(None)
    ('aggregate', 'permuted')
    """
    if release is None:
        return UNPINNED_RELEASE
    if release not in accounting.RELEASES:
        raise ValueError(f"unknown release {release!r}; choose {' or '.join(accounting.RELEASES)}")
    return release


def _below(v: Counts, w: Counts) -> bool:
    """Every count of ``v`` at most ``w``'s (a key ``w`` lacks counts 0)."""
    return all(c <= w.get(k, 0) for k, c in v.items())


@dataclass
class ShuffledDayLedger:
    """A device's daily budget charged through the shuffler's release at ``min_crowd`` reports
    (module doc). ``spend`` records one report of a query (``key``: the query and version) if
    the day, with it, stays within ``budget``; False (nothing recorded) if not."""

    budget: float
    min_crowd: int = 20
    delta: float = 1e-6
    counts: dict[str, Counts] = field(default_factory=dict)
    _accounts: dict[Hashable, tuple[float, accounting.EpochAccount | None]] = field(default_factory=dict, repr=False)
    _fits: dict[str, list[Counts]] = field(default_factory=dict, repr=False)
    _over: dict[str, list[Counts]] = field(default_factory=dict, repr=False)

    def account(self, key: Hashable, spec: MechanismSpec, mech: Mechanism, n_stations: int, passages: int = 1,
                span_s: int = accounting.EPOCH_S, release: str | None = None,
                day_cap: int | None = None) -> tuple[float, accounting.EpochAccount | None]:
        """``(local charge, release account)`` of one report of the query ``key`` (remembered: a
        key is one query version, whose mechanism, span, release and day cap never change); the
        account is None where no shuffled bound exists (Sampling Privacy)."""
        if key not in self._accounts:
            acc = accounting.epoch_account(spec, mech, n_stations, self.min_crowd, charged_release(release),
                                           span_s=span_s, passages=passages, day_cap=day_cap)
            self._accounts[key] = (report_charge(spec, mech, n_stations, passages),
                                   acc if math.isfinite(acc.local) else None)
        return self._accounts[key]

    def day_epsilon(self, counts: Counts) -> float:
        """The day's epsilon of ``counts`` reports per query: the releases' PLDs composed, never
        above the local figure (:func:`privacy.day_epsilon` of the local charges)."""
        charges = [self._accounts[k][0] for k, c in counts.items() for _ in range(self._differ(k, c))]
        local = privacy.day_epsilon(charges, self.delta)
        if any(self._accounts[k][1] is None for k, c in counts.items() if c):
            return local  # a query without a shuffled bound (Sampling Privacy): the local figure only
        accs = [(acc, c) for k, c in counts.items() if c and (acc := self._accounts[k][1]) is not None and acc.plds]
        if not accs:
            return 0.0
        # one grid for the whole day, _COARSE times the planner's (a device's check, not a published
        # figure: still an upper bound, at most ~0.08 looser)
        return min(local, accounting.day_epsilon_of(accs, self.delta, coarse=_COARSE))
    def _differ(self, key: Hashable, reports: int) -> int:
        """Of ``reports`` reports of a query, how many can differ between two days: all of them, or
        with a day cap M at most 2M (every other report names no station in both days)."""
        acc = self._accounts[key][1]
        return reports if acc is None or acc.day_cap is None else min(reports, 2 * acc.day_cap)

    def _fits_budget(self, day: str, v: Counts) -> bool:
        fits, over = self._fits.setdefault(day, []), self._over.setdefault(day, [])
        if any(_below(v, w) for w in fits):
            return True
        if any(_below(w, v) for w in over):
            return False
        if self.day_epsilon(v) > self.budget:
            over.append(v)
            return False
        # gallop (the same queries answered 1, 2, 4, ... more epochs), then bisect the last step:
        # the largest s with v + s fitting is stored, and v + s + 1 as not fitting
        lo, hi = 0, 1
        while hi < 4096:
            ahead = {k: c + hi for k, c in v.items()}
            if any(_below(w, ahead) for w in over) or self.day_epsilon(ahead) > self.budget:
                break
            lo, hi = hi, hi * 2
        else:
            fits.append({k: c + lo for k, c in v.items()})
            return True
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.day_epsilon({k: c + mid for k, c in v.items()}) <= self.budget:
                lo = mid
            else:
                hi = mid
        fits.append({k: c + lo for k, c in v.items()})
        over.append({k: c + hi for k, c in v.items()})
        return True

    def spend(self, day: str, key: Hashable, spec: MechanismSpec, mech: Mechanism, n_stations: int,
              passages: int = 1, span_s: int = accounting.EPOCH_S, release: str | None = None,
              day_cap: int | None = None) -> bool:
        """Charge one report of the query ``key`` (its mechanism ``mech`` over ``n_stations``; a span
        report of up to ``passages`` stations; served under ``release``, None: any, charged as
        permuted; of a device that names at most ``day_cap`` passages a day)."""
        self.account(key, spec, mech, n_stations, passages, span_s, release, day_cap)
        now = dict(self.counts.get(day, {}))
        now[key] = now.get(key, 0) + 1
        if not self._fits_budget(day, now):
            return False
        self.counts[day] = now
        return True

    def total(self, day: str) -> float:
        """The day's epsilon so far."""
        return self.day_epsilon(self.counts.get(day, {}))


def report_epsilon_shuffled(spec: MechanismSpec, mech: Mechanism, n_stations: int, n: int, release: str,
                            delta: float = 1e-6, passages: int = 1) -> float:
    """The central epsilon of one report of a query for ``release`` among ``n`` reports: a 30-s
    report's is :meth:`MechanismSpec.shuffled_epsilon` (:func:`estimators.figures.epoch_epsilon`);
    a span report's (``passages`` > 1, ``Query.passages``) is its span account's
    (:func:`estimators.budget.epoch_account`: its stations' PLDs composed P times each way), so that a span query's
    published ``epsilon_shuffled`` is never a 30-s report's smaller figure."""
    if min(passages, n_stations) <= 1:
        return spec.shuffled_epsilon(mech, n_stations, n, delta, release=release)
    acc = accounting.epoch_account(spec, mech, n_stations, n, release, span_s=accounting.DAY_S, passages=passages)
    return float(accounting.release_figures(acc, accounting.DAY_S // accounting.EPOCH_S, delta)["epsilon_shuffled"])
