"""The shuffler's admission of one polled batch of device records (the runtime's hot path):
decoded columns in (:func:`.columns.decode_batch`), dead letters and each slot's new counts out.

Per record, in arrival order, exactly as one report at a time would be decided:

1. refused at decode (malformed, unauthenticated, ...), or a source note on the device topic
   (``untrusted_note``);
2. ``wrong_partition`` (several instances) or ``duplicate_report`` (its device's report of the
   slot was taken already: :class:`.enrolled.SlotDevices`, keyed digests only);
3. the policy's checks (:meth:`.policy.ShufflePolicy.refuse`), the open window at the clock
   where the record lies in the input (:meth:`~.policy.ShufflePolicy.window_clock`) -- for
   station-valued and bitmap reports as arrays over the batch
   (:meth:`~.policy.ShufflePolicy.passing`), the scalar check only for a record that fails them
   (its reason) or has pairs;
4. ``slot_full`` (:meth:`~.policy.ShufflePolicy.reserve`).

What a slot takes is added as counts, once per (epoch, round) of the batch: a bincount of the
values, a column sum of the bitmaps, the pairs' keys counted. The per-record Python work left
is the slot digest and a few dict lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import Query
from schemas.estimates import Rejected

from .columns import DeviceBatch
from .enrolled import Slot, SlotDevices
from .payload import pairs_fit
from .policy import EpochKey, ShufflePolicy

__all__ = ["Admission", "Step"]


@dataclass
class Step:
    """What one step read: the source notes admitted ([-1, JSON]), the epochs its reports went
    to and its note epochs, the dead letters, the device records and notes read, and each
    slot's new devices (keyed digests)."""

    admitted: list[tuple[int, str]] = field(default_factory=list)
    slots: set[EpochKey] = field(default_factory=set)
    notes: set[int] = field(default_factory=set)
    letters: list[tuple[Rejected, Any]] = field(default_factory=list)
    read: list[int] = field(default_factory=lambda: [0, 0])
    digests: dict[Slot, list[bytes]] = field(default_factory=dict)


@dataclass
class Admission:
    """Admits batches into ``policy``; ``query``: the query version a report names (None:
    unknown); ``catch_up``: read the source notes to their end (once per batch, when a report is
    outside the open window and the clock is the replay's); ``partitions``: the device topic's
    partition count, when several ``instances`` share it."""

    policy: ShufflePolicy
    seen: SlotDevices
    query: Callable[[str, int], Query | None]
    catch_up: Callable[[Step], None]
    source_clock: bool
    source_topic: str
    instances: int = 1
    partitions: int = 1

    def take(self, batch: DeviceBatch, records: Any, step: Step, now: Callable[[], float]) -> None:
        """Admit ``records`` (decoded as ``batch``; records with a ``partition`` and an
        ``offset`` each, or one partition's :class:`~.intake.Polled` columns) into the policy;
        dead letters into ``step``."""
        policy, n = self.policy, len(records)
        step.read[0] += n
        queries = [self.query(q, v) for q, v in batch.keys]
        if isinstance(getattr(records, "offsets", None), list):  # one partition's columns (intake.Polled)
            parts, offsets = np.full(n, records.partition, np.int64), np.asarray(records.offsets, np.int64)
        else:
            parts = np.fromiter((r.partition for r in records), np.int64, n)
            offsets = np.fromiter((r.offset for r in records), np.int64, n)
        clocks = self._clocks(parts, offsets)
        passes = self._passing(batch, queries, clocks)
        took = self._all_admitted(batch, queries, passes, parts, step)
        if took is None:
            took = self._one_by_one(batch, records, queries, parts, offsets, clocks, passes, step)
        t = now()
        keys = batch.key.tolist()
        for (key, rnd), rows in took.items():
            query = queries[keys[rows[0]]]
            if query is not None:
                policy.add(key, rnd, _counts(batch, rows, query), t)

    def _all_admitted(self, batch: DeviceBatch, queries: list[Query | None], passes: npt.NDArray[np.bool_],
                      parts: npt.NDArray[np.int64], step: Step) -> dict[tuple[EpochKey, int], list[int]] | None:
        """The common batch -- every record a device report that passes the policy's checks,
        on its device's partition, no device twice in a slot, every slot with room for its
        rows -- admitted a slot at a time (what :meth:`_one_by_one` does then, without its
        per-record loop); None, having changed nothing, for any other batch."""
        n = batch.key.size
        if (n == 0 or batch.notes or batch.reasons.count(None) != n or not passes.all()
                or any(q is None for q in queries)
                or (self.instances > 1 and bool(np.any(parts != batch.device % self.partitions)))):
            return None
        # one int64 per row for its slot (key, round, u32 epoch): a 1-d unique, not a row-wise one
        code = ((batch.key << 1) | batch.round) << 32 | batch.epoch
        slots, group = np.unique(code, return_inverse=True)
        group = group.ravel()
        order = np.argsort(group, kind="stable")  # a slot's rows in arrival order
        cuts = np.searchsorted(group[order], np.arange(len(slots) + 1)).tolist()
        plan = []
        listed = slots.tolist()
        for g in sorted(range(len(listed)), key=lambda g: int(order[cuts[g]])):  # slots by first arrival
            k, rnd, epoch = listed[g] >> 33, (listed[g] >> 32) & 1, listed[g] & 0xFFFFFFFF
            rows = order[cuts[g]:cuts[g + 1]]
            query_id, version = batch.keys[k]
            slot, query = (query_id, version, epoch, rnd), queries[k]
            digests = self.seen.digests(slot, batch.device[rows].tolist())
            if query is None or not self.seen.took_none(slot, digests) or \
                    self.policy.room(slot[:3], rnd, query) < rows.size:
                return None
            plan.append((slot, query, rows.tolist(), digests))
        took: dict[tuple[EpochKey, int], list[int]] = {}
        for slot, query, rows, digests in plan:
            self.policy.reserve_many(slot[:3], slot[3], query, len(rows))
            self.seen.add_all(slot, digests)
            step.digests.setdefault(slot, []).extend(digests)
            step.slots.add(slot[:3])
            took[(slot[:3], slot[3])] = rows
        return took

    def _one_by_one(self, batch: DeviceBatch, records: Any, queries: list[Query | None],
                    parts: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], clocks: npt.NDArray[np.int64],
                    passes: npt.NDArray[np.bool_], step: Step) -> dict[tuple[EpochKey, int], list[int]]:
        """Each record in arrival order: its dead letter into ``step``, or admitted (its rows by
        slot returned)."""
        policy, seen = self.policy, self.seen
        caught = not self.source_clock
        took: dict[tuple[EpochKey, int], list[int]] = {}
        keys, epochs, rounds, devices = batch.key.tolist(), batch.epoch.tolist(), batch.round.tolist(), batch.device
        for i in range(len(records)):
            rec = records[i]
            bad = batch.reasons[i]
            if bad is not None:
                step.letters.append((bad, rec))
                continue
            note = batch.notes.get(i)
            if note is not None:
                step.letters.append((Rejected("untrusted_note", f"a source note of epoch {note.epoch} on the device "
                                              f"topic (only {self.source_topic} carries them)"), rec))
                continue
            query_id, version = batch.keys[keys[i]]
            slot = (query_id, version, epochs[i], rounds[i])
            device = int(devices[i])
            digest = seen.digest(slot, device)  # the device goes no further than this
            why = self._one_per_device(slot, device, digest, rec.partition)
            query = queries[keys[i]]
            if why is None and not passes[i]:
                why = self._refuse(batch, i, query, int(clocks[i]))
                if why is not None and why.reason == "outside_open_window" and not caught:
                    caught = True  # the notes the replay wrote before this report may be unread: read them
                    self.catch_up(step)
                    clocks = self._clocks(parts, offsets)
                    passes = self._passing(batch, queries, clocks)
                    why = None if passes[i] else self._refuse(batch, i, query, int(clocks[i]))
            if why is None and query is not None:
                why = policy.reserve(slot[:3], slot[3], query)
            if why is not None:
                step.letters.append((why, rec))
                continue
            seen.add(slot, digest)
            step.digests.setdefault(slot, []).append(digest)
            step.slots.add(slot[:3])
            took.setdefault((slot[:3], slot[3]), []).append(i)
        return took

    def _clocks(self, parts: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Each record's :meth:`~.policy.ShufflePolicy.window_clock` (the clock where it lies)."""
        out = np.empty(parts.size, np.int64)
        for p in np.unique(parts).tolist():
            rows = parts == p
            out[rows] = self.policy.window_clock(p, offsets[rows])
        return out

    def _passing(self, batch: DeviceBatch, queries: list[Query | None], clocks: npt.NDArray[np.int64]
                 ) -> npt.NDArray[np.bool_]:
        """Which rows pass the policy's checks, as arrays per query version (station-valued and
        bitmap rows; pair rows go through the scalar check)."""
        out = np.zeros(batch.key.size, bool)
        for k, query in enumerate(queries):
            rows = np.flatnonzero(batch.key == k)
            values = rows[batch.value[rows] >= 0]
            if values.size:
                out[values] = self.policy.passing(query, batch.epoch[values], batch.round[values],
                                                  value=batch.value[values], clock=clocks[values])
            maps = rows[batch.width[rows] >= 0]
            if maps.size:
                out[maps] = self.policy.passing(query, batch.epoch[maps], batch.round[maps],
                                                bitmap_stations=batch.width[maps], clock=clocks[maps])
            prow = rows[batch.npairs[rows] >= 0]
            if prow.size and query is not None and query.per_station is not None:
                local = np.full(batch.key.size, -1, np.int64)
                local[prow] = np.arange(prow.size)
                owner = local[batch.pair_row]
                sel = owner >= 0
                fit = pairs_fit(query, batch.pair_station[sel], batch.pair_output[sel], owner[sel], prow.size)
                out[prow] = self.policy.passing(query, batch.epoch[prow], batch.round[prow], clock=clocks[prow],
                                                pairs_fit=fit)
        return out

    def _refuse(self, batch: DeviceBatch, i: int, query: Query | None, clock: int) -> Rejected | None:
        return self.policy.refuse(batch.report(i), query, clock)

    def _one_per_device(self, slot: Slot, device: int, digest: bytes, partition: int) -> Rejected | None:
        """Why an authenticated report is refused before its slot sees it: its device's report
        of this slot was taken already, or (several instances, each reading some partitions)
        it is not on its device's partition, where its other reports of the slot are."""
        if self.instances > 1 and partition != device % self.partitions:
            return Rejected("wrong_partition", f"a device report on partition {partition}, not its device's "
                                               f"(id mod {self.partitions})")
        if self.seen.took(slot, digest):
            return Rejected("duplicate_report", f"{slot[0]}:v{slot[1]} epoch {slot[2]} round {slot[3]} already took "
                                                "this device's report")
        return None


def _counts(batch: DeviceBatch, rows: list[int], query: Query) -> npt.NDArray[np.int64]:
    """The counts (the policy's round layout) of admitted rows of one (epoch, round)."""
    n_out = query.n_outputs
    if query.per_station is None:
        return np.bincount(batch.value[rows], minlength=n_out).astype(np.int64)
    out = np.zeros((query.n_stations + 1) * n_out, np.int64)
    at = np.asarray(rows, np.int64)
    maps = at[batch.width[at] >= 0]
    if maps.size:  # bitmap bit s - 1 is the pair (s, 1)
        out[np.arange(1, query.n_stations + 1) * n_out + 1] += batch.station_counts(maps)
    fast = at[batch.npairs[at] >= 0]
    if fast.size:  # the fast path's pair rows: their pairs picked from the batch's pair arrays at once
        mine = np.zeros(batch.key.size, bool)
        mine[fast] = True
        sel = mine[batch.pair_row]
        out += np.bincount(batch.pair_station[sel] * n_out + batch.pair_output[sel], minlength=out.size)
    pairs = [np.asarray(batch.pairs[i], np.int64).reshape(-1, 2)
             for i in at[(batch.width[at] < 0) & (batch.npairs[at] < 0)].tolist()]
    if pairs:
        flat = np.concatenate(pairs)
        out += np.bincount(flat[:, 0] * n_out + flat[:, 1], minlength=out.size)
    return out
