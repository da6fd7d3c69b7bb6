"""A polled batch's admission (stream_app/shuffler/admission.py) against one report at a time
(the policy's scalar ``admit``, the loop the batch path replaced): on a mixed batch of good,
duplicate, forged, late, early, malformed and unknown records -- station-valued, bitmap, pairs
and JSON -- every record gets the same reason (or none), and every slot holds the same counts."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from schemas import DeviceReport, Query, SourceEpoch, encode_json
from schemas.device_binary import FLAG_AUTH, encode_device, encode_device_values
from schemas.enrollment import Enrollment
from schemas.estimates import Rejected
from stream_app.shuffler import admission as admission_module
from stream_app.shuffler.admission import Admission, Step
from stream_app.shuffler.columns import decode_batch
from stream_app.shuffler.enrolled import SlotDevices
from stream_app.shuffler.policy import ShufflePolicy

E = Enrollment(b"the admission test's enrollment secret", devices=1000)
T0 = datetime(2026, 11, 18, tzinfo=UTC)
V = 20
SP = Query(query_id="sp", analyst_id="a", version=1, mechanism="sp", sensors=tuple(range(1, V + 1)), population=40,
           t_start=T0, t_end=T0 + timedelta(days=1))
UN = Query(query_id="un", analyst_id="a", version=1, mechanism="unary", sensors=tuple(range(1, V + 1)),
           population=40, t_start=T0, t_end=T0 + timedelta(days=1))
QUERIES = {(q.query_id, q.version): q for q in (SP, UN)}
E0 = SP.epoch_range()[0]


@dataclass
class _Rec:
    partition: int
    value: bytes | None
    offset: int = 0


def _bitmap(query_id: str, epoch: int, rnd: int, stations: list[int], v: int, device: int) -> bytes:
    """A sealed bitmap report (docs/wire.md: flags pairs | bitmap, u16 V, ceil(V/8) bytes LSB first)."""
    bits = np.zeros(8 * ((v + 7) // 8), np.uint8)
    bits[np.asarray(stations, np.int64) - 1] = 1
    head = bytes((1, 0x05 | FLAG_AUTH, len(query_id))) + query_id.encode()
    body = (1).to_bytes(4, "little") + epoch.to_bytes(4, "little") + bytes((rnd,)) + v.to_bytes(2, "little")
    message = head + body + np.packbits(bits, bitorder="little").tobytes() + device.to_bytes(4, "little")
    return message + E.mac(device, message)


def _records(rng: np.random.Generator, n: int) -> list[_Rec]:
    out = []
    for _ in range(n):
        kind = rng.integers(8)
        device = int(rng.integers(0, 60))  # a small fleet: duplicates happen
        epoch = E0 + int(rng.choice([0, 1, 2, 3, 4, 9, -1]))  # decided, open, ahead, far, before the query
        rnd = int(rng.choice([0, 0, 0, 1, 2]))
        if kind <= 2:  # station-valued binary (some values above V)
            raw = E.seal_messages(encode_device_values("sp", 1, epoch, min(rnd, 1), np.array([rng.integers(0, V + 3)]),
                                                       np.array([device])), [device])[0]
        elif kind <= 4:  # bitmap, one time in four of the wrong width
            v = V if rng.random() < 0.75 else V - 1
            stations = sorted(set(rng.integers(1, v + 1, rng.integers(0, 6)).tolist()))
            raw = _bitmap("un" if rng.random() < 0.9 else "sp", epoch, min(rnd, 1), stations, v, device)
        elif kind == 5:  # pairs (a repeated station, the default report, a station above V now and then)
            pairs = tuple((int(s), int(o)) for s, o in zip(rng.integers(1, V + 2, 3), rng.choice([1, 1, 1, 0], 3),
                                                            strict=True))
            raw = E.seal(encode_device("un", 1, epoch, min(rnd, 1), pairs=pairs), device)
        elif kind == 6:  # JSON, station-valued, or an unknown query
            qid = "sp" if rng.random() < 0.8 else "nobody"
            raw = encode_json(E.sign_report(DeviceReport(query_id=qid, query_version=1, epoch=epoch, round=min(rnd, 1),
                                                         value=int(rng.integers(0, V + 1))), device))
        else:  # a note on the device topic, or a mutated record
            raw = encode_json(SourceEpoch(epoch=epoch)) if rng.random() < 0.3 else bytes(
                rng.integers(0, 256, rng.integers(0, 40), dtype=np.uint8))
        out.append(_Rec(int(rng.integers(0, 2)), raw, len(out)))
    return out


def _policy() -> ShufflePolicy:
    """The clock at E0 (decided), then E0 + 1 vouched at offset 1,500 of partition 0: records
    below it are judged at the clock E0, those above at E0 + 1 (window_clock)."""
    p = ShufflePolicy(min_crowd=1, lateness_epochs=1, idle_release_s=1.0, partitions=(0, 1), ahead_epochs=2)
    p.note(SourceEpoch(epoch=E0, opens=True), lambda e: [SP, UN], 0.0)
    p.note(SourceEpoch(epoch=E0, device_offsets=((0, 0),)), lambda e: [SP, UN], 0.0)
    p.note(SourceEpoch(epoch=E0 + 1, device_offsets=((0, 1500),)), lambda e: [SP, UN], 0.0)
    for q in (SP, UN):
        p.close((q.query_id, q.version, E0), np.random.default_rng(0), "aggregate")  # E0: decided, reports late
    return p


def _catch_up(p: ShufflePolicy) -> None:
    """The notes a real catch-up would read: the clock moves one epoch (the window grows)."""
    p.note(SourceEpoch(epoch=p.clock + 1), lambda e: [SP, UN], 0.0)


def _one_at_a_time(records: list[_Rec]) -> tuple[ShufflePolicy, list[str | None]]:
    """The loop before batches: each record decoded, de-duplicated and admitted alone."""
    p, seen, caught, out = _policy(), SlotDevices(E), False, []
    for rec in records:
        b = decode_batch([rec.value], E)
        why: Rejected | None = b.reasons[0]
        if why is None and 0 in b.notes:
            why = Rejected("untrusted_note", "")
        if why is None:
            report = b.report(0)
            slot = (report.query_id, report.query_version, report.epoch, report.round)
            digest = seen.digest(slot, int(b.device[0]))
            query = QUERIES.get((report.query_id, report.query_version))
            if seen.took(slot, digest):
                why = Rejected("duplicate_report", "")
            else:
                why = _admit(p, report, query, rec)
                if why is not None and why.reason == "outside_open_window" and not caught:
                    caught = True
                    _catch_up(p)
                    why = _admit(p, report, query, rec)
            if why is None:
                seen.add(slot, digest)
        out.append(None if why is None else why.reason)
    return p, out


def _admit(p: ShufflePolicy, report: DeviceReport, query: Query | None, rec: _Rec) -> Rejected | None:
    return p.admit(report, query, 0.0, int(p.window_clock(rec.partition, np.array([rec.offset]))[0]))


def _batched(records: list[_Rec], module: object = admission_module) -> tuple[ShufflePolicy, list[str | None]]:
    p = _policy()
    adm = module.Admission(p, SlotDevices(E), lambda q, v: QUERIES.get((q, v)),  # type: ignore[attr-defined]
                           lambda step: _catch_up(p), source_clock=True, source_topic="notes")
    step = Step()
    adm.take(decode_batch([r.value for r in records], E), records, step, lambda: 0.0)
    letters = {id(rec): why.reason for why, rec in step.letters}
    assert len(letters) == len(step.letters)  # one letter per refused record
    return p, [letters.get(id(rec)) for rec in records]


def _held(p: ShufflePolicy) -> dict[tuple[str, int, int], list[dict[str, object]]]:
    return {k: p.held_state(k) for k in p.open_epochs}


@pytest.mark.parametrize("seed", [3, 4])
def test_a_batch_is_admitted_as_one_report_at_a_time(seed: int) -> None:
    records = _records(np.random.default_rng(seed), 3000)
    p1, want = _one_at_a_time(records)
    p2, got = _batched(records)
    assert got == want
    assert _held(p2) == _held(p1)
    assert p2.clock == p1.clock  # the catch-up came once, at the same record
    kinds = {w for w in want if w is not None}
    # every path exercised: the policy's and the decoder's reasons, and admissions
    assert {"duplicate_report", "late", "outside_open_window", "outside_query_window", "bad_round", "out_of_range",
            "wrong_layout", "bad_pairs", "unknown_query", "untrusted_note", "slot_full", "bad_encoding"} <= kinds, kinds
    assert want.count(None) > 300


def test_the_comparison_catches_a_batch_path_that_skips_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is not vacuous: a batch path whose array check forgets the decided
    epochs (``late``) admits what one at a time refuses."""
    records = _records(np.random.default_rng(3), 3000)
    _, want = _one_at_a_time(records)
    real = ShufflePolicy.passing

    def forgetful(self: ShufflePolicy, *args: object, **kw: object) -> object:
        saved, self.decided = self.decided, set()
        try:
            return real(self, *args, **kw)  # type: ignore[arg-type]
        finally:
            self.decided = saved

    monkeypatch.setattr(ShufflePolicy, "passing", forgetful)
    _, got = _batched(records)
    assert got != want


def test_a_report_is_judged_at_the_clock_where_it_lies() -> None:
    """A flood for E0 + 4 read after the notes moved the clock to E0 + 2 (its window: E0 + 4) is
    still refused if it lies below the offset the note of E0 + 2 vouched for: it was sent when
    the clock was E0 + 1. One just past that offset is admitted."""
    def flood(offset: int) -> _Rec:
        device = offset % 1000
        raw = E.seal_messages(encode_device_values("sp", 1, E0 + 4, 0, np.array([3]), np.array([device])), [device])[0]
        return _Rec(0, raw, offset)

    p = _policy()
    p.note(SourceEpoch(epoch=E0 + 2, device_offsets=((0, 2000),)), lambda e: [SP, UN], 0.0)
    adm = Admission(p, SlotDevices(E), lambda q, v: QUERIES.get((q, v)), lambda step: None, source_clock=True,
                    source_topic="notes")
    records = [flood(1999), flood(2000)]
    step = Step()
    adm.take(decode_batch([r.value for r in records], E), records, step, lambda: 0.0)
    assert [(why.reason, rec.offset) for why, rec in step.letters] == [("outside_open_window", 1999)]
    assert "[" in step.letters[0][0].detail and f"{E0 + 3}]" in step.letters[0][0].detail
    assert p.held_state(("sp", 1, E0 + 4))[0]["devices"] == 1


def test_bitmap_counts_are_the_pairs_counts() -> None:
    """A bitmap report and the same stations as pairs give a slot the same counts."""
    stations = [1, 4, 9, 16, 17, 20]
    by_map = [_Rec(0, _bitmap("un", E0 + 1, 0, stations, V, 5))]
    by_pairs = [_Rec(0, E.seal(encode_device("un", 1, E0 + 1, 0, pairs=tuple((s, 1) for s in stations)), 5))]
    p1, r1 = _batched(by_map)
    p2, r2 = _batched(by_pairs)
    assert r1 == r2 == [None]
    assert _held(p1) == _held(p2)
    got = _held(p1)[("un", 1, E0 + 1)][0]
    assert got["devices"] == 1 and got["index"] == [2 * s + 1 for s in stations]  # station * O + report 1


def _good(n: int, dup: bool = False) -> list[_Rec]:
    """``n`` admissible reports of epoch E0 + 1 (station-valued for sp, both rounds, bitmaps
    for un), one per device and slot -- with ``dup``, device 7's sp report a second time at
    the end."""
    rng = np.random.default_rng(5)
    out = []
    for d in range(n):
        raw = [E.seal_messages(encode_device_values("sp", 1, E0 + 1, r, np.array([rng.integers(0, V + 1)]),
                                                    np.array([d])), [d])[0] for r in (0, 1)]
        stations = sorted(set(rng.integers(1, V + 1, 3).tolist()))
        out += [_Rec(0, raw[0]), _Rec(0, _bitmap("un", E0 + 1, 0, stations, V, d)), _Rec(0, raw[1])]
    if dup:
        out.append(_Rec(0, E.seal_messages(encode_device_values("sp", 1, E0 + 1, 0, np.array([2]), np.array([7])),
                                           [7])[0]))
    for i, r in enumerate(out):
        r.offset = i
    return out


def _steps(records: list[_Rec], population: int = 1000) -> tuple[ShufflePolicy, Step]:
    p = _policy()
    queries = {k: q.model_copy(update={"population": population}) for k, q in QUERIES.items()}
    adm = Admission(p, SlotDevices(E), lambda q, v: queries.get((q, v)), lambda step: _catch_up(p),
                    source_clock=True, source_topic="notes")
    step = Step()
    adm.take(decode_batch([r.value for r in records], E), records, step, lambda: 0.0)
    return p, step


@pytest.mark.parametrize(("dup", "population", "fast"), [(False, 1000, True), (True, 1000, False),
                                                         (False, 30, False)])
def test_a_clean_batch_is_admitted_a_slot_at_a_time(dup: bool, population: int, fast: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch where every record is admitted takes the slot-at-a-time path and ends where one
    report at a time ends (counts, devices, the step's digests in order); a batch with one
    device twice in a slot, or with more reports than a slot's population, takes the record
    loop (the duplicate and the reports past the population refused, as one at a time)."""
    records = _good(40, dup)
    loops: list[int] = []
    real = Admission._one_by_one

    def counted(self: Admission, *args: object) -> object:
        loops.append(1)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Admission, "_all_admitted", lambda self, *args: None)  # the reference: the record loop
    forced_p, forced_step = _steps(records, population)
    monkeypatch.undo()
    monkeypatch.setattr(Admission, "_one_by_one", counted)
    got_p, got_step = _steps(records, population)
    assert bool(loops) != fast
    assert _held(got_p) == _held(forced_p) and got_step.digests == forced_step.digests
    assert list(got_step.digests) == list(forced_step.digests)  # slots in first-arrival order
    assert [(w.reason, r.offset) for w, r in got_step.letters] == [(w.reason, r.offset) for w, r in forced_step.letters]
    assert got_step.slots == forced_step.slots
    want = 1 if dup else 3 * max(0, 40 - population)
    assert len(got_step.letters) == want
