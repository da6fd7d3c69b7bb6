"""The anonymizing shuffler (``ptt shuffler``) with a real broker, real shuffler and worker processes:
device reports in, the existing exact-tally batches (``--release aggregate``, the default) or
columnar batches (``--release permuted``) and markers out, estimates as without it."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.partitioner.default import murmur2
from prometheus_client.parser import text_string_to_metric_families

from estimators import Pairs, Values, get_spec, privacy
from estimators.reports import round_from_arrays
from producers.replay import fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from schemas import (
    DecodedBatch,
    DeviceReport,
    EndOfEpochSet,
    Query,
    SourceEpoch,
    decode_device_record,
    decode_record,
)
from schemas.estimates import DeadLetter
from schemas.kafka_io import ensure_topics, publish_query, read_queries
from stream_app.cli.local_broker import free_port
from stream_app.settings import WorkerSettings
from stream_app.shuffler.settings import ShufflerSettings
from stream_app.shuffler.state import decided_key, fold, from_kafka
from tests.devices import signed_json, signed_note

from .kafka_helpers import drain
from .stream_helpers import (
    DIRECT_DEMO_GROUP,
    WorkerProcess,
    core_estimates,
    demo_estimates,
    direct_demo_estimates,
    env_for,
    pipeline_settings,
    read_estimates,
    wait_for,
    wait_for_estimates,
)
from .test_dashboards import Prometheus

pytestmark = pytest.mark.integration

ESTIMATORS_PER_QUERY = {"sp": 1, "alp": 4, "rr": 1, "unary": 1}
RELEASES = ("aggregate", "permuted")


class ShufflerProcess:
    """``ptt shuffler`` in a subprocess, its output in a log file."""

    def __init__(self, settings: ShufflerSettings, log: Path, *extra: str) -> None:
        self.settings = settings
        self.log = log
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ShufflerProcess:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "shuffler", *self.extra],  # noqa: S603
                                         env=env_for(self.settings), stdout=fh, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def started(self) -> bool:
        """It has said what it reads (its signal handlers are installed by then)."""
        return "shuffler " in self.log.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM once it has started; its exit code (SIGKILL if it does not end within 60 s)."""
        assert self.proc is not None
        try:
            wait_for(lambda: self.started() or self.proc is None or self.proc.poll() is not None, 30,
                     "the shuffler to start")
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.kill()


def _shuffler_settings(rs: ReplaySettings, ws: WorkerSettings, **kw: Any) -> ShufflerSettings:
    base = {"min_crowd": 1, "idle_release_s": 2.0, "partitions": rs.partitions, "metrics_port": free_port(), **kw}
    return ShufflerSettings(**{**rs.model_dump(include=set(ShufflerSettings.model_fields)), **base},
                            shuffler_id=f"shuf-{uuid.uuid4().hex[:8]}", dead_letter_topic=ws.dead_letter_topic)


def _setup(broker: str, tmp: Path, epochs: int, *, query_mechanisms: str = "sp,alp,rr", **shuffler_kw: Any
           ) -> tuple[ReplaySettings, WorkerSettings, ShufflerSettings]:
    rs, ws = pipeline_settings(broker, tmp, max_epochs=epochs, query_mechanisms=query_mechanisms)
    rs = rs.model_copy(update={"via_shuffler": True, "device_topic": f"devices-{uuid.uuid4().hex[:8]}",
                               "device_partitions": 3})
    return rs, ws, _shuffler_settings(rs, ws, **shuffler_kw)


def _expected_rows(rs: ReplaySettings, epochs: int) -> int:
    return epochs * sum(ESTIMATORS_PER_QUERY[q.mechanism] * q.n_stations for q in read_queries(rs))


def _assert_cores_estimates(rs: ReplaySettings, ws: WorkerSettings, epochs: int, *, bounds: bool) -> None:
    """Every published estimate of the first ``epochs`` epochs is the statistics core's, from
    the same seeded fleet (and its bounds, with ``bounds``), closed by markers with the core's N."""
    got = read_estimates(ws)
    day = load_day(rs)
    fleet = fleet_size_for(day, rs)
    for q in read_queries(rs):
        for i in range(epochs):
            for name, (values, core_bounds, n) in core_estimates(q, rs, day, i, fleet, ws.confidences).items():
                for j, station in enumerate(q.sensors):
                    e = got[(q.query_id, q.version, int(day.epochs[i]), station, name)]
                    assert e.withheld is None and e.closed_by == "markers" and e.participants == n, e
                    assert e.estimate == pytest.approx(values[j], rel=1e-12, abs=1e-9)
                    for b in e.bounds if bounds else ():
                        lo, hi = core_bounds[b.confidence]
                        assert (b.lower, b.upper) == pytest.approx((lo[j], hi[j]), rel=1e-12, abs=1e-9)


def _assert_shuffled_epsilon(rs: ReplaySettings, ws: WorkerSettings, release: str) -> int:
    """Every estimate carries the shuffled epsilon of its epoch: the spec's for ``release`` at n,
    the reports the (one) shuffler mixed per round -- every participant's, in each round --
    rounded DOWN to 2 significant digits; non-null (the shuffler attests) wherever the spec's
    value is finite; and says which release it was. Returns how many estimates were checked."""
    queries = {(q.query_id, q.version): q for q in read_queries(rs)}
    checked = finite = 0
    for e in read_estimates(ws).values():
        q = queries[(e.query_id, e.query_version)]
        n = e.participants
        rounded = n if n < 100 else n - n % 10 ** (len(str(n)) - 2)
        want = q.spec.shuffled_epsilon(q.build(), q.n_stations, rounded, ws.shuffle_delta, release=release)
        # null where the spec has no bound (Sampling Privacy: its rounds share one die), else the spec's value
        assert e.epsilon_shuffled == (want if math.isfinite(want) else None) and e.release == release, (e, want)
        checked += 1
        finite += math.isfinite(want)
    assert finite > 0, "no estimate with a shuffled bound was checked"
    return checked


def _replay_until_estimated(rs: ReplaySettings, ws: WorkerSettings, worker: WorkerProcess, epochs: int) -> None:
    """Once the worker is ready, replay ``epochs`` and wait for every estimate they imply."""
    worker.wait_ready()
    summary = replay(rs, progress=False)
    assert summary.epochs == epochs
    n_rows = _expected_rows(rs, epochs)
    wait_for_estimates(ws, n_rows, 120)


@pytest.mark.parametrize("release", RELEASES)
def test_device_reports_through_the_shuffler_give_the_cores_estimates(broker: str, tmp_path: Path,
                                                                      release: str) -> None:
    """Every simulated vehicle's report as its own record, through the shuffler, under either
    release: the worker publishes, for SP, ALP, RR and unary RR, exactly what the statistics core
    computes from the same seeded fleet (so what the same replay gives without the shuffler),
    closed by the shuffler's markers and not withheld, with the release's shuffled epsilon;
    nothing on the reports topic links a report to its device. Unary RR's and RR's device
    reports travel as bitmaps over the query's stations (smaller than their pairs at 6
    stations), SP's and ALP's not."""
    epochs = 3
    rs, ws, ss = _setup(broker, tmp_path, epochs, query_mechanisms="sp,alp,rr,unary", release=release)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        _replay_until_estimated(rs, ws, worker, epochs)
        _assert_nothing_links(ss)
        _assert_unary_sent_as_bitmaps(ss)
        assert [DeadLetter.model_validate_json(r.value) for r in drain(ws, ws.dead_letter_topic, quiet_polls=1)] == []
        _assert_cores_estimates(rs, ws, epochs, bounds=True)
        assert _assert_shuffled_epsilon(rs, ws, release) == _expected_rows(rs, epochs)
    finally:
        worker.stop()
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


def _assert_unary_sent_as_bitmaps(ss: ShufflerSettings) -> None:
    """Every device report of a per-sensor query with outputs {0, 1} and default 0 (unary RR,
    RR) on the device topic is a bitmap over its query's stations (the binary layout's
    ``bitmap`` form: smaller than their pairs at 6 stations), and no other query's is."""
    queries = {(q.query_id, q.version): q for q in read_queries(ss)}
    forms: Counter[tuple[str, int | None]] = Counter()
    for rec in drain(ss, ss.device_topic):
        if rec.key is None and not rec.headers:  # a device report (no key, no header)
            d = decode_device_record(rec.value)
            assert isinstance(d, DeviceReport)
            q = queries[(d.query_id, d.query_version)]
            binary = q.per_station is not None and q.n_outputs == 2 and q.default_report == 0
            assert d.bitmap_stations == (q.n_stations if binary else None), (q.mechanism, d)
            forms[(q.mechanism, d.bitmap_stations)] += 1
    assert forms[("unary", 6)] > 100 and forms[("rr", 6)] > 100 and forms[("alp", None)] > 100, forms


def _assert_nothing_links(ss: ShufflerSettings) -> None:
    """Drained from the broker: device records carry no key and no header (nothing a device
    sets beside its report); batches are
    keyed by their (fresh, distinct) batch ids and markers by the shuffler's producer id; the
    only header is the kind; every record of an epoch carries the same timestamp, the epoch's
    end (arrival times do not survive); the partitions of batches are their keys' hash; markers
    name the shuffler's release. The aggregate release writes one tally per (query, version,
    epoch, round) equal to the counts of the device reports sent for it (the worker's registry
    completes both to the same per-station counts): a function of the multiset of reports, so
    nothing in it can tell which device sent what."""
    device = drain(ss, ss.device_topic)
    assert len(device) > 100 and all(r.key is None and not r.headers for r in device)  # nothing beside the report
    batches, markers = _drain_decoded(ss)
    ids = [b.header.batch_id for _, b in batches]
    assert len(set(ids)) == len(ids)
    kind = "tally" if ss.release == "aggregate" else "reports"
    for rec, b in batches:
        assert rec.key == b.header.batch_id.encode()
        assert rec.headers == [("ptt-kind", kind.encode())] and b.header.kind == kind
        assert rec.timestamp == (b.header.epoch + 1) * 30_000
        assert rec.partition == (murmur2(rec.key) & 0x7FFFFFFF) % ss.partitions
    for rec, m in markers:
        assert rec.key == f"eoe-{ss.transactional_id}".encode()
        assert rec.headers == [("ptt-kind", b"end_of_epoch")]
        assert {rec.timestamp} == {(x.epoch + 1) * 30_000 for x in m.markers}
        assert {x.release for x in m.markers} == {ss.release}
    if ss.release != "aggregate":
        return
    queries = {(q.query_id, q.version): q for q in read_queries(ss)}
    sent: dict[tuple[str, int, int, int], list[DeviceReport]] = {}
    for rec in device:
        if rec.key is None and not rec.headers:  # a device report (no key, no header)
            d = decode_device_record(rec.value)
            assert isinstance(d, DeviceReport)
            sent.setdefault((d.query_id, d.query_version, d.epoch, d.round), []).append(d)
    released = Counter((b.header.query_id, b.header.query_version, b.header.epoch, b.header.round) for _, b in batches)
    assert set(released) == set(sent) and set(released.values()) == {1}
    for _, b in batches:
        h = b.header
        q = queries[(h.query_id, h.query_version)]
        mech, spec, reports = q.build(), q.spec, sent[(h.query_id, h.query_version, h.epoch, h.round)]
        assert h.reports == len(reports)
        if q.per_station is None:
            want = spec.accumulate(mech, q.n_stations, Values(np.array([d.value for d in reports])))
        else:
            pairs = np.array([p for d in reports for p in d.pairs or ()], dtype=np.int64).reshape(-1, 2)
            want = spec.accumulate(mech, q.n_stations, Pairs(pairs[:, 0], pairs[:, 1]))
            table = want.reshape(q.n_stations, mech.n_outputs)  # the devices without a pair: the default report
            table[:, spec.default_report(mech)] += len(reports) - table.sum(axis=1)
        assert np.array_equal(spec.accumulate(mech, q.n_stations, round_from_arrays("counts", b.arrays, h.reports)),
                              want), h


def _drain_decoded(s: ShufflerSettings) -> tuple[list[tuple[Any, DecodedBatch]], list[tuple[Any, EndOfEpochSet]]]:
    batches, markers = [], []
    for rec in drain(s, s.reports_topic, quiet_polls=2):
        item = decode_record(rec.value)
        if isinstance(item, DecodedBatch):
            batches.append((rec, item))
        else:
            assert isinstance(item, EndOfEpochSet), item
            markers.append((rec, item))
    return batches, markers


def _hand_fed_query(ss: ShufflerSettings, query_id: str, device_partitions: int) -> Query:
    """The topics and a published two-station SP query (population 60) for device reports a
    test writes itself."""
    ensure_topics(ss, {ss.device_topic: device_partitions, ss.reports_topic: ss.partitions, ss.queries_topic: 1,
                       ss.dead_letter_topic: 1})
    t0 = datetime(2026, 11, 18, tzinfo=UTC)
    q = Query(query_id=query_id, analyst_id="a", version=1, mechanism="sp", sensors=(400001, 400002),
              population=60, t_start=t0, t_end=t0 + timedelta(days=1))
    publish_query(ss, q)
    return q


def _send_notes(ss: ShufflerSettings, first: int, last: int) -> None:
    """A replay's source notes (the shuffler's trusted clock): it begins with ``first`` and
    has finished every epoch up to ``last``.

    They vouch for no device-topic offsets (the reports are written before them, not between
    them as a replay's are), so an epoch ``lateness_epochs`` behind the newest note counts as read
    the moment the notes are: the shuffler could decide it before it has read the reports already
    there, as it did once in CI (a crowd withheld as ``no_reports``). Hence the check: with
    ``lateness_epochs`` above ``last - first`` every epoch waits for the end-of-input rule, which
    holds until every device partition is read to its end."""
    if ss.lateness_epochs <= last - first:
        raise ValueError(f"lateness_epochs {ss.lateness_epochs} <= {last - first}: epochs these notes pass "
                         "could be decided before the reports already written are read (set it higher)")
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    ensure_topics(ss, {ss.source_topic: 1})
    notes = [SourceEpoch(epoch=first, opens=True)] + [SourceEpoch(epoch=e) for e in range(first, last + 1)]
    for note in notes:
        producer.send(ss.source_topic, key=b"source-epoch", value=signed_note(note), partition=0)
    producer.flush()
    producer.close()


@pytest.mark.parametrize("release", RELEASES)
def test_bad_device_records_are_dead_lettered_small_crowds_withheld_order_permuted(broker: str, tmp_path: Path,
                                                                                   release: str) -> None:
    """Hand-made device records on a one-partition device topic: every bad one is dead-lettered
    with its reason and the good ones behind it still count; a slot takes at most the query's
    population; an epoch with fewer than min_crowd reports in a round is withheld under either
    release (a dead letter ``below_min_crowd``; on the reports topic no batch of it, only markers
    attesting nothing -- 0 reports and participants, no shuffle size -- with the reason); the released
    epoch is, permuted, a permutation of what was sent, neither in the order sent nor sorted
    (either by chance with probability below 1e-26: 60 values, 20 of each of 3 kinds, in one
    given order) -- or, aggregate, one tally per round holding exactly its counts -- and the
    markers count its devices."""
    rs, ws, ss = _setup(broker, tmp_path, 1, min_crowd=3, device_partitions=1, metrics_port=free_port(),
                        release=release)
    ss = ss.model_copy(update={"device_partitions": 1})
    q = _hand_fed_query(ss, "q-crowd", 1)
    first = q.epoch_range()[0]
    released, small = first + 1, first + 2

    def rep(epoch: int, rnd: int, value: int, device: int) -> bytes:  # an enrolled device's (tests/devices.py)
        return signed_json(DeviceReport(query_id="q-crowd", query_version=1, epoch=epoch, round=rnd, value=value),
                           device)

    sent_order = [i % 3 for i in range(60)]
    values: list[bytes] = [b"\x00garbage", b'{"kind": "device_report"}', rep(released, 0, 7, 1000),
                           signed_json(DeviceReport(query_id="nobody", query_version=1, epoch=released, value=1), 1),
                           signed_json(DeviceReport(query_id="q-crowd", query_version=1, epoch=released,
                                                    pairs=((1, 1),)), 1001),
                           rep(released, 2 - 1, 1, 1002)[:-1] + b"x"]
    values += [rep(released, r, v, d) for r in (0, 1) for d, v in enumerate(sent_order)]
    values += [rep(released, 0, 1, 60)]  # the 61st report of a slot of population 60
    values += [rep(small, r, 1, d) for r in (0, 1) for d in range(2)]
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for v in values:
        producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=v)
    producer.flush()
    producer.close()
    _send_notes(ss, released, small)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    try:
        wanted = Counter({"bad_encoding": 1, "bad_json_record": 2, "out_of_range": 1, "unknown_query": 1,
                          "wrong_layout": 1, "slot_full": 1, "below_min_crowd": 1})

        def letters() -> Counter[str]:
            return Counter(DeadLetter.model_validate_json(r.value).reason
                           for r in drain(ss, ss.dead_letter_topic, quiet_polls=1))

        wait_for(lambda: letters() == wanted and len(_drain_decoded(ss)[1]) == 2 * ss.partitions, 60,
                 f"dead letters {dict(wanted)} and the released and withheld epochs' markers")
        withheld = [DeadLetter.model_validate_json(r.value) for r in drain(ss, ss.dead_letter_topic, quiet_polls=1)
                    if r.key == b"below_min_crowd"]
        assert f"epoch {small}" in withheld[0].detail and "[2, 2]" in withheld[0].detail
        batches, markers = _drain_decoded(ss)
        assert {b.header.epoch for _, b in batches} == {released}
        for rnd in (0, 1):
            mine = [b for _, b in batches if b.header.round == rnd]
            if release == "aggregate":
                assert len(mine) == 1 and mine[0].header.reports == 60
                assert mine[0].arrays["counts"].tolist() == np.bincount(sent_order, minlength=3).tolist()
                continue
            got = [int(x) for b in mine for x in b.arrays["value"]]
            assert sorted(got) == sorted(sent_order)
            assert got != sent_order and got != sorted(sent_order)  # neither arrival order nor sorted
        assert {(x.epoch, x.participants, x.reports_total, x.shuffle_size, x.release, x.withheld) for _, m in markers
                for x in m.markers} == {(released, 60, 60, 60, release, None),
                                        (small, 0, 0, None, None, "below_min_crowd")}
        # of the withheld epoch, only markers attesting nothing: not how many it held
        assert {(x.round, x.batches_total, x.reports_to_partition) for _, m in markers for x in m.markers
                if x.epoch == small} == {(0, 0, 0), (1, 0, 0)}
        # its /metrics, scraped: what it read, released, refused and withheld, per committed step
        letters_wanted = {k: v for k, v in wanted.items() if k != "below_min_crowd"}
        got = _scrape_when(ss, lambda g: g.get(("ptt_shuffler_withheld_epochs_total", (("reason", "below_min_crowd"),)))
                           == 1 and g.get(("ptt_shuffler_records_total", (("kind", "device_report"),))) == len(values))
        assert got["ptt_shuffler_records_total", (("kind", "device_report"),)] == len(values)
        assert {dict(k[1])["reason"]: v for k, v in got.items()
                if k[0] == "ptt_shuffler_dead_letters_total" and v} == letters_wanted
        assert got["ptt_shuffler_withheld_epochs_total", (("reason", "below_min_crowd"),)] == 1
        assert got["ptt_shuffler_below_min_crowd_slots_total", ()] == 2
        assert got["ptt_shuffler_released_epochs_total", ()] == 1
        assert got["ptt_shuffler_released_reports_total", ()] == 120
        assert got["ptt_shuffler_last_released_epoch", ()] == released
        assert got["ptt_shuffler_transactions_total", (("outcome", "committed"),)] >= 1
        assert got["ptt_shuffler_transactions_total", (("outcome", "aborted"),)] == 0
        assert got["ptt_shuffler_held_reports", ()] == 0
        # no label but the fixed codes: nothing that could name or link a vehicle
        assert {name for k in got if k[0].startswith("ptt_shuffler") for name, _ in k[1]} <= {
            "kind", "reason", "outcome"}
        binary = shutil.which("prometheus")
        if binary is not None:  # a real Prometheus scrapes it (as the demo's does)
            (tmp_path / "prom").mkdir()
            prom = Prometheus(tmp_path / "prom", [f"127.0.0.1:{ss.metrics_port}"], binary).start()
            try:
                def scraped(expr: str) -> float | None:
                    got = prom.query(expr)
                    return float(got[0]["value"][1]) if got else None

                wait_for(lambda: scraped("ptt_shuffler_released_reports_total") == 120, 60,
                         "Prometheus to scrape the shuffler")
                assert scraped('sum(ptt_shuffler_dead_letters_total)') == sum(letters_wanted.values())
                assert scraped("ptt_shuffler_last_released_epoch") == released
            finally:
                prom.stop()
    finally:
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


@pytest.mark.parametrize("release", RELEASES)
def test_an_epoch_the_shuffler_withholds_ends_as_withheld_rows_with_its_reason(broker: str, tmp_path: Path,
                                                                               release: str) -> None:
    """Issue 24, item 4 on the shuffler path: of three epochs the replay's notes pass, one holds a
    crowd (published), one nobody reported for and one holds 2 reports per round under min_crowd
    3. Under either release the worker publishes a row for every station of each: the first
    estimated, the other two withheld with the shuffler's reason (``no_reports``,
    ``below_min_crowd``) and 0 participants -- never absent, never estimated."""
    rs, ws, ss = _setup(broker, tmp_path, 1, min_crowd=3, device_partitions=1, release=release,
                        lateness_epochs=3)
    ss = ss.model_copy(update={"device_partitions": 1})
    q = _hand_fed_query(ss, "q-held", 1)
    crowd, nobody, small = (q.epoch_range()[0] + i for i in (1, 2, 3))
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for epoch, n in ((crowd, 30), (small, 2)):
        for r in (0, 1):
            for i in range(n):
                producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=signed_json(DeviceReport(
                    query_id="q-held", query_version=1, epoch=epoch, round=r, value=i % 3), i))
    producer.flush()
    producer.close()
    _send_notes(ss, crowd, small)
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    try:
        worker.wait_ready()
        wait_for_estimates(ws, 3 * len(q.sensors), 90, "a row per station of 3 epochs")
        rows = {(e.epoch, e.station): e for e in read_estimates(ws).values()}
        assert set(rows) == {(e, s) for e in (crowd, nobody, small) for s in q.sensors}
        for s in q.sensors:
            assert rows[crowd, s].withheld is None and rows[crowd, s].participants == 30
            for epoch, reason in ((nobody, "no_reports"), (small, "below_min_crowd")):
                e = rows[epoch, s]
                assert e.withheld is not None and e.withheld.startswith(reason), e
                assert e.estimate is None and e.participants == 0 and e.epsilon_shuffled is None, e
    finally:
        worker.stop()
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(ss: ShufflerSettings) -> Scraped:
    """The shuffler's /metrics over HTTP: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{ss.metrics_host}:{ss.metrics_port}/metrics", timeout=10) as resp:  # noqa: S310
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _scrape_when(ss: ShufflerSettings, ready: Callable[[Scraped], bool], timeout_s: float = 30.0) -> Scraped:
    """The shuffler's /metrics once ``ready`` holds of it, or its last scrape after ``timeout_s``
    (for the caller's assertions to show). Its counters move after its transaction commits; a
    test's reader (read_uncommitted) can see the transaction's records before."""
    deadline = time.monotonic() + timeout_s
    while not ready(got := _scrape(ss)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


@pytest.mark.parametrize("release", RELEASES)
def test_sigkill_mid_transaction_loses_and_duplicates_nothing(broker: str, tmp_path: Path, release: str) -> None:
    """Under either release, the shuffler is SIGKILLed three times while it works through a replay's device reports --
    each time while a transaction it has sent is held open for 2 s (``--fault-hold-s``): after
    its first step, after its first release, after three releases -- and restarted (at least two
    of the kills are seen to have hit an open transaction: its step was done again). The worker's
    estimates are still exactly the core's for every epoch (nothing lost, nothing counted
    twice), no record is dead-lettered (nothing read twice is late), and every copy the broker
    shows of a batch id (Tansu shows aborted records) is the same bytes, every marker of a
    (slot, partition) the same marker."""
    epochs = 6
    rs, ws, ss = _setup(broker, tmp_path, epochs, max_poll_records=1000, release=release)
    summary = replay(rs, progress=False)  # every device report is on the device topic first
    assert summary.epochs == epochs
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    log = tmp_path / "shuffler.log"
    shuffler: ShufflerProcess | None = None
    try:
        worker.wait_ready()

        def state_records() -> int:
            try:
                return len(drain(ss, ss.state_topic, quiet_polls=1))
            except ValueError:  # not created yet
                return 0

        def released_epochs() -> int:
            return len({x.epoch for _, m in _drain_decoded(ss)[1] for x in m.markers})

        kills = [(state_records, 1, "a step"), (released_epochs, 1, "1 released epoch"),
                 (released_epochs, 3, "3 released epochs")]
        for count, at_least, what in kills:
            shuffler = ShufflerProcess(ss, log, "--fault-hold-s", "2").start()
            wait_for(lambda c=count, n=at_least: c() >= n, 60, what)  # type: ignore[misc]
            shuffler.kill()
        shuffler = ShufflerProcess(ss, log).start()
        n_rows = _expected_rows(rs, epochs)
        wait_for_estimates(ws, n_rows, 90)
        assert drain(ws, ws.dead_letter_topic, quiet_polls=1) == []
        _assert_cores_estimates(rs, ws, epochs, bounds=False)
        batches, markers = _drain_decoded(ss)
        copies: dict[str, set[bytes]] = {}
        for rec, b in batches:
            copies.setdefault(b.header.batch_id, set()).add(rec.value)
        assert all(len(v) == 1 for v in copies.values())
        seen: dict[tuple[str, int, int, int, int], set[str]] = {}
        for _, m in markers:
            for x in m.markers:
                seen.setdefault((x.query_id, x.query_version, x.epoch, x.round, x.partition), set()).add(
                    x.model_dump_json())
        assert all(len(v) == 1 for v in seen.values())
        assert shuffler.stop() == 130, log.read_text()[-3000:]
        # the kills hit open transactions: their steps' state records were written by two incarnations
        state = [from_kafka(r.key, r.value, r.headers) for r in drain(ss, ss.state_topic, quiet_polls=1)]
        writers = Counter(s for s, _ in {(r.s, r.inc) for r in state})
        assert sum(n > 1 for n in writers.values()) >= 2, writers
        # every epoch released: what a compacted state topic keeps holds no device report, only
        # the decided epochs, the salt and the clock (stream_app/shuffler/state.py)
        live = fold(state, committed_step=max(r.s for r in state))
        assert not [r.key for r in live if r.key.startswith("step-")]
        assert {r.key for r in live if r.key.startswith("decided-")} == {
            decided_key(x.query_id, x.query_version, x.epoch) for _, m in markers for x in m.markers}
        assert {r.key for r in live} - {r.key for r in live if r.key.startswith("decided-")} == {"salt", "clock"}
    finally:
        worker.stop()
        if shuffler is not None and shuffler.proc is not None and shuffler.proc.poll() is None:
            shuffler.kill()


def _delete_group(ss: ShufflerSettings) -> None:
    """The instance's consumer group deleted (what an offsets expiry leaves: no committed
    offset; Tansu has no OffsetDelete), checked gone."""
    admin = KafkaAdminClient(**ss.client_kwargs())
    try:
        assert admin.delete_groups([ss.transactional_id]) == {ss.transactional_id: "OK"}
    finally:
        admin.close()
    consumer = KafkaConsumer(**ss.client_kwargs(), group_id=ss.transactional_id, enable_auto_commit=False)
    try:
        assert consumer.committed(TopicPartition(ss.device_topic, 0)) is None
        assert consumer.committed(TopicPartition(ss.state_topic, 0)) is None
    finally:
        consumer.close()


@pytest.mark.parametrize("release", RELEASES)
def test_restart_without_the_groups_offsets_drops_and_duplicates_nothing(broker: str, tmp_path: Path,
                                                                         release: str) -> None:
    """Under either release, the shuffler is SIGKILLed twice while a transaction it has sent is held open (after one
    release, after three) and its consumer group is deleted before each restart (the group's
    offsets expired): it resumes from the step and input offsets its state log keeps. The
    worker's estimates are exactly the core's -- what a clean run gives (the first test) -- for
    every epoch: no held report dropped, nothing released twice under another salt; no record is
    dead-lettered (nothing read again is late)."""
    epochs = 6
    rs, ws, ss = _setup(broker, tmp_path, epochs, max_poll_records=1000, release=release)
    assert replay(rs, progress=False).epochs == epochs
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    log = tmp_path / "shuffler.log"
    shuffler: ShufflerProcess | None = None
    try:
        worker.wait_ready()

        def released_epochs() -> int:
            return len({x.epoch for _, m in _drain_decoded(ss)[1] for x in m.markers})

        for at_least in (1, 3):
            shuffler = ShufflerProcess(ss, log, "--fault-hold-s", "2").start()
            wait_for(lambda n=at_least: released_epochs() >= n, 60, f"{at_least} released epochs")  # type: ignore[misc]
            shuffler.kill()
            _delete_group(ss)
        shuffler = ShufflerProcess(ss, log).start()
        n_rows = _expected_rows(rs, epochs)
        wait_for_estimates(ws, n_rows, 90)
        assert log.read_text().count("no committed offsets") >= 2  # the state log's step was used
        assert drain(ws, ws.dead_letter_topic, quiet_polls=1) == []
        _assert_cores_estimates(rs, ws, epochs, bounds=False)
        assert len(read_estimates(ws)) == n_rows
        batches, _ = _drain_decoded(ss)
        copies: dict[str, set[bytes]] = {}
        for rec, b in batches:
            copies.setdefault(b.header.batch_id, set()).add(rec.value)
        assert all(len(v) == 1 for v in copies.values())  # a repeated release is the same bytes
        assert shuffler.stop() == 130, log.read_text()[-3000:]
    finally:
        worker.stop()
        if shuffler is not None and shuffler.proc is not None and shuffler.proc.poll() is None:
            shuffler.kill()


@pytest.mark.xdist_group(DIRECT_DEMO_GROUP)  # the direct demo run once for this test and test_front_door's
def test_demo_via_shuffler_publishes_the_same_estimates(tmp_path: Path) -> None:
    """``ptt demo`` (the demo starts the shuffler, the replay sends single device reports)
    publishes for the same seeded fleet the same estimates as ``ptt demo --no-shuffler``, under
    the default release (aggregate) and ``--release permuted`` alike: every field of every row --
    ``data_quality`` too (the replay's per-epoch ``SourceEpoch`` carries the stations without a
    source reading through the shuffler), ``reports`` too (per-sensor: the non-default answers,
    pairs or counted) -- except ``epsilon_shuffled`` and ``release`` (null on the direct path,
    which attests no shuffle; through the shuffler its release and that release's epsilon), and
    nothing withheld -- the default queries (ALP, unary RR) and the opt-in Sampling Privacy and RR
    included. ``--release`` with ``--no-shuffler`` is refused before anything starts."""
    got = {"direct": direct_demo_estimates(tmp_path / "direct"),
           "aggregate": demo_estimates(tmp_path / "aggregate"),
           "permuted": demo_estimates(tmp_path / "permuted", "--release", "permuted")}
    assert (tmp_path / "aggregate" / "out" / "shuffler.log").exists()
    plain = got["direct"]
    assert len(plain) == 6 * 16 * 7  # 6 epochs, 16 stations, 7 estimators (SP 1, ALP 4, RR 1, unary 1)
    shuffled = ("epsilon_shuffled", "release")
    for release in ("aggregate", "permuted"):
        via = got[release]
        assert plain.keys() == via.keys()
        for key, e in plain.items():
            assert e["withheld"] is None and via[key]["withheld"] is None, (e, via[key])
            assert e["epsilon_shuffled"] is None and e["release"] is None, e
            bounded = privacy.rounds_independent(get_spec(e["mechanism"]).build({}, 16))  # SP: no shuffled bound
            assert (via[key]["epsilon_shuffled"] is not None) == bounded and via[key]["release"] == release, via[key]
            assert {k: v for k, v in via[key].items() if k not in shuffled} == {
                k: v for k, v in e.items() if k not in shuffled}, key
    # the aggregate release's epsilon is, for now, the permuted release's bound (a valid upper bound)
    assert all(got["aggregate"][k]["epsilon_shuffled"] <= got["permuted"][k]["epsilon_shuffled"] for k in plain
               if got["permuted"][k]["epsilon_shuffled"] is not None)
    # the case is exercised: 4 station-epochs of the synthetic day's 16 stations have no source reading
    assert Counter(e["data_quality"] for e in plain.values())["no_source_data"] == 4 * 7  # x 7 estimators
    bad = subprocess.run([sys.executable, "-m", "stream_app.cli", "demo", "--release", "aggregate",  # noqa: S603
                          "--no-shuffler", "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert bad.returncode == 2 and "--no-shuffler" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists()


def test_two_instances_split_the_device_partitions_and_give_the_single_instances_estimates(
        broker: str, tmp_path: Path) -> None:
    """Two ``ptt shuffler`` instances (``--instance-count 2``) split a 4-partition device topic
    (partitions 0, 2 and 1, 3): every epoch gets both instances' markers, and the worker
    publishes exactly the statistics core's estimates -- what one instance gives (the first
    test) -- with the participants of both shares added up; each instance read only its own
    partitions' records and together they read every one once."""
    epochs = 3
    rs, ws, ss = _setup(broker, tmp_path, epochs, instance_count=2)
    rs = rs.model_copy(update={"device_partitions": 4})
    ss = ss.model_copy(update={"device_partitions": 4})
    shufflers = [ShufflerProcess(ss.model_copy(update={"instance_index": i, "metrics_port": free_port()}),
                                 tmp_path / f"shuffler-{i}.log").start() for i in (0, 1)]
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        _replay_until_estimated(rs, ws, worker, epochs)
        assert drain(ws, ws.dead_letter_topic, quiet_polls=1) == []
        _assert_cores_estimates(rs, ws, epochs, bounds=True)
        _, markers = _drain_decoded(ss)
        by_instance = Counter(x.producer_index for _, m in markers for x in m.markers)
        assert set(by_instance) == {0, 1} and all(x.producer_count == 2 for _, m in markers for x in m.markers)
        per_partition = Counter(r.partition for r in drain(ss, ss.device_topic, quiet_polls=1)
                                if r.key is None and not r.headers)
        read = [_scrape(sh.settings)["ptt_shuffler_records_total", (("kind", "device_report"),)] for sh in shufflers]
        assert read == [per_partition[0] + per_partition[2], per_partition[1] + per_partition[3]]
        assert all(read)
    finally:
        worker.stop()
        for sh in shufflers:
            assert sh.stop() == 130, sh.log.read_text()[-3000:]


def test_min_crowd_applies_per_instance(broker: str, tmp_path: Path) -> None:
    """``min_crowd`` is per instance: an epoch of 4 device reports per round, 3 on device
    partition 0 (instance 0) and 1 on partition 1 (instance 1), with min_crowd 2 -- one
    instance would release it (4 >= 2); of two, instance 0 releases its 3 (markers with 3
    participants, producer 0 of 2) and instance 1 withholds its 1 (dead letter
    ``below_min_crowd``, markers of producer 1 attesting nothing, with the reason: the worker
    withholds the epoch as ``below_min_crowd``)."""
    rs, ws, ss = _setup(broker, tmp_path, 1, min_crowd=2, instance_count=2, device_partitions=2)
    q = _hand_fed_query(ss, "q-split", 2)
    e = q.epoch_range()[0]
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for partition, n in ((0, 3), (1, 1)):
        for r in (0, 1):
            for i in range(n):  # enrolled devices on their partitions (id mod 2): 0, 2, 4 and 1
                producer.send(ss.device_topic, key=uuid.uuid4().bytes, partition=partition, value=signed_json(
                    DeviceReport(query_id="q-split", query_version=1, epoch=e, round=r, value=1), 2 * i + partition))
    # device 3 on partition 0: instance 0 never sees device 3's other reports, so it refuses it
    producer.send(ss.device_topic, key=uuid.uuid4().bytes, partition=0, value=signed_json(
        DeviceReport(query_id="q-split", query_version=1, epoch=e, round=0, value=1), 3))
    producer.flush()
    producer.close()
    _send_notes(ss, e, e)
    shufflers = [ShufflerProcess(ss.model_copy(update={"instance_index": i, "metrics_port": free_port()}),
                                 tmp_path / f"shuffler-{i}.log").start() for i in (0, 1)]
    try:
        def letters() -> list[DeadLetter]:
            return [DeadLetter.model_validate_json(r.value) for r in drain(ss, ss.dead_letter_topic, quiet_polls=1)]

        wait_for(lambda: len(letters()) == 2 and len(_drain_decoded(ss)[1]) == 2 * ss.partitions, 60,
                 "instance 1's below_min_crowd, instance 0's wrong_partition and both instances' markers")
        by_reason = {x.reason: x for x in letters()}
        assert set(by_reason) == {"below_min_crowd", "wrong_partition"}
        assert "[1, 1]" in by_reason["below_min_crowd"].detail and by_reason["wrong_partition"].partition == 0
        _, markers = _drain_decoded(ss)
        assert {(x.producer_index, x.producer_count, x.participants, x.epoch, x.withheld) for _, m in markers
                for x in m.markers} == {(0, 2, 3, e, None), (1, 2, 0, e, "below_min_crowd")}
        withheld = ("ptt_shuffler_withheld_epochs_total", (("reason", "below_min_crowd"),))
        got = [_scrape_when(sh.settings, lambda g, i=i: g.get(withheld) == i)  # type: ignore[misc]
               for i, sh in enumerate(shufflers)]
        assert [g["ptt_shuffler_released_epochs_total", ()] for g in got] == [1, 0]
        assert [g["ptt_shuffler_withheld_epochs_total", (("reason", "below_min_crowd"),)] for g in got] == [0, 1]
    finally:
        for sh in shufflers:
            assert sh.stop() == 130, sh.log.read_text()[-3000:]


def test_ctrl_c_of_a_replay_through_the_shuffler_withholds_its_stop_epoch_as_interrupted(
        broker: str, tmp_path: Path) -> None:
    """SIGINT to an unpaced ``ptt replay --via-shuffler``: exit 130; its ``SourceEpoch`` notes
    (on the source-notes topic) flag the stop epoch interrupted (none when the signal lands
    between two epochs); the shuffler releases that
    epoch as interrupted markers, with no batch, and the worker withholds it as
    ``interrupted`` -- as without the shuffler -- while every earlier epoch is published."""
    rs, ws, ss = _setup(broker, tmp_path, 2880)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        worker.wait_ready()
        wait_for(shuffler.started, 60, "the shuffler to start")
        proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "0",  # noqa: S603
                                 "--quiet"], env=env_for(rs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=tmp_path)
        try:
            def notes_read() -> float:
                try:
                    return _scrape(ss)["ptt_shuffler_records_total", (("kind", "source_epoch"),)]
                except OSError:
                    return 0

            # its opening note, then its first epoch's
            wait_for(lambda: notes_read() >= 2 or proc.poll() is not None, 120, "the replay's first epoch")
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 130, err
        notes = [n for n in (json.loads(r.value) for r in drain(ss, ss.source_topic, quiet_polls=1))
                 if not n["opens"]]
        epochs = sorted({n["epoch"] for n in notes})
        # the stop epoch is the last noted one, flagged; a signal that lands between two epochs
        # stops the replay with every noted epoch complete (as on the direct path)
        flagged = {n["epoch"] for n in notes if n["interrupted"]}
        assert len(epochs) >= 2 and flagged <= {epochs[-1]}, (epochs, flagged)
        stop = epochs[-1] if flagged else None
        n_rows = _expected_rows(rs, len(epochs))
        wait_for_estimates(ws, n_rows, 120)
        got = read_estimates(ws)
        assert len(got) == n_rows
        for (_, _, epoch, _, _), e in got.items():
            if epoch == stop:
                assert e.withheld is not None and "interrupted" in e.withheld, e
            else:
                assert e.withheld is None and e.closed_by == "markers", e
        batches, markers = _drain_decoded(ss)
        assert stop not in {b.header.epoch for _, b in batches}
        assert {x.interrupted for _, m in markers for x in m.markers if x.epoch == stop} <= {True}
        assert not any(x.interrupted for _, m in markers for x in m.markers if x.epoch != stop)
    finally:
        worker.stop()
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


def test_a_query_fixed_to_another_release_is_never_served(broker: str, tmp_path: Path) -> None:
    """Issue 33, item 3: a shuffler under ``--release permuted`` holds a crowd for a query fixed
    to the aggregate release (a device charged it at the aggregate figure) and for one that fixes
    none: the first is withheld ``release_mismatch`` -- no batch, markers attesting nothing with
    the reason, a dead letter naming both releases, counted -- the second is released permuted."""
    rs, ws, ss = _setup(broker, tmp_path, 1, min_crowd=3, device_partitions=1, release="permuted",
                        lateness_epochs=3)
    ss = ss.model_copy(update={"device_partitions": 1})
    free = _hand_fed_query(ss, "q-any", 1)
    fixed = free.model_copy(update={"query_id": "q-fixed", "release": "aggregate"})
    publish_query(ss, fixed)
    e = free.epoch_range()[0] + 1
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for q in (free, fixed):
        for r in (0, 1):
            for d in range(10):
                producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=signed_json(DeviceReport(
                    query_id=q.query_id, query_version=1, epoch=e, round=r, value=d % 3), d))
    producer.flush()
    producer.close()
    _send_notes(ss, e, e)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    try:
        def markers() -> set[tuple[str, int, int, str | None, str | None]]:
            return {(x.query_id, x.round, x.participants, x.release, x.withheld)
                    for _, m in _drain_decoded(ss)[1] for x in m.markers}

        want = {("q-any", r, 10, "permuted", None) for r in (0, 1)} | {
            ("q-fixed", r, 0, None, "release_mismatch") for r in (0, 1)}
        wait_for(lambda: markers() == want, 90, f"markers {want}")
        assert {b.header.query_id for _, b in _drain_decoded(ss)[0]} == {"q-any"}
        letters = [DeadLetter.model_validate_json(r.value) for r in drain(ss, ss.dead_letter_topic, quiet_polls=1)]
        assert [x.reason for x in letters] == ["release_mismatch"]
        assert "fixes the aggregate release; this shuffler releases permuted" in letters[0].detail
        mismatch = ("ptt_shuffler_withheld_epochs_total", (("reason", "release_mismatch"),))
        assert _scrape_when(ss, lambda g: g.get(mismatch) == 1)[mismatch] == 1
    finally:
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]
