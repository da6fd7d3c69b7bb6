"""What a day cap dropped, beside the flows it biased: the report's words for the replay's
cap drops file (:mod:`schemas.cap_drops`, which reads it). The flows are scored against the
uncapped truth, so their bias includes these passages; this says how much of it they are.

>>> drops = read_cap_drops("query_id,span_epoch,span_start,station,dropped\\n"
...                        "flows,59004960,2026-02-03T12:00:00-08:00,400001,30\\n"
...                        "flows,59004960,2026-02-03T12:00:00-08:00,400002,10\\n")
>>> print(cap_drop_words("flows", drops["flows"], cells=8, bias=-6.5))
flows: 40 passages in 2 of its 8 station-spans, 5.0 a station-span on average (its flows' bias: -6.50)
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.cap_drops import CAP_DROPS_HEADER, CapDropError, CapDrops, read_cap_drops

__all__ = ["CAP_DROPS_HEADER", "CapDropError", "CapDrops", "cap_drop_words", "read_cap_drops"]


def cap_drop_words(query_id: str, drops: Mapping[int, Mapping[int, int]], cells: int, bias: float | None) -> str:
    """One query's line (``drops``: span -> station -> passages): its dropped passages, in how
    many of its station-spans, the mean per station-span beside its flows' bias (both per
    station-span)."""
    total = sum(sum(st.values()) for st in drops.values())
    where = sum(len(st) for st in drops.values())
    mean = f", {total / cells:.1f} a station-span on average" if cells else ""
    beside = f" (its flows' bias: {bias:+.2f})" if bias is not None else ""
    return f"{query_id}: {total:,} passages in {where:,} of its {cells:,} station-spans{mean}{beside}"
