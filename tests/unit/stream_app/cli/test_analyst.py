"""``ptt analyst list``'s vehicle day (stream_app/cli/analyst.py ``vehicle_day``): the figure is
estimators' ``vehicle_day`` of the queries that have a whole-day bound, for the release asked;
Sampling Privacy's query is left out of the figure and said so (its finite local day is no
bound: its two rounds share one die), never summed into a number printed as if it were one.
(The list itself runs against a real broker: tests/integration/test_analyst_cli.py.)"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import estimators as E
from schemas.query import Query
from stream_app.cli.analyst import vehicle_day

T0, T1 = datetime(2026, 11, 18, 6, tzinfo=UTC), datetime(2026, 11, 18, 10, tzinfo=UTC)


def _query(qid: str, mechanism: str) -> Query:
    fields: dict[str, Any] = {"query_id": qid, "analyst_id": "a", "version": 1, "sensors": tuple(range(1, 17)),
                              "mechanism": mechanism, "population": 2039, "t_start": T0, "t_end": T1}
    return Query(**fields)


@pytest.mark.parametrize("release", ["local", "aggregate"])
def test_sampling_privacy_is_left_out_of_the_day_and_said_so(release: str) -> None:
    sp, alp = _query("sp-day", "sp"), _query("alp-day", "alp")
    line, day = vehicle_day([sp, alp], release)
    want = E.vehicle_day([(alp.spec, alp.build(), alp.n_stations)], 2000, release)
    assert day == (want["local"] if release == "local" else want["shuffled"])
    assert f"across its 1 query (alp-day): epsilon {day:.4g}" in line
    assert "not counting sp-day" in line and E.SP_CAVEAT in line
    with_sp = E.vehicle_day([(q.spec, q.build(), q.n_stations) for q in (sp, alp)], 2000, "local")["local"]
    assert f"{with_sp:.4g}" not in line  # the sum with SP's finite local day is no bound: never printed


def test_only_sampling_privacy_has_no_day_figure() -> None:
    line, day = vehicle_day([_query("sp-day", "sp")], "local")
    assert day is None and "no bound" in line and E.SP_CAVEAT in line
