"""Stage 1's gap finder: the epochs nobody wrote anything for. Pure; the app calls it per record.

On the direct path a window opens only when a record of its ``(query, version, epoch)``
arrives. If every producer is down for some epochs -- a replay restarted later, live devices
offline for minutes -- while later epochs do arrive, those epochs would have no window and so
no row at all: a subscriber could not tell the gap from a lost delivery. :class:`GapFinder`
keeps, per (source partition, query, version), the newest epoch stage 1 forwarded; a record
that jumps ahead by more than one epoch also yields a :class:`~stream_app.worker.records.Gap` for
each epoch skipped. A gap only *opens* its window (stage 2, :mod:`stream_app.worker.windows`); the
window then closes like any other and, with nothing in it, is withheld ``no_reports``.

Bounded: only epochs inside the query's ``[start, end)`` and at most ``horizon_epochs`` before
the record (stage 2 refuses what lies further ahead of the epoch a quorum of partitions
reached anyway, and ignores a gap whose record lies beyond it); the newest epoch per key only
grows, so each (partition, query version, epoch) yields a gap at most once per worker run, and
the memory is one integer per (partition, query version). A forged record far ahead makes gaps
for epochs whose genuine data is still to come: harmless, because a gap's window that later
receives data is opened afresh (:meth:`stream_app.worker.windows.WindowPolicy.apply`) and its earlier
``no_reports`` superseded.

A span query (``schemas.Query.span_s``) has one window per span, at the span's first epoch:
only the span starts a record skipped are gaps, never the epochs inside a span.

What it cannot see: the memory is the worker's own. A gap that spans a worker restart, or a
rebalance that moved the source partition to a worker that had not read it, is not found:
those epochs stay without a row, as before.

>>> from datetime import UTC, datetime, timedelta
>>> from schemas import Query
>>> t0 = datetime(2026, 11, 18, 16, tzinfo=UTC)
>>> q = Query(query_id="q", analyst_id="a", version=1, sensors=(1,), mechanism="rr", population=9,
...           t_start=t0, t_end=t0 + timedelta(minutes=5))
>>> start, end = q.epoch_range()
>>> finder = GapFinder(horizon_epochs=720)
>>> finder.gaps(0, [("q", 1, start + 1)], lambda qid, v: q)  # the first record: nothing known before
[]
>>> [g.epoch - start for g in finder.gaps(0, [("q", 1, start + 4)], lambda qid, v: q)]
[2, 3]
>>> finder.gaps(1, [("q", 1, start + 4)], lambda qid, v: q)  # another partition: its own memory
[]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from schemas import Query

from .records import Gap

__all__ = ["GapFinder"]

Lookup = Callable[[str, int], Query | None]


class GapFinder:
    """Per (source partition, query id, version): the newest epoch forwarded; :meth:`gaps` says
    which epochs a record skipped."""

    def __init__(self, horizon_epochs: int) -> None:
        if horizon_epochs < 1:
            raise ValueError(f"horizon_epochs {horizon_epochs} must be at least 1")
        self.horizon_epochs = horizon_epochs
        self._newest: dict[tuple[int, str, int], int] = {}

    def gaps(self, partition: int, windows: Iterable[tuple[str, int, int]], lookup: Lookup) -> list[Gap]:
        """The gaps that the ``(query id, version, epoch)`` of the stage records one source record
        of ``partition`` became reveal (each an epoch skipped since the newest forwarded before)."""
        out: list[Gap] = []
        for query_id, version, epoch in windows:
            key = (partition, query_id, version)
            prev = self._newest.get(key)
            if prev is not None and epoch <= prev:
                continue
            self._newest[key] = epoch
            if prev is None or epoch == prev + 1:
                continue
            q = lookup(query_id, version)
            if q is None:  # stage 1 knew it a moment ago; without its window no gap can be bounded
                continue
            step = q.epochs_per_span  # a span query's windows are its spans' first epochs
            start, end = q.epoch_range()
            lo, hi = max(prev + 1, epoch - self.horizon_epochs, start), min(epoch, end)
            first = -(-lo // step) * step  # the first span start at or after lo (spans align on the clock)
            out += [Gap(query_id, version, e, partition, epoch) for e in range(first, hi, step)]
        return out
