"""`ptt subscribe`: table rows, JSON lines and filters (the Kafka reading is mocked out here;
tests/integration/test_report_cli.py runs the real command against a broker)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from schemas.estimates import Estimate, EstimateBound
from schemas.settings import KafkaSettings
from stream_app import subscribe as sub


def _est(station: int, estimator: str = "sp_difference", withheld: str | None = None) -> Estimate:
    return Estimate(query_id="sp-day", query_version=1, mechanism="sp", estimator=estimator,  # type: ignore[arg-type]
                    epoch=59832960, epoch_start=datetime(2026, 11, 18, 8, tzinfo=UTC), station=station,
                    estimate=None if withheld else 41.7, sd=None if withheld else 6.9,
                    bounds=() if withheld else (EstimateBound(confidence=0.95, lower=30.1, upper=55.2),
                                                EstimateBound(confidence=0.99, lower=27.0, upper=60.3)),
                    reports=1876, participants=938, epsilon=2.7, withheld=withheld, closed_by="markers",
                    round_count_mismatch=0, late=0, refused=0, missing_batches=0)


def test_row_format() -> None:
    row = sub.format_row(_est(712377))
    assert "sp-day" in row and "712377" in row and "41.7" in row and "[30.1, 55.2]" in row and "938" in row
    assert "withheld: too few" in sub.format_row(_est(712377, withheld="too few"))


def test_filters_and_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [_est(0).model_dump_json().encode(), _est(5).model_dump_json().encode(),
               _est(5, "rr").model_dump_json().encode(), b"not json"]

    def fake(*_: object, **__: object) -> Iterator[bytes]:
        yield from records

    monkeypatch.setattr(sub, "_records", fake)
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", json_lines=True, station=0, out=out) == 1
    assert Estimate.model_validate_json(out.getvalue().strip()).station == 0
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", station=5, estimator="rr", out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == sub.HEADER and " rr " in lines[1]
