"""What a day cap dropped, beside the flows it biased: the report's reading of the replay's
``--cap-drops-file`` (one line per query, span and station; ``producers.trip_stats``). A
simulation diagnostic: a deployment cannot know it, and nothing of it is published. The flows
are scored against the uncapped truth, so their bias includes these passages; this section
says how much of it they are.

>>> drops = read_cap_drops("query_id,span_epoch,span_start,station,dropped\\n"
...                        "flows,59004960,2026-02-03T12:00:00-08:00,400001,30\\n"
...                        "flows,59004960,2026-02-03T12:00:00-08:00,400002,10\\n")
>>> drops
{'flows': {(59004960, 400001): 30, (59004960, 400002): 10}}
>>> print(cap_drop_words("flows", drops["flows"], cells=8, bias=-6.5))
flows: 40 passages in 2 of its 8 station-spans, 5.0 a station-span on average (its flows' bias: -6.50)
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CAP_DROPS_HEADER", "CapDropError", "CapDrops", "cap_drop_words", "read_cap_drops"]

#: per query, its dropped passages by (span epoch, station)
CapDrops = dict[str, dict[tuple[int, int], int]]

#: the first line of a cap drops file (``producers.trip_stats.cap_drop_lines``)
CAP_DROPS_HEADER = "query_id,span_epoch,span_start,station,dropped"


class CapDropError(ValueError):
    """A cap drops file that is not one: the line and why."""


def read_cap_drops(text: str) -> CapDrops:
    """Per query, its drops by (span epoch, station); :class:`CapDropError` on a bad line.

    >>> try:
    ...     read_cap_drops(CAP_DROPS_HEADER + "\\nq,1,x,2,-3\\n")
    ... except CapDropError as exc:
    ...     print(str(exc)[:36])
    line 2: 'q,1,x,2,-3' is not query_id
    """
    lines = text.splitlines()
    if not lines or lines[0] != CAP_DROPS_HEADER:
        raise CapDropError(f"line 1: not a cap drops file (its first line is not {CAP_DROPS_HEADER})")
    out: CapDrops = {}
    for i, line in enumerate(lines[1:], start=2):
        parts = line.split(",")
        try:
            qid, epoch, station, n = parts[0], int(parts[1]), int(parts[3]), int(parts[4])
        except (IndexError, ValueError):
            n, qid = 0, ""
        if len(parts) != 5 or not qid or n < 1 or (epoch, station) in out.get(qid, {}):
            raise CapDropError(f"line {i}: {line!r} is not {CAP_DROPS_HEADER} (a count of 1 or more)")
        out.setdefault(qid, {})[(epoch, station)] = n
    return out


def cap_drop_words(query_id: str, drops: Mapping[tuple[int, int], int], cells: int, bias: float | None) -> str:
    """One query's line: its dropped passages, in how many of its station-spans, the mean per
    station-span beside its flows' bias (both per station-span)."""
    total = sum(drops.values())
    mean = f", {total / cells:.1f} a station-span on average" if cells else ""
    beside = f" (its flows' bias: {bias:+.2f})" if bias is not None else ""
    return f"{query_id}: {total:,} passages in {len(drops):,} of its {cells:,} station-spans{mean}{beside}"
