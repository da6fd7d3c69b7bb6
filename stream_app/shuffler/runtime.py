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

Enrolled devices only (docs/wire.md, "Device authentication"): the decode step checks each
report's device id and MAC (``unauthenticated``, ``unknown_device``, ``bad_mac``), a slot takes
one report per device (``duplicate_report``; with several instances a device's reports must be
on partition ``id mod partitions``, else ``wrong_partition``), and the id goes no further than
the slot's keyed digest (:mod:`.enrolled`): the state log, dead letters, logs and metrics
never hold a device id or a MAC.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import numpy as np
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry, start_http_server

from schemas import (
    Query,
    SourceEpoch,
    WireError,
    active_queries,
    decode_device_record,
)
from schemas.device_binary import strip_auth
from schemas.epochs import epoch_of, epoch_start
from schemas.estimates import Rejected
from schemas.kafka_io import BrokerLost, BrokerUnavailable, QueryReader, broker_lost, connect, ensure_topics

from ..guard import BrokerGuard, stop_grace_s
from .admission import Admission, Step
from .columns import decode_batch
from .enrolled import Slot, SlotDevices, state
from .intake import Intake
from .metrics import ShufflerMonitor
from .policy import EpochKey, Released, ShufflePolicy, Withheld
from .release import KIND_HEADER, Outgoing, release_records, withheld_records
from .settings import ShufflerSettings
from .state import (
    BarrierLog,
    LiveSteps,
    StateRecord,
    decided_key,
    fold,
    from_kafka,
    headers,
    held_key,
    logged_step,
    step_key,
)

__all__ = ["KIND_HEADER", "Shuffler", "ShufflerSummary", "shuffler_topics"]

#: refusals of a record no enrolled device vouches for: its dead letter keeps 64 bytes of it, so a
#: flood of them costs the dead-letter topic a bounded letter each, not a copy
UNVOUCHED = frozenset({"unauthenticated", "bad_mac", "unknown_device", "revoked", "untrusted_note"})
UNVOUCHED_PREFIX = 64
#: seconds a step may spend reading the source notes ahead of the main consumer (Admission's catch-up)
CATCH_UP_S = 5.0
#: a device partition read more epochs than this past the slowest one waits (paused) for it
ABREAST_EPOCHS = 2

log = logging.getLogger(__name__)


@dataclass
class ShufflerSummary:
    received: int = 0
    released_epochs: int = 0
    released_reports: int = 0
    withheld: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    restored: int = 0
    notes: int = 0  # the replay's source metadata records (SourceEpoch), not device reports

    def line(self) -> str:
        w = ", ".join(f"{k}: {v}" for k, v in sorted(self.withheld.items())) or "none"
        d = ", ".join(f"{k}: {v}" for k, v in sorted(self.dead_letters.items())) or "none"
        return (f"shuffler: {self.received:,} device reports read ({self.restored:,} restored), "
                f"{self.released_epochs:,} epochs released with {self.released_reports:,} reports; "
                f"withheld epochs: {w}; dead letters: {d}")


def shuffler_topics(s: ShufflerSettings) -> tuple[dict[str, int], set[str]]:
    """The topics an instance ensures on start (name -> partitions) and those of them compacted:
    what deploy/kafka/create-topics.sh must create for it (tests/unit/project/test_deploy.py)."""
    topics = {s.reports_topic: s.partitions, s.queries_topic: 1, s.device_topic: s.device_partitions,
              s.source_topic: 1, s.dead_letter_topic: 1, s.state_topic: 1}
    return topics, {s.queries_topic, s.state_topic}


class Shuffler:
    """One shuffler instance; :meth:`run` until :meth:`stop` (or SIGTERM/SIGINT with ``signals``).

    A lost broker (:class:`~stream_app.guard.BrokerGuard`: silent for ``broker_loss_timeout_s``,
    a topic gone or recreated) stops it: :meth:`run` raises :class:`~schemas.kafka_io.BrokerLost`
    once its loop has ended, or -- a Kafka call that never returns while the broker is gone --
    ``exit_lost`` is called after :func:`~stream_app.guard.stop_grace_s` and must end the process
    (the command line's: one line, exit code 7)."""

    def __init__(self, settings: ShufflerSettings, monitor: ShufflerMonitor | None = None,
                 exit_lost: Callable[[BrokerLost], None] | None = None) -> None:
        self.s = settings
        self.enrollment = settings.enrollment()  # EnrollmentError (one line) before any connection
        self._seen = SlotDevices(self.enrollment)
        self._device_parts = 1
        self.summary = ShufflerSummary()
        self.monitor = monitor or ShufflerMonitor(CollectorRegistry())
        self._exit_lost = exit_lost
        self.guard: BrokerGuard | None = None
        self._queries_read_at = -1e9
        self._stop = threading.Event()
        self._step = 0
        self._step_tp = TopicPartition(settings.state_topic, 0)
        self._salt = ""
        self._salt_new = False
        self._inc = secrets.token_hex(8)  # this incarnation, on every state record (module state.py)
        # the steps whose state record is live: the epoch keys and note epochs its records went to
        self._live = LiveSteps()
        self._barriers = BarrierLog()  # the clock's barriers in the state log

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
        topics, compacted = shuffler_topics(s)
        ids = ensure_topics(s, topics, compacted=compacted)
        self.guard = guard = BrokerGuard(s, list(topics))
        guard.know(ids)  # the baseline: the topics as they are once ensured
        guard.start(self._on_lost)
        server = None
        if s.metrics_port:
            server, _ = start_http_server(s.metrics_port, s.metrics_host, registry=self.monitor.registry)
        try:
            self._run()
        except (KafkaError, OSError, BrokerUnavailable):
            if guard.lost is None:
                raise
        finally:
            guard.stop()
            if server is not None:
                server.shutdown()
                server.server_close()
        if guard.lost is not None:
            if self._exit_lost is not None and not guard.settle():  # the deadline reports it and ends the process
                threading.Event().wait()
            raise broker_lost(s, guard.lost)
        return self.summary

    def _on_lost(self, reason: str) -> None:
        """The guard's verdict: the loop stops after its step; past the stop grace (a Kafka call
        that waits for the gone broker forever) ``exit_lost`` ends the process."""
        self._stop.set()
        logging.disable(logging.CRITICAL)  # what the stop logs (connection errors) is noise next to the one line

        def deadline() -> None:
            guard = self.guard
            if self._exit_lost is not None and guard is not None and guard.settle():
                self._exit_lost(broker_lost(self.s, guard.lost or reason))

        timer = threading.Timer(stop_grace_s(self.s.broker_loss_timeout_s), deadline)
        timer.daemon = True
        timer.start()

    def _run(self) -> None:
        s = self.s
        self._producer = connect("producer", s, KafkaProducer, transactional_id=s.transactional_id,
                                 enable_idempotence=True, acks="all", linger_ms=5,
                                 max_request_size=8 * 1024 * 1024, batch_size=1024 * 1024)
        self._producer.init_transactions()  # fences a previous incarnation, aborts its open transaction
        self._consumer = Intake(s, group_id=s.transactional_id)  # reads the group's offsets, never commits
        self._reader = QueryReader(s)
        self._notes_reader: KafkaConsumer | None = None
        try:
            self._reader.catch_up()
            parts = sorted(self._producer.partitions_for(s.reports_topic) or [])
            self._out_parts = parts
            self._tps = self._assign()
            self.policy = ShufflePolicy(s.min_crowd, s.lateness_epochs, s.idle_release_s,
                                        [tp.partition for tp in self._tps], s.ahead_epochs, s.note_lead_epochs,
                                        s.note_pace)
            self._admission = Admission(self.policy, self._seen, self._query, self._catch_up_notes,
                                        source_clock=s.clock == "source", source_topic=s.source_topic,
                                        instances=s.instance_count, partitions=self._device_parts)
            self._restore()
            self._loop(s.fault_hold_s)
        finally:
            lost = self.guard is not None and self.guard.lost is not None
            self._reader.close()
            if self._notes_reader is not None:
                self._notes_reader.close()
            self._consumer.close()
            self._producer.close(timeout=0 if lost else 10)

    # -- setup ---------------------------------------------------------------------------------
    def _assign(self) -> list[TopicPartition]:
        s = self.s
        deadline = time.monotonic() + 30
        parts: set[int] = set()
        while not parts and time.monotonic() < deadline:
            parts = self._consumer.partitions_for_topic(s.device_topic) or set()
            if not parts:
                time.sleep(0.1)
        self._device_parts = max(len(parts), 1)
        mine = [TopicPartition(s.device_topic, p) for p in sorted(parts) if p % s.instance_count == s.instance_index]
        self._notes_tp = TopicPartition(s.source_topic, 0)  # the trusted clock: every instance reads it whole
        # the step counter travels as the committed "offset" of the state topic's partition: in
        # the same transaction as the input offsets (a broker need not keep offset metadata); it
        # is in the state log too (_restore), for when the group's offsets have expired
        step = self._consumer.committed(self._step_tp)
        self._group_step = step if step is not None and step > 0 else None
        self._step = self._group_step or 0
        return mine

    def _seek(self, kept: dict[str, int]) -> None:
        """Read the input from the group's committed offsets or, if they are gone (expired), from
        those the state log's ``clock`` record of the committed step kept (``kept``)."""
        offsets = {}
        for tp in [*self._tps, self._notes_tp]:
            got = self._consumer.committed(tp) if self._group_step is not None else None
            if got is None or got < 0:
                got = kept.get(f"{tp.topic}:{tp.partition}", 0)
            offsets[tp] = got
        self._consumer.assign(offsets)

    def _restore(self) -> None:
        """Rebuild the held reports and decided epochs from the state records of committed steps
        (stream_app/shuffler/state.py: what a compacted state topic keeps folds the same)."""
        s = self.s
        consumer = connect("consumer", s, KafkaConsumer, group_id=None, enable_auto_commit=False,
                           isolation_level="read_committed", max_partition_fetch_bytes=16 * 1024 * 1024)
        try:
            tp = TopicPartition(s.state_topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            end = consumer.end_offsets([tp])[tp]
            read: list[StateRecord] = []
            while consumer.position(tp) < end:
                for records in consumer.poll(timeout_ms=500, max_records=10_000).values():
                    read.extend(from_kafka(rec.key, rec.value, rec.headers) for rec in records)
        finally:
            consumer.close()
        if self._group_step is None and read:  # the group's offsets are gone: the state log's step
            self._step = logged_step(read)
            log.warning("shuffler: no committed offsets in group %s; resuming from the state log's step %d",
                        s.transactional_id, self._step)
        live = fold(read, self._step)
        clock = next((r.value or {} for r in live if r.key == "clock"), {})
        self.policy.restore_clock(clock)  # first: the reports restored were admitted under it
        barriers: list[tuple[int, dict[int, int]]] = []
        for record in live:
            value = record.value or {}
            if record.key == "clock":
                continue
            if "barrier" in value:
                clock_at, barrier = value["barrier"]
                barriers.append((int(clock_at), {int(p): int(o) for p, o in barrier.items()}))
                continue
            self._salt = value.get("salt") or self._salt
            self._seen.restore(value.get("seen", ()))
            slots, notes = self._apply(value)
            if value.get("admit") or value.get("seen"):
                self._live.add(record.s, slots, notes)  # each looked at in the first step
        self.policy.restore_barriers(barriers)
        self._barriers.restored(c for c, _ in barriers)
        self.policy.reopen(self._active_fn())
        self.policy.dropped_notes()  # what the restore dropped: every live step is looked at anyway
        self._seen.prune(self.policy.is_open)
        self._seek(clock.get("offsets", {}))
        if not self._salt:
            self._salt, self._salt_new = secrets.token_hex(16), True

    def _apply(self, state: dict[str, Any]) -> tuple[frozenset[EpochKey], frozenset[int]]:
        """Restore one record's admitted reports (a ``held`` epoch's counts, or -- a log written
        before counts were held -- the reports one by one) and decided epochs; the keys the
        reports went to."""
        slots: set[EpochKey] = set()
        notes: set[int] = set()
        if "held" in state:
            q, v, e = state["held"]
            query = self._query(q, v)
            if query is None:  # held before the restart, refused now (its query version is gone)
                log.warning("shuffler: restored counts of %s:v%s epoch %s name no known query; dropped", q, v, e)
            else:
                self.policy.restore_held((q, v, e), query, state["rounds"])
                self.summary.restored += max(int(r["devices"]) for r in state["rounds"])
        for _, raw in state.get("admit", ()):  # [partition (-1: the source notes), record]
            record = decode_device_record(raw.encode())
            if isinstance(record, SourceEpoch):
                why = self.policy.note(record, self._active_fn(), time.monotonic())
            else:
                why = self.policy.admit(record, self._query(record.query_id, record.query_version), time.monotonic())
            if why is not None:  # held before the restart, refused now (e.g. its query version is gone)
                log.warning("shuffler: a restored record is refused now (%s: %s); it is dropped", why.reason,
                            why.detail)
                continue
            if isinstance(record, SourceEpoch):
                notes.add(record.epoch)
                continue
            slots.add((record.query_id, record.query_version, record.epoch))
            self.summary.restored += 1
        slots.update((str(q), int(v), int(e)) for q, v, e, _, _ in state.get("seen", ()))
        for q, v, e in state.get("decided", ()):
            self.policy.mark_decided((q, v, e))
        return frozenset(slots), frozenset(notes)

    def _query(self, query_id: str, version: int) -> Query | None:
        """The query version a device report names; an unknown one after the queries topic was
        read to its end as the broker says now (a query published just before its first reports
        is then known), at most once a second (a flood of unknown queries costs no more)."""
        q = self._reader.queries.get((query_id, version))
        if q is None and time.monotonic() - self._queries_read_at >= 1.0:
            self._reader.read_to_end(5.0)
            self._queries_read_at = time.monotonic()
            q = self._reader.queries.get((query_id, version))
        return q

    def _active_fn(self) -> Callable[[int], list[Query]]:
        """The queries active in an epoch (:func:`schemas.active_queries`: per id, the newest
        version whose window holds the epoch's start), as the queries topic says now."""
        self._reader.poll(0)
        queries = list(self._reader.queries.values())
        return lambda epoch: active_queries(queries, epoch_start(epoch))

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self, fault_hold_s: float) -> None:
        s = self.s
        last_queries = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_queries > 1.0:
                self._reader.poll(0)
                last_queries = now
            if s.clock == "wall":  # live devices: the last epoch that ended on this host's clock
                self.policy.advance(epoch_of(datetime.now(UTC)) - 1, self._active_fn())
            got = self._consumer.poll(0.2, s.max_poll_records)
            step = Step()
            self.enrollment.refresh_revocation()  # a changed list applies from this batch on (one stat)
            for rec in got.get(self._notes_tp, ()):  # the trusted clock first: what the reports behind it need
                self._take_note(rec, step)
            for tp, records in got.items():
                if tp != self._notes_tp:  # the decode step: columns, reasons, each device id and MAC checked
                    self._admission.take(decode_batch(records.values, self.enrollment), records, step,
                                         time.monotonic)
            positions = self._positions()
            self._abreast(positions)
            due = (self.policy.due(time.monotonic(), self._caught_up(), positions)
                   if self.policy.open_count() else [])
            if not (step.admitted or step.letters or step.slots or due or self._salt_new):
                continue
            self._live.add(self._step + 1, step.slots, step.notes)
            for out in self._transaction(step.admitted, step.letters, due, fault_hold_s, step.read, step.digests,
                                         step.slots):
                self._seen.forget((out.query.query_id, out.query.version, out.epoch), out.query.n_rounds)

    def _take_note(self, rec: Any, step: Step) -> None:
        step.read[1] += 1
        try:
            note = decode_device_record(rec.value)
        except WireError as exc:
            step.letters.append((Rejected(exc.reason, exc.detail), rec))
            return
        if not isinstance(note, SourceEpoch):
            step.letters.append((Rejected("unexpected_record", "a device report on the source-notes topic"), rec))
            return
        # signed by the replay (whatever the broker's ACLs), and no further ahead than what vouches for it
        auth = self.enrollment.check_note(note)
        wall = epoch_of(datetime.now(UTC)) if self.s.clock == "wall" else None
        why = (Rejected(auth.reason, auth.detail) if auth is not None
               else self.policy.note_refusal(note, time.monotonic(), wall))
        if why is not None:
            self.policy.note_refused(note.epoch)
            step.letters.append((why, rec))
            return
        why = self.policy.note(note, self._active_fn(), time.monotonic())
        if why is not None:
            step.letters.append((why, rec))
            return
        step.admitted.append((-1, rec.value.decode()))
        step.notes.add(note.epoch)

    def _catch_up_notes(self, step: Step) -> None:
        """Read the source notes to their end as the broker says now, with a reader of their own,
        for at most ``CATCH_UP_S`` -- checked before each note, so a backlog of notes cannot hold
        the step (and its releases) longer -- then move the main consumer past the notes taken
        (it never returns them again; those left it reads itself)."""
        c, tp = self._consumer, self._notes_tp
        if self._notes_reader is None:
            self._notes_reader = connect("consumer", self.s, KafkaConsumer, group_id=None, enable_auto_commit=False,
                                         isolation_level="read_committed")
            self._notes_reader.assign([tp])
        reader = self._notes_reader
        reader.seek(tp, c.position(tp))
        end = reader.end_offsets([tp])[tp]
        deadline = time.monotonic() + CATCH_UP_S
        left: int | None = None  # the first note not taken, once the deadline passed within a poll
        while left is None and reader.position(tp) < end and time.monotonic() < deadline:
            for rec in reader.poll(timeout_ms=100, max_records=1000).get(tp, ()):
                if time.monotonic() >= deadline:
                    left = rec.offset
                    break
                self._take_note(rec, step)
        c.skip_to(tp, reader.position(tp) if left is None else left)

    def _positions(self) -> dict[int, int]:
        return {tp.partition: self._consumer.position(tp) for tp in self._tps}

    def _abreast(self, positions: dict[int, int]) -> None:
        """Read the device partitions abreast by the replay's clock: each is read up to the
        newest epoch whose reports lie below its position (:meth:`~.policy.ShufflePolicy.window_clock`),
        and one more than ``ABREAST_EPOCHS`` past the slowest is paused until that one catches up.
        An epoch is released only once every partition is read past it: a partition read to its
        end while another lags holds every release (a day's backlog: minutes, and its slots)."""
        if self.s.clock != "source" or len(self._tps) < 2:
            return
        at = {tp: int(self.policy.window_clock(tp.partition, np.array([positions[tp.partition]], np.int64))[0])
              for tp in self._tps}
        slowest = min(at.values())
        self._consumer.pause_only(tp for tp, epoch in at.items() if epoch > slowest + ABREAST_EPOCHS)

    def _caught_up(self) -> frozenset[int]:
        """The input partitions read to their end as the broker says now (a fetch's high-water
        mark may be older than records another partition's newer epoch implies are there) --
        asked only when it can matter: once the input has been quiet for ``idle_release_s``
        (the policy's end-of-input rule; a broker round trip per partition otherwise every step)."""
        if time.monotonic() - self.policy.last_arrival < self.s.idle_release_s:
            return frozenset()
        ends = self._consumer.end_offsets(self._tps)
        return frozenset(tp.partition for tp in self._tps if self._consumer.position(tp) >= ends[tp])

    def _transaction(self, admitted: list[tuple[int, str]], letters: list[tuple[Rejected, Any]],
                     due: list[EpochKey], fault_hold_s: float, read: list[int],
                     digests: dict[Slot, list[bytes]] | None = None, touched: set[EpochKey] | None = None,
                     ) -> list[Released | Withheld]:
        """One step, committed or (a Kafka error: counted, aborted unless the broker is lost) raised;
        what its due epochs became."""
        p = self._producer
        self._step += 1
        p.begin_transaction()
        try:
            outcomes = self._step_records(admitted, letters, due, fault_hold_s, digests or {}, touched or set())
            p.commit_transaction()
        except KafkaError:
            self.monitor.on_abort()
            if self.guard is None or self.guard.lost is None:
                with contextlib.suppress(KafkaError):
                    p.abort_transaction()
            raise
        self._salt_new = False
        self.summary.received += read[0]
        self.summary.notes += read[1]
        released: list[tuple[int, int]] = []
        withheld: list[tuple[str, int]] = []
        for why, _ in letters:
            self.summary.dead_letters[why.reason] += 1
        for outcome in outcomes:
            if isinstance(outcome, Released):
                n = 0 if outcome.interrupted else sum(r.devices for r in outcome.rounds)
                self.summary.released_epochs += 1
                self.summary.released_reports += n
                released.append((outcome.epoch, n))
            else:
                self.summary.withheld[outcome.reason] += 1
                below = sum(d < self.s.min_crowd for d in outcome.devices) if outcome.reason == "below_min_crowd" else 0
                withheld.append((outcome.reason, below))
        self.monitor.on_step(read[0], read[1], [why.reason for why, _ in letters], released, withheld,
                             self.policy.held())
        return outcomes

    def _step_records(self, admitted: list[tuple[int, str]], letters: list[tuple[Rejected, Any]],
                      due: list[EpochKey], fault_hold_s: float, digests: dict[Slot, list[bytes]],
                      touched: set[EpochKey]) -> list[Released | Withheld]:
        """Everything a step sends inside its transaction; what its due epochs became."""
        s = self.s
        p = self._producer
        for why, rec in letters:
            # never a device id or MAC: the record without its authentication trailer; of a record
            # nobody vouches for (a flood's), its reason, size and a short prefix only
            letter = why.letter(rec.topic, rec.partition, rec.offset, strip_auth(rec.value),
                                UNVOUCHED_PREFIX if why.reason in UNVOUCHED else 4096)
            p.send(s.dead_letter_topic, key=why.reason.encode(), value=letter.model_dump_json().encode())
        decided = []
        outcomes: list[Released | Withheld] = []
        for key in due:
            outcome = self.policy.close(key, self._slot_rng(key), self.s.release)
            decided.append(list(key))
            outcomes.append(outcome)
            if isinstance(outcome, Released):
                self._send_out(release_records(self.s, self._out_parts, self._salt, outcome))
            else:
                self._withhold(outcome)
        self._send_state(admitted, decided, digests, touched)
        offsets = {tp: OffsetAndMetadata(self._consumer.position(tp), "", -1) for tp in [*self._tps, self._notes_tp]}
        offsets[self._step_tp] = OffsetAndMetadata(self._step, "", -1)
        p.send_offsets_to_transaction(offsets, s.transactional_id)
        if fault_hold_s:
            p.flush()
            time.sleep(fault_hold_s)
        return outcomes

    def _send_state(self, admitted: list[tuple[int, str]], decided: list[list[Any]],
                    digests: dict[Slot, list[bytes]], touched: set[EpochKey]) -> None:
        """This step's state records (stream_app/shuffler/state.py): the source notes it took
        and its slots' new devices as keyed digests (apart, sorted: :mod:`.enrolled`), while any
        of their epochs is open; the counts held in each open epoch it added to (``held-``, the
        whole epoch's, replacing the last; a tombstone once decided); the epochs it decided;
        the salt once; the clock; and a tombstone for every earlier step whose epochs are all
        decided now."""
        def send(key: str, value: dict[str, Any] | None) -> None:
            self._producer.send(self.s.state_topic, key=key.encode(), partition=0, headers=hdrs,
                                value=None if value is None else json.dumps(value, separators=(",", ":")).encode())

        hdrs = headers(self._step, self._inc)
        self._live.touch([(q, v, e) for q, v, e in decided], self.policy.dropped_notes())
        for step in self._live.obsolete(self.policy.is_open, self.policy.has_note):
            if step != self._step:  # this step's own records, all decided already, are not written
                send(step_key(step), None)
        if self._step in self._live:
            send(step_key(self._step), {"admit": admitted, "seen": state(digests)})
        for key in sorted(k for k in touched if self.policy.is_open(k)):
            send(held_key(*key), {"held": list(key), "rounds": self.policy.held_state(key)})
        for q, v, e in decided:
            send(held_key(q, v, e), None)
            send(decided_key(q, v, e), {"decided": [[q, v, e]]})
        if self._salt_new:
            send("salt", {"salt": self._salt})
        for name, value in self._barriers.step(self.policy.barriers):  # each once, not all in every clock record
            send(name, value)
        offsets = {f"{tp.topic}:{tp.partition}": self._consumer.position(tp) for tp in [*self._tps, self._notes_tp]}
        send("clock", {**self.policy.clock_state(), "offsets": offsets})

    def _slot_rng(self, key: EpochKey) -> np.random.Generator:
        """The permutation's generator: seeded by the instance's secret salt (128 bits from the
        OS's entropy, ``secrets``) and the epoch, so a release repeated after a crash is the same
        release, and nobody without the salt can predict or undo it."""
        digest = hashlib.sha256(f"{self._salt}\x1fperm\x1f{key[0]}\x1f{key[1]}\x1f{key[2]}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest, "little"))

    def _send_out(self, records: list[Outgoing]) -> None:
        for r in records:
            self._producer.send(self.s.reports_topic, key=r.key, value=r.value, partition=r.partition,
                                timestamp_ms=r.timestamp_ms, headers=[(KIND_HEADER, r.kind.encode())])

    def _withhold(self, out: Withheld) -> None:
        s = self.s
        q = out.query
        detail = f"{q.record_key} epoch {out.epoch}: {out.detail}; not released, no estimate"
        log.warning("withheld %s", detail)
        letter = Rejected(out.reason, detail).letter(s.device_topic, -1, -1, None)
        self._producer.send(s.dead_letter_topic, key=out.reason.encode(), value=letter.model_dump_json().encode())
        # and markers attesting nothing, with the reason: the worker withholds the epoch, never leaves it absent
        self._send_out(withheld_records(s, self._out_parts, out))
