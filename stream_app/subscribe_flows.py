"""The order and the labels of ``ptt subscribe --flows`` (the rows' format is
:func:`stream_app.subscribe.format_flow`).

**Flows first.** The span queries' flows are the figures a reader wants (an hourly span query
is planned for its hour); the 5-minute and hourly rollups of a 30-s query sum epochs that are
noise one by one. So the view leads with the span queries' flows: :class:`FlowOrder` prints a
span query's group (its rows of one span) as soon as it is complete, and holds a rollup's group
until every shown span query's span holding the rollup's last epoch has been printed -- at
most one span (an hour) behind. What is released together is printed in one order
(:func:`stream_app.report.flows.flow_rank`): per hour, the span queries' flows, longest span
first, then the rollups, longest first. At the end of the stream (``--idle-timeout``) what is
still held is printed; a Ctrl-C drops it. Without a span query nothing is held.

**Labels.** Each group is preceded by a line (:func:`group_label`) saying what it is -- a span
query's flows, or a rollup of a 30-s query with the number of epochs it sums (a device in all of
them spends that many reports) -- and what it is good for, from its rows
(:func:`stream_app.report.flows.good_for`: a flow whose sd is at least half of it is
noise-dominated, the one rule of the report's plots, :func:`stream_app.report.summary.noise_dominated`,
with the estimate standing for the flow a subscriber has no truth of). Such a row says
``NOISE-DOMINATED`` itself.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from schemas import Query
from schemas.epochs import EPOCH_S
from schemas.estimates import Estimate

from .report.flows import flow_rank, flow_what, good_for
from .report.summary import noise_dominated

__all__ = ["HOUR_EPOCHS", "FlowOrder", "Group", "QueryBook", "group_label", "row_noisy", "span_keys"]

HOUR_EPOCHS = 3600 // EPOCH_S
Group = tuple[str, list[Estimate]]  # (kind: "span" or "rollup", the group's rows)


@dataclass(frozen=True)
class QueryBook:
    """What the subscriber knows of the queries (from the queries topic): ``expected(e)``, how
    many rows of ``e``'s group pass the filters (None: unknown); ``queries()``, every query
    version known so far; ``close``."""

    expected: Callable[[Estimate], int | None]
    queries: Callable[[], Iterable[Query]]
    close: Callable[[], None] = lambda: None


def span_keys(queries: Iterable[Query], epoch: int, shown: Callable[[Query], bool] = lambda q: True
              ) -> list[tuple[str, int]]:
    """(query id, first epoch) of the span of every span query (``span_s`` > 30) ``shown`` whose
    window publishes the span holding ``epoch`` (a span's first epoch must lie in the window)."""
    keys = set()
    for q in queries:
        if not q.is_span or not shown(q):
            continue
        first, end = q.epoch_range()
        start = q.span_start(epoch)
        if first <= start < end:
            keys.add((q.query_id, start))
    return sorted(keys)


def _order(group: Group) -> tuple[int, int, int, int, str]:
    kind, rows = group
    e = rows[0]
    last = e.epoch + e.span_s // EPOCH_S - 1
    return last // HOUR_EPOCHS, *flow_rank(kind, e.span_s), e.epoch, e.query_id


@dataclass
class FlowOrder:
    """Span queries' flows first (the module doc). ``spans_at(epoch)``: the (query id, first
    epoch) of the shown span queries' spans holding ``epoch`` (:func:`span_keys`). Pure."""

    spans_at: Callable[[int], Iterable[tuple[str, int]]]
    shown: set[tuple[str, int]] = field(default_factory=set)  # (query, first epoch) of span flows printed
    held: list[Group] = field(default_factory=list)

    def add(self, groups: Iterable[Group]) -> list[Group]:
        """Take the groups released (complete, or quiet) and give those to print now, in order."""
        spans = []
        for kind, rows in groups:
            if kind == "span":
                self.shown.add((rows[0].query_id, rows[0].epoch))
                spans.append((kind, rows))
            else:
                self.held.append((kind, rows))
        free = [g for g in self.held if not self._waits(g[1][0])]
        self.held = [g for g in self.held if self._waits(g[1][0])]
        return sorted(spans, key=_order) + sorted(free, key=_order)

    def rest(self) -> list[Group]:
        """Every group still held (at the end of the stream), in order."""
        out, self.held = sorted(self.held, key=_order), []
        return out

    def _waits(self, e: Estimate) -> bool:
        last = e.epoch + e.span_s // EPOCH_S - 1
        return any(key not in self.shown for key in self.spans_at(last))


def row_noisy(e: Estimate) -> bool:
    """Whether a published flow row is noise-dominated: its sd at least half its estimate (the
    report's rule, :func:`stream_app.report.summary.noise_dominated`; the estimate stands for
    the flow, whose truth a subscriber does not have)."""
    return e.withheld is None and e.data_quality == "ok" and noise_dominated(e.sd, e.estimate)


def group_label(kind: str, rows: Sequence[Estimate], width: int) -> str:
    """The line(s) before a group of the flows view, within ``width`` columns: its query,
    version and estimator, what it is (:func:`stream_app.report.flows.flow_what`: a rollup with
    the epochs it sums) and what it is good for (:func:`stream_app.report.flows.good_for`)."""
    e = rows[0]
    judged = [r for r in rows if r.withheld is None and r.data_quality == "ok" and r.estimate is not None
              and r.sd is not None]
    relative = sorted((r.sd or 0.0) / r.estimate for r in judged if r.estimate is not None and r.estimate > 0)
    use = good_for(len(judged), sum(row_noisy(r) for r in judged), relative[len(relative) // 2] if relative else None)
    text = f"-- {e.query_id} v{e.query_version} {e.estimator}: {flow_what(kind, e.span_s)}: {use}"
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="   "))
