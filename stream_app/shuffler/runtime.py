"""The shuffler's Kafka loop: read device reports, hand them to the pure policy, release what is
due -- all in one Kafka transaction per step (consume-transform-produce): the released batches
and markers, the dead letters, this instance's state records and the input offsets
(``send_offsets_to_transaction``) commit together or not at all.

State: the reports held in open epochs are written, in the same transaction that consumes them,
to the instance's state topic (``<shuffler_id>-state-<index>``), with the epochs decided. The
step counter is committed with the input offsets, as the committed "offset" of the state
topic's partition (Tansu keeps no offset metadata); a restart reads the state topic and keeps
only the records of committed steps, the last record of each (a broker that shows aborted records --
Tansu does -- cannot resurrect them), then reads the input from the committed offsets. So a
SIGKILL at any point loses and duplicates nothing: every input record is either in a committed
step (held in the state, released or dead-lettered) or read again.

Released batch ids and the permutation's seed are derived from a secret random salt (128 bits
from the OS's entropy, kept in the state topic) and the slot, and the held reports are sorted
before the permutation, so a release that an aborted transaction left visible and the restart's
release of the same reports are the same bytes under the same batch ids (the worker counts a
batch id once). Nothing of a device record's key,
header, partition, offset, arrival order or timestamp reaches the reports topic: batches are
permuted and keyed by those ids, and every record of a release is stamped with its epoch's end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.partitioner.default import murmur2
from kafka.structs import OffsetAndMetadata

from schemas import EndOfEpoch, EndOfEpochSet, Query, WireError, decode_device_report, encode_batch, encode_json
from schemas.epochs import EPOCH_S
from schemas.kafka_io import QueryReader, connect, ensure_topics

from ..decode import Rejected
from .policy import EpochKey, Released, ShufflePolicy, Withheld
from .settings import ShufflerSettings

__all__ = ["KIND_HEADER", "Shuffler", "ShufflerSummary"]

log = logging.getLogger(__name__)
KIND_HEADER = "ptt-kind"


@dataclass
class ShufflerSummary:
    received: int = 0
    released_epochs: int = 0
    released_reports: int = 0
    withheld: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    restored: int = 0

    def line(self) -> str:
        w = ", ".join(f"{k}: {v}" for k, v in sorted(self.withheld.items())) or "none"
        d = ", ".join(f"{k}: {v}" for k, v in sorted(self.dead_letters.items())) or "none"
        return (f"shuffler: {self.received:,} device reports read ({self.restored:,} restored), "
                f"{self.released_epochs:,} epochs released with {self.released_reports:,} reports; "
                f"withheld epochs: {w}; dead letters: {d}")


class Shuffler:
    """One shuffler instance; :meth:`run` until :meth:`stop` (or SIGTERM/SIGINT with ``signals``)."""

    def __init__(self, settings: ShufflerSettings) -> None:
        self.s = settings
        self.summary = ShufflerSummary()
        self._stop = threading.Event()
        self._step = 0
        self._step_tp = TopicPartition(settings.state_topic, 0)
        self._salt = ""
        self._salt_new = False
        self._queries_read_at = float("-inf")  # when an unknown query last made it read the queries topic to its end

    def stop(self) -> None:
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT end :meth:`run` after its current step (committed, never cut)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def run(self, signals: bool = True) -> ShufflerSummary:
        """Until stopped; the summary of what it did."""
        s = self.s
        if signals:
            self.install_signals()
        ensure_topics(s, {s.reports_topic: s.partitions, s.queries_topic: 1, s.device_topic: s.device_partitions,
                          s.dead_letter_topic: 1, s.state_topic: 1})
        self._producer = connect("producer", s, KafkaProducer, transactional_id=s.transactional_id,
                                 enable_idempotence=True, acks="all", linger_ms=5,
                                 max_request_size=8 * 1024 * 1024, batch_size=1024 * 1024)
        self._producer.init_transactions()  # fences a previous incarnation, aborts its open transaction
        self._consumer = connect("consumer", s, KafkaConsumer, group_id=s.transactional_id,
                                 enable_auto_commit=False, isolation_level="read_committed",
                                 auto_offset_reset="earliest", max_poll_records=s.max_poll_records)
        self._reader = QueryReader(s)
        try:
            self._reader.catch_up()
            parts = sorted(self._producer.partitions_for(s.reports_topic) or [])
            self._out_parts = parts
            self._tps = self._assign()
            self.policy = ShufflePolicy(s.min_crowd, s.lateness_epochs, s.idle_release_s,
                                        [tp.partition for tp in self._tps])
            self._restore()
            self._loop(s.fault_hold_s)
        finally:
            self._reader.close()
            self._consumer.close()
            self._producer.close(timeout=10)
        return self.summary

    # -- setup ---------------------------------------------------------------------------------
    def _assign(self) -> list[TopicPartition]:
        s = self.s
        deadline = time.monotonic() + 30
        parts: set[int] = set()
        while not parts and time.monotonic() < deadline:
            parts = self._consumer.partitions_for_topic(s.device_topic) or set()
            if not parts:
                time.sleep(0.1)
        mine = [TopicPartition(s.device_topic, p) for p in sorted(parts) if p % s.instance_count == s.instance_index]
        self._consumer.assign(mine)
        for tp in mine:
            got = self._consumer.committed(tp)
            self._consumer.seek(tp, got if got is not None and got >= 0 else 0)
        # the step counter travels as the committed "offset" of the state topic's partition: in
        # the same transaction as the input offsets (a broker need not keep offset metadata)
        step = self._consumer.committed(self._step_tp)
        self._step = step if step is not None and step > 0 else 0
        return mine

    def _restore(self) -> None:
        """Rebuild the held reports and decided epochs from the state records of committed steps."""
        s = self.s
        consumer = connect("consumer", s, KafkaConsumer, group_id=None, enable_auto_commit=False,
                           isolation_level="read_committed", max_partition_fetch_bytes=16 * 1024 * 1024)
        try:
            tp = TopicPartition(s.state_topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            end = consumer.end_offsets([tp])[tp]
            states: list[dict[str, Any]] = []
            while consumer.position(tp) < end:
                for records in consumer.poll(timeout_ms=500, max_records=10_000).values():
                    states.extend(json.loads(rec.value) for rec in records)
        finally:
            consumer.close()
        # the committed steps: 1 .. the step committed with the offsets; of several records of
        # one step (an aborted incarnation's, the broker shows them, then its successor's) the last
        newest: dict[int, dict[str, Any]] = {}
        for state in states:
            if state["s"] <= self._step:
                newest[state["s"]] = state
        for step in sorted(newest):
            self._apply(newest[step])
        if not self._salt:
            self._salt, self._salt_new = secrets.token_hex(16), True

    def _apply(self, state: dict[str, Any]) -> None:
        self._salt = state.get("salt") or self._salt
        for p, raw in state.get("admit", ()):
            report = decode_device_report(raw.encode())
            self.policy.admit(report, self._query(report.query_id, report.query_version), p, time.monotonic())
            self.summary.restored += 1
        for q, v, e in state.get("decided", ()):
            self.policy.mark_decided((q, v, e))

    def _query(self, query_id: str, version: int) -> Query | None:
        """The query a report names. An unknown one: the queries topic is read to its end
        (a query published before its first report is then known, however slow the fetch),
        at most once a second, so reports naming made-up queries cannot stall the loop."""
        q = self._reader.queries.get((query_id, version))
        if q is None and time.monotonic() - self._queries_read_at >= 1.0:
            self._reader.catch_up(timeout_s=30.0)
            self._queries_read_at = time.monotonic()
            q = self._reader.queries.get((query_id, version))
        return q

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self, fault_hold_s: float) -> None:
        s = self.s
        last_queries = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_queries > 1.0:
                self._reader.poll(0)
                last_queries = now
            got = self._consumer.poll(timeout_ms=200, max_records=s.max_poll_records)
            admitted: list[tuple[int, str]] = []
            letters: list[tuple[Rejected, Any]] = []
            for records in got.values():
                for rec in records:
                    self.summary.received += 1
                    try:
                        report = decode_device_report(rec.value)
                    except WireError as exc:
                        letters.append((Rejected(exc.reason, exc.detail), rec))
                        continue
                    why = self.policy.admit(report, self._query(report.query_id, report.query_version),
                                            rec.partition, time.monotonic())
                    if why is not None:
                        letters.append((why, rec))
                    else:  # the record as read: it decoded to this report (and decodes again on restore)
                        admitted.append((rec.partition, rec.value.decode()))
            due = self.policy.due(time.monotonic(), self._caught_up()) if self.policy.open_epochs else []
            if not (admitted or letters or due or self._salt_new):
                continue
            self._transaction(admitted, letters, due, fault_hold_s)

    def _caught_up(self) -> frozenset[int]:
        """The input partitions read to their end as the broker says now (a fetch's high-water
        mark may be older than records another partition's newer epoch implies are there)."""
        ends = self._consumer.end_offsets(self._tps)
        return frozenset(tp.partition for tp in self._tps if self._consumer.position(tp) >= ends[tp])

    def _transaction(self, admitted: list[tuple[int, str]], letters: list[tuple[Rejected, Any]],
                     due: list[EpochKey], fault_hold_s: float) -> None:
        s = self.s
        p = self._producer
        self._step += 1
        p.begin_transaction()
        for why, rec in letters:
            letter = why.letter(rec.topic, rec.partition, rec.offset, rec.value)
            p.send(s.dead_letter_topic, key=why.reason.encode(), value=letter.model_dump_json().encode())
        decided = []
        outcomes: list[Released | Withheld] = []
        for key in due:
            outcome = self.policy.close(key, self._slot_rng(key))
            decided.append(list(key))
            outcomes.append(outcome)
            if isinstance(outcome, Released):
                self._release(outcome)
            else:
                self._withhold(outcome)
        state: dict[str, Any] = {"s": self._step, "admit": admitted, "decided": decided}
        if self._salt_new:
            state["salt"] = self._salt
        p.send(s.state_topic, value=json.dumps(state, separators=(",", ":")).encode(), partition=0)
        offsets = {tp: OffsetAndMetadata(self._consumer.position(tp), "", -1) for tp in self._tps}
        offsets[self._step_tp] = OffsetAndMetadata(self._step, "", -1)
        p.send_offsets_to_transaction(offsets, s.transactional_id)
        if fault_hold_s:
            p.flush()
            time.sleep(fault_hold_s)
        p.commit_transaction()
        self._salt_new = False
        for why, _ in letters:
            self.summary.dead_letters[why.reason] += 1
        for outcome in outcomes:
            if isinstance(outcome, Released):
                self.summary.released_epochs += 1
                self.summary.released_reports += sum(r.devices for r in outcome.rounds)
            else:
                self.summary.withheld[outcome.reason] += 1

    def _slot_rng(self, key: EpochKey) -> np.random.Generator:
        """The permutation's generator: seeded by the instance's secret salt (128 bits from the
        OS's entropy, ``secrets``) and the epoch, so a release repeated after a crash is the same
        release, and nobody without the salt can predict or undo it."""
        digest = hashlib.sha256(f"{self._salt}\x1fperm\x1f{key[0]}\x1f{key[1]}\x1f{key[2]}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest, "little"))

    def _batch_id(self, q: Query, epoch: int, rnd: int, index: int) -> str:
        text = f"{self._salt}\x1f{q.query_id}\x1f{q.version}\x1f{epoch}\x1f{rnd}\x1f{index}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _release(self, out: Released) -> None:
        s = self.s
        q = out.query
        stamp = (out.epoch + 1) * EPOCH_S * 1000  # every record of a release: the epoch's end
        base = {"query_id": q.query_id, "query_version": q.version, "epoch": out.epoch,
                "producer_id": s.transactional_id, "n_stations": q.n_stations, "n_outputs": q.n_outputs,
                "kind": "reports", "layout": q.spec.layout}
        per_round: list[dict[int, list[int]]] = []
        for r, rnd in enumerate(out.rounds):
            per_part = {part: [0, 0] for part in self._out_parts}
            for i, start in enumerate(range(0, rnd.reports, s.batch_size)):
                n = min(s.batch_size, rnd.reports - start)
                batch_id = self._batch_id(q, out.epoch, r, i)
                key = batch_id.encode()
                part = self._out_parts[(murmur2(key) & 0x7FFFFFFF) % len(self._out_parts)]
                chunk = {k: v[start:start + n] for k, v in rnd.arrays.items()}
                value = encode_batch({**base, "round": r, "batch_id": batch_id, "reports": n}, chunk)
                self._producer.send(s.reports_topic, key=key, value=value, partition=part, timestamp_ms=stamp,
                                    headers=[(KIND_HEADER, b"reports")])
                per_part[part][0] += n
                per_part[part][1] += 1
            per_round.append(per_part)
        for part in self._out_parts:
            markers = tuple(EndOfEpoch(
                producer_id=s.transactional_id, producer_index=s.instance_index, producer_count=s.instance_count,
                query_id=q.query_id, query_version=q.version, epoch=out.epoch, round=r, partition=part,
                reports_to_partition=per_round[r][part][0], batches_to_partition=per_round[r][part][1],
                reports_total=rnd.reports, batches_total=sum(b for _, b in per_round[r].values()),
                participants=rnd.devices, refused=0, mode="per-vehicle") for r, rnd in enumerate(out.rounds))
            self._producer.send(s.reports_topic, key=f"eoe-{s.transactional_id}".encode(), partition=part,
                                value=encode_json(EndOfEpochSet(markers=markers)), timestamp_ms=stamp,
                                headers=[(KIND_HEADER, b"end_of_epoch")])

    def _withhold(self, out: Withheld) -> None:
        s = self.s
        q = out.query
        detail = (f"{q.record_key} epoch {out.epoch}: device reports per round {list(out.devices)}, below "
                  f"min_crowd {s.min_crowd}; not released, no estimate")
        log.warning("withheld %s", detail)
        letter = Rejected(out.reason, detail).letter(s.device_topic, -1, -1, None)
        self._producer.send(s.dead_letter_topic, key=out.reason.encode(), value=letter.model_dump_json().encode())
