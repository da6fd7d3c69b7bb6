"""A fix for Faust's end of recovery, which drops fetched records after a restart.

faust-streaming 0.15.3 (issue #596, still open upstream) ends a recovery in
``Recovery.on_recovery_completed`` in this order:

1. it resumes the stream partitions (reports, partials) while its fetcher is already
   running (the fetcher starts early, to read the changelog, and flow control was resumed
   then too);
2. it seeks them to their committed offsets, one OffsetFetch round trip per partition;
3. it calls ``flow_control.resume()`` again, and that clears every channel queue.

Records the fetcher delivers between 1 and 3 are cleared from the queues, although Faust's
read offset and aiokafka's position have already passed them. Nothing fetches them again
until the next restart, and the partition's commit stays stuck behind the gap. A restarted
worker on a loaded machine then sat idle with its input waiting: ``/debug/tasks`` showed
``reports[2] read 61 committed 40 highwater 62`` with both agents idle. The restart test
(tests/integration/test_adversarial.py) failed about 1 run in 15 under load this way.

The fix keeps upstream's steps and order, but resumes flow control at the end only if it is
suspended. It is not: recovery resumed it before reading the changelog, and a rebalance that
suspends it also clears the queues itself. So the queues are no longer cleared under
records just fetched. What the fetcher delivered before the seek is processed, and the seek
then delivers it again from the committed offset. Stage records are deduplicated by batch
id and re-published estimates are identical, so a re-delivery is harmless (docs/operations.md).

(Seeking while the stream partitions are still paused, and resuming them after the clear,
was tried first: restarted workers then never fetched their input at all, 2 restart tests
in 3.)

:func:`install` applies it once per process, before any recovery runs, and refuses a Faust
whose ``on_recovery_completed`` is not the one this was written against.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from typing import Any

from faust.tables.recovery import Recovery

__all__ = ["UPSTREAM_SHA256", "install", "upstream_source_digest"]

# sha256 (first 16 hex digits) of faust-streaming 0.15.3's Recovery.on_recovery_completed
UPSTREAM_SHA256 = "6ef567acf072e46d"
_UPSTREAM = Recovery.on_recovery_completed


def upstream_source_digest() -> str:
    """The digest of the installed Faust's own ``on_recovery_completed``."""
    return hashlib.sha256(inspect.getsource(_UPSTREAM).encode()).hexdigest()[:16]


async def on_recovery_completed(self: Any, generation_id: int = 0) -> None:
    """Upstream's ``Recovery.on_recovery_completed``, without clearing the queues under
    records just fetched (module doc)."""
    consumer = self.app.consumer
    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    pending = [asyncio.ensure_future(table.on_recovery_completed(self.actives_for_table[table],
                                                                 self.standbys_for_table[table]))
               for table in self.tables.values()]
    if pending:
        await asyncio.wait(pending)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning("Recovery rebalancing again app id %r param %r", self.app.consumer_generation_id,
                         generation_id)
        return
    consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
    if assignment:
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
        await _seek_uncommitted_to_beginning(self, consumer, assignment)
    self.completed.set()
    if not self.app.flow_control.is_active():  # resume() clears the queues: never under fetched records
        self.app.flow_control.resume()
    consumer.resume_flow()
    await self.app._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")


async def _seek_uncommitted_to_beginning(recovery: Any, consumer: Any, assignment: set[Any]) -> None:
    """The stream partitions without a committed offset go back to their first offset.

    ``perform_seek`` re-delivers what a partition's committed offset covers, but aiokafka
    does not seek a partition without one. Records fetched for such a partition before the
    stream was flowing were handed over and dropped, with aiokafka's position already past
    them: nothing fetched them again. ``/debug/tasks`` showed ``reports[0] read None committed
    None highwater 1 (aiokafka position 1)`` on a restarted worker whose epoch never closed
    (tests/integration/test_crash.py, about 1 run in 4 under load). Without a committed
    offset the consumer starts from the earliest record anyway (``auto_offset_reset``), so
    this changes no position a record was not already dropped from; re-delivered records
    are deduplicated (docs/operations.md)."""
    from faust.transport.drivers.aiokafka import ensure_aiokafka_TP

    fresh = sorted(tp for tp in assignment
                   if not recovery._is_changelog_tp(tp) and consumer._committed_offset.get(tp) is None)
    if fresh:
        recovery.log.info("Seek %d stream partition(s) without a committed offset to their beginning.", len(fresh))
        await recovery._wait(consumer._thread.seek_to_beginning(*map(ensure_aiokafka_TP, fresh)),
                             timeout=recovery.app.conf.broker_request_timeout)


def install() -> None:
    """Replace Faust's ``on_recovery_completed`` with :func:`on_recovery_completed`.

    :class:`RuntimeError` if the installed Faust's own version of it is not the one this
    fix was written against: re-read faust/tables/recovery.py, then update the digest."""
    if Recovery.on_recovery_completed is on_recovery_completed:
        return
    if upstream_source_digest() != UPSTREAM_SHA256:
        raise RuntimeError("faust's Recovery.on_recovery_completed changed: re-check "
                           "stream_app/worker/faust_recovery.py against faust/tables/recovery.py, then update "
                           "UPSTREAM_SHA256")
    Recovery.on_recovery_completed = on_recovery_completed  # type: ignore[method-assign]
