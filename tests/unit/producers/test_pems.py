"""PeMS readers on small files written here in the real formats (``PEMS_FORMAT.md``).

Station Raw (30 s), Station 5-Minute and station metadata, gzip and plain. Every expected
epoch is computed independently of the reader (``calendar.timegm`` and the fixed Pacific
offsets: PST = UTC-8, PDT = UTC-7), every expected flow by hand. Every file checks the
accounting invariant: each row read is used or skipped with a reason
(``rows_read == rows_used + rows_skipped``), and the skipped reasons are counted exactly.

No statistics here: every assertion is deterministic.
"""

from __future__ import annotations

import bz2
import calendar
import gzip
import lzma
import os
import zipfile
from collections import Counter
from datetime import date
from pathlib import Path

import numpy as np
import pytest

from producers import pems
from producers.pems import (
    CELL_DEAD,
    CELL_MISSING,
    CELL_OUT_OF_RANGE_LANE,
    CELL_SPIKE_LANE,
    CELL_STUCK_LANE,
    EPOCH_S,
    QualityReport,
    TrafficDay,
    day_epochs,
    epoch_of,
    epoch_start,
    load_cached,
    read_bytes,
    read_metadata,
    read_station_5min,
    read_station_raw,
)

PST, PDT = -8, -7  # UTC offsets in hours

# The two example lines of PEMS_FORMAT.md, verbatim.
DOC_LINE_1 = "01/23/2012 00:00:21,500001,0,1,0,0,1,0,1,.0078,46,,,,,,,,,,,,,,,"
DOC_LINE_2 = "01/23/2012 00:00:21,500004,2,.0106,65,1,.0106,60,,,,,,,,,,,,,,,,,,"

Lane = tuple[str, str, str]


# ---------------------------------------------------------------------------------------
# Helpers: write files in the real formats
# ---------------------------------------------------------------------------------------
def utc_epoch(stamp: str, offset_h: int) -> int:
    """Epoch of a ``MM/DD/YYYY HH:MM:SS`` local stamp at a known UTC offset, computed
    without the reader's code: (Unix seconds) // 30."""
    date_part, time_part = stamp.split()
    mo, d, y = (int(x) for x in date_part.split("/"))
    h, mi, s = (int(x) for x in time_part.split(":"))
    return (calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) - offset_h * 3600) // EPOCH_S


def raw_line(stamp: str, station: int | str, lanes: list[Lane]) -> str:
    """A 26-field Station Raw line: timestamp, station, 8 x (flow, occupancy, speed)."""
    cells: list[str] = []
    for k in range(8):
        cells += list(lanes[k]) if k < len(lanes) else ["", "", ""]
    return f"{stamp},{station}," + ",".join(cells)


def five_min_line(stamp: str, station: int | str, total: str, lane_flows: list[str],
                  district: str = "7", fwy: str = "5", direction: str = "N", lane_type: str = "ML",
                  occ: str = ".0456") -> str:
    """A Station 5-Minute line: 12 fixed columns, then (Samples, Flow, Avg Occ, Avg Speed,
    Observed) per lane."""
    fixed = [stamp, str(station), district, fwy, direction, lane_type, ".43", "80", "100", total, occ, "64.2"]
    lanes: list[str] = []
    for f in lane_flows:
        lanes += ["10", f, occ, "63.9", "1"]
    return ",".join(fixed + lanes)


def write_text(path: Path, lines: list[str], gz: bool) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    if gz:
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)
    return path


def accounted(q: QualityReport) -> None:
    """Every row read is either used or skipped with a reason."""
    assert q.rows_read == q.rows_used + q.rows_skipped
    assert all(n > 0 for n in q.skipped.values())


def flow_of(day: TrafficDay, station: int, epoch: int) -> int:
    j = int(np.flatnonzero(day.stations == station)[0])
    i = int(epoch - day.epochs[0])
    assert 0 <= i < day.epochs.size
    return int(day.flows[i, j])


# ---------------------------------------------------------------------------------------
# Station Raw: format, binning, time zone
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_doc_example_lines_parse(tmp_path: Path, gz: bool) -> None:
    name = "d07_text_station_raw_2012_01_23.txt" + (".gz" if gz else "")
    day = read_station_raw(write_text(tmp_path / name, [DOC_LINE_1, DOC_LINE_2], gz))
    e = utc_epoch("01/23/2012 00:00:00", PST)
    assert day.stations.tolist() == [500001, 500004]
    assert day.epochs.tolist() == [e]
    # 500001: lanes 1-2 are stuck (0 / 1 / 0), lane 3 counted 1 vehicle; 500004: 2 + 1
    assert day.flows.tolist() == [[1, 3]]
    q = day.quality
    assert (q.rows_read, q.rows_used, q.rows_skipped) == (2, 2, 0)
    assert q.lanes_flagged == Counter({"stuck": 2})
    accounted(q)


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    """A gzip file without the .gz suffix (and a plain one with it) read the same."""
    lines = [DOC_LINE_1, DOC_LINE_2]
    a = read_station_raw(write_text(tmp_path / "looks_plain.txt", lines, gz=True))
    b = read_station_raw(write_text(tmp_path / "looks_gzipped.txt.gz", lines, gz=False))
    for day in (a, b):
        assert day.flows.tolist() == [[1, 3]]
        assert day.stations.tolist() == [500001, 500004]


def test_off_mark_timestamps_bin_to_their_30s_epoch(tmp_path: Path) -> None:
    """Readings at hh:mm:21 and hh:mm:51 (and :29/:30/:59) belong to the 30-s interval
    containing them: epoch = Unix seconds // 30."""
    def lane(f: int) -> list[Lane]:
        return [(str(f), ".05", "60")]

    lines = [
        raw_line("01/23/2012 08:00:21", 1, lane(1)),
        raw_line("01/23/2012 08:00:51", 1, lane(2)),
        raw_line("01/23/2012 08:01:21", 1, lane(3)),
        raw_line("01/23/2012 08:00:00", 2, lane(4)),
        raw_line("01/23/2012 08:00:30", 2, lane(6)),  # exactly on the next mark
        raw_line("01/23/2012 08:01:29", 2, lane(7)),  # last second of the third interval
        raw_line("01/23/2012 08:00:29", 3, lane(8)),
        raw_line("01/23/2012 08:00:59", 3, lane(9)),
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    e0 = utc_epoch("01/23/2012 08:00:00", PST)
    assert day.epochs.tolist() == [e0, e0 + 1, e0 + 2]
    assert day.stations.tolist() == [1, 2, 3]
    assert day.flows.tolist() == [[1, 4, 8], [2, 6, 9], [3, 7, 0]]
    assert day.quality.rows_used == 8 and not day.quality.skipped


@pytest.mark.parametrize(("stamp", "offset"), [
    ("01/23/2012 00:00:21", PST),  # winter: PST
    ("07/04/2012 12:34:51", PDT),  # summer: PDT
    ("12/31/2012 23:59:59", PST),
])
def test_epoch_is_unix_seconds_div_30_in_pacific_time(tmp_path: Path, stamp: str, offset: int) -> None:
    day = read_station_raw(write_text(tmp_path / "raw.txt", [raw_line(stamp, 9, [("5", ".1", "55")])], gz=False))
    assert day.epochs.tolist() == [utc_epoch(stamp, offset)]
    # epoch_start gives back the aware start of that interval, in Pacific time
    start = epoch_start(int(day.epochs[0]))
    assert start.utcoffset() is not None
    assert int(start.timestamp()) == utc_epoch(stamp, offset) * EPOCH_S
    assert epoch_of(start) == int(day.epochs[0])


def test_dst_spring_forward_day_has_no_gap(tmp_path: Path) -> None:
    """2012-03-11: local clocks jump 02:00 PST -> 03:00 PDT. The readings at 01:59:30 PST and
    03:00:00 PDT are consecutive 30-s epochs (no hour of zeros is invented)."""
    lines = [
        raw_line("03/11/2012 01:59:30", 7, [("3", ".1", "60")]),
        raw_line("03/11/2012 03:00:21", 7, [("4", ".1", "60")]),
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    e = utc_epoch("03/11/2012 01:59:30", PST)
    assert e + 1 == utc_epoch("03/11/2012 03:00:00", PDT)
    assert day.epochs.tolist() == [e, e + 1]
    assert day.flows[:, 0].tolist() == [3, 4]


def test_dst_fall_back_day_repeated_hour(tmp_path: Path) -> None:
    """2012-11-04: 01:00-02:00 happens twice (PDT, then PST) and the text carries no offset.

    The first reading of an ambiguous stamp is its first occurrence (PDT); a second reading
    of the same station at the same stamp is the repeated hour (PST) and lands there -- no
    reading dropped, no hour of zeros. A third reading would be a true duplicate.
    """
    lines = [
        raw_line("11/04/2012 00:59:30", 8, [("1", ".1", "60")]),  # PDT
        raw_line("11/04/2012 01:00:00", 8, [("2", ".1", "60")]),  # first 01:00, PDT
        raw_line("11/04/2012 01:00:00", 8, [("3", ".1", "60")]),  # second 01:00, really PST
        raw_line("11/04/2012 02:00:00", 8, [("4", ".1", "60")]),  # PST
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    first = utc_epoch("11/04/2012 00:59:30", PDT)
    last = utc_epoch("11/04/2012 02:00:00", PST)
    assert last - first == 2 * 120 + 1  # two real hours and one interval
    assert day.epochs.tolist() == list(range(first, last + 1))  # consecutive
    assert flow_of(day, 8, first) == 1
    assert flow_of(day, 8, utc_epoch("11/04/2012 01:00:00", PDT)) == 2
    assert flow_of(day, 8, utc_epoch("11/04/2012 01:00:00", PST)) == 3
    assert flow_of(day, 8, last) == 4
    assert day.flows.sum() == 1 + 2 + 3 + 4
    assert day.quality.skipped == Counter()
    accounted(day.quality)
    third = [*lines[:3], raw_line("11/04/2012 01:00:00", 8, [("5", ".1", "60")]), lines[3]]
    day3 = read_station_raw(write_text(tmp_path / "raw3.txt", third, gz=False))
    assert day3.quality.skipped == Counter({"duplicate_epoch": 1})
    assert day3.flows.sum() == 1 + 2 + 3 + 4


# ---------------------------------------------------------------------------------------
# Station Raw: lanes, empty rows, malformed rows, detector glitches
# ---------------------------------------------------------------------------------------
def test_missing_lanes_single_loops_and_empty_occupancy(tmp_path: Path) -> None:
    lines = [
        # 2 lanes, the other 6 absent (empty fields)
        raw_line("01/23/2012 10:00:05", 11, [("7", ".06", "61"), ("5", ".04", "63")]),
        # single-loop detector: no speed on any lane
        raw_line("01/23/2012 10:00:05", 12, [("9", ".08", ""), ("4", ".03", ""), ("6", ".05", "")]),
        # occupancy and speed both unmeasured
        raw_line("01/23/2012 10:00:05", 13, [("3", "", "")]),
        # a lane in the middle is absent, lanes around it present
        raw_line("01/23/2012 10:00:05", 14, [("2", ".02", "60"), ("", "", ""), ("8", ".07", "58")]),
        # eight lanes
        raw_line("01/23/2012 10:00:05", 15, [(str(k), ".01", "65") for k in range(1, 9)]),
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=True))
    assert day.stations.tolist() == [11, 12, 13, 14, 15]
    assert day.flows.tolist() == [[12, 19, 3, 10, 36]]
    assert not day.quality.lanes_flagged
    assert (day.quality.rows_used, day.quality.rows_skipped) == (5, 0)


def test_empty_rows_are_skipped_and_counted(tmp_path: Path) -> None:
    lines = [
        raw_line("01/23/2012 10:00:05", 21, [("7", ".06", "61")]),
        raw_line("01/23/2012 10:00:05", 22, []),  # 26 fields, all empty after the station
        "01/23/2012 10:00:35,22",  # nothing after the station id at all
        raw_line("01/23/2012 10:00:35", 21, [("", ".06", "61")]),  # occupancy without flow: no lane
        "",  # a blank line
        raw_line("01/23/2012 10:01:05", 21, [("2", ".01", "66")]),
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    q = day.quality
    assert q.rows_read == 6
    assert q.rows_used == 2
    assert q.skipped == Counter({"empty_row": 3, "blank_line": 1})
    accounted(q)
    # an empty row is not a reading: station 22 never reported, so it is not in the day
    assert day.stations.tolist() == [21]
    assert day.flows[:, 0].tolist() == [7, 0, 2]


@pytest.mark.parametrize(("line", "reason"), [
    (raw_line("2012-01-23 10:00:05", 31, [("1", ".1", "60")]), "bad_timestamp"),
    (raw_line("01/23/2012 25:00:05", 31, [("1", ".1", "60")]), "bad_timestamp"),
    (raw_line("13/23/2012 10:00:05", 31, [("1", ".1", "60")]), "bad_timestamp"),
    (raw_line("01/23/2012", 31, [("1", ".1", "60")]), "bad_timestamp"),
    (raw_line("", 31, [("1", ".1", "60")]), "bad_timestamp"),
    (raw_line("01/23/2012 10:00:05", "S31", [("1", ".1", "60")]), "bad_station_id"),
    (raw_line("01/23/2012 10:00:05", "", [("1", ".1", "60")]), "bad_station_id"),
    (raw_line("01/23/2012 10:00:05", "31.5", [("1", ".1", "60")]), "bad_station_id"),
    (raw_line("01/23/2012 10:00:05", 31, [("x", ".1", "60")]), "bad_number"),
    (raw_line("01/23/2012 10:00:05", 31, [("1", "1..2", "60")]), "bad_number"),
    (raw_line("01/23/2012 10:00:05", 31, [("1", ".1", "6O")]), "bad_number"),
    (raw_line("01/23/2012 10:00:05", 31, [("1", ".1", "60")]) + ",", "bad_field_count"),  # 27 fields
    ("01/23/2012 10:00:05", "bad_field_count"),
    ("\x00\x01garbage", "bad_field_count"),
])
def test_malformed_rows_are_skipped_with_a_reason(tmp_path: Path, line: str, reason: str) -> None:
    good = raw_line("01/23/2012 10:00:05", 30, [("4", ".1", "60")])
    day = read_station_raw(write_text(tmp_path / "raw.txt", [good, line, good.replace(":05", ":35")], gz=False))
    q = day.quality
    assert q.skipped == Counter({reason: 1})
    assert (q.rows_read, q.rows_used) == (3, 2)
    accounted(q)
    assert day.stations.tolist() == [30]
    assert day.flows[:, 0].tolist() == [4, 4]


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf", "1e400"])
def test_raw_nonfinite_flow_never_crashes(tmp_path: Path, bad: str) -> None:
    """``float()`` accepts "nan"/"inf"; a malformed number must be skipped or flagged, never
    crash the reader, and never enter the ground truth.

    BUG (nan): ``_raw_row`` does ``int(round(flow))`` on a NaN flow -> ValueError escapes
    ``read_station_raw``.
    """
    lines = [
        raw_line("01/23/2012 10:00:05", 41, [("4", ".1", "60")]),
        raw_line("01/23/2012 10:00:05", 42, [(bad, ".1", "60"), ("3", ".1", "60")]),
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    accounted(day.quality)
    assert day.quality.rows_read == 2
    assert flow_of(day, 41, int(day.epochs[0])) == 4
    if 42 in day.stations:  # the row was used: the bad lane is left out, the good one counted
        assert flow_of(day, 42, int(day.epochs[0])) == 3
        assert sum(day.quality.lanes_flagged.values()) == 1
    else:
        assert day.quality.rows_skipped == 1


def test_stuck_lanes_and_spikes_are_flagged_and_left_out(tmp_path: Path) -> None:
    t = "01/23/2012 10:00:05"
    lines = [
        raw_line(t, 51, [("0", "1", "0"), ("6", ".05", "62")]),  # stuck lane + good lane
        raw_line(t, 52, [("0", ".995", "0"), ("0", ".98", "0")]),  # stuck (>= .99); a plain zero
        raw_line(t, 53, [("60", ".30", "20"), ("5", ".05", "60")]),  # impossible spike: 60 in 30 s
        raw_line(t, 54, [("40", ".30", "40"), ("41", ".30", "40")]),  # 40 kept (limit), 41 flagged
        raw_line(t, 55, [("-3", ".1", "60"), ("2", "1.5", "60"), ("7", ".1", "60")]),  # out of range
        raw_line(t, 56, [("0", "1", "0"), ("0", "1", "0"), ("0", "1", "0")]),  # all stuck: used, 0
        raw_line(t, 57, [("2.6", ".05", "60"), ("1", ".02", "")]),  # fractional flow rounds
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert day.stations.tolist() == [51, 52, 53, 54, 55, 56, 57]
    # ground truth = flow summed over the usable lanes only
    assert day.flows.tolist() == [[6, 0, 5, 40, 7, 0, 4]]
    q = day.quality
    assert q.lanes_flagged == Counter({"stuck": 5, "spike": 2, "out_of_range": 2})
    assert (q.rows_read, q.rows_used, q.rows_skipped) == (7, 7, 0)


def test_spike_limit_is_a_parameter(tmp_path: Path) -> None:
    line = raw_line("01/23/2012 10:00:05", 58, [("25", ".2", "50"), ("10", ".1", "60")])
    path = write_text(tmp_path / "raw.txt", [line], gz=False)
    assert read_station_raw(path).flows.tolist() == [[35]]
    strict = read_station_raw(path, spike_per_lane=20)
    assert strict.flows.tolist() == [[10]]
    assert strict.quality.lanes_flagged == Counter({"spike": 1})


def test_duplicate_readings_in_one_epoch(tmp_path: Path) -> None:
    """A second reading of a station in the same 30-s interval is skipped (the first is
    kept); the duplicate's lane flags are not counted."""
    lines = [
        raw_line("01/23/2012 10:00:05", 61, [("4", ".1", "60")]),
        raw_line("01/23/2012 10:00:25", 61, [("9", ".1", "60"), ("0", "1", "0")]),  # same epoch
        raw_line("01/23/2012 10:00:05", 61, [("4", ".1", "60")]),  # an exact repeat
        raw_line("01/23/2012 10:00:05", 62, [("3", ".1", "60")]),  # other station: fine
        raw_line("01/23/2012 10:00:35", 61, [("5", ".1", "60")]),  # next epoch: fine
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert day.flows.tolist() == [[4, 3], [5, 0]]
    assert day.quality.skipped == Counter({"duplicate_epoch": 2})
    assert not day.quality.lanes_flagged
    accounted(day.quality)


def test_epochs_are_consecutive_and_gaps_are_missing(tmp_path: Path) -> None:
    base = utc_epoch("01/23/2012 10:00:00", PST)
    lines = [
        raw_line("01/23/2012 10:00:11", 71, [("3", ".1", "60")]),
        raw_line("01/23/2012 10:02:41", 71, [("8", ".1", "60")]),  # epoch base + 5
        raw_line("01/23/2012 10:01:01", 72, [("6", ".1", "60"), ("1", ".1", "60")]),  # base + 2
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert day.epochs.dtype == np.int64 and day.flows.dtype == np.int64
    assert day.epochs.tolist() == list(range(base, base + 6))
    assert day.flows.T.tolist() == [[3, 0, 0, 0, 0, 8], [0, 0, 7, 0, 0, 0]]  # 0 = a number, not truth
    assert day.has_truth.T.tolist() == [[True, False, False, False, False, True],
                                        [False, False, True, False, False, False]]
    assert day.peak_total() == 8
    assert (int(day.epochs[2]), day.flows[2].tolist()) == (base + 2, [0, 7])


def test_rows_in_any_order(tmp_path: Path) -> None:
    """Rows out of time order (files concatenated) give the same day."""
    lines = [raw_line(f"01/23/2012 10:0{m}:{s}", st, [(str(m + st % 10), ".1", "60")])
             for m in range(3) for s in ("09", "39") for st in (81, 82)]
    a = read_station_raw(write_text(tmp_path / "a.txt", lines, gz=False))
    b = read_station_raw(write_text(tmp_path / "b.txt", lines[::-1], gz=True))
    assert np.array_equal(a.flows, b.flows) and np.array_equal(a.epochs, b.epochs)
    assert np.array_equal(a.stations, b.stations)


def test_empty_file(tmp_path: Path) -> None:
    day = read_station_raw(write_text(tmp_path / "raw.txt.gz", [], gz=True))
    assert day.flows.shape == (0, 0) and day.epochs.size == 0 and day.stations.size == 0
    assert day.peak_total() == 0
    accounted(day.quality)


def test_quality_report_counts_a_mixed_file_exactly(tmp_path: Path) -> None:
    t0, t1 = "01/23/2012 10:00:21", "01/23/2012 10:00:51"
    lines = [
        DOC_LINE_1,                                         # used (2 stuck lanes)
        DOC_LINE_2,                                         # used
        raw_line(t0, 91, [("5", ".1", "60"), ("70", ".9", "5")]),  # used (1 spike)
        raw_line(t0, 92, []),                               # empty_row
        raw_line(t0, 91, [("1", ".1", "60")]),             # duplicate_epoch
        raw_line("bad", 93, [("1", ".1", "60")]),          # bad_timestamp
        raw_line(t1, "x93", [("1", ".1", "60")]),          # bad_station_id
        raw_line(t1, 93, [("?", ".1", "60")]),             # bad_number
        "only,three,fields" + "," * 30,                     # bad_field_count
        "",                                                 # blank_line
        raw_line(t1, 91, [("6", ".1", "60")]),             # used
    ]
    day = read_station_raw(write_text(tmp_path / "raw.txt.gz", lines, gz=True))
    q = day.quality
    assert q.rows_read == 11
    assert q.rows_used == 4
    assert q.skipped == Counter({"empty_row": 1, "duplicate_epoch": 1, "bad_timestamp": 1, "bad_station_id": 1,
                                 "bad_number": 1, "bad_field_count": 1, "blank_line": 1})
    assert q.rows_skipped == 7
    assert q.lanes_flagged == Counter({"stuck": 2, "spike": 1})
    accounted(q)
    s = q.summary()
    assert "11 rows read, 4 used, 7 skipped" in s and "empty_row=1" in s and "spike=1" in s


# ---------------------------------------------------------------------------------------
# Station 5-Minute
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_5min_total_flow_spread_over_ten_epochs(tmp_path: Path, gz: bool) -> None:
    lines = [
        five_min_line("01/23/2012 08:00:00", 500010, "123", ["30", "31", "32", "30"]),
        five_min_line("01/23/2012 08:05:00", 500010, "7", ["3", "4"]),
        five_min_line("01/23/2012 08:00:00", 500011, "40", []),  # no lane groups at all
        five_min_line("01/23/2012 08:05:00", 500011, "0", ["0"]),
    ]
    day = read_station_5min(write_text(tmp_path / "d07_text_station_5min_2012_01_23.txt", lines, gz))
    e0 = utc_epoch("01/23/2012 08:00:00", PST)
    assert day.epochs.tolist() == list(range(e0, e0 + 20))
    assert day.stations.tolist() == [500010, 500011]
    a, b = day.flows[:, 0], day.flows[:, 1]
    # integer split, the remainder to the first epochs; totals preserved
    assert a[:10].tolist() == [13, 13, 13] + [12] * 7
    assert a[10:].tolist() == [1] * 7 + [0] * 3
    assert b.tolist() == [4] * 10 + [0] * 10
    assert int(a[:10].sum()) == 123 and int(a[10:].sum()) == 7 and int(b.sum()) == 40
    assert (day.quality.rows_read, day.quality.rows_used) == (4, 4)
    accounted(day.quality)


def test_5min_lane_flow_fallback_when_total_is_empty(tmp_path: Path) -> None:
    lines = [
        five_min_line("01/23/2012 08:00:00", 500020, "", ["12", "", "9"]),  # 21 from the lanes
        five_min_line("01/23/2012 08:05:00", 500020, "", ["", ""]),  # nothing known: empty_row
        five_min_line("01/23/2012 08:10:00", 500020, "50", ["1", "1"]),  # total wins over lanes
        five_min_line("01/23/2012 08:15:00", 500020, "44.6", []),  # fractional total rounds
    ]
    day = read_station_5min(write_text(tmp_path / "five.txt", lines, gz=False))
    f = day.flows[:, 0]
    assert f[:10].tolist() == [3] + [2] * 9 and int(f[:10].sum()) == 21
    assert f[10:20].tolist() == [0] * 10  # the skipped interval: 0 as a number ...
    assert day.flags[10:20, 0].tolist() == [CELL_MISSING] * 10  # ... but missing, not truth
    assert int(f[20:30].sum()) == 50 and set(f[20:30].tolist()) == {5}
    assert int(f[30:40].sum()) == 45
    assert day.quality.skipped == Counter({"empty_row": 1})
    accounted(day.quality)


def test_5min_malformed_rows(tmp_path: Path) -> None:
    ok = five_min_line("01/23/2012 08:00:00", 500030, "20", ["10", "10"])
    lines = [
        ok,
        ok.replace(",20,", ",21,", 1),                       # duplicate_epoch (first kept)
        "01/23/2012 08:05:00,500030,7,5,N,ML",               # bad_field_count
        five_min_line("01/23/2012 8h05", 500030, "20", []),   # bad_timestamp_or_station
        five_min_line("01/23/2012 08:05:00", "S1", "20", []),  # bad_timestamp_or_station
        five_min_line("01/23/2012 08:05:00", 500030, "abc", []),  # bad_number
        five_min_line("01/23/2012 08:05:00", 500030, "", ["x"]),  # bad_number (lane fallback)
        five_min_line("01/23/2012 08:05:00", 500030, "-4", []),  # out_of_range
        "",                                                    # blank_line
        five_min_line("01/23/2012 08:05:00", 500030, "10", ["5", "5"]),  # used
    ]
    day = read_station_5min(write_text(tmp_path / "five.txt", lines, gz=True))
    q = day.quality
    assert q.rows_read == 10 and q.rows_used == 2
    assert q.skipped == Counter({"duplicate_epoch": 1, "bad_field_count": 1, "bad_timestamp_or_station": 2,
                                 "bad_number": 2, "out_of_range": 1, "blank_line": 1})
    accounted(q)
    assert day.flows[:, 0].tolist() == [2] * 10 + [1] * 10


@pytest.mark.parametrize("bad", ["nan", "inf", "1e400"])
def test_5min_nonfinite_total_never_crashes(tmp_path: Path, bad: str) -> None:
    """BUG: ``_five_min_row`` does ``int(round(total))`` on "nan" (ValueError) or "inf"
    (OverflowError); the exception escapes ``read_station_5min`` instead of the row being
    skipped with a reason (e.g. bad_number / out_of_range)."""
    lines = [
        five_min_line("01/23/2012 08:00:00", 500040, bad, ["1"]),
        five_min_line("01/23/2012 08:05:00", 500040, "10", ["10"]),
    ]
    day = read_station_5min(write_text(tmp_path / "five.txt", lines, gz=False))
    accounted(day.quality)
    assert day.quality.rows_read == 2 and day.quality.rows_used >= 1
    assert int(day.flows.sum()) in (10, 11)  # the bad total never enters the truth


# ---------------------------------------------------------------------------------------
# Station metadata
# ---------------------------------------------------------------------------------------
META_HEADER = ["ID", "Fwy", "Dir", "District", "County", "City", "State_PM", "Abs_PM", "Latitude", "Longitude",
               "Length", "Type", "Lanes", "Name", "User_ID_1", "User_ID_2", "User_ID_3", "User_ID_4"]


def meta_row(sid: str, state_pm: str = "23.7", lat: str = "34.05", lon: str = "-118.25", length: str = ".5",
             typ: str = "ML", lanes: str = "4", name: str = "Main St") -> str:
    return "\t".join([sid, "5", "N", "7", "37", "", state_pm, "23.714", lat, lon, length, typ, lanes, name,
                      "", "", "", ""])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_metadata_parses(tmp_path: Path, gz: bool) -> None:
    lines = [
        "\t".join(META_HEADER),
        meta_row("500001", state_pm="R23.7"),                    # State_PM with a letter prefix
        meta_row("500004", lat="", lon="", length="", lanes="", typ="OR", name="Ramp to I-5 N"),
        meta_row("500005", state_pm="M1.2", typ="HV", lanes="1"),
        meta_row("S5", typ="ML"),                                 # bad id
        "",                                                      # blank line
        "500006\t101\tS",                                        # short row: what is there is read
    ]
    meta, q = read_metadata(write_text(tmp_path / "d07_text_meta_2012_01_01.txt", lines, gz))
    assert sorted(meta) == [500001, 500004, 500005, 500006]
    a = meta[500001]
    assert (a.freeway, a.direction, a.district, a.lane_type, a.lanes, a.name) == ("5", "N", "7", "ML", 4, "Main St")
    assert a.latitude == pytest.approx(34.05) and a.longitude == pytest.approx(-118.25)
    assert a.abs_postmile == pytest.approx(23.714)  # Abs_PM, not State_PM (R23.7)
    b = meta[500004]
    assert b.latitude is None and b.longitude is None and b.lanes is None
    assert (b.lane_type, b.name) == ("OR", "Ramp to I-5 N")
    assert meta[500005].lanes == 1 and meta[500005].lane_type == "HV"
    c = meta[500006]
    assert (c.freeway, c.direction, c.lanes, c.latitude) == ("101", "S", None, None)
    assert q.rows_read == 6 and q.rows_used == 4
    assert q.skipped == Counter({"bad_station_id": 1, "blank_line": 1})
    accounted(q)


def test_metadata_without_id_column_or_rows(tmp_path: Path) -> None:
    meta, q = read_metadata(write_text(tmp_path / "m1.txt", ["Station\tFwy", "1\t5"], gz=False))
    assert meta == {} and q.skipped == Counter({"no_id_column": 1})
    meta, q = read_metadata(write_text(tmp_path / "m2.txt", ["\t".join(META_HEADER)], gz=False))
    assert meta == {} and q.rows_read == 0
    (tmp_path / "m3.txt").write_bytes(b"")
    meta, q = read_metadata(tmp_path / "m3.txt")
    assert meta == {} and q.rows_read == 0


def test_station_missing_from_metadata_still_replays(tmp_path: Path) -> None:
    raw = [raw_line("01/23/2012 10:00:05", s, [(str(s % 10), ".1", "60")]) for s in (500001, 500002, 500003)]
    day = read_station_raw(write_text(tmp_path / "raw.txt.gz", raw, gz=True))
    meta_lines = ["\t".join(META_HEADER), meta_row("500001"), meta_row("500003"), meta_row("599999")]
    meta, _ = read_metadata(write_text(tmp_path / "meta.txt", meta_lines, gz=False))
    day.attach_metadata(meta)
    assert day.quality.stations_without_metadata == 1
    assert day.stations.tolist() == [500001, 500002, 500003]  # 500002 still replays
    assert day.flows.tolist() == [[1, 2, 3]]
    assert "1 stations not in the metadata" in day.quality.summary()
    day.attach_metadata({})
    assert day.quality.stations_without_metadata == 3


# ---------------------------------------------------------------------------------------
# Compression by content
# ---------------------------------------------------------------------------------------
def _compressed(path: Path, data: bytes, fmt: str) -> Path:
    if fmt == "bz2":
        path.write_bytes(bz2.compress(data))
    elif fmt == "xz":
        path.write_bytes(lzma.compress(data))
    elif fmt == "zip":
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("d07_text_station_raw_2012_01_23.txt", data)
    elif fmt == "gzip":
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", ["plain", "gzip", "bz2", "xz", "zip"])
def test_every_compression_read_by_content(tmp_path: Path, fmt: str) -> None:
    data = ("\n".join([DOC_LINE_1, DOC_LINE_2]) + "\n").encode()
    day = read_station_raw(_compressed(tmp_path / "no_telling_suffix.dat", data, fmt))
    assert day.flows.tolist() == [[1, 3]] and day.stations.tolist() == [500001, 500004]
    assert read_bytes(tmp_path / "no_telling_suffix.dat") == data


def test_zip_with_two_members_or_none_is_a_clear_error(tmp_path: Path) -> None:
    two = tmp_path / "two.zip"
    with zipfile.ZipFile(two, "w") as zf:
        zf.writestr("a.txt", DOC_LINE_1)
        zf.writestr("b.txt", DOC_LINE_2)
    with pytest.raises(ValueError, match=r"two\.zip.*exactly one data member.*holds 2"):
        read_station_raw(two)
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("folder/", "")
    with pytest.raises(ValueError, match="holds 0"):
        read_station_raw(empty)


@pytest.mark.parametrize("fmt", ["gzip", "bz2", "xz", "zip"])
def test_corrupt_compressed_file_is_a_one_line_value_error(tmp_path: Path, fmt: str) -> None:
    data = ("\n".join([DOC_LINE_1, DOC_LINE_2] * 50) + "\n").encode()
    good = _compressed(tmp_path / "good.bin", data, fmt).read_bytes()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(good[:6] + bytes(b ^ 0x5A for b in good[6:40]) + good[40:len(good) // 2])
    with pytest.raises(ValueError) as info:
        read_station_raw(bad)
    msg = str(info.value)
    assert "bad.bin" in msg and fmt in msg and "\n" not in msg


# ---------------------------------------------------------------------------------------
# Missing is not zero; dead detectors; lane flags on the cell
# ---------------------------------------------------------------------------------------
def _lane(f: int, occ: str = ".05") -> list[Lane]:
    return [(str(f), occ, "60"), (str(f), occ, "60")]


def test_gaps_are_missing_not_zero(tmp_path: Path) -> None:
    """A block of absent rows and an empty row: flows 0 (a number for the simulation) but
    CELL_MISSING and no truth; cells with readings of 0 vehicles are truth."""
    t0 = utc_epoch("01/23/2012 10:00:00", PST)
    lines = []
    for i in range(30):
        stamp = epoch_start(t0 + i).strftime("%m/%d/%Y %H:%M:%S")
        lines.append(raw_line(stamp, 1, _lane(3)))
        if not 10 <= i < 20:  # station 2: ten consecutive epochs absent
            lines.append(raw_line(stamp, 2, _lane(0 if i == 25 else 2)))
    lines[1] = raw_line(epoch_start(t0).strftime("%m/%d/%Y %H:%M:%S"), 2, [])  # an empty row
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert day.flags.dtype == np.uint8 and day.flags.shape == day.flows.shape == (30, 2)
    missing = (day.flags[:, 1] & CELL_MISSING) != 0
    assert np.flatnonzero(missing).tolist() == [0, *range(10, 20)]
    assert day.flows[missing, 1].tolist() == [0] * 11
    assert not day.has_truth[missing, 1].any()
    assert day.has_truth[25, 1] and day.flows[25, 1] == 0  # a real zero is truth
    assert day.has_truth[:, 0].all()
    assert day.quality.missing_cells == 11
    assert "11 missing" in day.quality.summary()
    accounted(day.quality)


def _dead_file(tmp_path: Path, others_flow: int, run: int) -> TrafficDay:
    t0 = utc_epoch("01/23/2012 02:00:00", PST)
    lines = []
    for i in range(run + 20):
        stamp = epoch_start(t0 + i).strftime("%m/%d/%Y %H:%M:%S")
        dead = 10 <= i < 10 + run
        lines.append(raw_line(stamp, 1, [("0", "0", "0"), ("0", "0", "")] if dead else _lane(0 if others_flow == 0
                                                                                              else 4)))
        lines.append(raw_line(stamp, 2, _lane(others_flow, ".05" if others_flow else "0")))
    return read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False), dead_run_epochs=120)


def test_dead_detector_is_flagged_dead(tmp_path: Path) -> None:
    day = _dead_file(tmp_path, others_flow=3, run=130)
    dead = (day.flags & CELL_DEAD) != 0
    assert np.flatnonzero(dead[:, 0]).tolist() == list(range(10, 140))
    assert not dead[:, 1].any()
    assert not day.has_truth[10:140, 0].any() and day.has_truth[:10, 0].all()
    assert day.quality.dead_cells == 130 and day.quality.dead_stations == 0
    # one epoch short of the threshold: not dead
    short = _dead_file(tmp_path, others_flow=3, run=119)
    assert not (short.flags & CELL_DEAD).any()


def test_zero_at_night_while_all_others_are_zero_is_not_dead(tmp_path: Path) -> None:
    day = _dead_file(tmp_path, others_flow=0, run=200)
    assert not (day.flags & CELL_DEAD).any()
    assert day.has_truth.all()


def test_station_dead_all_file(tmp_path: Path) -> None:
    t0 = utc_epoch("01/23/2012 09:00:00", PST)
    lines = []
    for i in range(150):
        stamp = epoch_start(t0 + i).strftime("%m/%d/%Y %H:%M:%S")
        lines += [raw_line(stamp, 1, [("0", "0", "0")] * 3), raw_line(stamp, 2, _lane(5))]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert ((day.flags[:, 0] & CELL_DEAD) != 0).all()
    assert day.quality.dead_stations == 1 and "1 stations dead all file" in day.quality.summary()
    assert day.peak_total() == 10


# A January 2012 weekday as a small district file holds it: at night every station reads 0/0
# (nobody drives past ten detectors at 2 am); from 03:45 the working stations carry traffic.
# Station 1 is dead: 0/0 in every row. Station 2 works but is quiet until 04:30 (45 minutes
# of 0/0 while station 3 has traffic: under the one-hour dead run). Station 3 works from 03:45.
_NIGHT_DAY = "01/24/2012"
_DEAD, _QUIET, _BUSY = 1, 2, 3
_TRAFFIC_FROM = {_DEAD: None, _QUIET: 540, _BUSY: 450}  # 30 s epochs after midnight


def _night_flow(station: int, i: int) -> int:
    start = _TRAFFIC_FROM[station]
    return 0 if start is None or i < start else 2 + (i % 3)


def _night_raw(tmp_path: Path, epochs: int = 720) -> Path:
    """Station Raw, 00:00 to 06:00: two lanes, 0/0 on both when nobody passes."""
    lines = []
    for i in range(epochs):
        stamp = epoch_start(utc_epoch(f"{_NIGHT_DAY} 00:00:00", PST) + i).strftime("%m/%d/%Y %H:%M:%S")
        for s in (_DEAD, _QUIET, _BUSY):
            f = _night_flow(s, i)
            lines.append(raw_line(stamp, s, _lane(f, ".05") if f else [("0", "0", "0"), ("0", "0", "")]))
    return write_text(tmp_path / "d05_text_station_raw_2012_01_24.txt.gz", lines, gz=True)


def _night_5min(tmp_path: Path, intervals: int = 72) -> Path:
    """Station 5-Minute, 00:00 to 06:00: the same stations, each total over ten epochs."""
    lines = []
    for k in range(intervals):
        stamp = epoch_start(utc_epoch(f"{_NIGHT_DAY} 00:00:00", PST) + 10 * k).strftime("%m/%d/%Y %H:%M:%S")
        for s in (_DEAD, _QUIET, _BUSY):
            total = sum(_night_flow(s, 10 * k + j) for j in range(10))
            lines.append(five_min_line(stamp, s, str(total), [str(total)], occ=".05" if total else "0"))
    return write_text(tmp_path / "d05_text_station_5min_2012_01_24.txt", lines, gz=False)


def _check_dead_all_day(day: TrafficDay, covered: int) -> None:
    """Station 1 is dead in every cell it read, night included; station 2's quiet night is truth."""
    dead, zero_truth = (day.flags & CELL_DEAD) != 0, day.has_truth
    col = {int(s): j for j, s in enumerate(day.stations)}
    assert dead[:covered, col[_DEAD]].all() and not day.has_truth[:, col[_DEAD]].any()
    assert not dead[:, col[_QUIET]].any() and not dead[:, col[_BUSY]].any()
    assert zero_truth[:covered, col[_QUIET]].all() and day.flows[:450, col[_QUIET]].tolist() == [0] * 450
    assert zero_truth[:covered, col[_BUSY]].all()
    assert day.quality.dead_cells == covered and day.quality.dead_stations == 1
    assert "1 stations dead all file" in day.quality.summary()
    accounted(day.quality)


@pytest.mark.parametrize("path", ["fast", "rows"])
def test_station_dead_all_day_is_dead_at_night_too_raw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       path: str) -> None:
    """Missing is not zero, at night: a station reading 0/0 in every row of a day on which
    others carry traffic is dead for the whole day -- also the ~450 night epochs before anyone
    else had traffic (no run there: nobody has traffic). Both the fast path and the row logic."""
    raw = _night_raw(tmp_path)
    if path == "rows":
        monkeypatch.setattr(pems.fast, "FAST_BYTES", np.zeros(256, bool))
    _check_dead_all_day(read_station_raw(raw), 720)
    whole_day = read_station_raw(raw, day=date(2012, 1, 24))  # the grid is the whole local day
    assert whole_day.epochs.size == 2880
    _check_dead_all_day(whole_day, 720)
    assert not ((whole_day.flags[720:] & CELL_DEAD) != 0).any()  # after 06:00: missing, not dead


def test_station_dead_all_day_is_dead_at_night_too_5min(tmp_path: Path) -> None:
    """The 5-minute reader agrees with the Station Raw reader, cell for cell."""
    five = read_station_5min(_night_5min(tmp_path))
    _check_dead_all_day(five, 720)
    raw = read_station_raw(_night_raw(tmp_path))
    assert np.array_equal(five.epochs, raw.epochs) and np.array_equal(five.stations, raw.stations)
    assert np.array_equal(five.flags & CELL_DEAD, raw.flags & CELL_DEAD)
    _check_dead_all_day(read_station_5min(_night_5min(tmp_path), day=date(2012, 1, 24)), 720)


def test_dead_all_day_is_per_local_day(tmp_path: Path) -> None:
    """A station 0/0 all of one day (its last half hour in the file: shorter than a dead run)
    but with traffic the next is dead on the first day only; a file where every station reads
    0/0 (nobody has traffic) kills nobody."""
    lines = []
    t0 = utc_epoch("01/24/2012 23:30:00", PST)
    for i in range(180):  # 23:30 to 01:00
        stamp = epoch_start(t0 + i).strftime("%m/%d/%Y %H:%M:%S")
        lines.append(raw_line(stamp, 1, _lane(3) if i >= 60 else [("0", "0", "0")]))
        lines.append(raw_line(stamp, 2, _lane(1)))
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    dead = (day.flags[:, 0] & CELL_DEAD) != 0
    assert dead[:60].all() and not dead[60:].any()
    assert day.quality.dead_stations == 0
    quiet = [raw_line(epoch_start(t0 + i).strftime("%m/%d/%Y %H:%M:%S"), s, [("0", "0", "0")])
             for i in range(180) for s in (1, 2)]
    assert not (read_station_raw(write_text(tmp_path / "quiet.txt", quiet, gz=False)).flags & CELL_DEAD).any()


def test_lane_flags_are_on_the_cell(tmp_path: Path) -> None:
    t = "01/23/2012 10:00:05"
    lines = [raw_line(t, 1, [("0", "1", "0"), ("6", ".05", "62")]),  # stuck lane
             raw_line(t, 2, [("60", ".30", "20"), ("5", ".05", "60")]),  # spike
             raw_line(t, 3, [("2", "1.5", "60"), ("7", ".1", "60")]),  # out of range
             raw_line(t, 4, [("7", ".1", "60")])]
    day = read_station_raw(write_text(tmp_path / "raw.txt", lines, gz=False))
    assert day.flags.tolist() == [[CELL_STUCK_LANE, CELL_SPIKE_LANE, CELL_OUT_OF_RANGE_LANE, 0]]
    assert day.flows.tolist() == [[6, 5, 7, 7]] and day.has_truth.all()
    assert (day.quality.stuck_lane_cells, day.quality.spike_lane_cells) == (1, 1)


def test_5min_missing_rows_are_ten_missing_epochs(tmp_path: Path) -> None:
    lines = [five_min_line("01/23/2012 08:00:00", 7, "20", []),
             five_min_line("01/23/2012 08:10:00", 7, "30", [])]  # 08:05 missing
    day = read_station_5min(write_text(tmp_path / "five.txt", lines, gz=False))
    assert day.epochs.size == 30
    assert np.flatnonzero(~day.has_truth[:, 0]).tolist() == list(range(10, 20))
    assert day.flags[10:20, 0].tolist() == [CELL_MISSING] * 10 and day.flows[10:20, 0].sum() == 0
    assert day.quality.missing_cells == 10


# ---------------------------------------------------------------------------------------
# Multi-day files
# ---------------------------------------------------------------------------------------
def _two_day_lines() -> list[str]:
    """Readings every hour from 2012-11-03 20:00 to 2012-11-05 03:00 (11-04 is the autumn DST
    day: 25 hours), station 5."""
    lines = []
    for d, hours in (("11/03/2012", range(20, 24)), ("11/04/2012", range(24)), ("11/05/2012", range(4))):
        lines += [raw_line(f"{d} {h:02d}:00:05", 5, [("2", ".05", "60")]) for h in hours]
    return lines


def test_day_selection_on_a_multi_day_file_with_a_dst_day(tmp_path: Path) -> None:
    path = write_text(tmp_path / "raw.txt", _two_day_lines(), gz=True)
    whole = read_station_raw(path)
    assert whole.quality.days_in_file == ["2012-11-03", "2012-11-04", "2012-11-05"]
    assert "the file holds 2012-11-03, 2012-11-04, 2012-11-05" in whole.quality.summary()
    # gaps between the hourly readings are missing, never zero-filled truth
    assert int(whole.has_truth.sum()) == 4 + 24 + 4
    dst = read_station_raw(path, day=date(2012, 11, 4))
    first, stop = day_epochs(date(2012, 11, 4))
    assert stop - first == 3000  # 25 hours
    assert dst.epochs.tolist() == list(range(first, stop))
    assert dst.epochs[0] == utc_epoch("11/04/2012 00:00:00", PDT)
    assert int(dst.has_truth.sum()) == 24 and int(dst.flows.sum()) == 48
    assert dst.quality.skipped == Counter({"other_day": 8}) and dst.quality.rows_used == 24
    accounted(dst.quality)
    assert dst.quality.days_in_file == whole.quality.days_in_file
    spring = day_epochs(date(2012, 3, 11))
    assert spring[1] - spring[0] == 2760  # 23 hours


def test_day_not_in_the_file_is_empty_and_says_which_days_it_holds(tmp_path: Path) -> None:
    path = write_text(tmp_path / "raw.txt", _two_day_lines(), gz=False)
    day = read_station_raw(path, day=date(2012, 11, 7))
    assert day.epochs.size == 0 and day.flows.shape == (0, 0) and day.peak_total() == 0
    s = day.quality.summary()
    assert "no rows on 2012-11-07" in s and "2012-11-03, 2012-11-04, 2012-11-05" in s
    accounted(day.quality)


# ---------------------------------------------------------------------------------------
# Fast path == row logic; cache
# ---------------------------------------------------------------------------------------
def test_fast_path_equals_the_row_logic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectorized parser gives exactly what the per-row logic gives (forced for every
    line by emptying the fast path's alphabet) on a file mixing every kind of row."""
    lines = [DOC_LINE_1, DOC_LINE_2, *_two_day_lines(),
             raw_line("01/23/2012 10:00:05", 51, [("0", "1", "0"), ("6", ".05", "62")]),
             raw_line("01/23/2012 10:00:05", 53, [("60", ".30", "20"), ("2.6", ".05", "60")]),
             raw_line("01/23/2012 10:00:05", 55, [("-3", ".1", "60"), ("2", "1.5", "60")]),
             raw_line("01/23/2012 10:00:25", 51, [("9", ".1", "60")]),  # duplicate
             raw_line("11/04/2012 01:00:05", 5, [("3", ".1", "60")]),  # repeated DST hour
             raw_line("01/23/2012 10:00:05", "31.5", [("1", ".1", "60")]),
             raw_line("02/30/2012 10:00:05", 31, [("1", ".1", "60")]),
             raw_line("01/23/2012 10:00:05", 31, [("nan", ".1", "60")]),
             raw_line("01/23/2012 10:00:05", 32, []), "", "x,y"]
    lines = [line.replace("01/23/2012", "11/04/2012") for line in lines]  # one grid of two days
    path = write_text(tmp_path / "raw.txt", lines, gz=False)
    fast = read_station_raw(path)
    monkeypatch.setattr(pems.fast, "FAST_BYTES", np.zeros(256, bool))
    slow = read_station_raw(path)
    assert np.array_equal(fast.flows, slow.flows) and np.array_equal(fast.flags, slow.flags)
    assert np.array_equal(fast.epochs, slow.epochs) and np.array_equal(fast.stations, slow.stations)
    assert fast.quality == slow.quality
    accounted(fast.quality)


def test_cache_hit_returns_the_same_day_and_a_change_invalidates(tmp_path: Path) -> None:
    path = write_text(tmp_path / "raw.txt", _two_day_lines(), gz=True)
    cache = tmp_path / "cache"
    first = load_cached(path, cache, day=date(2012, 11, 4))
    assert len(list(cache.glob("*.npz"))) == 1
    hit = load_cached(path, cache, day=date(2012, 11, 4))
    for name in ("stations", "epochs", "flows", "flags"):
        assert np.array_equal(getattr(first, name), getattr(hit, name))
        assert getattr(first, name).dtype == getattr(hit, name).dtype
    assert hit.quality == first.quality
    # other reader arguments: another entry
    load_cached(path, cache, day=date(2012, 11, 3))
    assert len(list(cache.glob("*.npz"))) == 2
    # the file changes (size and mtime): parsed again, not served stale
    st = path.stat()
    write_text(path, [*_two_day_lines(), raw_line("11/04/2012 12:00:25", 6, [("9", ".1", "60")])], gz=True)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    changed = load_cached(path, cache, day=date(2012, 11, 4))
    assert changed.stations.tolist() == [5, 6] and int(changed.flows.sum()) == 48 + 9


@pytest.mark.slow
def test_threads_loading_one_day_at_once_all_get_it(tmp_path: Path) -> None:
    """A replay thread and its caller load the same synthetic day at once (the flake of the
    SIGKILL test): writing the day and its parse cache under names per process *and thread*,
    then renaming, every loader gets the whole day and nothing is left half-written."""
    from concurrent.futures import ThreadPoolExecutor

    from producers.replay import load_day
    from producers.settings import ReplaySettings

    settings = ReplaySettings(data_dir=tmp_path / "data", synthetic_stations=6, max_epochs=4)
    with ThreadPoolExecutor(max_workers=6) as pool:
        days = list(pool.map(lambda _: load_day(settings), range(6)))
    for day in days[1:]:
        assert np.array_equal(day.flows, days[0].flows) and np.array_equal(day.stations, days[0].stations)
    assert not list((tmp_path / "data").rglob("*.tmp"))
