"""What the shuffler writes to the reports topic for a decided epoch, as plain records (pure; the
runtime sends them inside its step's transaction): a released epoch's batches -- one exact tally
per round (``aggregate``) or the permuted reports in columnar batches (``permuted``) -- and its
markers; a withheld epoch's markers, which attest nothing (0 reports, batches, participants, no
shuffle size) and name the reason, so the worker withholds the epoch with it instead of leaving
it absent (docs/wire.md, "The shuffler")."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kafka.partitioner.default import murmur2

from schemas import EndOfEpoch, EndOfEpochSet, Query, encode_batch, encode_json
from schemas.epochs import EPOCH_S
from schemas.wire import SHUFFLER_WITHHELD

from .policy import Released, Withheld
from .settings import ShufflerSettings

__all__ = ["KIND_HEADER", "Outgoing", "batch_id", "release_records", "withheld_records"]

KIND_HEADER = "ptt-kind"


@dataclass(frozen=True)
class Outgoing:
    """One record for the reports topic."""

    key: bytes
    value: bytes
    partition: int
    timestamp_ms: int
    kind: str  # the ``ptt-kind`` header, the record's only one


def batch_id(salt: str, release: str, q: Query, epoch: int, rnd: int, index: int) -> str:
    """A released batch's id: from the instance's secret salt and the slot, so a release repeated
    after a crash has the same ids. An aggregate's id differs from every permuted batch's: a
    release an aborted transaction left visible under the other ``--release`` is never taken for
    this one (the worker counts an id once)."""
    kind = "\x1faggregate" if release == "aggregate" else ""
    text = f"{salt}\x1f{q.query_id}\x1f{q.version}\x1f{epoch}\x1f{rnd}\x1f{index}{kind}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def release_records(s: ShufflerSettings, out_parts: Sequence[int], salt: str, out: Released) -> list[Outgoing]:
    """A released epoch: its batches (a batch goes where its id hashes), then one marker set per
    reports partition. Every record carries the epoch's end as its timestamp."""
    q = out.query
    stamp = (out.epoch + 1) * EPOCH_S * 1000
    aggregate = s.release == "aggregate"  # one exact tally per round, else reports batches
    base = {"query_id": q.query_id, "query_version": q.version, "epoch": out.epoch,
            "producer_id": s.transactional_id, "n_stations": q.n_stations, "n_outputs": q.n_outputs}
    records: list[Outgoing] = []
    per_round: list[dict[int, list[int]]] = []
    for r, rnd in enumerate(out.rounds):
        per_part = {part: [0, 0] for part in out_parts}
        # an aggregate's counts: one record (none for an interrupted epoch's empty round)
        chunks = [c for c in rnd.data.chunks(s.batch_size) if c.n_reports]
        for i, chunk in enumerate(chunks):
            n = chunk.n_reports
            bid = batch_id(salt, s.release, q, out.epoch, r, i)
            key = bid.encode()
            part = out_parts[(murmur2(key) & 0x7FFFFFFF) % len(out_parts)]
            value = encode_batch({**base, "kind": chunk.kind, "layout": chunk.layout, "round": r, "batch_id": bid,
                                  "reports": n}, chunk.arrays())
            records.append(Outgoing(key, value, part, stamp, chunk.kind))
            per_part[part][0] += n
            per_part[part][1] += 1
        per_round.append(per_part)
    missing = tuple(i + 1 for i, station in enumerate(q.sensors) if station in out.no_data)
    for part in out_parts:
        markers = tuple(EndOfEpoch(
            producer_id=s.transactional_id, producer_index=s.instance_index, producer_count=s.instance_count,
            query_id=q.query_id, query_version=q.version, epoch=out.epoch, round=r, partition=part,
            reports_to_partition=per_round[r][part][0], batches_to_partition=per_round[r][part][1],
            reports_total=rnd.reports, batches_total=sum(b for _, b in per_round[r].values()),
            participants=rnd.devices, refused=0, mode="tally" if aggregate else "per-vehicle",
            interrupted=out.interrupted, readings_missing=missing,
            # the attestation: this round's device reports were mixed together, as one shuffle, and
            # released as that (permuted, or only counted)
            shuffle_size=rnd.devices or None, release=s.release) for r, rnd in enumerate(out.rounds))
        records.append(_marker_set(s, part, stamp, markers))
    return records


def withheld_records(s: ShufflerSettings, out_parts: Sequence[int], out: Withheld) -> list[Outgoing]:
    """A withheld epoch: one marker set per reports partition, every round attesting 0 reports,
    batches and participants, no shuffle size, and the reason (``no_reports``,
    ``below_min_crowd``, ``notes_refused`` or ``release_mismatch``). How many reports the small
    crowd held is not said (the dead letter, for the operator, says it); nothing else of the epoch
    leaves the shuffler.

    >>> from datetime import datetime, timezone
    >>> t0 = datetime(2026, 11, 18, tzinfo=timezone.utc)
    >>> q = Query(query_id="q", analyst_id="a", version=1, mechanism="sp", sensors=(1, 2), population=10,
    ...           t_start=t0, t_end=t0.replace(day=19))
    >>> s = ShufflerSettings(shuffler_id="shuf", device_topic="d", reports_topic="r", partitions=2)
    >>> recs = withheld_records(s, [0, 1], Withheld(q, 9, "below_min_crowd", (3, 2)))
    >>> [(r.partition, r.kind, r.timestamp_ms) for r in recs]
    [(0, 'end_of_epoch', 300000), (1, 'end_of_epoch', 300000)]
    >>> m = EndOfEpochSet.model_validate_json(recs[0].value).markers
    >>> [(x.round, x.participants, x.reports_total, x.shuffle_size, x.withheld) for x in m]
    [(0, 0, 0, None, 'below_min_crowd'), (1, 0, 0, None, 'below_min_crowd')]
    """
    q = out.query
    stamp = (out.epoch + 1) * EPOCH_S * 1000
    if out.reason not in SHUFFLER_WITHHELD:
        raise ValueError(f"withheld for {out.reason!r}, a reason the wire does not know ({SHUFFLER_WITHHELD})")
    reason = out.reason
    return [_marker_set(s, part, stamp, tuple(EndOfEpoch(
        producer_id=s.transactional_id, producer_index=s.instance_index, producer_count=s.instance_count,
        query_id=q.query_id, query_version=q.version, epoch=out.epoch, round=r, partition=part,
        reports_to_partition=0, batches_to_partition=0, reports_total=0, batches_total=0, participants=0,
        refused=0, mode="tally" if s.release == "aggregate" else "per-vehicle", withheld=reason)
        for r in range(len(out.devices)))) for part in out_parts]


def _marker_set(s: ShufflerSettings, part: int, stamp: int, markers: tuple[EndOfEpoch, ...]) -> Outgoing:
    return Outgoing(f"eoe-{s.transactional_id}".encode(), encode_json(EndOfEpochSet(markers=markers)), part, stamp,
                    "end_of_epoch")
