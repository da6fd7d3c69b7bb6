"""The shuffler's state log: keyed records a compacted topic can shrink, and how a restart folds them.

Every transaction (a *step*) writes, to the instance's state topic, beside what it releases:

* ``step-<s>``: the replay's notes it took and the keyed digests of the devices its slots
  took, while any of their epochs is open. Once every epoch they went to is decided (released
  or withheld), a later step writes a **tombstone** for ``step-<s>``.
* ``held-<query>-<version>-<epoch>``: an open epoch's admitted reports as counts (per round:
  devices, and the nonzero counts of the policy's layout), the whole epoch's, rewritten by each
  step that adds to it and tombstoned in the step that decides it -- the state topic holds no
  report longer than its epoch is open, and a record's size is bounded by the query's
  stations x reports, not by how many devices report. (A log written before counts were held
  has the admitted reports one by one in ``step-<s>``'s ``admit``; a restart still reads it.)
* ``decided-<query>-<version>-<epoch>``: an epoch that was decided (late reports are refused).
* ``salt``: the secret salt, once; ``clock``: the policy's epoch clock and the newest epoch
  each input partition showed (what the tombstoned steps' reports had advanced).

Each record carries two headers: ``s``, its step, and ``inc``, the writing process's random
incarnation id. A restart keeps the records of committed steps (``s <= `` the step committed
with the input offsets) written by the *last* incarnation that wrote that step (an aborted
incarnation's records stay visible on a broker that shows aborted records -- Tansu does), then
the last record of each key, a tombstone deleting it. That is exactly what a compacted topic
keeps, so folding the whole log and folding its compaction give the same state
(tests/unit/stream_app/shuffler/test_state.py). Records written before keys existed (no
headers; one record per step holding ``admit``, ``decided`` and ``salt``) are read as the last
record of their step.

>>> log = [StateRecord("step-1", {"admit": [[0, "r"]]}, 1, "a"),
...        StateRecord("step-2", {"admit": [[0, "x"]]}, 2, "a"),   # step 2 aborted ...
...        StateRecord("step-2", {"admit": [[1, "y"]]}, 2, "b"),   # ... and redone
...        StateRecord("step-1", None, 3, "b"),                   # its epoch decided: tombstone
...        StateRecord("step-4", {"admit": [[0, "z"]]}, 4, "b")]  # not committed
>>> [(r.key, r.value) for r in fold(log, committed_step=3)]
[('step-2', {'admit': [[1, 'y']]})]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LEGACY", "StateRecord", "compact", "decided_key", "fold", "from_kafka", "headers", "held_key",
           "logged_step", "step_key"]

LEGACY = "legacy"  # the incarnation of records written before the log was keyed


@dataclass(frozen=True)
class StateRecord:
    """One state record: its key, its JSON value (None: a tombstone), step and incarnation."""

    key: str
    value: dict[str, Any] | None
    s: int
    inc: str


def step_key(step: int) -> str:
    return f"step-{step}"


def held_key(query_id: str, version: int, epoch: int) -> str:
    return f"held-{query_id}-{version}-{epoch}"


def decided_key(query_id: str, version: int, epoch: int) -> str:
    return f"decided-{query_id}-{version}-{epoch}"


def headers(step: int, inc: str) -> list[tuple[str, bytes]]:
    return [("s", str(step).encode()), ("inc", inc.encode())]


def from_kafka(key: bytes | None, value: bytes | None, record_headers: Sequence[tuple[str, bytes]]) -> StateRecord:
    """A consumed record; a legacy one (no headers, no key) becomes its step's ``legacy-step``."""
    h = dict(record_headers or ())
    if "s" not in h:  # written before the log was keyed: one record per step
        body = json.loads(value or b"{}")
        return StateRecord(f"legacy-{step_key(int(body['s']))}", body, int(body["s"]), LEGACY)
    return StateRecord((key or b"").decode(), json.loads(value) if value is not None else None, int(h["s"]),
                       h["inc"].decode())


def fold(records: Iterable[StateRecord], committed_step: int) -> list[StateRecord]:
    """The live state: records of committed steps by the last incarnation that wrote each step,
    the last per key, tombstoned keys dropped; in step order (log order within a step)."""
    records = list(records)
    writer: dict[int, str] = {}
    for r in records:
        if r.s <= committed_step:
            writer[r.s] = r.inc
    latest: dict[str, tuple[int, StateRecord]] = {}
    for i, r in enumerate(records):
        if r.s <= committed_step and writer[r.s] == r.inc:
            latest[r.key] = (i, r)
    live = [(r.s, i, r) for i, r in latest.values() if r.value is not None]
    return [r for _, _, r in sorted(live, key=lambda t: (t[0], t[1]))]


def logged_step(records: Sequence[StateRecord]) -> int:
    """The newest step the log proves committed, for a restart that finds no committed offsets
    (the consumer group's expired): the step before the newest one the log's last writer wrote.
    An incarnation writes step s + 1 only once step s committed, and starts at the committed
    step + 1; whether its own newest step committed the log cannot say, so that step is done
    again -- from the input offsets of the step before (the ``clock`` record), to the same
    release under the same batch ids (runtime.py), which the worker counts once.

    >>> logged_step([StateRecord("clock", {}, 4, "a"), StateRecord("clock", {}, 5, "b"),
    ...              StateRecord("clock", {}, 6, "b")])
    5
    >>> logged_step([])
    0
    """
    if not records:
        return 0
    last = records[-1].inc
    return max(0, max(r.s for r in records if r.inc == last) - 1)


def compact(records: Iterable[StateRecord]) -> list[StateRecord]:
    """What a compacted topic keeps of a committed log (as a ``read_committed`` consumer sees
    it; Kafka's cleaner discards aborted records): the last record of each key, in log order
    (a tombstone may be kept or gone). For tests: ``fold(compact(log)) == fold(log)``."""
    records = list(records)
    last = {r.key: i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i]
