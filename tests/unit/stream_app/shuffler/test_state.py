"""The shuffler's keyed state log (stream_app/shuffler/state.py): a restart folds what a
compacted topic keeps to the same state as the whole log; aborted incarnations never count."""

from __future__ import annotations

import random

from stream_app.shuffler.state import LEGACY, StateRecord, compact, decided_key, fold, from_kafka, headers, step_key


def _log(seed: int, steps: int = 60) -> list[StateRecord]:
    """A committed log as a shuffler writes it: steps admit to epochs, decide old ones, and
    tombstone the steps whose epochs are all decided."""
    rng = random.Random(seed)  # noqa: S311 -- a reproducible test log, not a secret
    out: list[StateRecord] = []
    live: dict[int, set[int]] = {}
    decided: set[int] = set()
    for s in range(1, steps + 1):
        epochs = {rng.randrange(max(0, s // 3 - 2), s // 3 + 2) for _ in range(rng.randrange(0, 3))} - decided
        if rng.random() < 0.4:
            decide = min((e for es in live.values() for e in es if e not in decided), default=None)
            if decide is not None:
                decided.add(decide)
                out.append(StateRecord(decided_key("q", 1, decide), {"decided": [["q", 1, decide]]}, s, "a"))
        live[s] = set(epochs)
        for t in [t for t, es in live.items() if es <= decided]:
            del live[t]
            if t != s:
                out.append(StateRecord(step_key(t), None, s, "a"))
        if s in live:
            out.append(StateRecord(step_key(s), {"admit": sorted(epochs)}, s, "a"))
        out.append(StateRecord("clock", {"clock": s // 3}, s, "a"))
    return out


def test_folding_the_compacted_log_gives_the_whole_logs_state() -> None:
    for seed in range(20):
        log = _log(seed)
        whole = fold(log, committed_step=60)
        assert fold(compact(log), committed_step=60) == whole
        compacted = compact(log)
        assert len(compacted) < len(log)  # compaction has something to drop
        # nothing of a step whose epochs are all decided is live
        decided = {r.value["decided"][0][2] for r in whole if r.value and "decided" in r.value}
        for r in whole:
            if r.key.startswith("step-"):
                assert r.value is not None and not set(r.value["admit"]) <= decided


def test_an_aborted_incarnation_never_counts() -> None:
    """Incarnation a's step 3 was aborted (its records visible, as on Tansu); b redid step 3
    without a's decided record; a's step 4 was never committed."""
    log = [
        StateRecord(step_key(1), {"admit": [1]}, 1, "a"),
        StateRecord(step_key(2), {"admit": [2]}, 2, "a"),
        StateRecord(decided_key("q", 1, 1), {"decided": [["q", 1, 1]]}, 3, "a"),
        StateRecord(step_key(1), None, 3, "a"),
        StateRecord("clock", {"clock": 9}, 3, "a"),
        StateRecord(step_key(3), {"admit": [3]}, 3, "b"),
        StateRecord("clock", {"clock": 3}, 3, "b"),
        StateRecord(step_key(4), {"admit": [4]}, 4, "b"),
    ]
    got = {r.key: r.value for r in fold(log, committed_step=3)}
    assert got == {step_key(1): {"admit": [1]}, step_key(2): {"admit": [2]}, step_key(3): {"admit": [3]},
                   "clock": {"clock": 3}}


def test_records_of_the_unkeyed_log_are_read_as_their_steps_last() -> None:
    old = [from_kafka(None, b'{"s":1,"admit":[[0,"x"]],"decided":[]}', []),
           from_kafka(None, b'{"s":2,"admit":[[0,"y"]],"decided":[]}', []),  # aborted
           from_kafka(None, b'{"s":2,"admit":[[0,"z"]],"decided":[],"salt":"ab"}', [])]
    assert all(r.inc == LEGACY for r in old)
    assert [r.value for r in fold(old, committed_step=2)] == [
        {"s": 1, "admit": [[0, "x"]], "decided": []}, {"s": 2, "admit": [[0, "z"]], "decided": [], "salt": "ab"}]
    new = from_kafka(b"step-7", None, headers(7, "c1"))
    assert new == StateRecord("step-7", None, 7, "c1")
