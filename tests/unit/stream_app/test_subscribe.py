"""`ptt subscribe`: table rows, JSON lines and filters (the Kafka reading is mocked out here;
tests/integration/test_report_cli.py runs the real command against a broker)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from estimators import SP_CAVEAT
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
    assert sub.format_row(hour).endswith("  60-min sum") and "min sum" not in row  # a rollup says so


def test_filters_and_json_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [_est(0).model_dump_json().encode(), _est(5).model_dump_json().encode(),
               _est(5, "rr").model_dump_json().encode(), b"not json"]

    def fake(*_: object, **__: object) -> Iterator[bytes]:
        yield from records

    monkeypatch.setattr(sub, "_polled", fake)
    monkeypatch.setattr(sub, "_query_sizes", lambda *_: (lambda e: 1, lambda: None))
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", json_lines=True, station=0, out=out) == 1
    assert Estimate.model_validate_json(out.getvalue().strip()).station == 0
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", rows=True, station=5, estimator="rr", out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == sub.HEADER and sub.NEGATIVE_NOTE in " ".join(lines[1:3]) and " rr " in lines[-1]
    caveat = next(i for i, x in enumerate(lines) if x.startswith(f"({SP_CAVEAT[:20]}"))
    assert sub.EPS_NOTE in " ".join(lines[1:caveat])  # the eps columns: per report, never a rollup's own
    assert f"({SP_CAVEAT})" == " ".join(x for x in lines[caveat:] if not x.startswith("2026"))  # Sampling Privacy's


def _q(station: int, epoch: int, query: str = "sp-day", estimate: float = 41.7, estimator: str = "sp_difference",
       **kw: object) -> Estimate:
    return _est(station, estimator).model_copy(update={"query_id": query, "epoch": 59832960 + epoch,
                                                       "epoch_start": datetime(2026, 11, 18, 8, tzinfo=UTC)
                                                       + timedelta(seconds=30 * epoch),
                                                       "estimate": estimate, **kw})


def test_the_default_table_is_one_ordered_line_per_closed_query_and_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of two queries and two epochs, interleaved as partitions deliver them: one line per
    (query, epoch) once all its estimates came, each estimator's sum, negatives counted; a
    group still incomplete when the topic goes quiet is printed at the end, marked partial."""
    arriving = [_q(1, 1, "rr-day", -12.4, "rr"), _q(1, 0), _q(2, 1, "rr-day", 3.0, "rr"), _q(2, 0, estimate=8.3),
                _q(1, 1), _q(3, 0, estimate=-1.0, data_quality="no_source_data"), _q(1, 2)]
    records = [e.model_dump_json().encode() for e in arriving]
    monkeypatch.setattr(sub, "_polled", lambda *_, **__: iter(records))
    monkeypatch.setattr(sub, "_query_sizes", lambda *_: (lambda e: 3 if e.query_id == "sp-day" else 2, lambda: None))
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", out=out) == len(arriving)
    header, *rest = out.getvalue().splitlines()
    key = " ".join(line for line in rest if not line.startswith("2026"))
    lines = [line for line in rest if line.startswith("2026")]
    assert header == sub.SUMMARY_HEADER and sub.NEGATIVE_NOTE in key and sub.SUMMARY_KEY in key and "--rows" in key
    # Sampling Privacy's caveat: once, after the key and before its estimates
    assert key.count(SP_CAVEAT) == 1 and key.index("(Sampling Privacy") > key.index("--rows")
    assert all(len(x) <= sub.WIDTH for x in [header, *rest])
    assert len(lines) == 4  # oldest epoch first (all came at once, faster than the 1 s hold)
    assert "sp-day v1" in lines[0] and "08:00:00" in lines[0]
    assert lines[0].split()[-4:] == ["sp_difference", "49.0", "1", "1"]  # sum, below 0, stations without data
    assert "rr-day v1" in lines[1] and lines[1].split()[-4:] == ["rr", "-9.4", "1", "0"]
    for line, start in zip(lines[2:], ("08:00:30", "08:01:00"), strict=True):  # never completed: at the end
        assert start in line and line.endswith("sp_difference         41.7    0    0 partial 1/3")
    withheld = sub.format_summary([_est(1, withheld="too few")])
    assert withheld.endswith("withheld: too few")


def test_epoch_groups_print_what_went_quiet_oldest_first() -> None:
    groups = sub.EpochGroups(lambda e: None, idle_s=2.0)
    assert groups.add(_q(1, 5), now=0.0) == [] and groups.add(_q(1, 4), now=1.0) == []
    assert groups.due(now=2.5) == []  # epoch 5 went quiet, but waits for epoch 4 (a row at 1.0)
    assert groups.due(now=3.0) == [[_q(1, 4)], [_q(1, 5)]]
    complete = sub.EpochGroups(lambda e: 1, hold_s=1.0)  # complete, then held 1 s for an older epoch
    assert complete.add(_q(1, 5, "a"), now=0.0) == [] and complete.add(_q(1, 4, "b"), now=0.2) == []
    assert complete.add(_q(1, 4, "a"), now=0.5) == [] and complete.due(now=1.1) == []  # a5 waits for a4
    assert complete.due(now=1.5) == [[_q(1, 4, "a")], [_q(1, 4, "b")], [_q(1, 5, "a")]]  # a4 came late: in order
    groups.add(_q(1, 6), now=0.0)
    groups.add(_q(1, 6, estimate=1.0), now=0.1)  # a repeated estimate replaces the earlier one
    assert groups.rest() == [[_q(1, 6, estimate=1.0)]]


def test_a_rollup_is_its_own_marked_line_after_the_epochs_it_sums() -> None:
    """A 5-minute rollup has the epoch of its first epoch: it must neither replace that epoch's
    rows nor come out before the last epoch it sums."""
    groups = sub.EpochGroups(lambda e: 2 if e.epoch == 59832969 else 1, hold_s=0.0)  # epoch 9: two rows
    rollup, other = _q(1, 0, estimate=417.0, span_s=300), _q(1, 9, estimator="rr")
    assert groups.add(_q(1, 0), now=0.0) == [[_q(1, 0)]]
    assert groups.add(other, now=0.1) == []  # epoch 9 open: one of its two rows came
    assert groups.add(rollup, now=0.2) == [] and groups.due(now=0.3) == []  # waits for epoch 9
    assert groups.add(_q(1, 9), now=0.4) == [[other, _q(1, 9)], [rollup]]  # epoch 9, then the rollup
    line = sub.format_summary([rollup], 1)
    assert line.endswith("sp_difference        417.0    0    0 5-min sum") and "08:00:00" in line
    assert "min sum" not in sub.format_summary([_q(1, 0)], 1)
    # a span query's row is its own span's report, not a sum
    assert sub.format_summary([rollup], 1, rollup=False).endswith("sp_difference        417.0    0    0 5-min span")
    assert sub.format_row(rollup, rollup=False).endswith("  5-min span")


def test_the_default_table_tells_a_span_query_from_a_rollup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query seen with 30-s rows has rollups ('N-min sum'); one whose shortest span is an hour is a
    span query ('N-min span')."""
    arriving = [_q(1, 0), _q(1, 0, estimate=417.0, span_s=300), _q(1, 0, "unary-hour", 900.0, span_s=3600)]
    monkeypatch.setattr(sub, "_polled", lambda *_, **__: iter([e.model_dump_json().encode() for e in arriving]))
    monkeypatch.setattr(sub, "_query_sizes", lambda *_: ((lambda e: 1), lambda: None))
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", out=out) == 3
    lines = out.getvalue().splitlines()
    assert [x.rsplit(" 0 ", 1)[-1] for x in lines if "min sum" in x or "min span" in x] == [
        "5-min sum", "60-min span"], lines


def test_the_flows_view_is_one_line_per_flow_within_120_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--flows``: the rollups and span-query rows only (no 30-s epoch), the headline estimator's
    unless one is named, one line per (query, span, epoch) row ordered by station after a line
    naming the group (its estimator, what it is), each at most 120 characters whatever the query
    id, estimator, figures or withheld reason; a rollup (its query has 30-s rows) is told from a
    span query's row; no flow printed for a sum with no source. (The order of the groups, span
    queries' first: tests/unit/stream_app/test_subscribe_order.py.)"""
    long_q = "a-very-long-query-name-for-hourly-flows"
    arriving = [
        _q(2, 0, "sp-day"), _q(1, 0, "sp-day"),  # epochs: not flows
        _q(2, 0, "sp-day", 417.25, span_s=300), _q(1, 0, "sp-day", -12345678.9, span_s=300),
        _q(1, 0, "sp-day", 9.0, span_s=300).model_copy(update={"station": 3, "data_quality": "no_source_data"}),
        _q(1, 0, "alp-day", 700.0, "alp_average", mechanism="alp", span_s=3600),
        _q(1, 0, "alp-day", 650.0, "alp_gls", mechanism="alp", span_s=3600),  # not the headline
        _q(1, 0, long_q, 1234.5, "unary", mechanism="unary", span_s=3600),  # a span query: no 30-s rows
        _q(2, 0, long_q, None, "unary", mechanism="unary", span_s=3600, sd=None, bounds=(),
           withheld="epoch 59832960 withheld (and 119 more of its epochs): conflicting_markers: " + "x" * 200),
    ]
    records = [e.model_dump_json().encode() for e in arriving]
    monkeypatch.setattr(sub, "_polled", lambda *_, **__: iter(records))
    sizes: list[tuple[object, ...]] = []

    def query_book(*args: object) -> sub.QueryBook:
        sizes.append(args)
        return sub.QueryBook(lambda e: {"sp-day": 3, "alp-day": 1}.get(e.query_id, 2), lambda: ())

    monkeypatch.setattr(sub, "_query_book", query_book)
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", flows=True, out=out) == 6
    assert sizes[0][1:] == (None, None)  # expected rows: the headline estimator's only (the default)
    text = out.getvalue()
    assert text.startswith(f"{sub.FLOWS_HEADER}\n{sub.FLOWS_NOTE}\n")
    assert all(len(x) <= sub.WIDTH for x in text.splitlines()), [len(x) for x in text.splitlines()]
    lines = [x for x in text.splitlines() if x.startswith("2026")]
    labels = [x for x in text.splitlines() if x.startswith("-- ")]
    assert len(lines) == 6 and not any("alp_gls" in x for x in text.splitlines())
    assert len(labels) == 3 and "sp-day v1 sp_difference: 5-minute rollups of a 30-s query (each sums 10 epochs" in \
        labels[[x.split()[1] for x in labels].index("sp-day")]
    cols = [x[26:].split() for x in lines]
    sp = [c for c in cols if c[0] == "sp-day"]
    assert [c[1:5] for c in sp] == [["rollup", "5", "min", "1"], ["rollup", "5", "min", "2"],
                                    ["rollup", "5", "min", "3"]]  # by station
    assert sp[0][5:] == ["-12345678.9", "[30.1,", "55.2]", "6.9", "NOISE-DOMINATED"] and sp[1][5:] == [
        "417.2", "[30.1,", "55.2]", "6.9"]  # an sd of at least half the flow says so
    assert lines[[c[0] for c in cols].index("sp-day") + 2].endswith("no source data: not a flow")
    (alp,) = [c for c in cols if c[0] == "alp-day"]
    assert alp[1:4] == ["span", "1", "h"]  # no 30-s row of alp-day came: its own span
    spans = [x for x in lines if "a-very-long-q\u2026" in x]
    assert [x[26:].split()[1] for x in spans] == ["span", "span"] and "\u2026" in spans[0]
    assert spans[1].endswith("withheld: conflicting_markers")
    gls = io.StringIO()
    monkeypatch.setattr(sub, "_polled", lambda *_, **__: iter(records))
    assert sub.subscribe(KafkaSettings(), "t", flows=True, estimator="alp_gls", out=gls) == 1
    (label,) = [x for x in gls.getvalue().splitlines() if x.startswith("-- ")]
    assert label.startswith("-- alp-day v1 alp_gls: hourly flows of a span query")


def _frames() -> list[bytes]:
    """Three frames (one withheld) of a 16-station ALP query, built as
    tests/unit/stream_app/worker/test_frames.py does."""
    from stream_app.worker.frames import encode_frame
    from tests.unit.stream_app.worker.test_frames import make_query, make_result

    q = make_query(16)
    return [encode_frame(make_result(q, seed=1)), encode_frame(make_result(q, seed=2)),
            encode_frame(make_result(q, withheld="interrupted", withheld_code="interrupted"))]


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_keep_frames_writes_the_long_form_and_skips_what_is_not_a_frame(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stream_app.worker.frames import decode_frame, long_table

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


def test_the_default_table_fits_120_columns_at_the_papers_scale() -> None:
    """3,220 stations, 10,047,719 participants, four ALP estimators with sums in the millions
    (negative too), stations without data, an hourly rollup: every line within 120 columns,
    the header and its key too, and none cut short; one line per estimator."""
    from datetime import UTC, datetime

    def est(station: int, estimator: str, value: float) -> Estimate:
        return Estimate(query_id="unary-day", query_version=12, mechanism="alp", estimator=estimator,  # type: ignore[arg-type]
                        epoch=59832960, epoch_start=datetime(2026, 11, 18, 8, tzinfo=UTC), station=station,
                        estimate=value, sd=900.0, bounds=(), reports=10_047_719, participants=10_047_719,
                        epsilon=1234.56, epsilon_shuffled=123.456, closed_by="markers", round_count_mismatch=0,
                        late=0, refused=0, missing_batches=0, span_s=3600,
                        data_quality="no_source_data" if station % 7 == 0 else "ok")

    names = ("alp_average", "alp_bottom", "alp_gls", "sp_difference")
    rows = [est(s, n, -3_000.5 if s % 2 else 2_900.25) for n in names for s in range(3220)]
    lines = sub.format_summary(rows, len(rows)).splitlines()
    assert len(lines) == len(names)
    for line in [*lines, sub.SUMMARY_HEADER]:
        assert len(line) <= sub.WIDTH and "\u2026" not in line, (len(line), line)
    assert lines[0].split()[-6:] == ["alp_average", "-161,402.5", "1610", "460", "60-min", "sum"]
    partial = sub.format_summary(rows[:100], len(rows)).splitlines()[0]
    assert len(partial) <= sub.WIDTH and partial.endswith("\u2026"), partial  # two notes at once: cut, marked
