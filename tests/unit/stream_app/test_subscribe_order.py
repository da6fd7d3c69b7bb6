"""``ptt subscribe --flows`` leads with the span queries' flows (``stream_app.subscribe_flows``):
a rollup of a 30-s query waits until the span queries' flows of its hour are printed, then comes
after them -- hourly rollups before 5-minute ones -- each group after a line saying what it is (a
rollup: the epochs it sums) and what it is good for, a noise-dominated row saying so. The
Kafka reading is mocked out, and the clock is the records': one every half second, as a live
topic delivers them (the complete groups are held 1 s, ``subscribe.HOLD_S``)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from schemas import Query
from schemas.estimates import Estimate, EstimateBound
from schemas.settings import KafkaSettings
from stream_app import subscribe as sub
from stream_app import subscribe_flows as flows

T0 = datetime(2026, 11, 18, 16, tzinfo=UTC)  # on a UTC hour: an hourly span starts here
E0 = int(T0.timestamp()) // 30
STATIONS = (712377, 717184)


def _row(query: str, epoch: int, station: int, span_s: int, estimate: float, sd: float, mechanism: str = "alp",
         estimator: str = "alp_average") -> Estimate:
    return Estimate(query_id=query, query_version=1, mechanism=mechanism, estimator=estimator,  # type: ignore[arg-type]
                    epoch=E0 + epoch, epoch_start=T0 + timedelta(seconds=30 * epoch), span_s=span_s, station=station,
                    estimate=estimate, sd=sd, bounds=(
                        EstimateBound(confidence=0.95, lower=max(0.0, estimate - 2 * sd), upper=estimate + 2 * sd),),
                    reports=100, participants=7306, epsilon=1.307, epsilon_shuffled=0.01228, closed_by="markers",
                    round_count_mismatch=0, late=0, refused=0, missing_batches=0)


def _hour_query(query_id: str = "unary-hour", start: datetime = T0) -> Query:
    return Query(query_id=query_id, analyst_id="a", version=1, sensors=STATIONS, mechanism="unary", population=7306,
                 t_start=start, t_end=T0 + timedelta(hours=24), span_s=3600)


def _live_hour() -> list[Estimate]:
    """What the topic delivers over an hour, in the order the worker publishes it: alp's 30-s rows
    (one epoch here: they make its longer spans rollups), its 5-minute rollups as each closes
    (sd 1,200 against flows of ~300: noise), its hourly rollup, then the span query's hourly flows
    (sd 66 against ~3,000)."""
    rows = [_row("alp-day", 0, s, 30, 25.0, 380.0) for s in STATIONS]
    for first in range(0, 120, 10):
        rows += [_row("alp-day", first, s, 300, 300.0 + 10 * first, 1200.0) for s in STATIONS]
    rows += [_row("alp-day", 0, s, 3600, 3500.0, 4200.0) for s in STATIONS]
    rows += [_row("unary-hour", 0, s, 3600, 3000.0 + s % 7, 66.0, "unary", "unary") for s in STATIONS]
    return rows


def _subscribe(monkeypatch: pytest.MonkeyPatch, rows: list[Estimate], queries: list[Query],
               query: str | None = None) -> str:
    clock = [0.0]

    def polled(*_: object, **__: object) -> Iterator[bytes | None]:
        for e in rows:
            clock[0] += 0.5
            yield e.model_dump_json().encode()
            yield None  # a quiet poll: the due groups go out

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

    monkeypatch.setattr(sub, "_polled", polled)
    monkeypatch.setattr(sub, "time", Clock)
    monkeypatch.setattr(sub, "_query_book", lambda *_: flows.QueryBook(lambda e: len(STATIONS), lambda: queries))
    monkeypatch.setattr(sub, "_query_sizes", lambda *_: (lambda e: len(STATIONS), lambda: None))  # the table views
    out = io.StringIO()
    assert sub.subscribe(KafkaSettings(), "t", flows=True, query=query, out=out) == len(rows) - len(STATIONS)
    return out.getvalue()


def _groups(text: str) -> list[tuple[str, str]]:
    """(query, span) of the printed rows, in order, consecutive repeats merged."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line.startswith("2026"):
            query, _, span, unit = line[26:].split()[:4]
            if not out or out[-1] != (query, span + unit):
                out.append((query, span + unit))
    return out


def test_the_span_querys_flows_lead_and_the_rollups_follow_them(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _subscribe(monkeypatch, _live_hour(), [_hour_query()])
    groups = _groups(text)
    # the hourly span flows first, though they came last; then the hourly rollup, then the twelve 5-minute ones
    assert groups == [("unary-hour", "1h"), ("alp-day", "1h"), ("alp-day", "5min")], groups
    rows = [x for x in text.splitlines() if x.startswith("2026")]
    assert len(rows) == 2 * (1 + 1 + 12) and all(len(x) <= sub.WIDTH for x in text.splitlines())
    five = [x[:25] for x in rows if " 5 min " in x]
    assert five == sorted(five)  # the 5-minute rollups in time order
    # each group after its label: what it is and what it is good for
    labels = [x for x in text.splitlines() if x.startswith("-- ")]
    assert len(labels) == 14 and labels[0].startswith("-- unary-hour v1 unary: hourly flows of a span query")
    joined = text.replace("\n   ", " ")  # a label's wrapped lines, joined
    assert "-- unary-hour v1 unary: hourly flows of a span query (one report per device per span): per-station " \
           "traffic (every flow above twice its sd; sd a median 2% of the flow)" in joined
    assert "-- alp-day v1 alp_average: 5-minute rollups of a 30-s query (each sums 10 epochs: 10 reports of a device " \
           "in all of them): NOISE-DOMINATED: noise, not traffic (2 of 2 flows at most twice their sd)" in joined
    assert "-- alp-day v1 alp_average: hourly rollups of a 30-s query (each sums 120 epochs: 120 reports" in joined
    # a row whose sd is at least half its flow says so; the span query's do not
    assert all(x.endswith(" NOISE-DOMINATED") == ("alp-day" in x) for x in rows)


def test_without_a_span_query_shown_nothing_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--query alp-day`` (the span query's flows are not shown) or no span query at all: the
    rollups come as they close, the first 5-minute rollup first."""
    alp = [e for e in _live_hour() if e.query_id == "alp-day"]
    for queries, query in (([_hour_query()], "alp-day"), ([], None)):
        text = _subscribe(monkeypatch, alp, queries, query)
        first = next(x for x in text.splitlines() if x.startswith("2026"))
        assert first.startswith("2026-11-18T16:00:00+00:00 alp-day        rollup  5 min"), first


def test_flow_order_holds_a_rollup_until_the_span_of_its_last_epoch() -> None:
    hour = _hour_query()
    order = flows.FlowOrder(lambda epoch: flows.span_keys([hour], epoch))
    late = ("rollup", [_row("alp-day", 110, STATIONS[0], 300, 1.0, 1.0)])
    assert order.add([late]) == [] and order.held == [late]
    nxt = ("rollup", [_row("alp-day", 120, STATIONS[0], 300, 1.0, 1.0)])  # the next hour's: waits for that one
    span = ("span", [_row("unary-hour", 0, STATIONS[0], 3600, 1.0, 1.0, "unary", "unary")])
    assert order.add([nxt, span]) == [span, late] and order.held == [nxt]
    assert order.rest() == [nxt] and order.held == []  # the end of the stream: whatever still waits


def test_span_keys_follow_the_windows_and_the_filters() -> None:
    """A span whose first epoch lies before the query's window is never published: nothing waits
    for it; nor for a query whose rows the filters leave out."""
    later = _hour_query("late", T0 + timedelta(minutes=20))
    assert flows.span_keys([_hour_query(), later], E0 + 50) == [("unary-hour", E0)]
    assert flows.span_keys([later], E0 + 130) == [("late", E0 + 120)]
    assert flows.span_keys([_hour_query()], E0 + 50, lambda q: q.query_id != "unary-hour") == []


def test_a_group_label_fits_the_width_and_says_noise() -> None:
    rows = [_row("alp-day", 0, s, 300, 250.0, 1200.0) for s in STATIONS]
    label = flows.group_label("rollup", rows, 120)
    assert all(len(x) <= 120 for x in label.splitlines()) and len(label.splitlines()) == 2
    assert "NOISE-DOMINATED" in label and flows.row_noisy(rows[0])
    assert not flows.row_noisy(_row("hour", 0, STATIONS[0], 3600, 3000.0, 66.0))
    withheld = rows[0].model_copy(update={"estimate": None, "sd": None, "bounds": (), "withheld": "too few"})
    assert not flows.row_noisy(withheld)
