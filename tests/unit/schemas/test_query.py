"""The query's span: one report per span of ``span_s`` seconds, per-sensor mechanisms only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import Query

T0 = datetime(2026, 11, 18, 8, tzinfo=UTC)
T1 = datetime(2026, 11, 18, 10, tzinfo=UTC)


def _query(**kw: Any) -> Query:
    fields: dict[str, Any] = {"query_id": "q", "analyst_id": "a", "version": 1, "sensors": (11, 12, 13),
                              "mechanism": "unary", "population": 100, "t_start": T0, "t_end": T1}
    return Query(**{**fields, **kw})


def test_the_default_span_is_one_epoch_of_one_passage() -> None:
    q = _query()
    assert (q.span_s, q.epochs_per_span, q.passages, q.span_start(57_000_001)) == (30, 1, 1, 57_000_001)


def test_an_hour_span_caps_passages_at_its_epochs_and_the_sensors() -> None:
    q = _query(span_s=3600)
    assert (q.epochs_per_span, q.passages) == (120, 3)  # three sensors: at most three passed
    assert _query(span_s=3600, sensors=tuple(range(1, 201))).passages == 120
    assert _query(span_s=3600, sensors=tuple(range(1, 201)), max_passages=20).passages == 20
    assert q.span_start(57_000_119) == 57_000_000  # 57,000,000 = 475,000 hours of 120 epochs
    assert q.span_start(57_000_120) == 57_000_120


def test_a_span_report_costs_its_passages() -> None:
    one, hour = _query(sensors=tuple(range(1, 11))), _query(span_s=300, sensors=tuple(range(1, 11)))
    assert hour.passages == 10
    assert hour.epsilon == pytest.approx(5 * one.epsilon)  # 10 stations: at most 5 flip each way


@pytest.mark.parametrize("kw,says", [
    ({"span_s": 45}, "multiple of 30"),
    ({"span_s": 30 * 7}, "divides a day"),
    ({"span_s": 0}, "greater than or equal"),
    ({"span_s": 172_800}, "less than or equal"),
    ({"span_s": 3600, "mechanism": "sp"}, "per-sensor mechanism"),
    ({"span_s": 3600, "mechanism": "krr"}, "per-sensor mechanism"),
    ({"span_s": 300, "max_passages": 11}, "at most one station per epoch"),
    ({"max_passages": 0}, "greater than or equal"),
])
def test_impossible_spans_are_refused_with_why(kw: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        _query(**kw)


def test_a_query_may_fix_its_release() -> None:
    assert _query().release is None
    assert _query(release="aggregate").release == "aggregate"
    with pytest.raises(ValidationError, match="aggregate"):
        _query(release="counts")
