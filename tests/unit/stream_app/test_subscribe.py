"""`ptt subscribe`: table rows, JSON lines and filters (the Kafka reading is mocked out here;
tests/integration/test_report_cli.py runs the real command against a broker)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

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
    assert row.endswith(" 2.70        -")  # no shuffled epsilon: not attested
    shuffled = _est(712377).model_copy(update={"epsilon_shuffled": 0.4321})
    assert sub.format_row(shuffled).endswith(" 2.70    0.432")
    hour = _est(712377).model_copy(update={"span_s": 3600})
    assert sub.format_row(hour).endswith("  sum over 60 min") and "sum over" not in row  # a rollup says so


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


def _frames() -> list[bytes]:
    """Three frames (one withheld) of a 16-station ALP query, built as tests/unit/stream_app/test_frames.py does."""
    from stream_app.frames import encode_frame
    from tests.unit.stream_app.test_frames import make_query, make_result

    q = make_query(16)
    return [encode_frame(make_result(q, seed=1)), encode_frame(make_result(q, seed=2)),
            encode_frame(make_result(q, withheld="interrupted", withheld_code="interrupted"))]


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_keep_frames_writes_the_long_form_and_skips_what_is_not_a_frame(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stream_app.frames import decode_frame, long_table

    frames = _frames()
    monkeypatch.setattr(sub, "_records", lambda *_, **__: iter([frames[0], b"not a frame", *frames[1:]]))
    path, out = tmp_path / f"day.{kind}", io.StringIO()
    kept, rows = sub.keep_frames(KafkaSettings(), "t", path, kind, out=out, group_rows=100)  # type: ignore[arg-type]
    assert (kept, rows) == (3, 3 * 16 * 4)
    assert out.getvalue() == f"wrote 192 estimates from 3 frames to {path} (1 record(s) that are not estimate " \
                             "frames skipped)\n"
    table = pq.read_table(path) if kind == "parquet" else pa.ipc.open_file(path).read_all()
    assert table.to_pylist() == pa.concat_tables([long_table(decode_frame(f)) for f in frames]).to_pylist()
    assert table.schema.remove_metadata() == long_table(decode_frame(frames[0])).schema


def test_keep_frames_filters_and_leaves_a_readable_file_on_ctrl_c(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    frames = _frames()

    def interrupted(*_: object, **__: object) -> Iterator[bytes]:
        yield frames[0]
        raise KeyboardInterrupt

    monkeypatch.setattr(sub, "_records", interrupted)
    path = tmp_path / "cut.parquet"
    with pytest.raises(KeyboardInterrupt):
        sub.keep_frames(KafkaSettings(), "t", path, "parquet", station=400_007, estimator="alp_gls", out=io.StringIO())
    rows = pq.read_table(path).to_pylist()
    assert [(r["station"], r["estimator"]) for r in rows] == [(400_007, "alp_gls")]
