"""A device's day in shuffled terms: what its reports cost through the shuffler's release.

:class:`privacy.DayLedger` charges each answered epoch its local epsilon. A device whose
reports go through the shuffler can be charged what the analyst actually sees instead: each
query's epoch PLD of the release (:func:`budget.epoch_account`) at the smallest crowd the
shuffler guarantees (its ``min_crowd``: an epoch with fewer reports in a round is withheld, and
adding devices to a release only post-processes it, so the figure holds whatever arrives).
The day is the composition of every answered epoch of every query (rounded up onto a grid:
an upper bound), never above the local ledger's figure for the same answers.

Composing a day's PLDs at every answer would cost a convolution per (query, epoch). A day's
epsilon only grows with what is answered, so the ledger remembers count vectors known to fit
(every vector below one fits) and known not to (every vector above one does not); an
undecided check gallops ahead (how many more epochs of the same queries would still fit) and
stores the answer, so a day costs a few dozen compositions, not thousands.

>>> from estimators.registry import get_spec
>>> spec = get_spec("unary")
>>> mech = spec.build({"q": 0.3}, 4)
>>> ledger = ShuffledDayLedger(budget=3.0, min_crowd=20)
>>> spent = [ledger.spend("2026-11-18", "u", spec, mech, 4) for _ in range(40)]
>>> 0 < spent.count(True) < 40 and spent == sorted(spent, reverse=True)
True
>>> ledger.total("2026-11-18") <= 3.0
True
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field

import estimators.budget as budget
import estimators.privacy as privacy
import estimators.shuffle as shuffle

from .mechanisms import Mechanism
from .registry import MechanismSpec

__all__ = ["ShuffledDayLedger"]

Counts = dict[Hashable, int]
_COARSE = 16


def _below(v: Counts, w: Counts) -> bool:
    """Every count of ``v`` at most ``w``'s (a key ``w`` lacks counts 0)."""
    return all(c <= w.get(k, 0) for k, c in v.items())


@dataclass
class ShuffledDayLedger:
    """A device's daily budget charged through the shuffler's ``release`` at ``min_crowd``
    reports (module doc). ``spend`` records one epoch's answer to a query (``key``: the query
    and version) if the day, with it, stays within ``budget``; False (nothing recorded) if not."""

    budget: float
    min_crowd: int = 20
    release: str = "aggregate"
    delta: float = 1e-6
    counts: dict[str, Counts] = field(default_factory=dict)
    _plds: dict[Hashable, tuple[float, tuple[shuffle.Pld, ...] | None]] = field(default_factory=dict, repr=False)
    _fits: dict[str, list[Counts]] = field(default_factory=dict, repr=False)
    _over: dict[str, list[Counts]] = field(default_factory=dict, repr=False)

    def _account(self, key: Hashable, spec: MechanismSpec, mech: Mechanism, n_stations: int) -> None:
        if key not in self._plds:  # the local figure is the query's published epsilon (what DayLedger charges)
            acc = budget.epoch_account(spec, mech, n_stations, self.min_crowd, self.release)
            self._plds[key] = (spec.report_epsilon(mech, n_stations), acc.plds if math.isfinite(acc.local) else None)

    def day_epsilon(self, counts: Counts) -> float:
        """The day's epsilon of ``counts`` answered epochs per query: the release's PLDs composed,
        never above the local figure (:func:`privacy.day_epsilon` of the local epsilons)."""
        local = privacy.day_epsilon([self._plds[k][0] for k, c in counts.items() for _ in range(c)], self.delta)
        if any(self._plds[k][1] is None for k, c in counts.items() if c):
            return local  # a query without a shuffled bound (Sampling Privacy): the local figure only
        plds = {k: list(p) for k, c in counts.items() if c and (p := self._plds[k][1])}
        if not plds:
            return 0.0
        # one grid for the whole day, _COARSE times the planner's (a device's check, not a published
        # figure: still an upper bound, at most ~0.08 looser)
        step = _COARSE * shuffle.grid_step([p for ps in plds.values() for p in ps], max(counts[k] for k in plds))
        parts = [shuffle.compose(ps, counts[k], step=step) for k, ps in plds.items()]
        day = parts[0] if len(parts) == 1 else shuffle.compose(parts, 1, step=step)
        return min(local, day.epsilon(self.delta))

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

    def spend(self, day: str, key: Hashable, spec: MechanismSpec, mech: Mechanism, n_stations: int) -> bool:
        """Charge one epoch of the query ``key`` (its mechanism ``mech`` over ``n_stations``)."""
        self._account(key, spec, mech, n_stations)
        now = dict(self.counts.get(day, {}))
        now[key] = now.get(key, 0) + 1
        if not self._fits_budget(day, now):
            return False
        self.counts[day] = now
        return True

    def total(self, day: str) -> float:
        """The day's epsilon so far."""
        return self.day_epsilon(self.counts.get(day, {}))
