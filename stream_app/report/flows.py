"""What a flow is, what it is good for, and in which order flows are read -- the one rule that
``ptt report`` (``summary.txt``, the flows plots) and ``ptt subscribe --flows`` follow.

A *flow* is a row of a span longer than a 30-s epoch: a span query's own row (one report per
device per span) or a rollup of a 30-s query (the sum of its estimates over 10 or 120 epochs).
The span queries' flows are the useful figures (an hourly span query is planned for its hour),
so they come first, longest span first; then the rollups of the 30-s queries, longest first;
the 30-s epochs last (:func:`flow_rank`).

What a set of flows is good for is read off its flows and their sd (:func:`good_for`): a flow
whose sd is at least half of it is noise-dominated -- the one rule of the plots,
:func:`stream_app.report.summary.noise_note`, applied to that flow -- and a set is
``NOISE-DOMINATED`` when the rule flags the set, or most of its flows; ``per-station traffic``
when no flow is flagged; ``busy stations only`` in between. The words are the figures' (how many flows
are clear of their noise, the median sd as a share of the flow), never a promise of the
mechanism's.

What a rollup spends (:func:`flow_what`): it sums the estimates of its epochs, each of which
cost a reporting device that epoch's report, so a rollup names how many epochs it composes; a
per-epoch epsilon shown beside it is labelled per epoch, never as the rollup's.
"""

from __future__ import annotations

from schemas.epochs import EPOCH_S

__all__ = ["KIND_ORDER", "NOISE_WORD", "flow_rank", "flow_what", "good_for", "span_adjective"]

#: the order of the kinds of row: a span query's own flows, then the rollups, then the 30-s epochs
KIND_ORDER = ("span", "rollup", "epoch")
#: what a noise-dominated flow, or set of flows, says
NOISE_WORD = "NOISE-DOMINATED"


def flow_rank(kind: str, span_s: int) -> tuple[int, int]:
    """The sort key of a (query, span) of ``kind`` (``span``, ``rollup``, ``epoch``): span
    queries' flows first, then rollups, then epochs; within a kind the longest span first."""
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), -span_s


def span_adjective(span_s: int) -> str:
    """``hourly``, ``2-hour``, ``5-minute``, ``90-second`` (also ``daily``)."""
    if span_s == 86_400:
        return "daily"
    if span_s == 3600:
        return "hourly"
    if span_s % 3600 == 0:
        return f"{span_s // 3600}-hour"
    if span_s % 60 == 0:
        return f"{span_s // 60}-minute"
    return f"{span_s}-second"


def flow_what(kind: str, span_s: int, own_s: int = EPOCH_S, short: bool = False) -> str:
    """What a (query, span) of ``kind`` is, in words a reader of its flows needs: a span query's
    flows, or a rollup of a 30-s query with the number of epochs (each a report of a device in
    all of them) it composes (``short``: without that)."""
    if kind == "rollup":
        n = span_s // own_s
        return f"{span_adjective(span_s)} rollups of a {own_s}-s query" + (
            "" if short else f" (each sums {n} epochs: {n} reports of a device in all of them)")
    if kind == "span":
        return f"{span_adjective(span_s)} flows" + (
            "" if short else " of a span query (one report per device per span)")
    return f"{span_s}-s counts"


def good_for(judged: int, noisy: int, relative_sd: float | None, noise: str | None = None) -> str:
    """What a set of flows is good for: ``judged`` flows held against their sd, ``noisy`` of them
    noise-dominated (each flow's sd at least half of it: ``summary.noise_note`` on that flow),
    ``relative_sd`` the median of sd / flow over the flows above 0, ``noise`` the set's own
    ``noise_note`` (None: not flagged). ``NOISE-DOMINATED`` when the set is flagged or most of
    its flows are (a few flows of pure noise clear twice their sd by chance); ``per-station
    traffic`` when none is; ``busy stations only`` in between."""
    share = "" if relative_sd is None else f"; sd a median {relative_sd:.0%} of the flow"
    if noise is not None or (judged and 2 * noisy > judged):
        what = (noise.removeprefix("noise-dominated: ") if noise
                else f"{noisy:,} of {judged:,} flows at most twice their sd")
        return f"{NOISE_WORD}: noise, not traffic ({what})"
    if not judged:
        return "not judged (no published flow with an sd to hold against it)"
    if not noisy:
        return f"per-station traffic (every flow above twice its sd{share})"
    return f"busy stations only ({judged - noisy:,} of {judged:,} flows above twice their sd{share})"
