"""Adversarial inputs against real Faust workers and a real broker.

Forged end-of-epoch markers, injected and re-sent reports, absurd counts, forward-dated
records, worker restarts and start-up races. Every case must end in one of three ways:

* **held** -- the published estimates equal those of a clean run (same seed and settings,
  no attack), compared per (epoch, station, estimator);
* **withheld** -- the attacked epoch(s) are published as withheld, with a reason whose code
  ``ptt_withheld_epochs_total{query, reason}`` counts;
* **dead-lettered** -- the attack's records go to the dead-letter topic with the reason, and
  ``ptt_dead_letters_total{reason}`` counts them.

Never silently wrong: a published, non-withheld estimate that differs from the clean run.

Most cases share one pre-filled topic set and one worker (:func:`scenario`): every case has
its own queries (``<case>-<mechanism>``) carrying exactly the genuine reports of the clean
queries (``clean-<mechanism>``, same arrays drawn once), plus the attack at epoch index
:data:`ATTACK`. Cases that move event time (forward-dated records) or kill workers run on
topic sets of their own and compare with the shared clean run.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka.partitioner.default import murmur2

from producers.pems import TrafficDay
from producers.replay import default_queries, fleet_size_for, load_day
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import EndOfEpoch, Query, encode_batch, encode_json, new_batch_id
from schemas.estimates import Estimate
from schemas.kafka_io import ensure_topics
from stream_app.settings import WorkerSettings
from stream_app.worker.frames import decode_frame, frame_estimates
from stream_app.worker.records import WindowId

from .kafka_helpers import drain
from .stream_helpers import (
    EpochSender,
    EstimateCount,
    WorkerProcess,
    core_estimates,
    dead_letter_origins,
    estimates_by_query,
    genuine_reports,
    metric,
    pipeline_settings,
    publish_queries,
    wait_for,
    wait_for_estimates,
)

pytestmark = pytest.mark.integration

MECHS = ("sp", "alp", "rr")
ROWS = {"sp": 6, "alp": 24, "rr": 6}  # estimate records per epoch: stations x estimators (6 stations)
BATCH = 50  # reports per batch: SP sends 5 batches per round, ALP and RR 2
ATTACK = 2  # epoch index of every attack
N_REF = 8  # epochs of the clean and dead-producer reference queries (the restart test replays them)
N_ATK = 4  # epochs of each attacked query
# epoch indices of the live tests on the shared worker: after the pre-filled epochs, fixed, so
# each test sees the same data whichever of them run
LIVE = {"race": N_REF, "flood": N_REF + 1, "midset-alp": N_REF + 2, "midset-rr": N_REF + 3}
DEAD_AT = 2  # epoch index at which the reference "dead producer" stops without markers
BIG = 2**63 - 1

Key = tuple[int, int, str]  # (epoch, station, estimator)


def _query(template: Query, qid: str, population: int | None = None) -> Query:
    d = template.model_dump()
    d["query_id"] = qid
    if population is not None:
        d["population"] = population
    return Query.model_validate(d)


def _row(e: Estimate) -> tuple[Any, ...]:
    """What must not change: values, bounds, the withheld reason, who counted, how it closed."""
    return (e.estimate, e.sd, tuple((b.confidence, b.lower, b.upper) for b in e.bounds), e.withheld,
            e.participants, e.reports, e.closed_by)


def _start(ws: WorkerSettings, tmp: Path, name: str) -> WorkerProcess:
    w = WorkerProcess(ws, tmp / f"{name}-{ws.web_port}.log").start()
    w.wait_ready()
    return w


def _bare_marker(q: Query, epoch: int, r: int, p: int, **kw: Any) -> bytes:
    fields: dict[str, Any] = {
        "producer_id": "intruder", "producer_index": 0, "producer_count": 1, "query_id": q.query_id,
        "query_version": q.version, "epoch": epoch, "round": r, "partition": p, "reports_to_partition": 0,
        "batches_to_partition": 0, "reports_total": 0, "batches_total": 0, "participants": 0, "refused": 0,
        "mode": "per-vehicle"}
    return encode_json(EndOfEpoch(**{**fields, **kw}))


def _batch(q: Query, epoch: int, r: int, arrays: dict[str, Any], reports: int, kind: str = "reports",
           layout: str = "values", **kw: Any) -> bytes:
    return encode_batch({"kind": kind, "query_id": q.query_id, "query_version": q.version, "epoch": epoch,
                         "round": r, "producer_id": "intruder", "layout": layout, "n_stations": q.n_stations,
                         "n_outputs": q.n_outputs, "batch_id": new_batch_id(), "reports": reports, **kw}, arrays)


def _send_keyed(sink: ReportSink, value: bytes, partition: int | None = None) -> None:
    key = new_batch_id().encode()
    sink.send(value, key=key, partition=sink.partition_for(key) if partition is None else partition)


# -- the attacks of the shared scenario --------------------------------------------------------
# Each gets the genuine sender of the attacked epoch and sends the genuine batches and markers
# itself, in the order the attack needs; it returns the dead letters it expects, by reason.

Attack = Callable[[ReportSink, EpochSender], Counter[str]]


def _honest(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches()
    s.markers()
    return Counter()


def _marker_100k_capped(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches()
    sink.send(encode_json(s.marker(0, 0, producer_id="intruder", participants=100_000)), partition=0)
    s.markers()
    return Counter(bad_marker=1)


def _marker_100k_second_producer(sink: ReportSink, s: EpochSender) -> Counter[str]:
    """A second producer slot (index 1 of 2) on every partition and round: 100,000 vehicles
    that sent nothing. The query's population (200,000) allows it."""
    for r in range(s.q.n_rounds):
        for p in sink.partitions:
            sink.send(_bare_marker(s.q, s.epoch, r, p, producer_index=1, producer_count=2, participants=100_000),
                      partition=p)
    s.batches()
    s.markers()
    return Counter()


def _empty_epoch_markers(sink: ReportSink, s: EpochSender) -> Counter[str]:
    """A full set of markers declaring the epoch empty, ahead of its genuine data."""
    for r in range(s.q.n_rounds):
        for p in sink.partitions:
            sink.send(_bare_marker(s.q, s.epoch, r, p), partition=p)
    s.batches()
    s.markers()
    return Counter()


def _interrupted_slot0(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches(1)
    sink.send(encode_json(s.marker(0, 0, producer_id="0", interrupted=True)), partition=0)
    s.batches()
    s.markers()
    return Counter()


def _producer_count_200k(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches()
    for index in (0, 199_999):
        sink.send(encode_json(s.marker(0, 0, producer_id="intruder", producer_count=200_000, producer_index=index)),
                  partition=0)
    s.markers()
    return Counter(bad_marker=2)


def _balanced(q: Query, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % (q.n_stations + 1)


def _fake_sp(chunks: int, size: int, reason: str | None) -> Attack:
    def attack(sink: ReportSink, s: EpochSender) -> Counter[str]:
        s.batches()
        for r in range(s.q.n_rounds):
            for _ in range(chunks):
                _send_keyed(sink, _batch(s.q, s.epoch, r, {"value": _balanced(s.q, size)}, size))
        s.markers()
        return Counter({reason: chunks * s.q.n_rounds}) if reason else Counter()
    return attack


def _million_reports(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches()
    n = 1_000_000
    _send_keyed(sink, _batch(s.q, s.epoch, 0, {"value": _balanced(s.q, n)}, n))
    counts = np.bincount(_balanced(s.q, n), minlength=s.q.n_outputs)
    _send_keyed(sink, _batch(s.q, s.epoch, 0, {"counts": counts}, n, kind="tally", layout="counts"))
    s.markers()
    return Counter(out_of_bounds=2)


def _million_tally_large_population(sink: ReportSink, s: EpochSender) -> Counter[str]:
    s.batches()
    n = 1_000_000
    counts = np.bincount(_balanced(s.q, n), minlength=s.q.n_outputs)
    _send_keyed(sink, _batch(s.q, s.epoch, 0, {"counts": counts}, n, kind="tally", layout="counts"))
    s.markers()
    return Counter()


def _resent_batches(sink: ReportSink, s: EpochSender) -> Counter[str]:
    """Genuine batches sent again under fresh batch ids (deduplication cannot see them)."""
    s.batches()
    for r, _, n, _, arrays in [c for c in s.chunks if c[0] == 0][:2]:
        layout = "values" if "value" in arrays else "pairs"
        _send_keyed(sink, _batch(s.q, s.epoch, r, arrays, n, layout=layout, producer_id=s.producer_id))
    s.markers()
    return Counter()


def _huge_counts(sink: ReportSink, s: EpochSender) -> Counter[str]:
    """Tally records with counts at and near 2**63 (and one near -2**63), a tally claiming
    2**63 - 1 vehicles, and a marker claiming 2**63 - 1 participants."""
    s.batches()
    q = s.q
    size = q.n_outputs * (q.n_stations if q.spec.per_sensor else 1)

    def tally(counts: np.ndarray, reports: int) -> None:
        _send_keyed(sink, _batch(q, s.epoch, 0, {"counts": counts}, reports, kind="tally", layout="counts"))

    one = np.zeros(size, dtype=np.int64)
    one[1] = BIG
    tally(one, 1)
    two = np.zeros(size, dtype=np.int64)
    two[:2] = 2**62  # each alone is bounded by int64; their sum is not
    tally(two, 2)
    tally(np.zeros(size, dtype=np.int64), BIG)
    raw = _batch(q, s.epoch, 0, {"counts": np.zeros(size, dtype=np.int64)}, 1, kind="tally", layout="counts")
    neg = raw[:-8 * size] + np.full(size, -BIG, dtype="<i8").tobytes()  # encode_batch refuses negatives
    _send_keyed(sink, neg)
    sink.send(encode_json(s.marker(0, 0, producer_id="intruder", participants=BIG, refused=BIG)), partition=0)
    s.markers()
    return Counter(out_of_bounds=3, out_of_range=1, bad_marker=1)


@dataclass(frozen=True)
class Case:
    attack: Attack
    mechanisms: tuple[str, ...]
    expect: str  # "held" or "withheld"
    codes: frozenset[str] = frozenset()  # withheld reason codes the case may end with
    population: int | None = None
    every_epoch: bool = False  # attacked in every epoch, not only ATTACK

    def attacked(self, i: int) -> bool:
        return self.every_epoch or i == ATTACK


CASES: dict[str, Case] = {
    # 3. forged markers
    "marker-100k-capped": Case(_marker_100k_capped, ("sp", "alp"), "held"),
    "marker-100k-second-producer": Case(_marker_100k_second_producer, ("sp", "alp", "rr"), "withheld",
                                        frozenset({"impossible_counts"}), population=200_000),
    "empty-epoch-markers": Case(_empty_epoch_markers, ("sp", "alp"), "withheld",
                                frozenset({"too_few_participants", "impossible_counts", "conflicting_markers"})),
    # the genuine marker of slot 0 conflicts with the forged one -- or, if the genuine markers of
    # the other partitions complete the set first, the forged one closes the epoch as interrupted
    "interrupted-slot0": Case(_interrupted_slot0, ("sp", "alp"), "withheld",
                              frozenset({"conflicting_markers", "interrupted"})),
    "producer-count-200k": Case(_producer_count_200k, ("sp",), "held"),
    # 4. injected reports
    "fake-sp-1000-one-batch": Case(_fake_sp(1, 1000, "out_of_bounds"), ("sp",), "held", every_epoch=True),
    "fake-sp-1000-in-5-batches": Case(_fake_sp(5, 200, None), ("sp",), "withheld", frozenset({"impossible_counts"}),
                                      every_epoch=True),
    "fake-sp-1000-large-population": Case(_fake_sp(1, 1000, None), ("sp",), "withheld",
                                          frozenset({"impossible_counts"}), population=5_000, every_epoch=True),
    "million-reports": Case(_million_reports, ("sp",), "held"),
    "million-tally-large-population": Case(_million_tally_large_population, ("sp",), "withheld",
                                           frozenset({"impossible_counts"}), population=2_000_000),
    "resent-batches": Case(_resent_batches, ("sp", "alp", "rr"), "withheld", frozenset({"impossible_counts"})),
    # 5. counts near 2**63
    "huge-counts": Case(_huge_counts, ("sp", "alp"), "held"),
}


@dataclass
class Scenario:
    rs: ReplaySettings
    ws: WorkerSettings
    tmp: Path
    day: TrafficDay
    fleet: int
    templates: dict[str, Query]
    worker: WorkerProcess
    estimates: dict[str, dict[Key, Estimate]] = field(default_factory=dict)
    letters: list[tuple[str, str | None]] = field(default_factory=list)
    metrics: str = ""
    expected_dead: dict[str, Counter[str]] = field(default_factory=dict)
    _reports: dict[tuple[str, int], Any] = field(default_factory=dict)

    def reports(self, mech: str, i: int) -> Any:
        if (mech, i) not in self._reports:
            self._reports[(mech, i)] = genuine_reports(self.rs, self.day, i, self.fleet, self.templates[mech])
        return self._reports[(mech, i)]

    def epoch(self, i: int) -> int:
        return int(self.day.epochs[i])

    def sender(self, sink: ReportSink, q: Query, mech: str, i: int, producer_id: str) -> EpochSender:
        return EpochSender(sink, q, self.epoch(i), self.reports(mech, i), producer_id, BATCH)

    def clean(self, mech: str, i: int) -> dict[Key, tuple[Any, ...]]:
        e = self.epoch(i)
        return {k: _row(v) for k, v in self.estimates[f"clean-{mech}"].items() if k[0] == e}


def _send_dead_producer_epochs(sc: Scenario, sink: ReportSink, queries: dict[str, Query],
                               epochs: range, ids: dict[str, str]) -> dict[str, int]:
    """The reference 'dead producer': at DEAD_AT it sends about half of round 0's batches and
    no markers (it died); from the next epoch a new producer process takes over. Returns the
    reports sent per mechanism."""
    sent: Counter[str] = Counter()
    for i in epochs:
        for mech, q in queries.items():
            s = sc.sender(sink, q, mech, i, ids[mech])
            if i == DEAD_AT:
                s.batches(max(1, sum(1 for c in s.chunks if c[0] == 0) // 2))
                ids[mech] = f"p0-{uuid.uuid4().hex[:8]}"
            else:
                _honest(sink, s)
            sent[mech] += s.sent_reports()
    return dict(sent)


@pytest.fixture(scope="module")
def scenario(broker: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("adversarial")
    rs, ws = pipeline_settings(broker, tmp)
    ensure_topics(rs)
    day = load_day(rs)
    fleet = fleet_size_for(day, rs)
    templates = {q.mechanism: q for q in default_queries(day, fleet, rs.mechanisms)}
    queries: dict[str, tuple[str, Query, Case | None]] = {}  # query id -> (mechanism, query, case)
    for mech in MECHS:
        queries[f"clean-{mech}"] = (mech, _query(templates[mech], f"clean-{mech}"), None)
        queries[f"dead-{mech}"] = (mech, _query(templates[mech], f"dead-{mech}"), None)
    for name, case in CASES.items():
        for mech in case.mechanisms:
            qid = f"{name}-{mech}"
            queries[qid] = (mech, _query(templates[mech], qid, case.population), case)
    publish_queries(rs, [q for _, q, _ in queries.values()])
    sc = Scenario(rs, ws, tmp, day, fleet, templates, worker=WorkerProcess(ws, tmp / "unused.log"))
    sink = ReportSink(rs, rs.reports_topic)
    ids = {qid: f"p0-{uuid.uuid4().hex[:8]}" for qid in queries}
    dead_ids = {mech: ids[f"dead-{mech}"] for mech in MECHS}
    for i in range(N_REF):
        _send_dead_producer_epochs(sc, sink, {m: queries[f"dead-{m}"][1] for m in MECHS}, range(i, i + 1), dead_ids)
        for qid, (mech, q, case) in queries.items():
            if qid.startswith("dead-") or (case is not None and i >= N_ATK):
                continue
            s = sc.sender(sink, q, mech, i, ids[qid])
            if case is not None and case.attacked(i):
                got = case.attack(sink, s)
                sc.expected_dead.setdefault(qid.rsplit("-", 1)[0], Counter()).update(got)
            else:
                _honest(sink, s)
    sink.close()
    assert sink.failed == 0, sink.failure_reasons
    want_rows = sum(ROWS[m] * (N_ATK if case is not None else N_REF) for m, _, case in queries.values())
    want_dead = sum(sum(c.values()) for c in sc.expected_dead.values())
    sc.worker = _start(ws, tmp, "shared")
    try:
        wait_for_estimates(ws, want_rows, 240, f"{want_rows} estimate records")
        wait_for(lambda: metric(sc.worker.metrics(), "ptt_dead_letters_total") >= want_dead, 60,
                 f"{want_dead} dead letters")
        want_windows = sum(N_ATK if case is not None else N_REF for _, _, case in queries.values())
        wait_for(lambda: metric(sc.worker.metrics(), "ptt_epochs_closed_total") >= want_windows, 60,
                 f"{want_windows} epochs closed and counted")
        sc.estimates = estimates_by_query(ws)
        sc.letters = dead_letter_origins(ws)
        sc.metrics = sc.worker.metrics()
        yield sc
    finally:
        sc.worker.stop()


def _withheld_by_code(text: str, qid: str) -> dict[str, float]:
    """ptt_withheld_epochs_total{query=qid} by reason code (codes never counted left out)."""
    from stream_app.worker.estimate import WITHHELD_CODES

    counts = {c: metric(text, "ptt_withheld_epochs_total", query=qid, reason=c) for c in WITHHELD_CODES}
    return {c: n for c, n in counts.items() if n}


def _rows(ws: WorkerSettings) -> int:
    """Estimate records on the estimates topic (the latest per key)."""
    return sum(len(v) for v in estimates_by_query(ws).values())


def _rows_at(count: EstimateCount, qid: str, epoch: int) -> int:
    """``sum(1 for k in estimates_by_query(ws).get(qid, {}) if k[0] == epoch)`` -- the rows of
    one query's epoch, across its versions, as the waits poll it -- from ``count`` (an
    :class:`EstimateCount` of ``ws``) read on as the topic fills: not the module's whole shared
    estimates topic read and validated again on every poll."""
    count()
    return len({(k[3], k[4]) for k in count.keys if k[0] == qid and k[2] == epoch})


def _assert_clean(sc: Scenario, ws: WorkerSettings, queries: dict[str, Query], last: int = N_REF - 1,
                  skip: frozenset[int] = frozenset()) -> None:
    """Every query's estimates (epochs in ``skip`` aside) equal the clean run's up to epoch index ``last``."""
    got = estimates_by_query(ws)
    for m, q in queries.items():
        mine = {k: _row(v) for k, v in got[q.query_id].items() if k[0] not in skip}
        clean = {k: _row(v) for k, v in sc.estimates[f"clean-{m}"].items() if k[0] <= sc.epoch(last)}
        assert mine == clean, f"{q.query_id} differs from the clean run"


def _withheld_count(text: str, qid: str) -> float:
    return sum(_withheld_by_code(text, qid).values())


# A restarted worker's waits have no fixed deadline: on 2 cores at load ~10 (two busy loops and
# other tests) the same steps took 2-3x longer than on a quiet machine, and its event loop ran
# one batch for 5-9 s (Faust's timers drifted as much) -- its /metrics page then did not answer
# within 5 s, which failed the test 4 runs in 5 although every step completed. A wait moves on
# while the worker does: it fails once the worker has neither read a record nor published an
# estimate for QUIET_S, which is 4x the longest pause its own rules make (an epoch the watermark
# passed waits watermark_idle_s = 20 s of its tick clock, ticks late by up to ~9 s under load).
QUIET_S = 120.0
CAP_S = 900.0  # a worker that keeps moving but never gets there


def _page(w: WorkerProcess) -> str | None:
    """The worker's /metrics page, or None while it is too busy to answer in time (its event
    loop runs a batch); a worker that has exited fails the test."""
    try:
        return w.metrics()
    except OSError:
        if w.proc is not None and w.proc.poll() is not None:
            raise AssertionError(f"the worker exited ({w.proc.returncode}):\n{w.log.read_text()[-3000:]}") from None
        return None


def _until(w: WorkerProcess, ws: WorkerSettings, done: Callable[[str | None], bool], what: str) -> None:
    """Until ``done(page)`` (``page``: the worker's /metrics, None when it did not answer in
    time): failed once the worker has gone QUIET_S without reading a record
    (``ptt_records_total``) or publishing an estimate (the estimates topic), or after CAP_S."""
    count = EstimateCount(ws)  # _rows(ws), read as the topic fills
    try:
        t0 = moved = time.monotonic()
        rows, records = count(), None
        while not done(page := _page(w)):
            now = time.monotonic()
            rows_now = count()
            records_now = None if page is None else metric(page, "ptt_records_total")
            if rows_now != rows or (records_now is not None and records_now != records):
                moved, rows, records = now, rows_now, records_now if records_now is not None else records
            stalled = now - moved > QUIET_S
            if stalled or now - t0 > CAP_S:
                why = f"nothing read or published for {QUIET_S:.0f} s" if stalled else f"not there after {CAP_S:.0f} s"
                raise AssertionError(f"waiting for {what}: {why} ({rows} estimate records)" + w.diagnosis())
            time.sleep(0.5)
    finally:
        count.close()


# -- the clean run itself ---------------------------------------------------------------------

def test_clean_run_matches_the_statistics_core(scenario: Scenario) -> None:
    """The reference every case is compared with is itself right."""
    sc = scenario
    for mech in MECHS:
        q = _query(sc.templates[mech], f"clean-{mech}")
        got = sc.estimates[q.query_id]
        assert len(got) == N_REF * ROWS[mech]
        for i in range(N_REF):
            for name, (values, bounds, n) in core_estimates(sc.templates[mech], sc.rs, sc.day, i, sc.fleet,
                                                            sc.ws.confidences).items():
                for j, station in enumerate(q.sensors):
                    e = got[(sc.epoch(i), station, name)]
                    assert e.withheld is None and e.participants == n and e.closed_by == "markers"
                    assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)
                    for b in e.bounds:
                        lo, hi = bounds[b.confidence]
                        assert (b.lower, b.upper) == pytest.approx((lo[j], hi[j]), rel=1e-12, abs=1e-9)
        assert _withheld_count(sc.metrics, q.query_id) == 0
    assert metric(sc.metrics, "ptt_dead_letters_total", reason="internal_error") == 0


# -- 3, 4, 5: forged markers, injected reports, counts near 2**63 ------------------------------

def _assert_case(sc: Scenario, name: str) -> None:
    case = CASES[name]
    withheld_epochs = 0
    for mech in case.mechanisms:
        qid = f"{name}-{mech}"
        got = sc.estimates[qid]
        assert len(got) == N_ATK * ROWS[mech], f"{qid}: {len(got)} estimate records"
        for i in range(N_ATK):
            clean = sc.clean(mech, i)
            mine = {k: _row(v) for k, v in got.items() if k[0] == sc.epoch(i)}
            assert mine.keys() == clean.keys()
            if case.expect == "withheld" and case.attacked(i):
                withheld_epochs += 1
                for k, e in got.items():
                    if k[0] == sc.epoch(i):
                        assert e.withheld and e.estimate is None and e.bounds == (), (qid, i, e)
            else:
                assert mine == clean, f"{qid} epoch index {i} differs from the clean run"
        counted = _withheld_by_code(sc.metrics, qid)
        texts = sorted({e.withheld for e in got.values() if e.withheld})
        if case.expect == "withheld":
            n = sum(1 for i in range(N_ATK) if case.attacked(i))
            # no other reason, no other epoch
            assert sum(counted.values()) == n and set(counted) <= case.codes, (qid, counted, texts)
        else:
            assert not counted, (qid, counted, texts)
    mine = Counter(r for r, q in sc.letters if q is not None and q.rsplit("-", 1)[0] == name)
    assert mine == sc.expected_dead.get(name, Counter()), (name, mine)
    for reason, n in mine.items():
        assert metric(sc.metrics, "ptt_dead_letters_total", reason=reason) >= n
    assert metric(sc.metrics, "ptt_dead_letters_total", reason="internal_error") == 0


@pytest.mark.parametrize("name", ["marker-100k-capped", "marker-100k-second-producer"])
def test_marker_claiming_100000_participants(scenario: Scenario, name: str) -> None:
    """Population 247: the marker is refused (bad_marker) and nothing changes. Population
    200,000: accepted as a second producer whose vehicles sent nothing -- the epoch is
    withheld as impossible (SP: round reports != participants; ALP/RR: counts inconsistent
    with the declared population)."""
    _assert_case(scenario, name)


def test_full_set_of_forged_markers_declaring_an_epoch_empty(scenario: Scenario) -> None:
    """The forged markers close the epoch ahead of its data: withheld (no participants, or
    the genuine data that slipped in exceeds what the markers declare, or the genuine markers
    conflict with the forged ones); the genuine records that come after are late."""
    _assert_case(scenario, "empty-epoch-markers")
    for mech in CASES["empty-epoch-markers"].mechanisms:
        assert metric(scenario.metrics, "ptt_late_records_total", query=f"empty-epoch-markers-{mech}") >= 1


def test_interrupted_marker_from_producer_0_for_slot_0(scenario: Scenario) -> None:
    _assert_case(scenario, "interrupted-slot0")


def test_marker_claiming_200000_producers(scenario: Scenario) -> None:
    _assert_case(scenario, "producer-count-200k")


@pytest.mark.parametrize("name", ["fake-sp-1000-one-batch", "fake-sp-1000-in-5-batches",
                                  "fake-sp-1000-large-population"])
def test_1000_fake_balanced_sp_reports_every_epoch(scenario: Scenario, name: str) -> None:
    """One forged batch of 1,000 reports exceeds the population (247): out_of_bounds. Split
    into batches of 200, or for a population of 5,000, they are counted -- and every epoch
    is withheld: more reports than the markers declare."""
    _assert_case(scenario, name)


@pytest.mark.parametrize("name", ["million-reports", "million-tally-large-population"])
def test_record_claiming_a_million_reports(scenario: Scenario, name: str) -> None:
    _assert_case(scenario, name)


def test_genuine_batches_resent_under_fresh_batch_ids(scenario: Scenario) -> None:
    _assert_case(scenario, "resent-batches")


def test_counts_near_2_63(scenario: Scenario) -> None:
    _assert_case(scenario, "huge-counts")
    assert scenario.worker.proc is not None and scenario.worker.proc.poll() is None  # no crash


# -- 1: worker restarts -------------------------------------------------------------------------

def test_worker_restarts_keep_the_watermark_and_the_estimates(broker: str, scenario: Scenario,
                                                             tmp_path: Path) -> None:
    """Live: r-* are genuine; d-* lose their producer in the middle of epoch DEAD_AT (about
    half of round 0 sent, no markers; a new producer process takes over from the next epoch).
    The worker is SIGKILLed (1) with the dead producer's epoch open, (2) in the middle of an
    epoch, (3) right after an epoch's markers, and restarted each time. r-* equal the clean
    run; d-* equal the same dead-producer data processed without restarts (the shared
    scenario) -- and the dead producer's epoch still closes, by the watermark kept across
    the restarts. The worker publishes rows and frames (``estimate_output="both"``): the
    frames, the latest per window, say exactly what the rows say, and a frame re-published
    after a restart is the same frame (docs/wire.md, "Estimate frames")."""
    sc = scenario
    rs, ws = pipeline_settings(broker, sc.tmp)
    ws = ws.model_copy(update={"estimate_output": "both", "frames_topic": f"frames-{uuid.uuid4().hex[:8]}"})
    queries = {f"{k}-{m}": _query(sc.templates[m], f"{k}-{m}") for k in ("r", "d") for m in MECHS}
    publish_queries(rs, list(queries.values()))
    ids = {qid: f"p0-{uuid.uuid4().hex[:8]}" for qid in queries}
    dead_ids = {m: ids[f"d-{m}"] for m in MECHS}
    sink = ReportSink(rs, rs.reports_topic)
    w = _start(ws, tmp_path, "first")

    def send_r(i: int, half: bool = False) -> list[EpochSender]:
        out = []
        for m in MECHS:
            s = sc.sender(sink, queries[f"r-{m}"], m, i, ids[f"r-{m}"])
            if half:
                s.batches(max(1, len(s.chunks) // 2))
            else:
                _honest(sink, s)
            out.append(s)
        return out

    seen = EstimateCount(ws)

    def published(qids: list[str], i: int) -> bool:
        return all(_rows_at(seen, q, sc.epoch(i)) == ROWS[q[2:]] for q in qids)

    def restart(name: str) -> WorkerProcess:
        w.kill()
        return _start(ws, tmp_path, name)

    try:
        d_queries = {m: queries[f"d-{m}"] for m in MECHS}
        for i in range(DEAD_AT + 1):
            send_r(i)
        want_dead = _send_dead_producer_epochs(sc, sink, d_queries, range(DEAD_AT + 1), dead_ids)
        sink.flush()
        r_ids = [f"r-{m}" for m in MECHS]
        _until(w, ws, lambda page: published(r_ids, DEAD_AT), "r-* of the dead producer's epoch")
        _until(w, ws, lambda page: page is not None and all(
            metric(page, "ptt_reports_total", query=f"d-{m}") >= want_dead[m] for m in MECHS),
            "the dead producer's partial epoch counted")
        w = restart("second")  # (1) the dead producer's epoch is open, with data and no markers

        send_r(DEAD_AT + 1)
        _send_dead_producer_epochs(sc, sink, d_queries, range(DEAD_AT + 1, DEAD_AT + 2), dead_ids)
        mid = DEAD_AT + 2
        halves = send_r(mid, half=True)
        d_half = [sc.sender(sink, q, m, mid, dead_ids[m]) for m, q in d_queries.items()]
        for s in d_half:
            s.batches(max(1, len(s.chunks) // 2))
        sink.flush()
        _until(w, ws, lambda page: published(r_ids + [f"d-{m}" for m in MECHS], DEAD_AT + 1), "the epoch after")
        _until(w, ws, lambda page: page is not None and all(
            metric(page, "ptt_newest_seen_epoch", query=q) >= sc.epoch(mid) for q in queries), "half an epoch counted")
        w = restart("third")  # (2) in the middle of an epoch

        for s in [*halves, *d_half]:
            s.batches()
            s.markers()
        for i in range(mid + 1, N_REF - 1):
            send_r(i)
            _send_dead_producer_epochs(sc, sink, d_queries, range(i, i + 1), dead_ids)
        sink.flush()
        _until(w, ws, lambda page: page is not None and
               metric(page, "ptt_last_closed_epoch", query="r-sp") >= sc.epoch(N_REF - 3),
               "progress before the third kill")
        w = restart("fourth")  # (3) right after the markers of the last epochs went out

        send_r(N_REF - 1)
        _send_dead_producer_epochs(sc, sink, d_queries, range(N_REF - 1, N_REF), dead_ids)
        sink.flush()
        total = N_REF * 2 * sum(ROWS.values())
        _until(w, ws, lambda page: seen() >= total, f"{total} estimates")
        text = w.metrics()
    finally:
        w.stop()
        sink.close()
        seen.close()
    assert sink.failed == 0, sink.failure_reasons
    got = estimates_by_query(ws)
    for m in MECHS:
        clean = {k: _row(v) for k, v in sc.estimates[f"clean-{m}"].items()}
        assert {k: _row(v) for k, v in got[f"r-{m}"].items()} == clean, f"r-{m} differs from the clean run"
        ref = {k: _row(v) for k, v in sc.estimates[f"dead-{m}"].items()}
        assert {k: _row(v) for k, v in got[f"d-{m}"].items()} == ref, f"d-{m} differs from the run without restarts"
        dead = [e for k, e in got[f"d-{m}"].items() if k[0] == sc.epoch(DEAD_AT)]
        assert dead and all(e.closed_by == "watermark" for e in dead)
        if m != "sp":  # per-sensor estimates need the participants only markers give
            assert all(e.withheld for e in dead)
    # a re-published estimate (a crash between publishing and writing state) is identical
    seen: dict[tuple[Any, ...], set[bytes]] = {}
    for rec in drain(ws, ws.estimates_topic, quiet_polls=2):
        e = Estimate.model_validate_json(rec.value)
        seen.setdefault((e.query_id, e.epoch, e.span_s, e.station, e.estimator), set()).add(
            repr(_row(e)).encode())
    assert all(len(v) == 1 for v in seen.values())
    assert metric(text, "ptt_dead_letters_total") == 0
    # the frames: per window, every frame published (re-published after a kill) decodes to the
    # same estimates, and the latest per window give exactly the rows
    framed: dict[bytes, set[tuple[Any, ...]]] = {}
    from_frames: dict[str, dict[tuple[int, int, str], tuple[Any, ...]]] = {}
    for rec in drain(ws, ws.frames_topic, quiet_polls=2):
        rows = [_row(e) for e in frame_estimates(decode_frame(rec.value))]
        framed.setdefault(rec.key, set()).add(tuple(rows))
        for e in frame_estimates(decode_frame(rec.value)):
            if e.span_s == 30:  # the epochs' (rollups are compared where they are made: tests of rollups)
                from_frames.setdefault(e.query_id, {})[(e.epoch, e.station, e.estimator)] = _row(e)
    assert all(len(v) == 1 for v in framed.values()), "a re-published frame differs"
    assert len(framed) == N_REF * 2 * len(MECHS)
    assert from_frames == {q: {k: _row(v) for k, v in rows.items()} for q, rows in got.items()}


# -- 2: forward-dated records ------------------------------------------------------------------

def test_forward_dated_markers_and_batches_are_refused(broker: str, scenario: Scenario, tmp_path: Path) -> None:
    """Live, after three genuine epochs (every stage-2 partition has a quorum): markers for
    the last 8 epochs of the query window and markers 140 epochs ahead, to every partition;
    batches 130, 500 and ~2,870 epochs ahead on one partition -> too_far_ahead. Batches 60
    epochs ahead on one partition are inside the horizon: counted in a window of their own
    that one partition cannot close. The genuine estimates equal the clean run's."""
    sc = scenario
    rs, ws = pipeline_settings(broker, sc.tmp)
    queries = {m: _query(sc.templates[m], f"fwd-{m}") for m in MECHS}
    parts = {(murmur2(WindowId(q.query_id, 1, sc.epoch(i)).key) & 0x7FFFFFFF) % ws.internal_partitions
             for q in queries.values() for i in range(3)}
    assert parts == set(range(ws.internal_partitions)), "precondition: every stage-2 partition has a window"
    publish_queries(rs, list(queries.values()))
    ids = {m: f"p0-{uuid.uuid4().hex[:8]}" for m in MECHS}
    sink = ReportSink(rs, rs.reports_topic)
    w = _start(ws, tmp_path, "fwd")
    n_epochs = 6
    try:
        def send(i: int) -> None:
            for m, q in queries.items():
                _honest(sink, sc.sender(sink, q, m, i, ids[m]))

        for i in range(3):
            send(i)
        sink.flush()
        wait_for_estimates(ws, 3 * sum(ROWS.values()), 120, "three genuine epochs")
        now = sc.epoch(2)
        refused = 0
        for q in queries.values():
            _, end = q.epoch_range()
            for epoch in [*range(end - 8, end), now + 140]:
                for r in range(q.n_rounds):
                    for p in sink.partitions:
                        sink.send(_bare_marker(q, epoch, r, p, participants=1), partition=p)
                        refused += 1
        sp = queries["sp"]
        for epoch in (now + 130, now + 500, sp.epoch_range()[1] - 1):
            sink.send(_batch(sp, epoch, 0, {"value": _balanced(sp, 50)}, 50), partition=0)
            refused += 1
        for _ in range(2):  # inside the horizon, one partition only
            sink.send(_batch(sp, now + 60, 0, {"value": _balanced(sp, 50)}, 50), partition=0)
        sink.flush()
        for i in range(3, n_epochs):
            send(i)
        sink.flush()
        wait_for_estimates(ws, n_epochs * sum(ROWS.values()), 120, "the genuine epochs")
        wait_for(lambda: metric(w.metrics(), "ptt_dead_letters_total", reason="too_far_ahead") >= refused, 60,
                 "too_far_ahead dead letters")
        text = w.metrics()
    finally:
        w.stop()
        sink.close()
    _assert_clean(sc, ws, queries, last=n_epochs - 1)
    assert all(_withheld_count(text, q.query_id) == 0 for q in queries.values())
    assert metric(text, "ptt_dead_letters_total", reason="too_far_ahead") == refused
    assert metric(text, "ptt_dead_letters_total") == refused
    letters = Counter(dead_letter_origins(ws))
    assert letters == Counter({("too_far_ahead", q.query_id): n for q, n in
                               [(queries["sp"], 9 * 2 * 3 + 3), (queries["alp"], 9 * 3), (queries["rr"], 9 * 3)]})
    assert metric(text, "ptt_late_records_total") == 0


def test_markers_190_epochs_ahead_erase_nothing(broker: str, scenario: Scenario, tmp_path: Path) -> None:
    """Live, in the middle of epoch 3 (half its batches sent): a full set of well-formed
    markers for epoch 3 + 190 -- inside the 720-epoch horizon -- from every partition, every
    round, for every query. The watermark jumps 190 epochs. Before, the epochs whose data was
    still arriving were then "too old": counted late, never published, no withheld record.
    Now every genuine epoch is published and equal to the clean run (its data keeps its
    window open until its markers complete it), none is counted late, and the forged epoch
    gets an outcome of its own."""
    sc = scenario
    rs, ws = pipeline_settings(broker, sc.tmp)
    ws = ws.model_copy(update={"horizon_epochs": 720})  # the product's horizon: +190 is inside it
    queries = {m: _query(sc.templates[m], f"ahead-{m}") for m in MECHS}
    publish_queries(rs, list(queries.values()))
    ids = {m: f"p0-{uuid.uuid4().hex[:8]}" for m in MECHS}
    sink = ReportSink(rs, rs.reports_topic)
    w = _start(ws, tmp_path, "ahead")
    forged_at = 3
    forged = sc.epoch(forged_at) + 190
    try:
        for i in range(forged_at):
            for m, q in queries.items():
                _honest(sink, sc.sender(sink, q, m, i, ids[m]))
        sink.flush()
        wait_for_estimates(ws, forged_at * sum(ROWS.values()), 120, "the epochs before the attack")
        halves = [sc.sender(sink, q, m, forged_at, ids[m]) for m, q in queries.items()]
        for h in halves:
            h.batches(max(1, len(h.chunks) // 2))
        sink.flush()
        wait_for(lambda: all(metric(w.metrics(), "ptt_newest_seen_epoch", query=q.query_id) >= sc.epoch(forged_at)
                             for q in queries.values()), 60, "half of the attacked epoch counted")
        for q in queries.values():
            for r in range(q.n_rounds):
                for p in sink.partitions:
                    sink.send(_bare_marker(q, forged, r, p, participants=1), partition=p)
        sink.flush()
        wait_for(lambda: all(metric(w.metrics(), "ptt_newest_seen_epoch", query=q.query_id) >= forged
                             for q in queries.values()), 60, "the forged markers counted")
        for h in halves:
            _honest(sink, h)
        for i in range(forged_at + 1, N_REF):
            for m, q in queries.items():
                _honest(sink, sc.sender(sink, q, m, i, ids[m]))
        sink.flush()
        wait_for_estimates(ws, N_REF * sum(ROWS.values()), 180, "every genuine epoch")
        text = w.metrics()
    finally:
        w.stop()
        sink.close()
    _assert_clean(sc, ws, queries, skip=frozenset({forged}))
    got = estimates_by_query(ws)
    assert all({k[0] for k in got[q.query_id]} == {sc.epoch(i) for i in range(N_REF)} | {forged}
               for q in queries.values())
    assert metric(text, "ptt_late_records_total") == 0


# -- 6: start-up race and a flood of unknown queries -------------------------------------------

def test_query_published_35ms_before_its_first_batch(scenario: Scenario) -> None:
    """With the worker running, a new query is published and its genuine data follows 35 ms
    later: counted (no unknown_query letter) and equal to the clean value."""
    sc = scenario
    i = LIVE["race"]
    q = _query(sc.templates["sp"], "race-sp")
    clean_q = _query(sc.templates["sp"], "clean-sp")
    before = metric(sc.worker.metrics(), "ptt_dead_letters_total", reason="unknown_query")
    sink = ReportSink(sc.rs, sc.rs.reports_topic)
    try:
        race = sc.sender(sink, q, "sp", i, f"p0-{uuid.uuid4().hex[:8]}")
        clean = sc.sender(sink, clean_q, "sp", i, f"p0-{uuid.uuid4().hex[:8]}")
        publish_queries(sc.rs, [q])
        time.sleep(0.035)  # the race itself, not a wait for a condition
        race.batches(1)
        sink.flush()
        race.batches()
        race.markers()
        _honest(sink, clean)
    finally:
        sink.close()

    seen = EstimateCount(sc.ws)
    try:
        wait_for(lambda: all(_rows_at(seen, x, sc.epoch(i)) == ROWS["sp"] for x in ("race-sp", "clean-sp")), 60,
                 "the race epoch")
    finally:
        seen.close()
    est = estimates_by_query(sc.ws)
    assert {k: _row(v) for k, v in est["race-sp"].items()} == \
        {k: _row(v) for k, v in est["clean-sp"].items() if k[0] == sc.epoch(i)}
    assert all(e.withheld is None for e in est["race-sp"].values())
    assert metric(sc.worker.metrics(), "ptt_dead_letters_total", reason="unknown_query") == before


def test_backlog_before_its_query_loses_no_epoch(broker: str, scenario: Scenario, tmp_path: Path) -> None:
    """The start-up race: a backlog of every reference epoch waits on the reports topic for
    queries that are published only once a fresh worker is serving. Stage 1 holds the records
    while the query cache fills (in its reader thread, possibly in the middle of a batch); no
    later epoch may overtake an earlier one of its partition, so no epoch is lost: all are
    published, equal to the clean run, with no late record and no dead letter."""
    sc = scenario
    rs, ws = pipeline_settings(broker, sc.tmp)
    queries = {m: _query(sc.templates[m], f"backlog-{m}") for m in MECHS}
    ids = {m: f"p0-{uuid.uuid4().hex[:8]}" for m in MECHS}
    ensure_topics(rs)
    sink = ReportSink(rs, rs.reports_topic)
    try:
        for i in range(N_REF):
            for m, q in queries.items():
                _honest(sink, sc.sender(sink, q, m, i, ids[m]))
        sink.flush()
    finally:
        sink.close()
    w = _start(ws, tmp_path, "backlog")
    try:
        publish_queries(rs, list(queries.values()))

        wait_for_estimates(ws, N_REF * sum(ROWS.values()), 180, "every epoch of the backlog")
        text = w.metrics()
    finally:
        w.stop()
    _assert_clean(sc, ws, queries)
    assert metric(text, "ptt_late_records_total") == 0
    assert metric(text, "ptt_dead_letters_total") == 0


def test_flood_of_300_unknown_queries(scenario: Scenario) -> None:
    """300 records naming 300 queries nobody published, then a genuine epoch: the 300 are
    dead-lettered as unknown_query within 60 s, and the genuine epoch is published (equal to
    the statistics core) meanwhile or right after."""
    sc = scenario
    i = LIVE["flood"]
    before = metric(sc.worker.metrics(), "ptt_dead_letters_total", reason="unknown_query")
    sp = sc.templates["sp"]
    sink = ReportSink(sc.rs, sc.rs.reports_topic)
    started = time.monotonic()
    try:
        for k in range(300):
            ghost = _query(sp, f"ghost-{k:03d}")
            _send_keyed(sink, _batch(ghost, sc.epoch(i), 0, {"value": _balanced(ghost, 5)}, 5))
        for m in ("sp", "alp"):
            _honest(sink, sc.sender(sink, _query(sc.templates[m], f"clean-{m}"), m, i, f"p0-{uuid.uuid4().hex[:8]}"))
    finally:
        sink.close()
    timings: dict[str, float] = {}

    def flood_done() -> bool:
        done = metric(sc.worker.metrics(), "ptt_dead_letters_total", reason="unknown_query") - before >= 300
        if done:
            timings.setdefault("flood", time.monotonic() - started)
        return done

    seen = EstimateCount(sc.ws)

    def genuine_done() -> bool:
        done = all(_rows_at(seen, f"clean-{m}", sc.epoch(i)) == ROWS[m] for m in ("sp", "alp"))
        if done:
            timings.setdefault("genuine", time.monotonic() - started)
        return done

    try:
        wait_for(lambda: flood_done() and genuine_done(), 90,
                 "the flood dead-lettered and the genuine epoch published")
    finally:
        seen.close()
    assert timings["flood"] < 60, timings
    assert timings["genuine"] < 60, timings
    assert metric(sc.worker.metrics(), "ptt_dead_letters_total", reason="unknown_query") - before == 300
    ghosts = Counter(q for r, q in dead_letter_origins(sc.ws) if r == "unknown_query")
    assert len(ghosts) == 300 and set(ghosts.values()) == {1}
    est = estimates_by_query(sc.ws)
    for m in ("sp", "alp"):
        q = _query(sc.templates[m], f"clean-{m}")
        for name, (values, _, n) in core_estimates(sc.templates[m], sc.rs, sc.day, i, sc.fleet,
                                                   sc.ws.confidences).items():
            for j, station in enumerate(q.sensors):
                e = est[q.query_id][(sc.epoch(i), station, name)]
                assert e.withheld is None and e.participants == n
                assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)


# -- 3 (variant): a forged complete marker set in the middle of an epoch ------------------------

@pytest.mark.parametrize("mech", ["alp", "rr"])
def test_forged_marker_set_in_the_middle_of_an_epoch(scenario: Scenario, mech: str) -> None:
    """A writer watching the reports topic copies the genuine producer's id and, after its
    first batch of a per-sensor query, sends the markers that producer would send if it
    stopped there (every partition, the true participants, the batches seen so far). The set
    is complete, so the epoch closes on it; the rest of the genuine batches and the genuine
    markers arrive late. The genuine markers contradict the forged ones: the epoch's estimates
    are withdrawn (re-published as withheld, ``conflicting_markers``), so what stands never
    differs from the clean run."""
    sc = scenario
    i = LIVE[f"midset-{mech}"]
    q = _query(sc.templates[mech], f"midset-{mech}")
    publish_queries(sc.rs, [q])
    sink = ReportSink(sc.rs, sc.rs.reports_topic)
    epoch = sc.epoch(i)

    seen = EstimateCount(sc.ws)

    def published(qid: str) -> bool:
        return _rows_at(seen, qid, epoch) == ROWS[mech]

    try:
        try:
            s = sc.sender(sink, q, mech, i, f"p0-{uuid.uuid4().hex[:8]}")
            assert len(s.chunks) >= 2
            s.batches(1)
            sink.flush()
            wait_for(lambda: metric(sc.worker.metrics(), "ptt_reports_total", query=q.query_id) >= s.sent_reports(), 60,
                     "the first batch counted")
            s.markers()  # forged: what the genuine producer would declare had it stopped here
            sink.flush()
            wait_for(lambda: published(q.query_id), 60, "the epoch closed on the forged markers")
            s.batches()  # the genuine producer carries on: late
            s.markers()
            _honest(sink, sc.sender(sink, _query(sc.templates[mech], f"clean-{mech}"), mech, i,
                                    f"p0-{uuid.uuid4().hex[:8]}"))
        finally:
            sink.close()
        wait_for(lambda: published(f"clean-{mech}"), 60, "the clean epoch")
    finally:
        seen.close()
    wait_for(lambda: metric(sc.worker.metrics(), "ptt_late_records_total", query=q.query_id) >= 1, 60, "late records")
    wait_for(lambda: _withheld_count(sc.worker.metrics(), q.query_id) >= 1, 60, "the withdrawal")
    est = estimates_by_query(sc.ws)
    clean = {k: _row(v) for k, v in est[f"clean-{mech}"].items() if k[0] == epoch}
    mine = {k: _row(v) for k, v in est[q.query_id].items() if k[0] == epoch}
    withheld = all(e.withheld for k, e in est[q.query_id].items() if k[0] == epoch)
    assert withheld or mine == clean, "published estimates differ from the clean run (silently wrong)"
    if withheld:
        assert _withheld_count(sc.worker.metrics(), q.query_id) == 1
