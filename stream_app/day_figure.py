"""A vehicle's whole day across every query it answers: the one figure the demo's banner,
``summary.txt``, ``ptt analyst list``, the report's plots, the worker's ``/metrics``
(``ptt_vehicle_day_epsilon``, :mod:`stream_app.worker.day_metric`) and the README give for a run (with
``ptt plan fleet`` at the same crowd, stations and queries: the same function underneath,
:func:`estimators.vehicle_day`, over each query's :attr:`~schemas.Query.accounting`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["crowd", "day_title", "newest", "release_of", "unbounded", "vehicle_day"]


def unbounded(q: Any) -> bool:
    """A query with no shuffled or whole-day bound (Sampling Privacy's rounds share one die)."""
    from estimators import privacy

    return not privacy.rounds_independent(q.build())


def newest(queries: Iterable[Any]) -> list[Any]:
    """The newest version of each query, by query id: the queries a vehicle answers."""
    latest = {q.query_id: q for q in sorted(queries, key=lambda q: q.version)}
    return [latest[k] for k in sorted(latest)]


def crowd(answered: list[Any], shuffle_size: int | None = None) -> int:
    """The n a shuffled day figure is computed at: ``shuffle_size``, else the smallest
    population of the ``answered`` queries, rounded down to 2 significant digits as the worker does."""
    from estimators import round_down_2sig

    return round_down_2sig(shuffle_size or min(q.population for q in answered))


def vehicle_day(queries: list[Any], release: str, shuffle_size: int | None = None) -> tuple[str, float | None]:
    """A vehicle's whole day across every query it answers (the newest version of each), for
    ``release``: through the shuffler among n reports (the smallest population, rounded down to
    2 significant digits as the worker does), or ``local``; and the day's epsilon (None: none of
    the queries has a bound). A query without a whole-day bound (Sampling Privacy) is left out
    of the figure, and the line says so rather than print a number that is no bound."""
    from estimators import SP_CAVEAT, planning
    from estimators import vehicle_day as day_of

    answered = newest(queries)
    n = crowd(answered, shuffle_size)
    bounded = [q for q in answered if not unbounded(q)]
    left_out = [q.query_id for q in answered if unbounded(q)]
    names = ", ".join(q.query_id for q in bounded)
    which = f"{len(bounded)} {'query' if len(bounded) == 1 else 'queries'} ({names})"
    caveat = (f"; not counting {', '.join(left_out)}, which has no whole-day bound ({SP_CAVEAT})"
              if left_out else "")
    if not bounded:
        return f"a vehicle's day: no bound ({SP_CAVEAT})", None
    day = day_of([q.accounting for q in bounded], n, release, planning.EPOCHS_PER_DAY)
    if release == "local":
        return (f"a vehicle's day across its {which}: epsilon {day['local']:.4g} at delta 1e-06, local (no shuffler)"
                + caveat, day["local"])
    return (f"a vehicle's day across its {which}: epsilon {day['shuffled']:.4g} at delta 1e-06 through the "
            f"shuffler's {release} release among n={n:,} (local, without it: {day['local']:.4g})" + caveat,
            day["shuffled"])


#: the shuffler's releases, least revealing first (the aggregate counts are a function of the
#: permuted reports, so a day through both is bounded by the permuted release's figure)
RELEASES = ("aggregate", "permuted")


def release_of(releases: Iterable[str | None]) -> str:
    """The path a run's estimates took, from their ``release`` fields, as its most revealing
    part: ``local`` when any estimate is not attested (None: the direct path, whose reports
    only the local figure protects) or there is none, else the shuffler's release they attest
    (``permuted`` when they attest both).

    >>> release_of(["aggregate", "aggregate"]), release_of([None, "aggregate"]), release_of([])
    ('aggregate', 'local', 'local')
    >>> release_of(["aggregate", "permuted", "aggregate"])
    'permuted'
    """
    seen = set(releases)
    if not seen or None in seen:
        return "local"
    return max((r for r in seen if r), key=RELEASES.index)


def day_title(epsilon: float | None, release: str) -> str:
    """The day figure, short, for a plot's title.

    >>> day_title(0.98779, "aggregate")
    "a vehicle's day: \u03b5 0.988 through the shuffler's aggregate release"
    >>> day_title(4685.5, "local"), day_title(None, "local")
    ("a vehicle's day: \u03b5 4.69e+03 local (no shuffler)", "a vehicle's day: no bound")
    """
    if epsilon is None:
        return "a vehicle's day: no bound"
    where = "local (no shuffler)" if release == "local" else f"through the shuffler's {release} release"
    return f"a vehicle's day: \u03b5 {epsilon:.3g} {where}"
