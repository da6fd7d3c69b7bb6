"""What one producer sends for an epoch (``producers.replay.epoch``), without a broker: the
reports are exactly what the devices' privatization gives for this producer's row (so the
records on the wire are those of before), span queries carry their span's first epoch, a stop
cuts the epoch between queries (a query after it is neither privatized nor charged), and
refusals and span reports are counted. Seeded: every check is exact."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from estimators import DayLedger, StationCounts
from producers.fleet import Device, EpochReports, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.replay.epoch import EpochWork, ProducerShare, epoch_outputs, epoch_work
from producers.replay.plan import ReplayPlan
from producers.replay.summary import ReplaySummary
from producers.settings import ReplaySettings
from producers.spans import SpanTracker
from schemas import Query

SEED = 11
STATIONS = np.array([401, 402, 403], dtype=np.int64)
FLOWS = np.array([30, 0, 12], dtype=np.int64)
FLEET = 100
EPOCH = 3 * 2880 + 60  # the first epoch of a 90-s span
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _query(name: str, mechanism: str = "unary", span_s: int = 30, params: dict[str, float] | None = None) -> Query:
    return Query(query_id=name, analyst_id="a", version=1, sensors=(401, 402, 403), mechanism=mechanism,
                 params={"q": 0.2} if params is None else params, population=1000, span_s=span_s, t_start=T0,
                 t_end=T0 + timedelta(days=30))


class _Stop:
    """A stop that comes after ``after`` looks (never: None)."""

    def __init__(self, after: int | None = None) -> None:
        self.after, self.looks = after, 0

    @property
    def requested(self) -> bool:
        self.looks += 1
        return self.after is not None and self.looks > self.after


def _plan(**settings: object) -> ReplayPlan:
    return ReplayPlan(ReplaySettings(seed=SEED, fleet_size=FLEET, **settings), FLEET, "test", ("flows:v1",), 10)


def _share(index: int = 0, count: int = 2, device: Device | None = None, ledger: DayLedger | None = None
           ) -> ProducerShare:
    spans = SpanTracker(SEED, FLEET // count, STATIONS, index)
    return ProducerShare(index, count, STATIONS, device or Device(), ledger, spans, None, ReplaySummary())


def _row(epoch: int, index: int = 0, count: int = 2) -> np.ndarray:
    return split_fleet(SEED, epoch, FLOWS, FLEET, count)[index]


def _work(epoch: int, queries: list[Query]) -> EpochWork:
    return epoch_work(0, epoch, T0 + timedelta(seconds=30 * epoch), queries, [], set())


def _same(a: EpochReports, b: EpochReports) -> bool:
    return (a.participants, a.refused, a.reports) == (b.participants, b.refused, b.reports) and all(
        type(ra) is type(rb) and ra.arrays().keys() == rb.arrays().keys()
        and all(np.array_equal(ra.arrays()[k], rb.arrays()[k]) for k in ra.arrays())
        for ra, rb in zip(a.rounds, b.rounds, strict=True))


@pytest.mark.parametrize(("mode", "via_shuffler"), [("per-vehicle", False), ("tally", False),
                                                    ("per-vehicle", True)])
def test_the_reports_are_the_devices_privatization_of_this_producers_row(mode: str, via_shuffler: bool) -> None:
    """Producer 1 of 2: each query's reports are ``privatize`` of its own row under the epoch's
    generator; through the shuffler without mixing pairs (each device's report its own). A wrong
    row, generator or mixing gives other arrays."""
    plan = _plan(mode=mode, via_shuffler=via_shuffler)
    queries = [_query("flows"), _query("sp", mechanism="sp", params={})]
    work, row = _work(EPOCH, queries), _row(EPOCH, 1)
    got = list(epoch_outputs(plan, _share(1), work, row, _Stop()))
    assert [(o.query.query_id, o.epoch) for o in got] == [("flows", EPOCH), ("sp", EPOCH)]
    for out, q in zip(got, queries, strict=True):
        want = privatize(q, StationCounts(query_truth_counts(row, STATIONS, q)), epoch_rng(SEED, q, EPOCH, 1), mode,
                         Device(), None, work.when.date().isoformat(), mix_pairs=not via_shuffler)
        assert out.reports.participants == int(row.sum()) and _same(out.reports, want)
    other = list(epoch_outputs(plan, _share(1), work, _row(EPOCH, 0), _Stop()))
    assert not _same(other[0].reports, got[0].reports)


def test_the_plan_goes_to_a_producer_process_as_it_is() -> None:
    """Producer processes are spawned with the plan: it pickles (a Query, with its cached
    mechanism, would not) and comes back equal."""
    plan = _plan(mode="tally")
    assert pickle.loads(pickle.dumps(plan)) == plan  # noqa: S301 (our own bytes)


def test_the_same_epoch_twice_is_the_same_output() -> None:
    """No hidden state between producers: two fresh shares give equal reports."""
    plan, work, row = _plan(), _work(EPOCH, [_query("flows")]), _row(EPOCH)
    a, b = (next(epoch_outputs(plan, _share(), work, row, _Stop())) for _ in range(2))
    assert _same(a.reports, b.reports)


@pytest.mark.parametrize("after", [0, 1])
def test_a_stop_cuts_the_epoch_between_queries(after: int) -> None:
    """A stop before a query: it is not privatized and the devices' day is not charged for it."""
    ledger = DayLedger(100.0)
    share = _share(ledger=ledger)
    work = _work(EPOCH, [_query("a"), _query("b")])
    got = list(epoch_outputs(_plan(), share, work, _row(EPOCH), _Stop(after)))
    assert [o.query.query_id for o in got] == ["a", "b"][:after]
    day = work.when.date().isoformat()
    assert ledger.total(day) == pytest.approx(after * _query("a").epsilon)


def test_refusals_are_counted_with_their_reason() -> None:
    """A device whose audit refuses the query: no participants, the refusals and why in the summary."""
    share = _share(device=Device(epsilon_limit=1e-9))
    row = _row(EPOCH)
    (out,) = epoch_outputs(_plan(), share, _work(EPOCH, [_query("flows")]), row, _Stop())
    assert out.reports.participants == 0 and out.reports.refused == int(row.sum())
    assert share.summary.refused["flows"] == int(row.sum()) and share.summary.refusal_reasons["flows"]


def test_a_whole_span_is_answered_once_with_its_first_epoch() -> None:
    """A 90-s query: answered at its span's last epoch only, its report's epoch the span's first,
    counted as sent; the 30-s query beside it every epoch."""
    flows, hourly = _query("flows"), _query("hourly", span_s=90)
    plan, share = _plan(), _share()
    answered = []
    for epoch in range(EPOCH, EPOCH + 3):
        row = _row(epoch)
        due = share.spans.step(epoch, [flows, hourly], row, set())
        work = epoch_work(epoch - EPOCH, epoch, T0, [flows, hourly], due, set())
        answered.append([(o.query.query_id, o.epoch) for o in epoch_outputs(plan, share, work, row, _Stop())])
    assert answered == [[("flows", EPOCH)], [("flows", EPOCH + 1)], [("flows", EPOCH + 2), ("hourly", EPOCH)]]
    assert share.summary.spans_sent == {"hourly": 1}
