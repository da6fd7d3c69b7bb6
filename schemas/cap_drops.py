"""What a day cap dropped, as a file: the replay writes it (``--cap-drops-file``, the demo's
``cap-drops.csv``), ``ptt report --cap-drops`` reads it. One CSV line per query, span and station
where the cap dropped passages; the span by its first epoch and its local start. A simulation
diagnostic: a deployment cannot know it, and nothing of it is published.

>>> drops = {"unary-hour": {59004960: {400001: 3, 400002: 1}}}
>>> for line in cap_drop_lines(drops):
...     print(line)
query_id,span_epoch,span_start,station,dropped
unary-hour,59004960,2026-02-03T12:00:00-08:00,400001,3
unary-hour,59004960,2026-02-03T12:00:00-08:00,400002,1
>>> read_cap_drops("\\n".join(cap_drop_lines(drops))) == drops
True
"""

from __future__ import annotations

from .epochs import epoch_start

__all__ = ["CAP_DROPS_HEADER", "CapDropError", "CapDrops", "cap_drop_lines", "largest_cap_drop", "read_cap_drops"]

#: query id -> span (its first epoch) -> station -> passages dropped
CapDrops = dict[str, dict[int, dict[int, int]]]

#: the file's first line
CAP_DROPS_HEADER = "query_id,span_epoch,span_start,station,dropped"


class CapDropError(ValueError):
    """A cap drops file that is not one: the line and why."""


def cap_drop_lines(drops: CapDrops) -> list[str]:
    """``drops`` as the file's lines, the header first."""
    lines = [CAP_DROPS_HEADER]
    for qid, spans in sorted(drops.items()):
        for epoch, stations in sorted(spans.items()):
            start = epoch_start(epoch).isoformat()
            lines += [f"{qid},{epoch},{start},{s},{n}" for s, n in sorted(stations.items())]
    return lines


def read_cap_drops(text: str) -> CapDrops:
    """The file's drops; :class:`CapDropError` on a bad line.

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
        if len(parts) != 5 or not qid or n < 1 or station in out.get(qid, {}).get(epoch, {}):
            raise CapDropError(f"line {i}: {line!r} is not {CAP_DROPS_HEADER} (a count of 1 or more)")
        out.setdefault(qid, {}).setdefault(epoch, {})[station] = n
    return out


def largest_cap_drop(spans: dict[int, dict[int, int]]) -> tuple[int, int, int, int]:
    """Of one query's drops: the station-spans with any, and the largest (passages, station,
    span epoch), the earliest span and lowest station on a tie.

    >>> largest_cap_drop({20: {7: 2, 9: 5}, 10: {3: 5}})
    (3, 5, 3, 10)
    """
    cells = [(-n, e, s) for e, stations in spans.items() for s, n in stations.items()]
    n, e, s = min(cells)
    return len(cells), -n, s, e
