"""Stage records and epoch windows as plain data (``stream_app.worker.records``,
``stream_app.worker.windows``): no Faust, no broker.

Checked:

* records: ``encode_partial``/``decode_partial`` round trip for batches, markers and ticks;
  the count array travels in the smallest dtype (u1/u2/u4, i8 for negatives); anything
  else is a ``ValueError``;
* ``WindowState.new`` shapes; ``add`` of batches (per-vehicle and tallies) and markers:
  counts add across batches and rounds, reports and tallied vehicles are kept per round;
  a wrong width or round is refused before anything is added;
* duplicates: a batch id or an identical marker (same round, producer index, partition)
  counts once; a DIFFERENT marker for an occupied slot (a restarted producer) is recorded
  in ``conflicting`` whatever the arrival order (the epoch is then withheld, see
  tests/unit/stream_app/worker/test_estimate.py);
* late records after ``close`` are counted and change nothing, also after an
  ``encode``/``decode`` round trip; a closed state keeps only closed_by/late/duplicates;
* ``markers_complete`` for K producers x P partitions x R rounds in seeded random orders;
  ``participants`` (round-0 markers, missing producer indices), ``refused``,
  ``missing_batches`` (per producer, partition and round);
* ``Watermarks``: None until every source partition was seen, then the minimum; ``due``
  with allowed lateness; ``too_old``; ``track``/``untrack``; ``encode``/``decode``;
  ``dirty`` exactly when a change that must be persisted happened; a decoded state shares
  nothing with the bytes it came from;
* merge is addition: the same partials (duplicates included) in 25 seeded orders, with an
  encode/decode in the middle, give the same state; partials split across two states sum
  to the counts of one;
* ``WindowPolicy.apply``: closes by "markers", "watermark" and "wall_clock" (within the
  grace and the live horizon only); an epoch the watermark passed before its data came opens
  a window all the same (``born_late``); with ``watermark_idle_s`` a passed window closes only
  once idle by the tick clock, so forged markers far ahead cannot close windows whose data is
  still arriving (and later genuine epochs close by their markers); unknown queries are skipped;
  ``touched`` holds every window read or created; applying a batch in one call equals
  applying it item by item with the state persisted and reloaded in between.

Nothing here is random except the seeded shuffles and arrays.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from schemas.epochs import EPOCH_S
from stream_app.worker.records import (
    BatchPartial,
    MarkerPartial,
    Partial,
    Tick,
    WindowId,
    bundle,
    decode_partial,
    decode_partials,
    encode_partial,
    split_bundle,
)
from stream_app.worker.windows import Marker, Outcome, Watermarks, WindowPolicy, WindowState

QID = "q-win"
VERSION = 3
EPOCH = 59_832_960
WIDTH = 5
WID = WindowId(QID, VERSION, EPOCH)


def batch(batch_id: str, counts: Sequence[int], rnd: int = 0, producer: str = "p0-aaaa", partition: int = 0,
          reports: int | None = None, tallied: bool = True, epoch: int = EPOCH, qid: str = QID) -> BatchPartial:
    return BatchPartial(qid, VERSION, epoch, rnd, partition, producer, batch_id,
                        int(sum(counts)) if reports is None else reports, tallied, np.asarray(counts, dtype=np.int64))


def marker(rnd: int, index: int, partition: int, count: int = 1, producer: str | None = None, batches: int = 0,
           reports: int = 0, participants: int = 0, refused: int = 0, interrupted: bool = False,
           epoch: int = EPOCH, qid: str = QID) -> MarkerPartial:
    return MarkerPartial(qid, VERSION, epoch, rnd, partition, producer or f"p{index}-aaaa", index, count, reports,
                         batches, participants, refused, interrupted)


def new(n_rounds: int = 2, width: int = WIDTH) -> WindowState:
    return WindowState.new(WID, n_rounds, width)


def bid(i: int) -> str:
    return f"{i:032x}"


def state(w: WindowState) -> tuple[Any, ...]:
    """Everything of a window, order-normalized (dict insertion order does not matter)."""
    return (w.wid, w.n_rounds, w.width, w.counts.tolist(), w.reports.tolist(), w.tallied.tolist(), dict(w.seen),
            dict(w.markers), set(w.conflicting), w.closed_by, w.late, w.duplicates)


def roundtrip(w: WindowState) -> WindowState:
    return WindowState.decode(bytes(bytearray(w.encode())))


# ---------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [
    batch(bid(5), [0, 1, 2, 3, 4], rnd=1, partition=3, tallied=False, reports=7),
    batch(bid(6), [], reports=0),
    marker(1, 2, 1, count=4, batches=6, reports=70, participants=80, refused=3, interrupted=True),
    Tick(1_795_000_000.25),
], ids=["batch", "empty-batch", "marker", "tick"])
def test_partial_round_trips_through_bytes(p: Partial) -> None:
    data = encode_partial(p)
    assert data[:4] == b"PTS1"
    back = decode_partial(data)
    assert type(back) is type(p) and back == p
    if isinstance(back, BatchPartial):
        assert back.counts.dtype == np.int64 and back.window == WID


@pytest.mark.parametrize(("counts", "dtype", "itemsize"), [
    ([0, 1, 255], "<u1", 1), ([256, 0], "<u2", 2), ([65_535], "<u2", 2), ([65_536, 1], "<u4", 4),
    ([2**32, 0], "<i8", 8), ([3, -1, 0], "<i8", 8), ([-(2**40)], "<i8", 8),
])
def test_counts_travel_in_the_smallest_dtype(counts: list[int], dtype: str, itemsize: int) -> None:
    p = batch(bid(1), counts, reports=1)
    data = encode_partial(p)
    hlen = int.from_bytes(data[5:9], "big")
    head = json.loads(data[9:9 + hlen])
    assert head["dtype"] == dtype and head["n"] == len(counts)
    assert len(data) == 9 + hlen + itemsize * len(counts)  # the array, nothing else
    back = decode_partial(data)
    assert isinstance(back, BatchPartial) and back.counts.tolist() == counts


@pytest.mark.parametrize("data", [b"", b"PTS", b"garbage, not a record", b"PTS1X\x00\x00\x00\x02{}",
                                  b"PTW1\x00\x00\x00\x02{}", b"PTS1B\x00\x00\x00\x05{\"a\":",
                                  b'PTS1B\x00\x00\x00\x0e{"dtype":"<f8"}', b"PTS1T\x00\x00\x00\x02{}",
                                  b"PTS1M\x00\x00\x00\x02[]", b'PTS1T\x00\x00\x00\x0b{"now_s":1}'[:9] + b"{}",
                                  b'PTS1B\x00\x00\x00\x15{"dtype":"<u1","n":5}'],
                         ids=["empty", "short", "text", "bad-kind", "window-state", "broken-json", "bad-dtype",
                              "tick-no-fields", "marker-not-object", "truncated-head", "batch-short-array"])
def test_decode_of_garbage_raises_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_partial(data)


def test_bundles_keep_every_record_in_order_per_partition() -> None:
    """Stage 1 bundles the records for one stage-2 partition; each comes back intact, in the
    order it was given, and no bundle grows past the byte limit unless one record is bigger."""
    rng = np.random.default_rng(7)
    parts: list[Partial] = [batch(bid(i), rng.integers(0, 300, size=int(rng.integers(1, 60))).tolist(), reports=1)
                            if i % 3 else marker(i % 2, i, 0) for i in range(60)]
    records = [(int(rng.integers(0, 3)), f"k{i}".encode(), encode_partial(p)) for i, p in enumerate(parts)]
    records.append((1, b"big", encode_partial(batch(bid(99), list(range(5000)), reports=1))))
    out = bundle(records, max_bytes=400)
    assert len(out) > 3
    for part in range(3):
        sent = [value for p, _, value in records if p == part]
        got = [r for p, _, value in out if p == part for r in split_bundle(value)]
        assert got == sent
    for _, _, value in out:
        members = split_bundle(value)
        assert len(members) == 1 or sum(map(len, members)) <= 400
        assert [decode_partial(m) for m in members] == decode_partials(value)
    assert decode_partials(encode_partial(parts[0])) == [parts[0]]  # a single record is a bundle of one


@pytest.mark.parametrize("data", [b"PTS1L", b"PTS1L\x00\x00\x00\x02\x00\x00\x00\x01x",
                                  b"PTS1L\x00\x00\x00\x01\x00\x00\x00\x09x",
                                  b"PTS1L\x00\x00\x00\x01\x00\x00\x00\x01xy"],
                         ids=["no-count", "fewer-members", "member-too-long", "trailing-bytes"])
def test_malformed_bundles_raise_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        split_bundle(data)


def test_window_key_partitions_by_window() -> None:
    assert WID.key == f"{QID}\x1f{VERSION}\x1f{EPOCH}".encode()
    assert batch(bid(1), [0] * WIDTH).window.key == marker(0, 0, 0).window.key == WID.key
    assert WindowId("q:x", 1, 2).key != WindowId("q", 1, 2).key  # no split-on-separator ambiguity


# ---------------------------------------------------------------------------------------
# new / add
# ---------------------------------------------------------------------------------------
def test_new_window_is_empty_with_one_row_per_round() -> None:
    w = new(n_rounds=2, width=4)
    assert (w.wid, w.n_rounds, w.width) == (WID, 2, 4)
    assert w.counts.tolist() == [[0] * 4, [0] * 4] and w.counts.dtype == np.int64
    assert w.reports.tolist() == [0, 0] and w.tallied.tolist() == [0, 0]
    assert w.seen == {} and w.markers == {} and w.conflicting == set() and not w.closed
    assert (w.late, w.duplicates) == (0, 0)


def test_batches_add_across_batches_and_rounds() -> None:
    w = new()
    assert w.add(batch(bid(1), [1, 2, 0, 0, 3], rnd=0)) == "added"
    assert w.add(batch(bid(2), [0, 1, 1, 0, 0], rnd=0, partition=1)) == "added"
    assert w.add(batch(bid(3), [4, 0, 0, 1, 0], rnd=1)) == "added"
    assert w.counts.tolist() == [[1, 3, 1, 0, 3], [4, 0, 0, 1, 0]]
    assert w.reports.tolist() == [8, 5]
    assert w.tallied.tolist() == [8, 5]
    assert w.seen == {bid(1): (0, "p0-aaaa", 0), bid(2): (0, "p0-aaaa", 1), bid(3): (1, "p0-aaaa", 0)}
    assert w.duplicates == 0


def test_per_vehicle_batches_feed_counts_but_not_tallied() -> None:
    w = new(n_rounds=1, width=6)
    w.add(batch(bid(1), [0, 1, 0, 2, 0, 0], tallied=False))
    w.add(batch(bid(2), [1, 0, 0, 0, 0, 1], tallied=False))
    w.add(batch(bid(3), [3, 0, 1, 0, 2, 1], reports=3, tallied=True))  # a tally of 3 vehicles (2 stations)
    assert w.counts.tolist() == [[4, 1, 1, 2, 2, 2]]
    assert w.reports.tolist() == [8]
    assert w.tallied.tolist() == [3]


def test_add_refuses_wrong_width_or_round() -> None:
    w = new(n_rounds=1)
    with pytest.raises(ValueError, match="width"):
        w.add(batch(bid(1), [1] * (WIDTH + 1)))
    with pytest.raises(ValueError, match="round"):
        w.add(batch(bid(2), [1] * WIDTH, rnd=1))
    assert w.seen == {} and w.counts.tolist() == [[0] * WIDTH] and w.reports.tolist() == [0]  # nothing half-added


# ---------------------------------------------------------------------------------------
# duplicates and conflicts
# ---------------------------------------------------------------------------------------
def test_duplicate_batch_id_counts_once() -> None:
    w = new()
    b = batch(bid(7), [1, 0, 2, 0, 0])
    assert w.add(b) == "added"
    assert w.add(b) == "duplicate"
    # the same id again with other content or from another partition is still the same batch
    assert w.add(batch(bid(7), [9, 9, 9, 9, 9], rnd=1, partition=2)) == "duplicate"
    assert w.counts.tolist() == [[1, 0, 2, 0, 0], [0] * WIDTH]
    assert w.reports.tolist() == [3, 0]
    assert w.duplicates == 2
    assert len(w.seen) == 1


def test_duplicate_marker_counts_once() -> None:
    w = new()
    m = marker(0, 0, 1, count=2, batches=3, reports=30, participants=30, refused=1)
    assert w.add(m) == "added"
    assert w.add(m) == "duplicate"
    assert w.duplicates == 1
    assert w.markers == {(0, 0, 1): Marker("p0-aaaa", 2, 3, 30, 30, 1, False)}
    # the same producer's markers for other slots are not duplicates
    assert w.add(marker(1, 0, 1, count=2)) == "added"
    assert w.add(marker(0, 0, 0, count=2)) == "added"
    assert w.add(marker(0, 1, 1, count=2)) == "added"
    assert w.duplicates == 1 and len(w.markers) == 4 and w.conflicting == set()


def test_conflicting_markers_for_one_slot_are_recorded_in_any_order() -> None:
    """Changed on purpose: two different markers for one (round, producer index, partition)
    -- a restarted producer re-sending the epoch under a new id -- are no longer resolved by
    producer-id order. The slot is recorded in ``conflicting`` (and the epoch withheld with
    code "conflicting_markers"), whichever arrived first; batches still add."""
    first = [batch(bid(1), [1, 1, 0, 0, 0], producer="p0-first"),
             batch(bid(2), [0, 1, 0, 0, 0], producer="p0-first"),
             marker(0, 0, 0, producer="p0-first", batches=2, participants=40)]
    second = [batch(bid(3), [1, 1, 0, 0, 0], producer="p0-second"),
              marker(0, 0, 0, producer="p0-second", batches=1, participants=25)]
    a, b = new(), new()
    assert [a.add(p) for p in first + second] == ["added"] * 5
    assert [b.add(p) for p in second + first] == ["added"] * 5
    assert a.counts.tolist() == b.counts.tolist()
    assert a.conflicting == b.conflicting == {(0, 0, 0)}
    assert roundtrip(a).conflicting == {(0, 0, 0)}  # survives a restart
    # a conflict is not a duplicate; re-delivering either marker changes nothing more
    assert a.duplicates == 0
    a.add(first[-1])
    a.add(second[-1])
    assert a.conflicting == {(0, 0, 0)} and len(a.markers) == 1


def test_conflicting_markers_leave_the_same_state_in_any_order() -> None:
    """What a withheld epoch still publishes (participants, refused, missing_batches) and the
    stored state must not depend on which of two conflicting markers came first."""
    first = [batch(bid(1), [1, 1, 0, 0, 0], producer="p0-first"),
             marker(0, 0, 0, producer="p0-first", batches=1, participants=40, refused=1)]
    second = [marker(0, 0, 0, producer="p0-second", batches=3, participants=25, refused=2)]
    a, b = new(), new()
    for p in first + second:
        a.add(p)
    for p in second + first:
        b.add(p)
    assert (a.participants(), a.refused(), a.missing_batches()) == (b.participants(), b.refused(),
                                                                     b.missing_batches())
    assert state(a) == state(b)


def test_same_producer_id_with_other_content_is_a_conflict_too() -> None:
    w = new(n_rounds=1)
    w.add(marker(0, 0, 0, batches=1, participants=10))
    assert w.add(marker(0, 0, 0, batches=2, participants=10)) == "added"
    assert w.conflicting == {(0, 0, 0)} and w.duplicates == 0


# ---------------------------------------------------------------------------------------
# close, late records, encoding
# ---------------------------------------------------------------------------------------
def test_late_records_after_close_are_counted_and_change_nothing() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(marker(0, 0, 0, batches=1, participants=6))
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))  # one duplicate before closing
    w.close("markers")
    w.published = True  # the app publishes the epoch's estimates
    assert w.closed and w.closed_by == "markers"
    before = state(w)
    assert w.add(batch(bid(2), [5, 5, 5, 5, 5])) == "late"
    assert w.add(batch(bid(1), [1, 2, 3, 0, 0])) == "late"  # a duplicate arriving late is late
    assert w.add(marker(1, 0, 0)) == "late"
    assert not w.retract
    # a late marker that contradicts the one the epoch closed on: late, and the epoch's
    # published estimates must be withdrawn (the slot is recorded as conflicting)
    assert w.add(marker(0, 0, 0, batches=9)) == "late"
    assert w.retract and w.conflicting == {(0, 0, 0)}
    w.retract = False
    assert w.add(marker(0, 0, 0, batches=7)) == "late" and not w.retract  # withdrawn once
    after = state(w)
    assert after[-2] == 5 and after[-1] == 1  # five late records, the one early duplicate
    assert after[:8] == before[:8]  # counts, reports, batch ids and markers unchanged


def test_open_window_round_trips_through_bytes() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0], partition=2, producer="p1-bbbb"))
    w.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1, tallied=False))
    w.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1, tallied=False))
    w.add(marker(0, 1, 2, count=2, producer="p1-bbbb", batches=1, reports=6, participants=9, refused=2))
    w.add(marker(0, 0, 1, count=2, interrupted=True))
    w.add(marker(0, 0, 1, count=2, participants=1))  # a conflict
    w.add(batch(bid(3), [2**40, 0, 0, 0, 0], rnd=0))  # counts beyond 32 bits survive
    back = roundtrip(w)
    assert state(back) == state(w)
    assert back.encode() == w.encode()
    # and it keeps working the same after the round trip
    assert back.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1)) == "duplicate"
    assert back.add(marker(0, 1, 2, count=2, producer="p1-bbbb", batches=1, reports=6, participants=9,
                           refused=2)) == "duplicate"
    assert back.missing_batches() == 0 and back.participants() == (9, []) and back.refused() == 2
    assert back.interrupted()


def test_closed_window_keeps_only_the_small_record() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(marker(0, 0, 0, batches=1))
    w.close("watermark")
    w.add(batch(bid(9), [1, 0, 0, 0, 0]))
    data = w.encode()
    # no count arrays, no batch ids; the markers stay (a contradicting late marker withdraws the epoch)
    assert len(data) < len(new().encode()) + 120
    assert len(data) < len(w.__class__.encode(_reopened(w))) - WIDTH * 2 * 8 + 40
    back = WindowState.decode(data)
    assert back.closed and back.closed_by == "watermark" and (back.late, back.duplicates) == (1, 1)
    assert (back.wid, back.n_rounds, back.width) == (WID, 2, WIDTH)
    assert back.seen == {} and not back.counts.any()
    assert back.markers == w.markers and back.reports.tolist() == w.reports.tolist()
    assert back.add(batch(bid(10), [1, 0, 0, 0, 0])) == "late"
    assert back.add(marker(0, 0, 0, batches=1)) == "late" and not back.retract  # the same marker
    assert WindowState.decode(back.encode()).late == 3


def _reopened(w: WindowState) -> WindowState:
    import copy

    o = copy.deepcopy(w)
    o.closed_by = None
    return o


def test_decoded_state_is_independent_of_its_bytes() -> None:
    """Mutating a decoded state and re-encoding gives new bytes; the old bytes still decode
    to the old state (nothing is shared with the stored value)."""
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    data = w.encode()
    a = WindowState.decode(data)
    a.counts[0, 0] += 1  # writable, not a read-only view of ``data``
    a.add(batch(bid(2), [1, 1, 1, 1, 1]))
    a.add(marker(0, 0, 0))
    assert a.encode() != data
    assert state(WindowState.decode(data)) == state(w)


def test_window_state_decode_of_garbage_raises() -> None:
    with pytest.raises(ValueError):
        WindowState.decode(b"PTS1 not a window")


# ---------------------------------------------------------------------------------------
# markers, participants, refused, missing batches
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("k", "n_partitions", "n_rounds"), [(1, 1, 1), (1, 3, 2), (2, 1, 2), (3, 2, 1), (2, 4, 2)])
def test_markers_complete_only_with_the_last_marker(k: int, n_partitions: int, n_rounds: int) -> None:
    slots = list(itertools.product(range(n_rounds), range(k), range(n_partitions)))
    for seed in range(5):
        order = np.random.default_rng([seed, k, n_partitions, n_rounds]).permutation(len(slots))
        w = new(n_rounds=n_rounds)
        assert not w.markers_complete(n_partitions)
        assert w.producer_count() is None
        for j, i in enumerate(order):
            r, idx, p = slots[i]
            assert not w.markers_complete(n_partitions)
            w.add(marker(r, idx, p, count=k, participants=10 * (idx + 1)))
            assert w.producer_count() == k  # taken from the markers
            assert w.markers_complete(n_partitions) == (j == len(slots) - 1)
        assert w.markers_complete(n_partitions)


def test_markers_complete_needs_every_round_and_partition() -> None:
    w = new(n_rounds=2)
    for p in range(3):
        w.add(marker(0, 0, p))
    assert not w.markers_complete(3)  # round 1 missing
    for p in range(2):
        w.add(marker(1, 0, p))
    assert not w.markers_complete(3)  # round 1 of partition 2 missing
    assert w.markers_complete(2)  # with two source partitions it is complete
    w.add(marker(1, 0, 2))
    assert w.markers_complete(3)


def test_producer_count_is_the_largest_stated_by_the_markers() -> None:
    w = new(n_rounds=1)
    w.add(marker(0, 0, 0, count=1))
    assert w.markers_complete(1)
    w.add(marker(0, 1, 0, count=2))
    assert w.producer_count() == 2
    w2 = new(n_rounds=1)
    w2.add(marker(0, 1, 0, count=2))
    w2.add(marker(0, 0, 0, count=1))  # a stale count cannot shrink the fleet
    assert w2.producer_count() == 2 and w2.markers_complete(1)
    w3 = new(n_rounds=1)
    w3.add(marker(0, 0, 0, count=2))
    assert not w3.markers_complete(1)


def test_participants_one_marker_per_producer_from_round_zero() -> None:
    w = new(n_rounds=2)
    assert w.participants() == (None, [])
    # K = 3 producers, 2 partitions; producer 1 sent nothing in round 0
    for p in range(2):
        w.add(marker(0, 0, p, count=3, participants=100, refused=4))
        w.add(marker(0, 2, p, count=3, participants=70, refused=0))
        w.add(marker(1, 1, p, count=3, participants=55, refused=9))  # round 1 only: not counted
        w.add(marker(1, 0, p, count=3, participants=100, refused=4))
    assert w.participants() == (170, [1])
    assert w.refused() == 4
    w.add(marker(0, 1, 1, count=3, participants=55, refused=9))
    assert w.participants() == (225, [])
    assert w.refused() == 13


def test_participants_zero_is_known_not_unknown() -> None:
    w = new(n_rounds=1)
    w.add(marker(0, 0, 0, participants=0, refused=12))
    assert w.participants() == (0, [])
    assert w.refused() == 12


def test_only_round_one_markers_leave_participants_unknown() -> None:
    w = new(n_rounds=2)
    w.add(marker(1, 0, 0, count=2, participants=10))
    assert w.participants() == (None, [0, 1])
    assert w.refused() == 0


def test_interrupted_is_read_from_any_marker() -> None:
    w = new(n_rounds=2)
    w.add(marker(0, 0, 0, count=2))
    assert not w.interrupted()
    w.add(marker(1, 1, 0, count=2, interrupted=True))
    assert w.interrupted()


def test_missing_batches_per_producer_partition_and_round() -> None:
    w = new(n_rounds=2)
    # producer p0: partition 0 announces 2 batches in round 0, partition 1 announces 1 in round 0 and 2 in round 1
    w.add(marker(0, 0, 0, count=2, producer="p0-x", batches=2))
    w.add(marker(0, 0, 1, count=2, producer="p0-x", batches=1))
    w.add(marker(1, 0, 1, count=2, producer="p0-x", batches=2))
    # producer p1 announces 1 batch on partition 0 in round 0
    w.add(marker(0, 1, 0, count=2, producer="p1-y", batches=1))
    assert w.missing_batches() == 6
    w.add(batch(bid(1), [1, 0, 0, 0, 0], producer="p0-x", partition=0))
    w.add(batch(bid(1), [1, 0, 0, 0, 0], producer="p0-x", partition=0))  # duplicate: no help
    assert w.missing_batches() == 5
    w.add(batch(bid(2), [1, 0, 0, 0, 0], producer="p0-x", partition=0, rnd=1))  # round 1 on p0: not announced
    assert w.missing_batches() == 5
    w.add(batch(bid(3), [1, 0, 0, 0, 0], producer="p1-y", partition=1))  # p1 on the wrong partition
    assert w.missing_batches() == 5
    w.add(batch(bid(4), [1, 0, 0, 0, 0], producer="p1-y", partition=0))
    w.add(batch(bid(5), [1, 0, 0, 0, 0], producer="p0-x", partition=1))
    w.add(batch(bid(6), [1, 0, 0, 0, 0], producer="p0-x", partition=1, rnd=1))
    assert w.missing_batches() == 2  # p0: 1 more on partition 0 round 0, 1 more on partition 1 round 1
    for i, (p, r) in enumerate([(0, 0), (1, 1), (0, 0)]):  # more than announced never goes negative
        w.add(batch(bid(10 + i), [1, 0, 0, 0, 0], producer="p0-x", partition=p, rnd=r))
    assert w.missing_batches() == 0
    assert roundtrip(w).missing_batches() == 0


def test_batches_of_a_producer_without_markers_are_not_missing() -> None:
    w = new(n_rounds=1)
    w.add(batch(bid(1), [1, 0, 0, 0, 0], producer="device"))
    assert w.missing_batches() == 0


# ---------------------------------------------------------------------------------------
# watermarks
# ---------------------------------------------------------------------------------------
def wid(epoch: int, version: int = 1) -> WindowId:
    return WindowId(QID, version, epoch)


def test_watermark_is_none_until_every_source_partition_was_seen() -> None:
    wm = Watermarks()
    assert wm.watermark(3) is None
    wm.see(0, 100)
    wm.see(2, 104)
    assert wm.watermark(3) is None
    assert wm.watermark(1) == 100
    wm.see(1, 102)
    assert wm.watermark(3) == 100
    wm.see(0, 99)  # an older epoch never moves the newest back
    assert wm.newest[0] == 100 and wm.watermark(3) == 100
    wm.see(0, 107)
    assert wm.watermark(3) == 102
    wm.see(5, 1)  # a partition outside the source partitions is ignored
    assert wm.watermark(3) == 102
    wm.see(1, 0)
    assert wm.watermark(3) == 102


def test_watermark_from_epoch_zero() -> None:
    wm = Watermarks()
    wm.see(0, 0)
    assert wm.watermark(1) == 0 and wm.dirty


def test_due_respects_allowed_lateness() -> None:
    wm = Watermarks()
    for e in (10, 11, 12):
        wm.track(wid(e))
    assert wm.due(2, 0) == []  # no watermark yet
    wm.see(0, 12)
    wm.see(1, 11)  # watermark 11
    assert wm.due(2, 0) == [wid(10)]
    assert wm.due(2, 1) == []
    wm.see(1, 13)  # watermark 12
    assert wm.due(2, 0) == [wid(10), wid(11)]
    assert wm.due(2, 1) == [wid(10)]
    assert wm.due(2, 2) == []
    wm.see(0, 20)
    wm.see(1, 20)
    assert wm.due(2, 7) == [wid(e) for e in (10, 11, 12)]
    assert wm.due(2, 8) == [wid(e) for e in (10, 11)]


def test_track_and_untrack() -> None:
    wm = Watermarks()
    a, b = wid(5, 1), wid(5, 2)
    wm.track(a)
    wm.track(b)
    wm.track(a)  # tracking again changes nothing
    assert wm.open == {a: 5, b: 5} and list(wm.open) == [a, b]
    wm.untrack(a)
    wm.untrack(a)  # untracking twice is harmless
    wm.untrack(WindowId("never-tracked", 1, 1))
    assert wm.open == {b: 5}
    wm.see(0, 7)
    assert wm.due(1, 0) == [b]
    wm.untrack(b)
    assert wm.due(1, 0) == []


def test_too_old_epochs_are_late_before_a_window_exists() -> None:
    wm = Watermarks()
    assert not wm.too_old(1, n_partitions=2, lateness=2)  # no watermark yet
    wm.see(0, 20)
    wm.see(1, 15)
    assert wm.watermark(2) == 15
    assert wm.too_old(12, 2, 2) and not wm.too_old(13, 2, 2) and not wm.too_old(15, 2, 2)


def test_watermark_waits_for_every_producer_the_markers_name() -> None:
    """Two shuffler instances each write to every partition: a partition's newest epoch follows
    the faster one; the slower one's epochs are not passed until it marks them."""
    wm = Watermarks()
    for p in (0, 1):
        wm.see(p, 20)
        wm.mark(p, 0, 2, 20)
    assert wm.watermark(2) is None  # producer 1 of 2 has marked nothing
    wm.mark(0, 1, 2, 12)
    assert wm.watermark(2) is None  # nor on partition 1
    wm.mark(1, 1, 2, 14)
    assert wm.watermark(2) == 12 and wm.due(2, 0) == [] and wm.too_old(11, 2, 0)
    wm.mark(0, 1, 2, 11)  # an older marker never moves it back
    assert wm.watermark(2) == 12
    wm.mark(0, 1, 2, 30)
    assert wm.watermark(2) == 14
    wm.mark(0, 0, 1, 31)  # the newest marker names one producer (scaled down): partitions only
    assert wm.watermark(2) == 20
    wm.mark(0, 0, 3, 30)  # an older claim of three changes nothing
    assert wm.producers == (31, 1) and wm.watermark(2) == 20


def test_watermarks_round_trip() -> None:
    assert Watermarks.decode(None) == Watermarks()
    assert Watermarks.decode(b"") == Watermarks()
    wm = Watermarks()
    wm.see(0, 3)
    wm.see(1, 4)
    wm.see(12, 2)
    for part, index, epoch in ((0, 0, 3), (0, 1, 3), (1, 0, 4), (1, 1, 5)):
        wm.mark(part, index, 2, epoch)
    wm.track(wid(3))
    wm.track(wid(1, version=7))
    back = Watermarks.decode(wm.encode())
    assert (back.newest, back.open, back.marked, back.producers) == (wm.newest, wm.open, wm.marked, wm.producers)
    assert list(back.open) == list(wm.open)  # insertion order kept
    assert back.watermark(2) == 3 and back.due(2, 0) == [wid(1, version=7)]
    assert back.encode() == wm.encode()


def test_watermarks_dirty_exactly_when_a_change_must_be_persisted() -> None:
    wm = Watermarks()
    wm.see(0, 10)
    wm.see(1, 12)
    wm.mark(0, 0, 1, 10)
    wm.track(wid(10))
    data = wm.encode()

    def fresh() -> Watermarks:
        w = Watermarks.decode(data)
        assert not w.dirty  # right after decode
        return w

    w = fresh()
    w.see(0, 9)  # older: nothing changes
    w.see(1, 12)  # same: nothing changes
    w.mark(0, 0, 1, 10)  # a marker already seen
    w.track(wid(10))  # already open
    w.untrack(wid(99))  # never open
    assert not w.dirty and w.encode() == data
    for change in (lambda x: x.see(0, 11), lambda x: x.see(2, 0), lambda x: x.track(wid(11)),
                   lambda x: x.untrack(wid(10)), lambda x: x.mark(0, 0, 1, 11), lambda x: x.mark(0, 0, 2, 10)):
        w = fresh()
        change(w)
        assert w.dirty
        assert w.encode() != data  # and the change is in what gets written


def test_decoded_watermarks_are_independent_of_their_bytes() -> None:
    """The regression of the watermark that was never persisted: the loaded state shared its
    containers with the stored value, so "changed" could not be seen. Now decode builds new
    containers and ``dirty`` tells the app to write."""
    wm = Watermarks()
    wm.see(0, 10)
    wm.track(wid(10))
    data = wm.encode()
    a = Watermarks.decode(data)
    b = Watermarks.decode(data)
    a.see(0, 11)
    a.untrack(wid(10))
    assert a.dirty and not b.dirty
    assert (b.newest, b.open) == ({0: 10}, {wid(10): 10})
    assert Watermarks.decode(a.encode()).newest == {0: 11}
    assert Watermarks.decode(data).newest == {0: 10}


# ---------------------------------------------------------------------------------------
# merge is addition
# ---------------------------------------------------------------------------------------
def _epoch_partials(seed: int, k: int, n_partitions: int, n_rounds: int, width: int,
                    mixed: bool) -> list[BatchPartial | MarkerPartial]:
    """A realistic epoch: K producers, each sending several batches per round to random
    partitions (some re-delivered), then a marker per (round, partition) with what it sent."""
    rng = np.random.default_rng(seed)
    out: list[BatchPartial | MarkerPartial] = []
    serial = 0
    for idx in range(k):
        producer = f"p{idx}-{seed:04x}"
        participants = int(rng.integers(20, 60))
        refused = int(rng.integers(0, 3))
        for r in range(n_rounds):
            sent = {p: [0, 0] for p in range(n_partitions)}
            for _ in range(int(rng.integers(1, 6))):
                serial += 1
                counts = rng.integers(0, 5, size=width)
                part = int(rng.integers(n_partitions))
                tallied = not (mixed and rng.random() < 0.5)
                b = batch(bid(serial), counts.tolist(), rnd=r, producer=producer, partition=part, tallied=tallied)
                out.append(b)
                if rng.random() < 0.3:
                    out.append(b)  # re-delivered
                sent[part][0] += b.reports
                sent[part][1] += 1
            for p, (n_rep, n_bat) in sent.items():
                m = marker(r, idx, p, count=k, producer=producer, batches=n_bat, reports=n_rep,
                           participants=participants, refused=refused)
                out.append(m)
                if rng.random() < 0.2:
                    out.append(m)
    return out


def _decisions(w: WindowState, n_partitions: int) -> tuple[Any, ...]:
    return (w.markers_complete(n_partitions), w.producer_count(), w.participants(), w.refused(),
            w.missing_batches(), w.interrupted(), set(w.conflicting))


@pytest.mark.parametrize(("k", "n_partitions", "n_rounds", "mixed"),
                         [(1, 1, 2, False), (2, 3, 2, False), (3, 2, 1, True), (2, 4, 1, True)])
def test_merge_is_order_independent(k: int, n_partitions: int, n_rounds: int, mixed: bool) -> None:
    width = 7
    partials = _epoch_partials(1000 + k * 10 + n_partitions, k, n_partitions, n_rounds, width, mixed)
    marker_slots_all = {(p.round, p.producer_index, p.source_partition) for p in partials
                        if isinstance(p, MarkerPartial)}
    n_markers = len(marker_slots_all)
    assert n_markers == k * n_partitions * n_rounds

    reference = new(n_rounds, width)
    for p in partials:
        reference.add(p)
    ref_state = state(reference)
    ref_decisions = _decisions(reference, n_partitions)
    assert ref_decisions[0] is True and ref_decisions[4] == 0 and ref_decisions[6] == set()
    distinct = {p.batch_id: p for p in partials if isinstance(p, BatchPartial)}
    for r in range(n_rounds):
        want = np.sum([b.counts for b in distinct.values() if b.round == r], axis=0).tolist()
        assert reference.counts[r].tolist() == want
        assert reference.tallied[r] == sum(b.reports for b in distinct.values() if b.round == r and b.tallied)
    assert reference.duplicates == len(partials) - len(distinct) - n_markers

    for seed in range(25):
        order = np.random.default_rng([seed, 77]).permutation(len(partials))
        w = new(n_rounds, width)
        marker_slots: set[tuple[int, int, int]] = set()
        for j, i in enumerate(order):
            p = partials[i]
            w.add(p)
            if isinstance(p, MarkerPartial):
                marker_slots.add((p.round, p.producer_index, p.source_partition))
            assert w.markers_complete(n_partitions) == (len(marker_slots) == n_markers)
            if j == len(order) // 2:  # a restart in the middle: the state through its changelog bytes
                w = roundtrip(w)
        assert state(w) == ref_state, f"order seed {seed}"
        assert _decisions(w, n_partitions) == ref_decisions


@pytest.mark.parametrize("seed", range(5))
def test_partials_split_across_two_states_sum_to_one(seed: int) -> None:
    """Merge is addition: any split of the batches over two states (two workers, or before
    and after a rebalance), summed, gives the counts, reports and tallies of one state."""
    partials = [p for p in _epoch_partials(seed, 2, 3, 2, 6, True) if isinstance(p, BatchPartial)]
    one = new(2, 6)
    for p in partials:
        one.add(p)
    rng = np.random.default_rng([seed, 13])
    ids = sorted({p.batch_id for p in partials})
    side = {b: int(rng.integers(2)) for b in ids}
    halves = [new(2, 6), new(2, 6)]
    for i in rng.permutation(len(partials)):
        p = partials[i]
        halves[side[p.batch_id]].add(p)
    np.testing.assert_array_equal(halves[0].counts + halves[1].counts, one.counts)
    np.testing.assert_array_equal(halves[0].reports + halves[1].reports, one.reports)
    np.testing.assert_array_equal(halves[0].tallied + halves[1].tallied, one.tallied)
    assert {**halves[0].seen, **halves[1].seen} == one.seen


def test_two_stage1_workers_interleaving_gives_the_same_window() -> None:
    """Two stage-1 workers each own some source partitions and keep their own order; stage 2
    sees an arbitrary interleaving of the two streams. Every interleaving gives one state."""
    partials = _epoch_partials(4242, 2, 4, 2, 5, False)
    worker_of = {0: 0, 1: 1, 2: 0, 3: 1}
    streams: list[list[BatchPartial | MarkerPartial]] = [[], []]
    for p in partials:
        streams[worker_of[p.source_partition]].append(p)
    one = new(2, 5)
    for p in partials:
        one.add(p)
    for seed in range(10):
        rng = np.random.default_rng([seed, 5])
        picks = rng.permutation([0] * len(streams[0]) + [1] * len(streams[1]))
        pos = [0, 0]
        w = new(2, 5)
        for s in picks:
            w.add(streams[s][pos[s]])
            pos[s] += 1
        assert state(w) == state(one)
        assert _decisions(w, 4) == _decisions(one, 4)


# ---------------------------------------------------------------------------------------
# WindowPolicy
# ---------------------------------------------------------------------------------------
SHAPES = {QID: (2, WIDTH), "q-one": (1, 3)}


def shape(w: WindowId) -> tuple[int, int] | None:
    return SHAPES.get(w.query_id)


class Store:
    """A stage-2 partition's table: window bytes and the watermark bytes, written as the app
    writes them (every touched window; the watermark when dirty)."""

    def __init__(self) -> None:
        self.windows: dict[WindowId, bytes] = {}
        self.wm: bytes | None = None
        self.loads: list[WindowId] = []

    def load(self, w: WindowId) -> WindowState | None:
        self.loads.append(w)
        raw = self.windows.get(w)
        return None if raw is None else WindowState.decode(raw)

    def apply(self, policy: WindowPolicy, items: Sequence[Partial]) -> Outcome:
        wm = Watermarks.decode(self.wm)
        out = policy.apply(wm, self.load, shape, items)
        for w, st in out.touched.items():
            self.windows[w] = st.encode()
        if wm.dirty:
            self.wm = wm.encode()
        return out


def closed(out: Outcome) -> list[tuple[int, str]]:
    return [(st.wid.epoch, reason) for st, reason in out.closed]


def test_policy_closes_by_markers() -> None:
    policy = WindowPolicy(n_source_partitions=2, allowed_lateness_epochs=2)
    store = Store()
    items: list[Partial] = [batch(bid(1), [1, 0, 0, 0, 0], partition=0)]
    items += [marker(r, 0, p, batches=int(p == 0 and r == 0)) for r in range(2) for p in range(2)]
    out = store.apply(policy, items[:-1])
    assert closed(out) == []
    out = store.apply(policy, items[-1:])
    assert closed(out) == [(EPOCH, "markers")]
    st = out.closed[0][0]
    assert st.closed_by == "markers" and st.counts[0].tolist() == [1, 0, 0, 0, 0]  # the full state, for estimates
    assert Watermarks.decode(store.wm).open == {}  # untracked and persisted
    assert WindowState.decode(store.windows[WID]).closed_by == "markers"
    late = store.apply(policy, [batch(bid(2), [1, 0, 0, 0, 0])])
    assert late.late == Counter({QID: 1}) and closed(late) == []


def test_policy_closes_by_watermark_with_allowed_lateness() -> None:
    policy = WindowPolicy(n_source_partitions=2, allowed_lateness_epochs=1)
    store = Store()
    out = store.apply(policy, [batch(bid(1), [1, 0, 0, 0, 0], partition=0, epoch=10),
                               batch(bid(2), [1, 0, 0, 0, 0], partition=1, epoch=10),
                               batch(bid(3), [1, 0, 0, 0, 0], partition=0, epoch=12)])
    assert closed(out) == []  # watermark 10 (partition 1 is at 10)
    out = store.apply(policy, [batch(bid(4), [1, 0, 0, 0, 0], partition=1, epoch=11)])
    assert closed(out) == []  # watermark 11: 10 is not below 11 - 1
    out = store.apply(policy, [batch(bid(5), [1, 0, 0, 0, 0], partition=1, epoch=12)])
    assert closed(out) == [(10, "watermark")]  # watermark 12: 10 < 12 - 1
    assert out.closed[0][0].reports.tolist() == [2, 0]
    assert set(Watermarks.decode(store.wm).open) == {wid(11, VERSION), wid(12, VERSION)}
    # too old for a new window: it opens all the same ("born late": the epoch gets an outcome,
    # withheld as late by estimate.py) and, incomplete and with no idle time asked, closes at once
    out = store.apply(policy, [batch(bid(6), [1, 0, 0, 0, 0], partition=0, epoch=9)])
    assert closed(out) == [(9, "watermark")] and out.late == Counter()
    assert WindowState.decode(store.windows[wid(9, VERSION)]).born_late
    # the closed one counts late records
    out = store.apply(policy, [batch(bid(7), [1, 0, 0, 0, 0], partition=0, epoch=10)])
    assert out.late == Counter({QID: 1})
    assert WindowState.decode(store.windows[wid(10, VERSION)]).late == 1


def test_policy_does_not_pass_a_slower_producers_epochs() -> None:
    """Two producers (shuffler instances), each writing to both partitions: producer 0 runs
    ten epochs ahead; the epochs producer 1 has not marked stay open (they would close by the
    watermark, withheld, were it read from the partitions alone) and close by their markers
    once producer 1's data comes."""
    policy = WindowPolicy(n_source_partitions=2, allowed_lateness_epochs=1)
    store = Store()

    def epoch_of(producer: int, epoch: int) -> list[Partial]:
        return [*(batch(bid(1000 * producer + 10 * epoch + part), [1, 0, 0], producer=f"p{producer}-aaaa",
                        partition=part, epoch=epoch, qid="q-one") for part in (0, 1)),
                *(marker(0, producer, part, count=2, batches=1, reports=1, epoch=epoch, qid="q-one")
                  for part in (0, 1))]

    out = store.apply(policy, [item for e in range(10, 21) for item in epoch_of(0, e)] + epoch_of(1, 10))
    assert closed(out) == [(10, "markers")]
    out = store.apply(policy, [item for e in range(11, 21) for item in epoch_of(1, e)])
    assert closed(out) == [(e, "markers") for e in range(11, 21)]
    assert all(st.reports.tolist() == [4] for st, _ in out.closed)


def test_policy_closes_by_wall_clock_within_grace_and_horizon() -> None:
    policy = WindowPolicy(n_source_partitions=3, wall_clock_grace_s=60.0, live_horizon_s=3600.0)
    end = (EPOCH + 1) * EPOCH_S
    store = Store()
    store.apply(policy, [batch(bid(1), [1, 0, 0, 0, 0])])  # one partition only: no watermark
    for now in (end, end + 59.0, end + 60.0):
        assert closed(store.apply(policy, [Tick(now)])) == []
    out = store.apply(policy, [Tick(end + 61.0)])
    assert closed(out) == [(EPOCH, "wall_clock")]
    assert Watermarks.decode(store.wm).open == {}
    # data older than the live horizon (a replay of an old day) is not closed by the clock
    other = Store()
    other.apply(policy, [batch(bid(2), [1, 0, 0, 0, 0])])
    assert closed(other.apply(policy, [Tick(end + 3600.0)])) == []
    assert closed(other.apply(policy, [Tick(end + 10_000.0)])) == []
    assert WID in Watermarks.decode(other.wm).open


def test_policy_skips_an_unknown_query() -> None:
    policy = WindowPolicy(n_source_partitions=1)
    store = Store()
    out = store.apply(policy, [batch(bid(1), [1, 0, 0, 0, 0], qid="q-deleted"),
                               marker(0, 0, 0, qid="q-deleted")])
    assert out.touched == {} and out.closed == [] and not out.reports and not out.late and out.newest == {}
    assert store.wm is None and store.windows == {}  # nothing tracked, nothing seen


def test_policy_touched_holds_every_window_read_or_created() -> None:
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=5)
    store = Store()
    store.apply(policy, [batch(bid(1), [1, 0, 0, 0, 0], epoch=EPOCH)])
    store.loads.clear()
    out = store.apply(policy, [batch(bid(2), [1, 0, 0, 0, 0], epoch=EPOCH),  # read
                               batch(bid(3), [1, 0, 0], epoch=EPOCH, qid="q-one"),  # created
                               batch(bid(3), [1, 0, 0], epoch=EPOCH, qid="q-one"),  # created, then a duplicate
                               batch(bid(4), [1, 0, 0, 0, 0], epoch=EPOCH + 1)])  # created
    want = {WID, WindowId("q-one", VERSION, EPOCH), wid(EPOCH + 1, VERSION)}
    assert set(out.touched) == want
    assert set(store.loads) == want and len(store.loads) == 3  # each read once per call
    assert out.reports == Counter({QID: 2, "q-one": 1}) and out.duplicates == Counter({"q-one": 1})
    assert out.newest == {QID: EPOCH + 1, "q-one": EPOCH}
    # a tick reads the open windows (to decide) and so touches them
    out = store.apply(policy, [Tick(0.0)])
    assert set(out.touched) == want and out.closed == []


def _policy_items(seed: int) -> list[Partial]:
    """Three epochs from two producers on two partitions, markers for the first, a tick and
    stragglers in a seeded order: every kind of decision happens."""
    rng = np.random.default_rng(seed)
    items: list[Partial] = []
    serial = 0
    for e in (EPOCH, EPOCH + 1, EPOCH + 2, EPOCH + 5):
        for _ in range(6):
            serial += 1
            b = batch(bid(serial), rng.integers(0, 4, size=WIDTH).tolist(), rnd=int(rng.integers(2)),
                      producer=f"p{serial % 2}-x", partition=int(rng.integers(2)), epoch=e)
            items.append(b)
            if rng.random() < 0.3:
                items.append(b)
        if e == EPOCH:
            items += [marker(r, i, p, count=2, producer=f"p{i}-x", participants=5) for r in range(2)
                      for i in range(2) for p in range(2)]
    items.insert(int(rng.integers(len(items))), Tick((EPOCH + 1) * EPOCH_S + 100.0))
    items += [batch(bid(500), [1] * WIDTH, epoch=EPOCH), batch(bid(501), [1] * WIDTH, epoch=EPOCH - 10)]
    return items


@pytest.mark.parametrize("seed", range(4))
def test_policy_batch_equals_item_by_item_with_reloads(seed: int) -> None:
    """What makes a restart exact: one call over a batch and one call per item, with every
    window and the watermark persisted as bytes and reloaded in between, give the same
    stored bytes, the same closes and the same counters."""
    policy = WindowPolicy(n_source_partitions=2, allowed_lateness_epochs=1)
    items = _policy_items(seed)
    whole, single = Store(), Store()
    out = whole.apply(policy, items)
    closes: list[tuple[WindowId, str]] = []
    reports: Counter[str] = Counter()
    late: Counter[str] = Counter()
    dups: Counter[str] = Counter()
    for item in items:
        o = single.apply(policy, [item])
        closes += [(st.wid, r) for st, r in o.closed]
        reports += o.reports
        late += o.late
        dups += o.duplicates
    assert [(st.wid, r) for st, r in out.closed] == closes
    reasons = {r for _, r in closes}  # the fixture exercises closing by markers and by time
    assert "markers" in reasons and reasons & {"watermark", "wall_clock"}
    assert (out.reports, out.late, out.duplicates) == (reports, late, dups)
    assert late[QID] >= 1 and dups[QID] >= 1
    assert whole.windows == single.windows
    assert whole.wm == single.wm


# -- the watermark cannot erase epochs whose data is still arriving ---------------------------

def _epoch_items(epoch: int, n_partitions: int, key: int) -> list[Partial]:
    """One genuine epoch of query q-win (2 rounds): a batch per round on partition 0, then the
    markers of producer 0 from every partition."""
    items: list[Partial] = [batch(bid(key * 10 + r), [1, 0, 0, 0, 0], rnd=r, partition=0, epoch=epoch)
                            for r in range(2)]
    items += [marker(r, 0, p, batches=int(p == 0), reports=int(p == 0), participants=1, epoch=epoch)
              for r in range(2) for p in range(n_partitions)]
    return items


def test_idle_rule_keeps_a_passed_window_open_while_records_arrive() -> None:
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=0, watermark_idle_s=20.0,
                          wall_clock_grace_s=1e9)  # the wall-clock rule out of the way
    store = Store()
    store.apply(policy, [Tick(1000.0), batch(bid(1), [1, 0, 0, 0, 0], epoch=10)])
    out = store.apply(policy, [batch(bid(2), [1, 0, 0, 0, 0], epoch=12)])  # watermark 12 passes 10
    assert closed(out) == []  # not idle yet
    assert closed(store.apply(policy, [Tick(1015.0)])) == []
    store.apply(policy, [batch(bid(3), [0, 1, 0, 0, 0], epoch=10)])  # still arriving: idle again from 1015
    assert closed(store.apply(policy, [Tick(1030.0)])) == []  # 15 s idle
    out = store.apply(policy, [Tick(1036.0)])  # 21 s idle
    assert (10, "watermark") in closed(out)
    assert out.closed[0][0].reports.tolist() == [2, 0]  # nothing of what arrived was lost
    # the clock and the activity times survive the table (a restart)
    wm = Watermarks.decode(store.wm)
    assert wm.clock_s == 1036.0 and WindowId(QID, VERSION, 10) not in wm.active


def test_idle_rule_needs_a_tick_clock() -> None:
    wm = Watermarks()
    wm.see(0, 10)
    wm.track(wid(5))
    assert wm.due(1, 0, idle_s=0.0) == [wid(5)]
    assert wm.due(1, 0, idle_s=5.0) == []  # no tick yet: idleness cannot be told
    wm.tick(100.0)  # the window gets this time as its activity
    assert wm.due(1, 0, idle_s=5.0) == []
    wm.tick(104.0)
    assert wm.due(1, 0, idle_s=5.0) == []
    wm.tick(105.0)
    assert wm.due(1, 0, idle_s=5.0) == [wid(5)]
    back = Watermarks.decode(wm.encode())
    assert (back.clock_s, back.active) == (105.0, {wid(5): 100.0})
    assert back.due(1, 0, idle_s=5.0) == [wid(5)]


@pytest.mark.parametrize("n_partitions", [1, 3])
def test_forged_markers_far_ahead_erase_no_epoch(n_partitions: int) -> None:
    """Genuine epochs 0..29 go out one after the other; after epoch 5's first batch a writer
    sends well-formed markers for epoch 5 + 190 from every partition (a full marker set: the
    watermark jumps). Every genuine epoch not covered by the forged claim still closes by its
    own markers with exactly its own data, none is counted late, and the forged epoch closes
    on its own (withheld or withdrawn by estimate.py when the genuine markers contradict it).
    Without the idle rule and with the old "too old: late" rule, epochs 5..192 are erased."""
    base = 1000
    forged_epoch = base + 5 + 190
    policy = WindowPolicy(n_source_partitions=n_partitions, allowed_lateness_epochs=2, watermark_idle_s=20.0)
    store = Store()
    closes: dict[int, list[str]] = {}
    late = 0
    now = 50_000.0

    def run(items: list[Partial]) -> None:
        nonlocal late
        out = store.apply(policy, items)
        late += sum(out.late.values())
        for st, reason in out.closed:
            closes.setdefault(st.wid.epoch, []).append(reason)
            if st.wid.epoch != forged_epoch:
                assert reason == "markers", (st.wid.epoch, reason)
                assert st.reports.tolist() == [1, 1] and st.counts.sum() == 2  # exactly its own data

    for i in range(30):
        items = _epoch_items(base + i, n_partitions, i)
        if i == 5:
            run(items[:1])
            run([marker(r, 0, p, participants=3, epoch=forged_epoch, producer="intruder")
                 for r in range(2) for p in range(n_partitions)])
            items = items[1:]
        now += 2.0  # a tick between epochs: far less than the idle time
        run([*items, Tick(now)])
    assert sorted(e for e in closes if e != forged_epoch) == [base + i for i in range(30)]
    assert all(len(v) == 1 for v in closes.values()) and late == 0
    assert closes[forged_epoch] == ["markers"]


def test_born_late_window_of_a_straggler_gets_an_outcome() -> None:
    """A record of an epoch the watermark passed before any of its data came here: a window
    all the same, closed once idle -- an outcome, not a silent drop."""
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=0, watermark_idle_s=10.0,
                          wall_clock_grace_s=1e9)
    store = Store()
    store.apply(policy, [Tick(0.0), batch(bid(1), [1, 0, 0, 0, 0], epoch=50)])
    out = store.apply(policy, [batch(bid(2), [1, 0, 0, 0, 0], epoch=40)])
    assert closed(out) == [] and out.late == Counter()
    assert WindowState.decode(store.windows[wid(40, VERSION)]).born_late
    out = store.apply(policy, [Tick(11.0)])
    assert closed(out) == [(40, "watermark")] and out.closed[0][0].born_late


def test_markers_wait_for_the_batches_they_announce() -> None:
    """A batch that reaches stage 2 after its producer's markers (a broker's retry reordered
    them) is waited for: the epoch closes by its markers once the batch is there, with all of
    its data -- not at the last marker, short of a batch."""
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=2)
    store = Store()
    markers = [marker(r, 0, 0, batches=1, reports=1, participants=1) for r in range(2)]
    out = store.apply(policy, [batch(bid(1), [1, 0, 0, 0, 0], rnd=1), *markers])
    assert closed(out) == []  # round 0's batch is announced and missing
    out = store.apply(policy, [batch(bid(2), [0, 1, 0, 0, 0], rnd=0)])
    assert closed(out) == [(EPOCH, "markers")]
    assert out.closed[0][0].reports.tolist() == [1, 1] and out.closed[0][0].missing_batches() == 0


def test_a_stalled_window_closes_after_stall_close_s_and_not_before() -> None:
    """One of two producers marked epoch 7, the other died before it; nothing later comes, so
    the watermark never passes 7. With ``stall_close_s`` the window closes (as by the
    watermark, its markers incomplete) once it received nothing for that long of the tick
    clock -- never absent; without it, it stays open (the rule is off)."""
    epoch = 7
    now = (epoch + 1) * EPOCH_S + 10 * 3600.0  # long past: not live, the wall clock closes nothing
    marker = MarkerPartial("q", 1, epoch, 0, 0, "p0", 0, 2, 0, 0, 5, 0, False)
    for stall, closed in ((30.0, True), (0.0, False)):
        policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=2, stall_close_s=stall)
        wm = Watermarks()
        states: dict[WindowId, WindowState] = {}
        got = []
        for items in ([Tick(now), marker], [Tick(now + 29.0)], [Tick(now + 30.0)]):
            out = policy.apply(wm, states.get, lambda w: (1, 2), items)
            states.update(out.touched)
            got.append([(s.wid.epoch, reason) for s, reason in out.closed])
        assert got == [[], [], [(epoch, "watermark")] if closed else []]
