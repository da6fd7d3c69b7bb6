"""Epoch windows as plain data: accumulate, deduplicate, decide when an epoch is complete.

Pure Python on JSON-serializable dicts, so the Faust tables can store them as they are and
the tests need no broker. Per-partition partial counts simply add (the STYLE reference's
accumulator: merge is addition), which is what lets one or many workers, and a restart,
give the same numbers.

A window is keyed by ``(query id, version, epoch)`` and holds the count arrays of every
round of that epoch. It closes when

1. end-of-epoch markers from every producer have arrived from every source partition for
   every round ("markers"), or
2. the event-time watermark -- the smallest, over source partitions, of the newest epoch
   seen from it -- has passed the epoch by more than the allowed lateness ("watermark"), or
3. for live data, a wall-clock grace after the epoch's end has passed ("wall_clock"),

whichever comes first. After closing, only a small record stays (to count late records).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "Partial",
    "Window",
    "WindowKey",
    "Watermarks",
    "window_key",
]

WindowKey = str
CloseReason = Literal["markers", "watermark", "wall_clock"]


def window_key(query_id: str, version: int, epoch: int) -> WindowKey:
    return f"{query_id}:v{version}:e{epoch}"


@dataclass
class Partial:
    """Stage 1 -> stage 2: one decoded batch (``kind="batch"``), an end-of-epoch marker
    (``kind="marker"``) or a wall-clock tick (``kind="tick"``), with its source partition."""

    kind: Literal["batch", "marker", "tick"]
    query_id: str = ""
    query_version: int = 0
    epoch: int = 0
    round: int = 0
    source_partition: int = 0
    producer_id: str = ""
    batch_id: str = ""
    reports: int = 0
    mode: Literal["sparse", "full"] = "full"  # sparse: default reports implied (per-vehicle pairs)
    counts: list[int] = field(default_factory=list)
    producer_index: int = 0
    producer_count: int = 1
    batches: int = 0
    participants: int = 0
    refused: int = 0
    interrupted: bool = False
    now_s: float = 0.0

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Partial:
        return cls(**json.loads(data))

    @property
    def key(self) -> WindowKey:
        return window_key(self.query_id, self.query_version, self.epoch)


@dataclass
class Window:
    """The state of one (query, version, epoch). ``counts[r]`` adds every batch of round r;
    ``sparse[r]`` the per-vehicle pairs among them (their default report is implied)."""

    query_id: str
    query_version: int
    epoch: int
    n_rounds: int
    width: int
    counts: list[list[int]] = field(default_factory=list)
    sparse: list[list[int]] = field(default_factory=list)
    reports: list[int] = field(default_factory=list)
    full_vehicles: list[int] = field(default_factory=list)
    seen: dict[str, list[Any]] = field(default_factory=dict)  # batch id -> [round, producer, partition]
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)  # "r:k:p" -> marker fields
    closed_by: CloseReason | None = None
    late: int = 0
    duplicates: int = 0
    conflicts: int = 0

    @classmethod
    def new(cls, query_id: str, version: int, epoch: int, n_rounds: int, width: int) -> Window:
        return cls(query_id, version, epoch, n_rounds, width,
                   counts=[[0] * width for _ in range(n_rounds)], sparse=[[0] * width for _ in range(n_rounds)],
                   reports=[0] * n_rounds, full_vehicles=[0] * n_rounds)

    # -- serialization ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        if self.closed_by is not None:  # a closed window keeps only what late records need
            return {"query_id": self.query_id, "query_version": self.query_version, "epoch": self.epoch,
                    "n_rounds": self.n_rounds, "width": self.width, "closed_by": self.closed_by,
                    "late": self.late, "duplicates": self.duplicates}
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Window:
        return cls(**d)

    @property
    def closed(self) -> bool:
        return self.closed_by is not None

    # -- accumulate ---------------------------------------------------------------------
    def add(self, p: Partial) -> Literal["added", "duplicate", "late"]:
        """Add a batch or a marker; duplicates (same batch id / same marker) count once."""
        if self.closed:
            self.late += 1
            return "late"
        if p.kind == "batch":
            if p.batch_id in self.seen:
                self.duplicates += 1
                return "duplicate"
            if len(p.counts) != self.width or not 0 <= p.round < self.n_rounds:
                raise ValueError(f"batch of width {len(p.counts)} round {p.round} for a window of width "
                                 f"{self.width} with {self.n_rounds} rounds")
            self.seen[p.batch_id] = [p.round, p.producer_id, p.source_partition]
            row = self.counts[p.round]
            for i, c in enumerate(p.counts):
                if c:
                    row[i] += c
            if p.mode == "sparse":
                srow = self.sparse[p.round]
                for i, c in enumerate(p.counts):
                    if c:
                        srow[i] += c
            else:
                self.full_vehicles[p.round] += p.reports
            self.reports[p.round] += p.reports
            return "added"
        if p.kind == "marker":
            mkey = f"{p.round}:{p.producer_index}:{p.source_partition}"
            held = self.markers.get(mkey)
            if held is not None:
                if held["producer_id"] == p.producer_id:
                    self.duplicates += 1
                    return "duplicate"
                # Two producer runs claim the same slot (e.g. a producer restarted with a new
                # id). Keep one by a rule that does not depend on arrival order.
                self.conflicts += 1
                if held["producer_id"] < p.producer_id:
                    return "duplicate"
            self.markers[mkey] = {"producer_id": p.producer_id, "producer_count": p.producer_count,
                                  "batches": p.batches, "reports": p.reports, "participants": p.participants,
                                  "refused": p.refused, "interrupted": p.interrupted}
            return "added"
        raise ValueError(f"cannot add a {p.kind} to a window")

    # -- decide ---------------------------------------------------------------------------
    def producer_count(self) -> int | None:
        counts = {m["producer_count"] for m in self.markers.values()}
        return max(counts) if counts else None

    def markers_complete(self, n_partitions: int) -> bool:
        k = self.producer_count()
        if k is None:
            return False
        need = {f"{r}:{i}:{p}" for r in range(self.n_rounds) for i in range(k) for p in range(n_partitions)}
        return need <= set(self.markers)

    def participants(self) -> tuple[int | None, list[int]]:
        """(vehicles that answered, producer indices without a marker) from round 0's markers."""
        k = self.producer_count()
        per_producer: dict[int, int] = {}
        for mkey, m in self.markers.items():
            r, i, _ = (int(x) for x in mkey.split(":"))
            if r == 0:
                per_producer[i] = m["participants"]
        missing = [i for i in range(k or 0) if i not in per_producer]
        return (sum(per_producer.values()) if per_producer else None), missing

    def interrupted(self) -> bool:
        """A producer stopped in the middle of this epoch (its markers say so)."""
        return any(m["interrupted"] for m in self.markers.values())

    def refused(self) -> int:
        per_producer = {int(k.split(":")[1]): m["refused"] for k, m in self.markers.items() if k.startswith("0:")}
        return sum(per_producer.values())

    def missing_batches(self) -> int:
        """Batches the markers announce per (producer, partition, round) but that never came."""
        seen: dict[tuple[int, str, int], int] = {}
        for r, producer, partition in self.seen.values():
            seen[(r, producer, partition)] = seen.get((r, producer, partition), 0) + 1
        missing = 0
        for mkey, m in self.markers.items():
            r, _, p = (int(x) for x in mkey.split(":"))
            missing += max(0, m["batches"] - seen.get((r, m["producer_id"], p), 0))
        return missing

    def close(self, reason: CloseReason) -> None:
        self.closed_by = reason


@dataclass
class Watermarks:
    """Per stage-2 partition: the newest epoch seen from each source partition, and the
    windows still open here."""

    newest: dict[str, int] = field(default_factory=dict)  # source partition (str for JSON) -> epoch
    open: list[WindowKey] = field(default_factory=list)
    open_epochs: dict[WindowKey, int] = field(default_factory=dict)

    def see(self, source_partition: int, epoch: int) -> None:
        k = str(source_partition)
        if epoch > self.newest.get(k, -1):
            self.newest[k] = epoch

    def watermark(self, n_partitions: int) -> int | None:
        """The smallest newest-epoch over all source partitions (None until all were seen)."""
        if any(str(p) not in self.newest for p in range(n_partitions)):
            return None
        return min(self.newest[str(p)] for p in range(n_partitions))

    def track(self, key: WindowKey, epoch: int) -> None:
        if key not in self.open_epochs:
            self.open.append(key)
            self.open_epochs[key] = epoch

    def untrack(self, key: WindowKey) -> None:
        if key in self.open_epochs:
            self.open.remove(key)
            del self.open_epochs[key]

    def too_old(self, epoch: int, n_partitions: int, lateness: int) -> bool:
        """An epoch the watermark passed before any of its data arrived here: a new window for
        it would close at once on one straggler, so its records are late instead."""
        wm = self.watermark(n_partitions)
        return wm is not None and epoch < wm - lateness

    def due(self, n_partitions: int, lateness: int) -> list[WindowKey]:
        """Open windows the watermark has passed by more than ``lateness`` epochs."""
        wm = self.watermark(n_partitions)
        if wm is None:
            return []
        return [k for k in self.open if self.open_epochs[k] < wm - lateness]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Watermarks:
        return cls(**d) if d else cls()
