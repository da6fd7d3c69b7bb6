"""Whether a device report's payload fits its query: the pure checks the shuffler's policy
(:meth:`.policy.ShufflePolicy.admit`) and its column path (:mod:`.admission`) share."""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt

from schemas import DeviceReport, Query
from schemas.estimates import Rejected

__all__ = ["check_payload", "pairs_fit"]

IntArray = npt.NDArray[np.int64]


def pairs_fit(query: Query, station: IntArray, output: IntArray, owner: IntArray, n: int) -> npt.NDArray[np.bool_]:
    """Whether each of ``n`` pair reports' pairs fit ``query`` as :func:`check_payload` says
    (pair ``j`` belongs to report ``owner[j]``): stations at most V, each once in a report,
    reports non-default and below the query's outputs.

    >>> from datetime import datetime, timezone
    >>> t0 = datetime(2026, 11, 18, tzinfo=timezone.utc)
    >>> q = Query(query_id="q", analyst_id="a", version=1, mechanism="unary", sensors=(1, 2, 3), population=9,
    ...           t_start=t0, t_end=t0.replace(day=19))
    >>> st, out, owner = np.array([1, 3, 4, 2, 2, 1]), np.array([1, 1, 1, 1, 1, 0]), np.array([0, 0, 1, 2, 2, 3])
    >>> pairs_fit(q, st, out, owner, 5).tolist()  # fits; station 4 > V; station 2 twice; the default; no pairs
    [True, False, False, False, True]
    """
    bad = (station > query.n_stations) | (output >= query.n_outputs)
    if query.default_report is not None:
        bad |= output == query.default_report
    keys = np.sort(owner * (query.n_stations + 2) + np.minimum(station, query.n_stations + 1))
    twice = keys[1:][keys[1:] == keys[:-1]] // (query.n_stations + 2)
    out: npt.NDArray[np.bool_] = (np.bincount(owner[bad], minlength=n) == 0) & (np.bincount(twice, minlength=n) == 0)
    return out


def check_payload(report: DeviceReport, query: Query, stations: tuple[int, ...],
                   outputs: tuple[int, ...]) -> Rejected | None:
    """Why a report's payload does not fit its query (None: it fits); ``stations`` and
    ``outputs``: its pairs' columns."""
    v = query.n_stations
    if query.per_station is None:
        if report.value is None:
            return Rejected("wrong_layout", f"pairs for a {query.mechanism} query (a device sends one value)")
        if report.value > v:
            return Rejected("out_of_range", f"station index {report.value} > {v}")
        return None
    if report.pairs is None:
        return Rejected("wrong_layout", f"a value for a {query.mechanism} query (a device sends its pairs)")
    if report.bitmap_stations is not None and report.bitmap_stations != v:
        return Rejected("wrong_layout", f"a bitmap over {report.bitmap_stations} stations for "
                                        f"{query.record_key}'s {v} stations")
    if not report.pairs:
        return None
    if max(stations) > v:
        return Rejected("out_of_range", f"station index {max(stations)} > {v}")
    n_out = query.n_outputs
    default = query.default_report
    if max(outputs) >= n_out or default in outputs:
        bad = next(o for o in outputs if o >= n_out or o == default)
        return Rejected("out_of_range", f"report {bad}: pairs carry non-default reports below {n_out}")
    if len(set(stations)) != len(stations):
        twice = next(s for s, n in Counter(stations).items() if n > 1)
        return Rejected("bad_pairs", f"station {twice} twice in one device's report")
    return None
