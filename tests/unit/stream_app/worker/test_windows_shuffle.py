"""The attested shuffle size in epoch windows (``stream_app.worker.windows``, ``stream_app.worker.records``):
``WindowState.shuffle_size`` -- the smallest attested size over producers, rounds and
partitions; ``not_attested`` when any (round, producer) marker lacks it or the markers are
incomplete; ``exceeds_released`` when a producer attests more than it released in the round
(its declared reports over all partitions for a station-valued mechanism, its participants for a
per-sensor one) -- and that window states and stage records written before the field existed
still decode (and unattested ones are written byte for byte as before).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from schemas.wire import FRAME_LENGTH
from stream_app.worker.records import MarkerPartial, WindowId, decode_partial, encode_partial
from stream_app.worker.windows import SHUFFLE_NULL_CODES, Marker, WindowState

WID = WindowId("q-shuf", 2, 59_832_960)


def marker(rnd: int, index: int, partition: int, *, k: int = 2, reports: int = 10, participants: int = 20,
           size: int | None = None) -> MarkerPartial:
    return MarkerPartial(WID.query_id, WID.query_version, WID.epoch, rnd, partition, f"shuf-{index}", index, k,
                         reports, 1, participants, 0, False, (), size)


def window(sizes: dict[tuple[int, int], int | None], *, k: int = 2, n_partitions: int = 2, n_rounds: int = 2,
           reports: int = 10, participants: int = 20) -> WindowState:
    """Complete markers; ``sizes[(round, producer)]`` attested on every partition (None: absent)."""
    w = WindowState.new(WID, n_rounds, 3)
    for r in range(n_rounds):
        for i in range(k):
            for p in range(n_partitions):
                assert w.add(marker(r, i, p, k=k, reports=reports, participants=participants,
                                    size=sizes[(r, i)])) == "added"
    return w


def test_the_smallest_size_over_producers_and_rounds() -> None:
    # each producer released 2 x 10 = 20 reports per round over the two partitions
    w = window({(0, 0): 20, (0, 1): 17, (1, 0): 19, (1, 1): 20})
    assert w.shuffle_size(2, per_sensor=False) == (17, None)
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 12, (1, 1): 20})
    assert w.shuffle_size(2, per_sensor=False) == (12, None)


def test_the_smallest_claim_of_a_producer_over_its_partitions_counts() -> None:
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
    held = w.markers[(1, 1, 1)]
    w.markers[(1, 1, 1)] = replace(held, shuffle_size=9)
    assert w.shuffle_size(2, per_sensor=False) == (9, None)


@pytest.mark.parametrize("missing", [(0, 0), (1, 1)])
def test_one_unattested_producer_or_round_gives_none(missing: tuple[int, int]) -> None:
    sizes: dict[tuple[int, int], int | None] = {(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20}
    sizes[missing] = None
    assert window(sizes).shuffle_size(2, per_sensor=False) == (None, "not_attested")


def test_one_partition_without_the_field_gives_none() -> None:
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
    w.markers[(0, 1, 0)] = replace(w.markers[(0, 1, 0)], shuffle_size=None)
    assert w.shuffle_size(2, per_sensor=False) == (None, "not_attested")


def test_no_markers_or_incomplete_markers_give_none() -> None:
    assert WindowState.new(WID, 2, 3).shuffle_size(2, per_sensor=False) == (None, "not_attested")
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
    del w.markers[(1, 0, 1)]
    assert w.shuffle_size(2, per_sensor=False) == (None, "not_attested")
    # a third partition the markers never reached: incomplete for a 3-partition topic
    assert window({(0, 0): 5, (0, 1): 5, (1, 0): 5, (1, 1): 5}).shuffle_size(3, per_sensor=False) == (
        None, "not_attested")


def test_a_size_above_the_reports_released_is_a_lie() -> None:
    # station-valued: producer 1 declares 2 x 10 reports in round 1 but attests 21
    lie = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 21})
    assert lie.shuffle_size(2, per_sensor=False) == (None, "exceeds_released")
    # the bound is the sum over partitions, not one partition's share
    assert window({(0, 0): 20, (0, 1): 11, (1, 0): 20, (1, 1): 20}).shuffle_size(2, per_sensor=False) == (11, None)
    # a lie outranks a missing attestation elsewhere (it is what gets counted)
    mixed = window({(0, 0): None, (0, 1): 20, (1, 0): 20, (1, 1): 99})
    assert mixed.shuffle_size(2, per_sensor=False) == (None, "exceeds_released")
    assert set(SHUFFLE_NULL_CODES) == {"not_attested", "exceeds_released", "mixed_release"}


def test_per_sensor_sizes_are_bounded_by_the_participants() -> None:
    # per-sensor: a device's report is its pairs, possibly none -- fewer pairs (reports) than
    # devices is possible, so the bound is the round's participants
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20}, reports=3, participants=20)
    assert w.shuffle_size(2, per_sensor=True) == (20, None)
    assert w.shuffle_size(2, per_sensor=False) == (None, "exceeds_released")  # 2 x 3 pairs < 20
    lie = window({(0, 0): 20, (0, 1): 21, (1, 0): 20, (1, 1): 20}, reports=50, participants=20)
    assert lie.shuffle_size(2, per_sensor=True) == (None, "exceeds_released")


def test_shuffle_size_survives_the_state_round_trip() -> None:
    w = window({(0, 0): 20, (0, 1): 17, (1, 0): 19, (1, 1): None})
    back = WindowState.decode(w.encode())
    assert back.markers == w.markers
    assert back.markers[(0, 1, 0)].shuffle_size == 17 and back.markers[(1, 1, 0)].shuffle_size is None
    w.close("markers")
    assert WindowState.decode(w.encode()).markers == w.markers


def _old_state(markers: list[list[object]]) -> bytes:
    """A window state as the worker wrote it before the shuffle size (a closed window)."""
    head = {"q": WID.query_id, "v": WID.query_version, "e": WID.epoch, "r": 2, "w": 3, "closed_by": "markers",
            "late": 0, "dup": 0, "published": True, "born_late": False, "reports": [20, 20], "tallied": [0, 0],
            "markers": markers, "conflicting": []}
    h = json.dumps(head, separators=(",", ":")).encode()
    return b"PTW1" + FRAME_LENGTH.pack(len(h)) + h


def test_state_written_before_the_field_still_decodes() -> None:
    old = _old_state([[0, 0, 0, "p0", 1, 1, 20, 20, 0, False, [3]],  # with readings_missing
                      [1, 0, 0, "p0", 1, 1, 20, 20, 0, False]])  # older still: without it
    w = WindowState.decode(old)
    assert w.markers[(0, 0, 0)] == Marker("p0", 1, 1, 20, 20, 0, False, (3,), None)
    assert w.markers[(1, 0, 0)] == Marker("p0", 1, 1, 20, 20, 0, False, (), None)
    assert w.shuffle_size(1, per_sensor=False) == (None, "not_attested")
    # and an unattested window is written exactly as before the field existed
    assert w.encode() == _old_state([[0, 0, 0, "p0", 1, 1, 20, 20, 0, False, [3]],
                                     [1, 0, 0, "p0", 1, 1, 20, 20, 0, False, []]])


def test_stage_records_without_the_field_decode_and_unattested_ones_are_unchanged() -> None:
    plain = marker(0, 1, 0)
    data = encode_partial(plain)
    assert b"shuffle_size" not in data  # what a worker from before the field writes and reads
    assert decode_partial(data) == plain and plain.shuffle_size is None
    attested = marker(0, 1, 0, size=17)
    assert decode_partial(encode_partial(attested)) == attested
    head = json.loads(encode_partial(attested)[9:])
    for bad in (0, -3, "7", True):
        h = json.dumps({**head, "shuffle_size": bad}).encode()
        with pytest.raises(ValueError, match="shuffle size"):
            decode_partial(b"PTS1M" + FRAME_LENGTH.pack(len(h)) + h)


def test_markers_differing_only_in_shuffle_size_conflict_in_any_order() -> None:
    a, b = marker(0, 0, 0, k=1, size=None), marker(0, 0, 0, k=1, size=20)
    held = []
    for first, second in ((a, b), (b, a)):
        w = WindowState.new(WID, 2, 3)
        w.add(first)
        assert w.add(second) == "added"  # no TypeError comparing None with an int
        assert w.conflicting == {(0, 0, 0)}
        held.append(w.markers[(0, 0, 0)])
    assert held[0] == held[1] and held[0].shuffle_size is None  # the fixed rule: the smaller


def test_counts_are_untouched_by_the_size() -> None:
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
    assert np.array_equal(w.counts, np.zeros((2, 3), dtype=np.int64)) and w.participants() == (40, [])


def released(release: str | None, rnd: int = 0, index: int = 0, partition: int = 0, size: int | None = 20
             ) -> MarkerPartial:
    return replace(marker(rnd, index, partition, size=size), release=release)


def test_the_release_the_attesting_markers_name() -> None:
    """``WindowState.release``: the one release every attesting marker names; a size without a
    release is a shuffler from before the field (permuted); none attests, or two names: None."""
    for names, want in [({"aggregate"}, "aggregate"), ({"permuted"}, "permuted"), ({None}, "permuted"),
                        ({"aggregate", "permuted"}, None), ({"aggregate", None}, None)]:
        w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
        order = sorted(names, key=str)
        w.markers = {slot: replace(m, release=order[slot[1] % len(order)]) for slot, m in w.markers.items()}
        assert w.release() == want, names
    direct = window({(0, 0): None, (0, 1): None, (1, 0): None, (1, 1): None})
    assert direct.release() is None  # the direct path: nothing attested


def test_the_release_survives_state_and_stage_records() -> None:
    w = window({(0, 0): 20, (0, 1): 20, (1, 0): 20, (1, 1): 20})
    w.markers = {slot: replace(m, release="aggregate") for slot, m in w.markers.items()}
    w.markers[(0, 0, 0)] = replace(w.markers[(0, 0, 0)], shuffle_size=None)  # a release without a size
    back = WindowState.decode(w.encode())
    assert back.markers == w.markers and back.release() == "aggregate"
    for p in (released("aggregate"), released("permuted"), released(None), released("aggregate", size=None)):
        assert decode_partial(encode_partial(p)) == p
    assert b"release" not in encode_partial(released(None))  # unset: as before the field
    head = json.loads(encode_partial(released("aggregate"))[9:])
    for bad in ("counts", 1, ""):
        h = json.dumps({**head, "release": bad}).encode()
        with pytest.raises(ValueError, match="release"):
            decode_partial(b"PTS1M" + FRAME_LENGTH.pack(len(h)) + h)


def test_markers_differing_only_in_release_conflict_in_any_order() -> None:
    held = []
    for first, second in ((released("aggregate"), released("permuted")), (released("permuted"),
                                                                          released("aggregate"))):
        w = WindowState.new(WID, 2, 3)
        w.add(first)
        assert w.add(second) == "added"
        assert w.conflicting == {(0, 0, 0)}
        held.append(w.markers[(0, 0, 0)])
    assert held[0] == held[1] and held[0].release == "aggregate"  # the fixed rule: the smaller
