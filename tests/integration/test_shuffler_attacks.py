"""The shuffler's trusted clock under attack (issue 24's battery, the cases a clock no device
moves answers): a paced ``ptt replay --via-shuffler`` through ``ptt shuffler`` and a worker,
while an attacker holding device credentials writes well-formed device reports the moment each
epoch's source note appears -- far-future epochs (32, 80 and 10,000 reports) and a flood of the
query's population + 200 reports per round for the epoch 3 ahead of the one being sent -- plus
forged source notes on the device topic. Every epoch's estimates are the statistics core's (what
a clean run of the same seed gives: tests/integration/test_shuffler.py), no epoch is published
with another N, every genuine report is released, and every forged record is dead-lettered with
its reason. Forged source notes on the notes topic itself (unsigned, badly signed, or validly
signed but 40 epochs ahead) change nothing either, and a device revoked mid-day is refused
from the next batch on.

With enrollment (schemas/enrollment.py: every report carries its device's id and MAC, a slot
takes one report per device): re-sent copies of genuine records during a replay are refused
(``duplicate_report``, or ``late`` once their epoch is out) and the estimates are the clean
run's; a flood by one enrolled device adds one report per slot; and the documented residual --
an attacker holding k stolen device credentials adds at most k reports per slot -- holds with
k = 3 exactly. The forged floods above are signed with credentials the attacker holds (the
worst case: they are refused for their epoch alone).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from producers.replay import load_day
from producers.settings import ReplaySettings
from schemas import DeviceReport, Query, SourceEpoch, decode_device_record, encode_json
from schemas.device_binary import encode_device
from schemas.estimates import DeadLetter
from schemas.kafka_io import read_queries
from stream_app.settings import WorkerSettings
from stream_app.shuffler.settings import ShufflerSettings
from tests.devices import enrollment, signed_json, signed_note

from .kafka_helpers import drain
from .stream_helpers import (
    ReplayThread,
    WorkerProcess,
    read_estimates,
    start_replay_thread,
    wait_for,
    wait_for_estimates,
)
from .test_shuffler import (
    ShufflerProcess,
    _assert_cores_estimates,
    _drain_decoded,
    _expected_rows,
    _hand_fed_query,
    _scrape,
    _scrape_when,
    _send_notes,
    _setup,
)

pytestmark = pytest.mark.integration

FAR = ((100, 32), (200, 80), (500, 10_000))  # (epochs past the first noted one, reports)


def _forged(q: Query, epoch: int, n: int) -> list[bytes]:
    """``n`` well-formed reports of ``q`` for ``epoch``, spread over its rounds (a value or an
    empty pair list: what any device may send), each sealed by its own enrolled device (ids
    from 200,000: stolen credentials, none the replay's fleet uses), in the binary layout (as
    fast to make as the replay's own: the attacker keeps up with it)."""
    e = enrollment()
    out = []
    for i in range(n):
        payload = {"value": i % (q.n_stations + 1)} if q.per_station is None else {"pairs": ()}
        raw = encode_device(q.query_id, q.version, epoch, i % q.n_rounds, **payload)
        out.append(e.seal(raw, 200_000 + i // q.n_rounds))
    return out


class _Thread(threading.Thread):
    """An attacker's thread: its error kept for the test to report, its stop flag."""

    def __init__(self, ss) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.ss = ss
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def _run(self) -> None:
        raise NotImplementedError


class Attacker(_Thread):
    """Follows the replay's source notes; after each epoch e's note floods e + 4 (3 ahead of the
    epoch being sent), after the first one also sends the far-future reports and a forged note."""

    def __init__(self, ss, queries: list[Query]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ss)
        self.queries = queries
        self.sent: Counter[str] = Counter()

    def _run(self) -> None:
        ss = self.ss
        producer = KafkaProducer(**ss.client_kwargs(), acks="all", linger_ms=5)
        consumer = KafkaConsumer(**ss.client_kwargs(), enable_auto_commit=False)
        tp = TopicPartition(ss.source_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        flooded: set[int] = set()
        first = True
        try:
            while not self.stop.is_set():
                notes = [decode_device_record(rec.value) for records in consumer.poll(timeout_ms=100).values()
                         for rec in records]
                assert all(isinstance(n, SourceEpoch) for n in notes), notes
                # only the newest note counts: an attacker slowed by a loaded machine never floods
                # an epoch the replay (and so the shuffler's window) has since reached
                newest = max((n.epoch for n in notes if isinstance(n, SourceEpoch) and not n.opens), default=None)
                if newest is None or newest in flooded or (flooded and newest < max(flooded)):
                    continue
                flooded.add(newest)
                batch = [(v, "flood") for q in self.queries
                         for v in _forged(q, newest + 4, (q.population + 200) * q.n_rounds)]
                if first:
                    first = False
                    batch += [(v, f"far_{n}") for q in self.queries[:1] for ahead, n in FAR
                              for v in _forged(q, newest + ahead, n)]
                    batch.append((encode_json(SourceEpoch(epoch=newest + 50)), "note"))
                for value, kind in batch:
                    producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=value)
                    self.sent[kind] += 1
                producer.flush()
        finally:
            producer.close()
            consumer.close()


@dataclass
class Paced:
    """A paced replay under way through a shuffler and a worker (:func:`_paced`)."""

    rs: ReplaySettings
    ws: WorkerSettings
    ss: ShufflerSettings
    runner: ReplayThread


@contextmanager
def _paced(broker: str, tmp_path: Path, epochs: int, speed: float = 10.0) -> Iterator[Paced]:
    """``ptt shuffler`` and a worker started and ready, then a replay of ``epochs`` epochs through
    them at ``speed`` (10: an epoch every 3 s, an attacker keeps up with it) in a thread, once its
    default queries are on the queries topic (the replay creates the device topic, then publishes
    them). Stops the worker and the shuffler (which must exit 130) at the end."""
    rs, ws, ss = _setup(broker, tmp_path, epochs)
    rs = rs.model_copy(update={"speed": speed})
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    try:
        worker.wait_ready()
        wait_for(shuffler.started, 60, "the shuffler to start")
        runner = start_replay_thread(rs)
        wait_for(lambda: len(read_queries(rs)) >= 3, 60, "the default queries")
        yield Paced(rs, ws, ss, runner)
    finally:
        worker.stop()
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


def test_forged_reports_outside_the_open_window_change_nothing(broker: str, tmp_path: Path) -> None:
    epochs = 6
    attacker: Attacker | None = None
    # an epoch every 5 s: the flood for e + 4 must be in before note e + 2 opens it (10 s; its
    # ~12,000 records took ~1 s on a loaded machine, sharing this process with the replay)
    with _paced(broker, tmp_path, epochs, speed=6.0) as run:
        rs, ws, ss = run.rs, run.ws, run.ss
        try:
            # the attacker reads the replay's default queries once they are there
            attacker = Attacker(ss, read_queries(rs))
            attacker.start()
            reports = run.runner.result(240).reports
            n_rows = _expected_rows(rs, epochs)
            wait_for_estimates(ws, n_rows, 120, f"{n_rows} estimates")
            attacker.stop.set()
            attacker.join(timeout=30)
            assert attacker.error is None, attacker.error
            sent = attacker.sent
            assert sent["flood"] and all(sent[f"far_{n}"] == n for _, n in FAR) and sent["note"] == 1, sent
            forged = sum(sent.values())

            def letters() -> Counter[str]:
                return Counter(DeadLetter.model_validate_json(r.value).reason
                               for r in drain(ws, ws.dead_letter_topic, quiet_polls=1))

            wanted = Counter({"outside_open_window": forged - sent["note"], "untrusted_note": sent["note"]})
            seen: list[Counter[str]] = [Counter()]

            def all_letters() -> bool:
                seen[0] = letters()
                return seen[0] == wanted

            # a bound on a hung shuffler only: under load (~10 on 2 cores) 17,000 forged records took
            # over 60 s to be dead-lettered; the last count read is in the error
            try:
                wait_for(all_letters, 180, f"dead letters {dict(wanted)}")
            except TimeoutError as exc:
                raise AssertionError(f"dead letters {dict(seen[0])}, expected {dict(wanted)}") from exc
            # every estimate is the core's, with the core's N: nothing forged got in, nothing genuine was lost
            _assert_cores_estimates(rs, ws, epochs, bounds=False)
            assert len(read_estimates(ws)) == n_rows
            assert _scrape(ss)["ptt_shuffler_released_reports_total", ()] == reports
        finally:
            if attacker is not None:
                attacker.stop.set()


class Copier(_Thread):
    """Re-sends a copy of every genuine device record the moment it appears on the device topic
    (same bytes, same partition, a fresh key): what anyone who can read and write the topic can
    do."""

    def __init__(self, ss) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ss)
        self.sent = 0

    def _run(self) -> None:
        ss = self.ss
        producer = KafkaProducer(**ss.client_kwargs(), acks="all", linger_ms=5)
        consumer = KafkaConsumer(**ss.client_kwargs(), enable_auto_commit=False)
        parts = [TopicPartition(ss.device_topic, p) for p in range(ss.device_partitions)]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        copies: set[bytes] = set()
        try:
            while not self.stop.is_set():
                for records in consumer.poll(timeout_ms=100).values():
                    for rec in records:
                        if rec.value in copies:  # our own copy coming back
                            continue
                        copies.add(rec.value)
                        producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=rec.value,
                                      partition=rec.partition)
                        self.sent += 1
                producer.flush()
        finally:
            producer.close()
            consumer.close()


def test_resent_copies_of_genuine_records_change_nothing(broker: str, tmp_path: Path) -> None:
    """Issue 24's copies case: during a paced replay through the shuffler, every genuine device
    record is re-sent once. Each copy is dead-lettered -- ``duplicate_report`` while its slot is
    open (most of them), ``late`` once its epoch was released -- and every estimate is the
    statistics core's with the core's N (what the clean run gives): no copy counted, no genuine
    report displaced."""
    epochs = 4
    with _paced(broker, tmp_path, epochs) as run:
        rs, ws, ss = run.rs, run.ws, run.ss
        copier = Copier(ss)
        try:
            copier.start()
            reports = run.runner.result(240).reports
            n_rows = _expected_rows(rs, epochs)
            wait_for_estimates(ws, n_rows, 120, f"{n_rows} estimates")
            wait_for(lambda: copier.sent >= reports, 60, "a copy of every genuine record")
            copier.stop.set()
            copier.join(timeout=30)
            assert copier.error is None, copier.error
            assert copier.sent == reports

            def letters() -> Counter[str]:
                return Counter(DeadLetter.model_validate_json(r.value).reason
                               for r in drain(ws, ws.dead_letter_topic, quiet_polls=1))

            wait_for(lambda: sum(letters().values()) == copier.sent, 90, f"{copier.sent} dead letters")
            got = letters()
            assert set(got) <= {"duplicate_report", "late"} and got["duplicate_report"] > copier.sent // 2, got
            _assert_cores_estimates(rs, ws, epochs, bounds=False)
            assert len(read_estimates(ws)) == n_rows
            assert _scrape(ss)["ptt_shuffler_released_reports_total", ()] == reports
        finally:
            copier.stop.set()


def test_one_device_floods_and_k_stolen_credentials_add_at_most_k_per_slot(broker: str, tmp_path: Path) -> None:
    """Hand-fed, on one device partition (arrival order is the order sent), three epochs of 40
    genuine enrolled devices per round (values 0..2), and the attacks:

    * epoch A: a copy of every genuine record -> each dead-lettered ``duplicate_report``; the
      release is exactly the genuine counts (the clean run's) with 40 participants;
    * epoch B: one enrolled device floods 300 validly signed reports per round -> one admitted
      per slot (its first), 299 ``duplicate_report``; 41 participants;
    * epoch C: the documented residual, k = 3 stolen credentials, 100 reports each per round ->
      exactly k admitted per slot, the rest ``duplicate_report``; 43 participants.

    The attested n (the markers' participants and shuffle size) counts distinct enrolled devices."""
    rs, ws, ss = _setup(broker, tmp_path, 1, device_partitions=1, min_crowd=3, lateness_epochs=3)
    ss = ss.model_copy(update={"device_partitions": 1})
    q = _hand_fed_query(ss, "q-enrolled", 1)
    a, b, c = (q.epoch_range()[0] + i for i in (1, 2, 3))
    genuine = {e: {(r, d): (d + r + e) % 3 for r in (0, 1) for d in range(40)} for e in (a, b, c)}

    def rep(epoch: int, rnd: int, value: int, device: int) -> bytes:
        return signed_json(DeviceReport(query_id=q.query_id, query_version=1, epoch=epoch, round=rnd, value=value),
                           device)

    values = [rep(e, r, v, d) for e, slots in genuine.items() for (r, d), v in slots.items()]
    copies = [rep(a, r, v, d) for (r, d), v in genuine[a].items()]
    flood = [rep(b, r, i % 3, 5_000) for r in (0, 1) for i in range(300)]
    k = 3
    stolen = [rep(c, r, (i + d) % 3, 7_000 + d) for r in (0, 1) for i in range(100) for d in range(k)]
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for v in [*values, *copies, *flood, *stolen]:
        producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=v)
    producer.flush()
    producer.close()
    _send_notes(ss, a, c)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    try:
        duplicates = len(copies) + (len(flood) - 2) + (len(stolen) - 2 * k)

        def letters() -> Counter[str]:
            return Counter(DeadLetter.model_validate_json(r.value).reason
                           for r in drain(ss, ss.dead_letter_topic, quiet_polls=1))

        wait_for(lambda: letters() == Counter({"duplicate_report": duplicates})
                 and len({x.epoch for _, m in _drain_decoded(ss)[1] for x in m.markers}) == 3, 90,
                 f"{duplicates} duplicate_report dead letters and three epochs' markers")
        batches, markers = _drain_decoded(ss)
        counts = {(bt.header.epoch, bt.header.round): bt.arrays["counts"].tolist() for _, bt in batches}
        # what the attackers got in: the flooder's first report per round, each stolen credential's first
        extra: dict[int, dict[int, list[int]]] = {a: {0: [], 1: []}, b: {0: [0], 1: [0]},
                                                  c: {r: [d % 3 for d in range(k)] for r in (0, 1)}}
        for e in (a, b, c):
            for r in (0, 1):
                want = Counter(v for (rr, _), v in genuine[e].items() if rr == r) + Counter(extra[e][r])
                assert counts[e, r] == [want[0], want[1], want[2]], (e, r)
        assert {(x.epoch, x.round, x.participants, x.shuffle_size) for _, m in markers for x in m.markers} == {
            (e, r, n, n) for e, n in ((a, 40), (b, 41), (c, 40 + k)) for r in (0, 1)}
        dup = ("ptt_shuffler_dead_letters_total", (("reason", "duplicate_report"),))
        assert _scrape_when(ss, lambda g: g.get(dup) == duplicates)[dup] == duplicates
    finally:
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]


class NoteForger(_Thread):
    """Issue 35's forged notes, on the notes topic itself (the embedded broker has no ACLs):
    once the replay's first finished epoch n is noted, unsigned and badly signed notes -- n + 1
    ``interrupted``, n + 1 with every station ``readings_missing``, n + 40 -- and one validly
    signed note 40 epochs ahead (a copy of a genuine note of a later epoch from another run, or a
    leaked notes key: only the clock rule stops it)."""

    def __init__(self, ss, stations: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(ss)
        self.stations = stations
        self.sent: Counter[str] = Counter()

    def _run(self) -> None:
        ss = self.ss
        consumer = KafkaConsumer(**ss.client_kwargs(), enable_auto_commit=False)
        tp = TopicPartition(ss.source_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        try:
            n = None
            while n is None and not self.stop.is_set():
                notes = [decode_device_record(rec.value) for records in consumer.poll(timeout_ms=100).values()
                         for rec in records]
                n = max((x.epoch for x in notes if isinstance(x, SourceEpoch) and not x.opens), default=None)
            if n is None:
                return
            bad_mac = "ab" * 32
            forged = [(SourceEpoch(epoch=n + 1, interrupted=True), "untrusted_note"),
                      (SourceEpoch(epoch=n + 1, readings_missing=self.stations, mac=bad_mac), "untrusted_note"),
                      (SourceEpoch(epoch=n + 40), "untrusted_note"),
                      (SourceEpoch(epoch=n + 40, mac=bad_mac), "untrusted_note"),
                      (enrollment().sign_note(SourceEpoch(epoch=n + 40)), "note_from_future")]
            producer = KafkaProducer(**ss.client_kwargs(), acks="all")
            try:
                for note, reason in forged:
                    producer.send(ss.source_topic, key=b"source-epoch", value=encode_json(note), partition=0)
                    self.sent[reason] += 1
                producer.flush()
            finally:
                producer.close()
        finally:
            consumer.close()


def test_forged_source_notes_change_no_estimate_and_withhold_no_epoch(broker: str, tmp_path: Path) -> None:
    """Issue 35, item 4, on the embedded broker (no ACLs: anyone may write the notes topic):
    during a paced replay through the shuffler, forged notes (:class:`NoteForger`) -- unsigned,
    badly signed, an ``interrupted`` and a ``readings_missing`` one, 40 epochs ahead, and a
    validly signed one 40 epochs ahead -- are dead-lettered (``untrusted_note``,
    ``note_from_future``); every estimate is the statistics core's with the core's N (the clean
    run's), none withheld, every genuine report released. Unchecked, the note 40 ahead had
    withheld 114 of 180 query-epochs as no_reports and sent 133,052 genuine reports late."""
    epochs = 5
    forger: NoteForger | None = None
    with _paced(broker, tmp_path, epochs) as run:
        rs, ws, ss = run.rs, run.ws, run.ss
        try:
            forger = NoteForger(ss, read_queries(rs)[0].sensors)
            forger.start()
            reports = run.runner.result(240).reports
            n_rows = _expected_rows(rs, epochs)
            wait_for_estimates(ws, n_rows, 120, f"{n_rows} estimates")
            forger.join(timeout=30)
            assert forger.error is None, forger.error
            wanted = Counter({"untrusted_note": 4, "note_from_future": 1})
            assert forger.sent == wanted

            def letters() -> Counter[str]:
                return Counter(DeadLetter.model_validate_json(r.value).reason
                               for r in drain(ws, ws.dead_letter_topic, quiet_polls=1))

            _assert_cores_estimates(rs, ws, epochs, bounds=False)  # first: what a forged note could change
            wait_for(lambda: letters() == wanted, 60, f"dead letters {dict(wanted)}")
            # a record no enrolled party vouches for costs a bounded letter: its size and 64 bytes of it
            untrusted = [d for r in drain(ws, ws.dead_letter_topic, quiet_polls=1)
                         if (d := DeadLetter.model_validate_json(r.value)).reason == "untrusted_note"]
            assert all(len(base64.b64decode(d.value_b64)) == 64 < d.value_bytes for d in untrusted), untrusted
            got = read_estimates(ws)
            assert len(got) == n_rows
            # the forged readings_missing note flagged nothing: what is flagged is the clean run's (the day's gaps)
            day = load_day(rs)
            gaps = {(int(day.epochs[i]), int(s)) for i in range(epochs) for s in day.stations[~day.has_truth[i]]}
            assert {(e.epoch, e.station) for e in got.values() if e.data_quality == "no_source_data"} <= gaps
            metrics = _scrape(ss)
            assert metrics["ptt_shuffler_released_reports_total", ()] == reports
            assert not any(v for k, v in metrics.items() if k[0] == "ptt_shuffler_withheld_epochs_total")
        finally:
            if forger is not None:
                forger.stop.set()


def test_a_device_revoked_mid_day_is_refused_from_the_next_batch_on(broker: str, tmp_path: Path) -> None:
    """Issue 35, item 5: hand-fed, 30 enrolled devices per round for two epochs. The first epoch
    is released whole (30 participants); then device 4 is added to the shuffler's revocation
    list (the file rewritten while it runs; no restart) and the second epoch's reports are
    written: device 4's two are dead-lettered ``revoked`` (counted), the other 29 devices' are
    released exactly, and nothing of the first epoch changes."""
    revoked = tmp_path / "revoked-devices"
    revoked.write_text("# none yet\n")
    rs, ws, ss = _setup(broker, tmp_path, 1, device_partitions=1, min_crowd=3, lateness_epochs=3,
                        revoked_devices_file=revoked)
    ss = ss.model_copy(update={"device_partitions": 1})
    q = _hand_fed_query(ss, "q-revoked", 1)
    a, b = (q.epoch_range()[0] + i for i in (1, 2))
    genuine = {e: {(r, d): (d + r + e) % 3 for r in (0, 1) for d in range(30)} for e in (a, b)}

    def send(epoch: int) -> None:
        producer = KafkaProducer(**ss.client_kwargs(), acks="all")
        for (r, d), v in genuine[epoch].items():
            producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=signed_json(DeviceReport(
                query_id=q.query_id, query_version=1, epoch=epoch, round=r, value=v), d))
        producer.flush()
        producer.close()

    def letters() -> Counter[str]:
        return Counter(DeadLetter.model_validate_json(r.value).reason
                       for r in drain(ss, ss.dead_letter_topic, quiet_polls=1))

    def marked() -> set[int]:
        return {x.epoch for _, m in _drain_decoded(ss)[1] for x in m.markers}

    send(a)
    _send_notes(ss, a, a)
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    try:
        wait_for(lambda: a in marked(), 90, "the first epoch's markers")
        revoked.write_text("# a stolen device\n4\n")
        send(b)
        producer = KafkaProducer(**ss.client_kwargs(), acks="all")
        producer.send(ss.source_topic, key=b"source-epoch", value=signed_note(SourceEpoch(epoch=b)), partition=0)
        producer.flush()
        producer.close()
        wait_for(lambda: b in marked() and letters() == Counter({"revoked": 2}), 90,
                 "the second epoch's markers and device 4's two reports revoked")
        batches, markers = _drain_decoded(ss)
        counts = {(bt.header.epoch, bt.header.round): bt.arrays["counts"].tolist() for _, bt in batches}
        for e, gone in ((a, set()), (b, {4})):
            for r in (0, 1):
                want = Counter(v for (rr, d), v in genuine[e].items() if rr == r and d not in gone)
                assert counts[e, r] == [want[0], want[1], want[2]], (e, r)
        assert {(x.epoch, x.round, x.participants) for _, m in markers for x in m.markers} == {
            (e, r, n) for e, n in ((a, 30), (b, 29)) for r in (0, 1)}
        refused = ("ptt_shuffler_dead_letters_total", (("reason", "revoked"),))
        assert _scrape_when(ss, lambda g: g.get(refused) == 2)[refused] == 2
        assert "re-read: 1 device ids revoked" in shuffler.log.read_text()
    finally:
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]
