"""Stage 2's batch plan, pure: how a batch of stage records is grouped and what it publishes,
in which order. The Faust agent (:mod:`stream_app.worker.app`) reads, calls these, writes and emits.

* :func:`by_partition` -- a batch's records per stage-2 partition, bundles split, in order;
* :func:`epoch_outputs` -- what the closed and the withdrawn epochs of one partition's outcome
  publish, in order: one query's closed epochs estimated together (one ``(windows, stations)``
  stack), then the withdrawals; each closed window learns whether it was published;
* :func:`rollup_outputs` -- what the rollups (:mod:`stream_app.worker.rollups`) decided or withdrawn by
  one partition's epoch summaries publish, rendered as an epoch's results are;
* :func:`publish_chunks` -- those results rendered chunk by chunk (as rows, frames or both),
  each chunk worth at least ``limit`` estimate records (the last one the rest), so memory
  stays bounded and the broker's acknowledgement of a chunk is awaited before the next is
  rendered.

>>> list(by_partition([(0, b"a"), (1, b"b"), (0, b"c")], split=lambda raw: [raw]))
[(0, [(0, b'a'), (2, b'c')]), (1, [(1, b'b')])]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from schemas import Query
from schemas.epochs import EPOCH_S

from .estimate import EpochResult, QueryEstimators, ShuffledEpsilon, epoch_results, retraction, shuffle_needs
from .frames import encode_frame
from .records import WindowId
from .rollups import RollupId, RollupOutcome, rollup_result
from .windows import CloseReason, Outcome, WindowState

__all__ = ["OutputSettings", "by_partition", "epoch_outputs", "frame_key", "publish_chunks", "rollup_outputs",
           "shuffled_needs"]


def by_partition(records: Iterable[tuple[int, bytes]], split: Callable[[bytes], list[bytes]]
                 ) -> list[tuple[int, list[tuple[int, bytes]]]]:
    """``(partition, value)`` of a batch's events -> per partition (first seen first), the
    ``(event index, stage record)`` pairs in order. A value ``split`` cannot read (a malformed
    bundle) is kept whole: decoding it fails later and it is dead-lettered."""
    out: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for index, (partition, value) in enumerate(records):
        try:
            parts = split(value)
        except ValueError:
            parts = [value]
        out[partition] += [(index, raw) for raw in parts]
    return list(out.items())


@dataclass(frozen=True)
class OutputSettings:
    """What estimates depend on besides the windows."""

    confidences: tuple[float, ...]
    min_participants: int
    n_source_partitions: int
    shuffled: ShuffledEpsilon | None = None  # the shuffled epsilon's cache (None: not computed)


def epoch_outputs(outcome: Outcome, known: Callable[[str, int], Query | None],
                  estimators: Callable[[Query], QueryEstimators], out: OutputSettings) -> Iterator[EpochResult]:
    """The results one partition's outcome publishes, in order (closed epochs grouped by query,
    then withdrawals); windows of a query no longer known are skipped. Sets each closed
    window's ``published``, which its stored state keeps."""
    by_query: dict[tuple[str, int], list[tuple[WindowState, CloseReason]]] = defaultdict(list)
    for st, reason in outcome.closed:
        by_query[(st.wid.query_id, st.wid.query_version)].append((st, reason))
    for (query_id, version), closed in by_query.items():
        q = known(query_id, version)
        if q is None:
            continue
        results = epoch_results(estimators(q), closed, out.confidences, out.min_participants, out.n_source_partitions,
                                out.shuffled)
        for (st, _), res in zip(closed, results, strict=True):
            st.published = res.withheld is None
            yield res
    for st in outcome.retracted:
        q = known(st.wid.query_id, st.wid.query_version)
        if q is not None:
            st.published = False
            yield retraction(q, st, out.confidences)


def rollup_outputs(outcome: RollupOutcome, known: Callable[[str, int], Query | None],
                   estimators: Callable[[Query], QueryEstimators], out: OutputSettings) -> Iterator[EpochResult]:
    """The rollups one partition's rollup outcome publishes (decided, then withdrawn), as
    results rendered like an epoch's; rollups of a query no longer known are skipped."""
    for st in [*outcome.decided, *outcome.retracted]:
        q = known(st.rid.query_id, st.rid.query_version)
        if q is not None:
            yield rollup_result(estimators(q), st, out.confidences)


def shuffled_needs(outcome: Outcome, known: Callable[[str, int], Query | None],
                   out: OutputSettings) -> list[tuple[Query, int, str]]:
    """The shuffled epsilons the outcome's closed epochs need that the cache lacks: the caller
    computes them (:meth:`ShuffledEpsilon.warm`) off the event loop before :func:`epoch_outputs`."""
    if out.shuffled is None:
        return []
    need: list[tuple[Query, int, str]] = []
    for st, _ in outcome.closed:
        q = known(st.wid.query_id, st.wid.query_version)
        if q is not None:
            need += shuffle_needs(q, [st], out.n_source_partitions, out.shuffled)
    return need


def frame_key(res: EpochResult) -> bytes:
    """An estimate frame's key: its window's, or its rollup's (a restart re-publishes the same key)."""
    q = res.query
    if res.span_s == q.span_s:  # an epoch's, or a span query's span
        return WindowId(q.query_id, q.version, res.epoch).key
    return RollupId(q.query_id, q.version, res.span_s // EPOCH_S, res.epoch).key


def publish_chunks(results: Iterable[EpochResult], limit: int, rows: bool = True, frames: bool = False
                   ) -> Iterator[tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]], list[EpochResult]]]:
    """``(rows, frames, results)`` chunks of results worth at least ``limit`` estimate records
    (the last: what is left, possibly nothing -- it is always yielded, so a caller acknowledges
    at the end). ``rows``: each result's per-row records (keyed by station); ``frames``: its
    one estimate frame (:mod:`stream_app.worker.frames`, keyed by the window)."""
    row_records: list[tuple[bytes, bytes]] = []
    frame_records: list[tuple[bytes, bytes]] = []
    done: list[EpochResult] = []
    size = 0
    for res in results:
        if rows:
            row_records += res.render()
        if frames:
            frame_records.append((frame_key(res), encode_frame(res)))
        done.append(res)
        size += res.n_records()
        if size >= limit:
            yield row_records, frame_records, done
            row_records, frame_records, done, size = [], [], [], 0
    yield row_records, frame_records, done
