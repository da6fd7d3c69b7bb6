"""The shuffler's trusted clock under attack (issue 24's battery, the cases a clock no device
moves answers): a paced ``ptt replay --via-shuffler`` through ``ptt shuffler`` and a worker,
while an attacker holding device credentials writes well-formed device reports the moment each
epoch's source note appears -- far-future epochs (32, 80 and 10,000 reports) and a flood of the
query's population + 200 reports per round for the epoch 3 ahead of the one being sent -- plus
forged source notes on the device topic. Every epoch's estimates are the statistics core's (what
a clean run of the same seed gives: tests/integration/test_shuffler.py), no epoch is published
with another N, every genuine report is released, and every forged record is dead-lettered with
its reason.

Not covered here (they need per-device enrollment, issue 24 item 2, not built): re-sent copies
of genuine records and a flood by one enrolled device for an epoch inside the open window --
without enrollment a well-formed report for an open epoch is indistinguishable from a device's.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from producers.replay import replay
from schemas import DeviceReport, Query, SourceEpoch, decode_device_record, encode_json
from schemas.estimates import DeadLetter
from schemas.kafka_io import read_queries

from .kafka_helpers import drain
from .stream_helpers import WorkerProcess, read_estimates, wait_for
from .test_shuffler import ShufflerProcess, _assert_cores_estimates, _expected_rows, _scrape, _setup

pytestmark = pytest.mark.integration

FAR = ((100, 32), (200, 80), (500, 10_000))  # (epochs past the first noted one, reports)


def _forged(q: Query, epoch: int, n: int) -> list[bytes]:
    """``n`` well-formed reports of ``q`` for ``epoch``, spread over its rounds (a value or an
    empty pair list: what any device may send)."""
    out = []
    for i in range(n):
        payload = {"value": i % (q.n_stations + 1)} if q.per_station is None else {"pairs": ()}
        out.append(encode_json(DeviceReport(query_id=q.query_id, query_version=q.version, epoch=epoch,
                                            round=i % q.n_rounds, **payload)))
    return out


class Attacker(threading.Thread):
    """Follows the replay's source notes; after each epoch e's note floods e + 4 (3 ahead of the
    epoch being sent), after the first one also sends the far-future reports and a forged note."""

    def __init__(self, ss, queries: list[Query]) -> None:  # type: ignore[no-untyped-def]
        super().__init__(daemon=True)
        self.ss, self.queries = ss, queries
        self.sent: Counter[str] = Counter()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

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
                for records in consumer.poll(timeout_ms=100).values():
                    for rec in records:
                        note = decode_device_record(rec.value)
                        assert isinstance(note, SourceEpoch)
                        if note.opens or note.epoch in flooded:
                            continue
                        flooded.add(note.epoch)
                        batch = [(v, "flood") for q in self.queries
                                 for v in _forged(q, note.epoch + 4, (q.population + 200) * q.n_rounds)]
                        if first:
                            first = False
                            batch += [(v, f"far_{n}") for q in self.queries[:1] for ahead, n in FAR
                                      for v in _forged(q, note.epoch + ahead, n)]
                            batch.append((encode_json(SourceEpoch(epoch=note.epoch + 50)), "note"))
                        for value, kind in batch:
                            producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=value)
                            self.sent[kind] += 1
                        producer.flush()
        finally:
            producer.close()
            consumer.close()


def test_forged_reports_outside_the_open_window_change_nothing(broker: str, tmp_path: Path) -> None:
    epochs = 6
    rs, ws, ss = _setup(broker, tmp_path, epochs)
    rs = rs.model_copy(update={"speed": 10.0})  # an epoch every 3 s: the attacker keeps up with the replay
    shuffler = ShufflerProcess(ss, tmp_path / "shuffler.log").start()
    worker = WorkerProcess(ws, tmp_path / "w.log").start()
    attacker: Attacker | None = None
    try:
        worker.wait_ready()
        wait_for(shuffler.started, 60, "the shuffler to start")
        # the replay publishes its default queries first; the attacker reads them once they are there
        done: list[int] = []
        runner = threading.Thread(target=lambda: done.append(replay(rs, progress=False).reports), daemon=True)
        runner.start()
        wait_for(lambda: len(read_queries(rs)) >= 3, 60, "the default queries")
        attacker = Attacker(ss, read_queries(rs))
        attacker.start()
        runner.join(timeout=240)
        assert done, "the replay did not finish"
        n_rows = _expected_rows(rs, epochs)
        wait_for(lambda: len(read_estimates(ws)) >= n_rows, 120, f"{n_rows} estimates")
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
        wait_for(lambda: letters() == wanted, 60, f"dead letters {dict(wanted)}")
        # every estimate is the core's, with the core's N: nothing forged got in, nothing genuine was lost
        _assert_cores_estimates(rs, ws, epochs, bounds=False)
        assert len(read_estimates(ws)) == n_rows
        assert _scrape(ss)["ptt_shuffler_released_reports_total", ()] == done[0]
    finally:
        if attacker is not None:
            attacker.stop.set()
        worker.stop()
        assert shuffler.stop() == 130, shuffler.log.read_text()[-3000:]
