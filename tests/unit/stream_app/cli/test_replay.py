"""``ptt replay``'s summary lines (``stream_app.cli.replay.replay_summary_lines``): the fleet line
says what sized the fleet, and span queries' reports, skipped spans and dropped passages are
named."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from producers.replay import ReplaySummary
from stream_app.cli.replay import replay_summary_lines


def test_the_fleet_line_says_what_sized_the_fleet_and_spans_are_counted() -> None:
    s = ReplaySummary(epochs=27, reports=10, records=2, reports_sent=10, records_sent=2, fleet_size=1_931,
                      fleet_basis="the largest 300-s span flow of a station with room for 1 producer(s): 1,931",
                      data_quality="ok", elapsed_s=3.0, spans_sent=Counter({"flow-5min": 2}),
                      spans_skipped=Counter({"flow-5min": 1, "flow-hour": 1}),
                      span_skip_reasons={"flow-5min": "x", "flow-hour": "the replay did not cover the span from its "
                                                                        "first epoch"},
                      passages_dropped=Counter({"flow-5min": 812}))
    lines = replay_summary_lines(s)
    assert lines[1] == ("fleet: 1,931 vehicles (at least the largest 300-s span flow of a station with room for 1 "
                        "producer(s): 1,931); replayed 27 epochs, 10 reports in 2 records in 3.0s")
    assert ("spans: 2 of flow-5min reported, 1 not (covered only in part), 812 passages over the query's cap "
            "dropped") in lines
    assert ("spans: none of flow-hour reported (1 covered only in part: the replay did not cover the span from "
            "its first epoch)") in lines
    plain = replay_summary_lines(ReplaySummary(fleet_size=5, data_quality="ok"))
    assert plain[1].startswith("fleet: 5 vehicles; replayed") and len(plain) == 2


def test_a_day_caps_drops_are_named_by_their_largest_station_span_and_file(tmp_path: Path) -> None:
    """The day cap's line: how many station-spans lost passages, the largest (its station and its
    span's local start), where every one is (``--cap-drops-file``); and the file's lines."""
    from schemas.cap_drops import cap_drop_lines

    drops = {"unary-hour": {59004960: {400001: 3, 400002: 9}, 59005080: {400001: 9}}}
    s = ReplaySummary(fleet_size=5, data_quality="ok", day_cap_drops=drops)
    (line,) = [ln for ln in replay_summary_lines(s, tmp_path / "d.csv") if ln.startswith("day cap")]
    assert line == ("day cap of unary-hour (a simulation diagnostic, not published): passages dropped in 3 "
                    f"station-spans, the most 9 at station 400002 in the span from 12:00; every station and span: "
                    f"{tmp_path / 'd.csv'}")
    assert cap_drop_lines(drops)[1:] == ["unary-hour,59004960,2026-02-03T12:00:00-08:00,400001,3",
                                         "unary-hour,59004960,2026-02-03T12:00:00-08:00,400002,9",
                                         "unary-hour,59005080,2026-02-03T13:00:00-08:00,400001,9"]
