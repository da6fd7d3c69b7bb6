"""Stage 1 logic: one record of the reports topic -> partial counts for stage 2, or the
reason it goes to the dead-letter topic. No Faust here; the app calls it per record."""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas import DecodedBatch, EndOfEpoch, GroundTruth, Query, SingleReport, WireError, decode_record
from schemas.estimates import DeadLetter

from .windows import Partial

__all__ = ["REASONS", "Rejected", "to_partials"]

# every reason a record can be dead-lettered for (schemas.WireError reasons, then stage 1's)
REASONS = ("empty", "bad_encoding", "truncated", "bad_header", "size_mismatch", "bad_layout", "out_of_range",
           "bad_json_record", "unknown_query", "outside_query_window", "bad_round", "mismatched_sizes",
           "wrong_layout", "bad_marker", "unexpected_record", "internal_error")

QueryLookup = Callable[[str, int], Query | None]


@dataclass(frozen=True)
class Rejected:
    reason: str
    detail: str

    def letter(self, topic: str, partition: int, offset: int, value: bytes | None) -> DeadLetter:
        raw = value or b""
        return DeadLetter(reason=self.reason, detail=self.detail[:2000], topic=topic, partition=partition,
                          offset=offset, value_b64=base64.b64encode(raw[:4096]).decode(), value_bytes=len(raw))


def _check_query(lookup: QueryLookup, query_id: str, version: int, epoch: int, rnd: int) -> Query | Rejected:
    q = lookup(query_id, version)
    if q is None:
        return Rejected("unknown_query", f"no query {query_id!r} version {version}")
    length = q.epoch_length_s
    start = int(q.t_start.timestamp()) // length
    end = -(-int(q.t_end.timestamp()) // length)
    if not start <= epoch < end:
        return Rejected("outside_query_window", f"epoch {epoch} outside {q.record_key}'s [{start}, {end})")
    if rnd >= q.n_rounds:
        return Rejected("bad_round", f"round {rnd} but {q.mechanism} has {q.n_rounds} round(s)")
    return q


def _batch(b: DecodedBatch, q: Query, partition: int) -> Partial | Rejected:
    h = b.header
    n_out = q.build().n_outputs
    if h.n_stations != q.n_stations or h.n_outputs != n_out:
        return Rejected("mismatched_sizes", f"batch for {h.n_stations} stations x {h.n_outputs} outputs, "
                                            f"query has {q.n_stations} x {n_out}")
    v = q.n_stations
    common: dict[str, Any] = {
        "query_id": h.query_id, "query_version": h.query_version, "epoch": h.epoch, "round": h.round,
        "source_partition": partition, "producer_id": h.producer_id, "batch_id": h.batch_id}
    if q.mechanism == "sp":
        if h.layout == "values":
            counts = np.bincount(b.arrays["value"], minlength=v + 1)
            return Partial("batch", reports=h.reports, mode="full", counts=counts.tolist(), **common)
        if h.layout == "counts" and b.arrays["counts"].size == v + 1:
            if int(b.arrays["counts"].sum()) != h.reports:
                return Rejected("mismatched_sizes", f"tally counts must sum to the {h.reports} vehicles")
            return Partial("batch", reports=h.reports, mode="full", counts=b.arrays["counts"].tolist(), **common)
        return Rejected("wrong_layout", f"{h.layout} ({b.arrays[next(iter(b.arrays))].size}) for a Sampling "
                                        f"Privacy query over {v} stations")
    default = _default_report(q)
    if h.layout == "pairs":
        if np.any(b.arrays["output"] == default):
            return Rejected("out_of_range", f"pairs carry only non-default reports; {default} is the default")
        flat = (b.arrays["station"] - 1) * n_out + b.arrays["output"]
        counts = np.bincount(flat, minlength=v * n_out)
        return Partial("batch", reports=h.reports, mode="sparse", counts=counts.tolist(), **common)
    if h.layout == "counts" and b.arrays["counts"].size == v * n_out:
        c = b.arrays["counts"].reshape(v, n_out)
        if np.any(c.sum(axis=1) != h.reports):
            return Rejected("mismatched_sizes", f"tally rows must each sum to the {h.reports} vehicles")
        return Partial("batch", reports=h.reports, mode="full", counts=b.arrays["counts"].tolist(), **common)
    return Rejected("wrong_layout", f"{h.layout} for a per-sensor {q.mechanism} query over {v} stations")


def _single(r: SingleReport, q: Query, partition: int) -> Partial | Rejected:
    v = q.n_stations
    n_out = q.build().n_outputs
    common: dict[str, Any] = {
        "query_id": r.query_id, "query_version": r.query_version, "epoch": r.epoch, "round": r.round,
        "source_partition": partition, "producer_id": "device", "batch_id": r.batch_id}
    if q.mechanism == "sp":
        if r.value is None or r.value > v:
            return Rejected("out_of_range", f"a Sampling Privacy report needs a value in 0..{v}")
        counts = [0] * (v + 1)
        counts[r.value] = 1
        return Partial("batch", reports=1, mode="full", counts=counts, **common)
    default = _default_report(q)
    if r.pairs is None or any(s > v or o >= n_out or o == default for s, o in r.pairs):
        return Rejected("out_of_range", f"a {q.mechanism} report needs pairs with station 1..{v} and a "
                                        f"non-default report < {n_out} (default {default})")
    if len({s for s, _ in r.pairs}) != len(r.pairs):
        return Rejected("out_of_range", "a station appears twice in one report")
    counts = [0] * (v * n_out)
    for s, o in r.pairs:
        counts[(s - 1) * n_out + o] += 1
    return Partial("batch", reports=len(r.pairs), mode="sparse", counts=counts, **common)


def _default_report(q: Query) -> int:
    d = q.default_report
    return -1 if d is None else d


def to_partials(value: bytes | None, partition: int, lookup: QueryLookup) -> Partial | Rejected:
    """What stage 1 forwards for one record of the reports topic, or why it cannot."""
    try:
        item = decode_record(value)
    except WireError as exc:
        return Rejected(exc.reason, exc.detail)
    if isinstance(item, GroundTruth):
        return Rejected("unexpected_record", "ground truth belongs on the truth topic")
    if isinstance(item, DecodedBatch):
        h = item.header
        q = _check_query(lookup, h.query_id, h.query_version, h.epoch, h.round)
        return q if isinstance(q, Rejected) else _batch(item, q, partition)
    if isinstance(item, EndOfEpoch):
        q = _check_query(lookup, item.query_id, item.query_version, item.epoch, item.round)
        if isinstance(q, Rejected):
            return q
        if item.producer_index >= item.producer_count:
            return Rejected("bad_marker", f"producer index {item.producer_index} of {item.producer_count}")
        if item.partition != partition:
            return Rejected("bad_marker", f"marker for partition {item.partition} arrived on {partition}")
        return Partial("marker", query_id=item.query_id, query_version=item.query_version, epoch=item.epoch,
                       round=item.round, source_partition=partition, producer_id=item.producer_id,
                       reports=item.reports_to_partition, producer_index=item.producer_index,
                       producer_count=item.producer_count, batches=item.batches_to_partition,
                       participants=item.participants, refused=item.refused, interrupted=item.interrupted)
    q = _check_query(lookup, item.query_id, item.query_version, item.epoch, item.round)
    return q if isinstance(q, Rejected) else _single(item, q, partition)
