"""Epoch windows as plain data (``stream_app.windows``): no Faust, no broker.

Checked:

* ``Window.new`` shapes; ``add`` of batches (full and sparse) and markers: counts add across
  batches and rounds, reports and the vehicles of full batches are kept per round;
* duplicates: a batch id or a marker (same producer, round, index, partition) counts once and
  is counted as a duplicate; a marker for the same slot re-sent under ANOTHER producer id is
  not a duplicate -- it replaces the earlier one (last writer wins), which makes the window's
  state depend on arrival order (a failing test shows it; see the module's promise that
  "one or many workers, and a restart, give the same numbers");
* late records after ``close`` are counted and change nothing, also after a round trip;
* ``to_dict``/``from_dict`` round trips through JSON (open: everything; closed: only the
  small record), ``Partial.to_bytes``/``from_bytes``;
* ``markers_complete`` for K producers x P partitions x R rounds, in seeded random orders:
  incomplete until the very last marker; the producer count comes from the markers;
* ``participants`` (one round-0 marker per producer, missing producer indices), ``refused``,
  ``missing_batches`` (per producer, partition and round);
* ``Watermarks``: None until every source partition was seen, then the minimum of the
  newest epochs; ``due`` with allowed lateness; ``track``/``untrack``; round trip;
* merge order independence (what makes 1 and 2 workers, and a restart, identical): the same
  set of partials, duplicates included, in 25 seeded random orders -- with and without a
  JSON round trip of the state in the middle -- gives identical state and decisions.

Nothing here is random except the seeded shuffles.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest

from stream_app.windows import Partial, Watermarks, Window, window_key

QID = "q-win"
VERSION = 3
EPOCH = 59_832_960
WIDTH = 5


def batch(batch_id: str, counts: list[int], rnd: int = 0, producer: str = "p0-aaaa", partition: int = 0,
          reports: int | None = None, mode: str = "full", epoch: int = EPOCH) -> Partial:
    return Partial("batch", query_id=QID, query_version=VERSION, epoch=epoch, round=rnd, source_partition=partition,
                   producer_id=producer, batch_id=batch_id, reports=sum(counts) if reports is None else reports,
                   mode=mode, counts=list(counts))  # type: ignore[arg-type]


def marker(rnd: int, index: int, partition: int, count: int = 1, producer: str | None = None, batches: int = 0,
           reports: int = 0, participants: int = 0, refused: int = 0, epoch: int = EPOCH) -> Partial:
    return Partial("marker", query_id=QID, query_version=VERSION, epoch=epoch, round=rnd, source_partition=partition,
                   producer_id=producer or f"p{index}-aaaa", reports=reports, producer_index=index,
                   producer_count=count, batches=batches, participants=participants, refused=refused)


def new(n_rounds: int = 2, width: int = WIDTH) -> Window:
    return Window.new(QID, VERSION, EPOCH, n_rounds, width)


def bid(i: int) -> str:
    return f"{i:032x}"


def state(w: Window) -> dict[str, Any]:
    """Everything of a window, JSON-normalized (dict order does not matter)."""
    d: dict[str, Any] = json.loads(json.dumps(w.to_dict()))
    return d


# ---------------------------------------------------------------------------------------
# new / add
# ---------------------------------------------------------------------------------------
def test_new_window_is_empty_with_one_row_per_round() -> None:
    w = new(n_rounds=2, width=4)
    assert (w.query_id, w.query_version, w.epoch, w.n_rounds, w.width) == (QID, VERSION, EPOCH, 2, 4)
    assert w.counts == [[0] * 4, [0] * 4] and w.sparse == [[0] * 4, [0] * 4]
    assert w.reports == [0, 0] and w.full_vehicles == [0, 0]
    assert w.seen == {} and w.markers == {} and not w.closed
    assert (w.late, w.duplicates) == (0, 0)
    w.counts[0][0] = 1  # rows are independent lists
    assert w.counts[1][0] == 0


def test_window_key_and_partial_key() -> None:
    assert window_key("q", 2, 17) == "q:v2:e17"
    assert batch(bid(1), [0] * WIDTH).key == f"{QID}:v{VERSION}:e{EPOCH}"


def test_batches_add_across_batches_and_rounds() -> None:
    w = new()
    assert w.add(batch(bid(1), [1, 2, 0, 0, 3], rnd=0)) == "added"
    assert w.add(batch(bid(2), [0, 1, 1, 0, 0], rnd=0, partition=1)) == "added"
    assert w.add(batch(bid(3), [4, 0, 0, 1, 0], rnd=1)) == "added"
    assert w.counts == [[1, 3, 1, 0, 3], [4, 0, 0, 1, 0]]
    assert w.reports == [8, 5]
    assert w.full_vehicles == [8, 5]  # full batches: every report is a vehicle
    assert w.sparse == [[0] * WIDTH, [0] * WIDTH]
    assert w.seen == {bid(1): [0, "p0-aaaa", 0], bid(2): [0, "p0-aaaa", 1], bid(3): [1, "p0-aaaa", 0]}
    assert w.duplicates == 0


def test_sparse_batches_feed_counts_and_sparse_but_not_full_vehicles() -> None:
    w = new(n_rounds=1, width=6)
    w.add(batch(bid(1), [0, 1, 0, 2, 0, 0], mode="sparse"))
    w.add(batch(bid(2), [1, 0, 0, 0, 0, 1], mode="sparse"))
    w.add(batch(bid(3), [3, 0, 1, 0, 2, 1], reports=3, mode="full"))  # a tally of 3 vehicles (2 stations)
    assert w.counts == [[4, 1, 1, 2, 2, 2]]
    assert w.sparse == [[1, 1, 0, 2, 0, 1]]
    assert w.reports == [8]
    assert w.full_vehicles == [3]


def test_add_refuses_wrong_width_round_or_kind() -> None:
    w = new(n_rounds=1)
    with pytest.raises(ValueError, match="width"):
        w.add(batch(bid(1), [1] * (WIDTH + 1)))
    with pytest.raises(ValueError, match="round"):
        w.add(batch(bid(2), [1] * WIDTH, rnd=1))
    with pytest.raises(ValueError, match="tick"):
        w.add(Partial("tick", now_s=1.0))
    assert w.seen == {} and w.counts == [[0] * WIDTH]  # nothing half-added


# ---------------------------------------------------------------------------------------
# duplicates
# ---------------------------------------------------------------------------------------
def test_duplicate_batch_id_counts_once() -> None:
    w = new()
    b = batch(bid(7), [1, 0, 2, 0, 0])
    assert w.add(b) == "added"
    assert w.add(b) == "duplicate"
    # the same id again with other content or from another partition is still the same batch
    assert w.add(batch(bid(7), [9, 9, 9, 9, 9], rnd=1, partition=2)) == "duplicate"
    assert w.counts == [[1, 0, 2, 0, 0], [0] * WIDTH]
    assert w.reports == [3, 0]
    assert w.duplicates == 2
    assert len(w.seen) == 1


def test_duplicate_marker_counts_once() -> None:
    w = new()
    m = marker(0, 0, 1, count=2, batches=3, reports=30, participants=30, refused=1)
    assert w.add(m) == "added"
    assert w.add(m) == "duplicate"
    assert w.duplicates == 1
    assert list(w.markers) == ["0:0:1"]
    assert w.markers["0:0:1"] == {"producer_id": "p0-aaaa", "producer_count": 2, "batches": 3, "reports": 30,
                                  "participants": 30, "refused": 1, "interrupted": False}
    # the same producer's markers for other slots are not duplicates
    assert w.add(marker(1, 0, 1, count=2)) == "added"
    assert w.add(marker(0, 0, 0, count=2)) == "added"
    assert w.add(marker(0, 1, 1, count=2)) == "added"
    assert w.duplicates == 1 and len(w.markers) == 4


def test_marker_resent_by_other_producer_id_keeps_one_by_a_fixed_rule() -> None:
    """A marker for the same (round, index, partition) under another producer id (a producer
    process restarted: ids are ``p<index>-<random>``) is a conflict: counted, and the slot keeps
    the marker with the smaller producer id, whichever arrived first."""
    w = new()
    assert w.add(marker(0, 0, 0, producer="p0-second", batches=1, participants=25)) == "added"
    assert w.add(marker(0, 0, 0, producer="p0-first", batches=2, participants=40)) == "added"
    assert w.add(marker(0, 0, 0, producer="p0-second", batches=1, participants=25)) == "duplicate"
    assert w.conflicts == 2 and w.duplicates == 0
    assert list(w.markers) == ["0:0:0"]
    assert w.markers["0:0:0"]["producer_id"] == "p0-first"
    assert w.participants() == (40, [])


def test_conflicting_markers_for_one_slot_give_the_same_state_in_any_order() -> None:
    """BUG (stream_app/windows.py, Window.add, marker branch): last writer wins.

    Two markers for the same (round 0, producer index 0, partition 0) under different producer
    ids -- a restarted producer re-sending the epoch -- leave a window whose participants,
    missing batches and markers depend on which arrived last. Stage 2 sees the partials of
    different source partitions in no fixed order (and 1 vs 2 workers interleave them
    differently), so the published N differs from run to run. Expected: the same state in
    either order (e.g. keep the first, or keep both/flag a conflict deterministically).
    """
    first = [batch(bid(1), [1, 1, 0, 0, 0], producer="p0-first"),
             batch(bid(2), [0, 1, 0, 0, 0], producer="p0-first"),
             marker(0, 0, 0, producer="p0-first", batches=2, participants=40)]
    second = [batch(bid(3), [1, 1, 0, 0, 0], producer="p0-second"),
              marker(0, 0, 0, producer="p0-second", batches=1, participants=25)]
    a, b = new(), new()
    for p in first + second:
        a.add(p)
    for p in second + first:
        b.add(p)
    assert a.counts == b.counts  # batches are fine: they add
    assert (a.participants(), a.missing_batches(), a.markers) == (b.participants(), b.missing_batches(), b.markers)


# ---------------------------------------------------------------------------------------
# close, late records, serialization
# ---------------------------------------------------------------------------------------
def test_late_records_after_close_are_counted_and_change_nothing() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(marker(0, 0, 0, batches=1, participants=6))
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))  # one duplicate before closing
    w.close("markers")
    assert w.closed and w.closed_by == "markers"
    before = asdict(w)
    assert w.add(batch(bid(2), [5, 5, 5, 5, 5])) == "late"
    assert w.add(batch(bid(1), [1, 2, 3, 0, 0])) == "late"  # a duplicate arriving late is late
    assert w.add(marker(1, 0, 0)) == "late"
    after = asdict(w)
    assert after.pop("late") == 3
    before.pop("late")
    assert after == before
    assert w.duplicates == 1


def test_open_window_round_trips_through_json() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0], partition=2, producer="p1-bbbb"))
    w.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1, mode="sparse"))
    w.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1, mode="sparse"))
    w.add(marker(0, 1, 2, count=2, producer="p1-bbbb", batches=1, reports=6, participants=9, refused=2))
    d = json.loads(json.dumps(w.to_dict()))
    back = Window.from_dict(d)
    assert back == w
    assert back.to_dict() == w.to_dict()
    # and it keeps working the same after the round trip
    assert back.add(batch(bid(2), [0, 1, 0, 0, 4], rnd=1)) == "duplicate"
    assert back.add(marker(0, 1, 2, count=2, producer="p1-bbbb", batches=1)) == "duplicate"
    assert back.missing_batches() == 0 and back.participants() == (9, [0]) and back.refused() == 2


def test_closed_window_keeps_only_the_small_record() -> None:
    w = new()
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(batch(bid(1), [1, 2, 3, 0, 0]))
    w.add(marker(0, 0, 0, batches=1))
    w.close("watermark")
    w.add(batch(bid(9), [1, 0, 0, 0, 0]))
    d = json.loads(json.dumps(w.to_dict()))
    assert d == {"query_id": QID, "query_version": VERSION, "epoch": EPOCH, "n_rounds": 2, "width": WIDTH,
                 "closed_by": "watermark", "late": 1, "duplicates": 1}
    back = Window.from_dict(d)
    assert back.closed and back.closed_by == "watermark"
    assert back.counts == [] and back.seen == {} and back.markers == {}
    assert back.add(batch(bid(10), [1, 0, 0, 0, 0])) == "late"
    assert back.add(marker(0, 0, 0)) == "late"
    assert back.to_dict() == {**d, "late": 3}


@pytest.mark.parametrize("p", [
    batch(bid(5), [0, 1, 2, 3, 4], rnd=1, partition=3, mode="sparse", reports=7),
    marker(1, 2, 1, count=4, batches=6, reports=70, participants=80, refused=3),
    Partial("tick", now_s=1_795_000_000.25),
], ids=["batch", "marker", "tick"])
def test_partial_round_trips_through_bytes(p: Partial) -> None:
    data = p.to_bytes()
    assert isinstance(json.loads(data), dict)
    assert Partial.from_bytes(data) == p


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
        # markers from partitions beyond the source partitions do not matter
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


def test_batches_of_a_producer_without_markers_are_not_missing() -> None:
    w = new(n_rounds=1)
    w.add(batch(bid(1), [1, 0, 0, 0, 0], producer="device"))
    assert w.missing_batches() == 0


# ---------------------------------------------------------------------------------------
# watermarks
# ---------------------------------------------------------------------------------------
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
    assert wm.newest["0"] == 100 and wm.watermark(3) == 100
    wm.see(0, 107)
    assert wm.watermark(3) == 102
    wm.see(5, 1)  # a partition outside the source partitions is ignored
    assert wm.watermark(3) == 102
    wm.see(1, 0)
    assert wm.watermark(3) == 102


def test_watermark_from_epoch_zero() -> None:
    wm = Watermarks()
    wm.see(0, 0)
    assert wm.watermark(1) == 0


def test_due_respects_allowed_lateness() -> None:
    wm = Watermarks()
    for e in (10, 11, 12):
        wm.track(window_key(QID, 1, e), e)
    assert wm.due(2, 0) == []  # no watermark yet
    wm.see(0, 12)
    wm.see(1, 11)  # watermark 11
    assert wm.due(2, 0) == [window_key(QID, 1, 10)]
    assert wm.due(2, 1) == []
    wm.see(1, 13)  # watermark 12
    assert wm.due(2, 0) == [window_key(QID, 1, 10), window_key(QID, 1, 11)]
    assert wm.due(2, 1) == [window_key(QID, 1, 10)]
    assert wm.due(2, 2) == []
    wm.see(0, 20)
    wm.see(1, 20)
    assert wm.due(2, 7) == [window_key(QID, 1, e) for e in (10, 11, 12)]
    assert wm.due(2, 8) == [window_key(QID, 1, e) for e in (10, 11)]


def test_track_and_untrack() -> None:
    wm = Watermarks()
    a, b = window_key(QID, 1, 5), window_key(QID, 2, 5)
    wm.track(a, 5)
    wm.track(b, 5)
    wm.track(a, 99)  # tracking again changes nothing
    assert wm.open == [a, b] and wm.open_epochs == {a: 5, b: 5}
    wm.untrack(a)
    wm.untrack(a)  # untracking twice is harmless
    wm.untrack("never-tracked")
    assert wm.open == [b] and wm.open_epochs == {b: 5}
    wm.see(0, 7)
    assert wm.due(1, 0) == [b]
    wm.untrack(b)
    assert wm.due(1, 0) == []


def test_watermarks_round_trip() -> None:
    assert Watermarks.from_dict(None) == Watermarks()
    assert Watermarks.from_dict({}) == Watermarks()
    wm = Watermarks()
    wm.see(0, 3)
    wm.see(1, 4)
    wm.track(window_key(QID, 1, 3), 3)
    back = Watermarks.from_dict(json.loads(json.dumps(wm.to_dict())))
    assert back == wm
    assert back.watermark(2) == 3 and back.due(2, 0) == [] and back.open == [window_key(QID, 1, 3)]


# ---------------------------------------------------------------------------------------
# merge order independence
# ---------------------------------------------------------------------------------------
def _epoch_partials(seed: int, k: int, n_partitions: int, n_rounds: int, width: int,
                    sparse: bool) -> list[Partial]:
    """A realistic epoch: K producers, each sending several batches per round to random
    partitions (some re-delivered), then a marker per (round, partition) with what it sent."""
    rng = np.random.default_rng(seed)
    out: list[Partial] = []
    serial = 0
    for idx in range(k):
        producer = f"p{idx}-{seed:04x}"
        participants = int(rng.integers(20, 60))
        refused = int(rng.integers(0, 3))
        for r in range(n_rounds):
            sent = {p: [0, 0] for p in range(n_partitions)}
            for _ in range(int(rng.integers(1, 6))):
                serial += 1
                counts = rng.integers(0, 5, size=width).tolist()
                part = int(rng.integers(n_partitions))
                mode = "sparse" if sparse and rng.random() < 0.5 else "full"
                b = batch(bid(serial), counts, rnd=r, producer=producer, partition=part, mode=mode,
                          reports=int(sum(counts)))
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


def _decisions(w: Window, n_partitions: int) -> tuple[Any, ...]:
    return (w.markers_complete(n_partitions), w.producer_count(), w.participants(), w.refused(),
            w.missing_batches())


@pytest.mark.parametrize(("k", "n_partitions", "n_rounds", "sparse"),
                         [(1, 1, 2, False), (2, 3, 2, False), (3, 2, 1, True), (2, 4, 1, True)])
def test_merge_is_order_independent(k: int, n_partitions: int, n_rounds: int, sparse: bool) -> None:
    width = 7
    partials = _epoch_partials(1000 + k * 10 + n_partitions, k, n_partitions, n_rounds, width, sparse)
    n_markers = len({(p.round, p.producer_index, p.source_partition) for p in partials if p.kind == "marker"})
    assert n_markers == k * n_partitions * n_rounds

    reference = new(n_rounds, width)
    for p in partials:
        reference.add(p)
    ref_state = state(reference)
    ref_decisions = _decisions(reference, n_partitions)
    assert ref_decisions[0] is True and ref_decisions[4] == 0  # everything arrived
    # counts are the plain sums of the distinct batches
    distinct = {p.batch_id: p for p in partials if p.kind == "batch"}
    for r in range(n_rounds):
        want = np.sum([b.counts for b in distinct.values() if b.round == r], axis=0).tolist()
        assert reference.counts[r] == want
    assert reference.duplicates == len(partials) - len(distinct) - n_markers

    for seed in range(25):
        order = np.random.default_rng([seed, 77]).permutation(len(partials))
        w = new(n_rounds, width)
        marker_slots: set[tuple[int, int, int]] = set()
        for j, i in enumerate(order):
            p = partials[i]
            w.add(p)
            if p.kind == "marker":
                marker_slots.add((p.round, p.producer_index, p.source_partition))
            # complete exactly when the last distinct marker slot has arrived, in every order
            assert w.markers_complete(n_partitions) == (len(marker_slots) == n_markers)
            if j == len(order) // 2:  # a restart in the middle: state through its JSON changelog
                w = Window.from_dict(json.loads(json.dumps(w.to_dict())))
        assert state(w) == ref_state, f"order seed {seed}"
        assert _decisions(w, n_partitions) == ref_decisions


def test_two_stage1_workers_interleaving_gives_the_same_window() -> None:
    """Two stage-1 workers each own some source partitions and keep their own order; stage 2
    sees an arbitrary interleaving of the two streams. Every interleaving gives one state."""
    partials = _epoch_partials(4242, 2, 4, 2, 5, False)
    worker_of = {0: 0, 1: 1, 2: 0, 3: 1}
    streams: list[list[Partial]] = [[], []]
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


def test_too_old_epochs_are_late_before_a_window_exists() -> None:
    """The watermark (min over source partitions of the newest epoch) minus the lateness:
    epochs below it get no new window."""
    wm = Watermarks()
    assert not wm.too_old(1, n_partitions=2, lateness=2)  # no watermark yet
    wm.see(0, 20)
    wm.see(1, 15)
    assert wm.watermark(2) == 15
    assert wm.too_old(12, 2, 2) and not wm.too_old(13, 2, 2) and not wm.too_old(15, 2, 2)
