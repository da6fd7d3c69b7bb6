"""The one epoch clock: a 30-second epoch (the PeMS Station Raw interval), numbered from the
Unix epoch. Every layer -- readers, fleet, wire, windows, estimates -- uses these.

>>> epoch_of(epoch_start(57_000_000)) == 57_000_000
True
>>> EPOCH_S
30
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

__all__ = ["EPOCH_S", "PACIFIC", "epoch_of", "epoch_start", "spans_epochs"]

EPOCH_S = 30
PACIFIC = ZoneInfo("America/Los_Angeles")


def epoch_of(ts: datetime) -> int:
    """Absolute epoch index of an aware timestamp: Unix seconds // 30."""
    return int(ts.timestamp()) // EPOCH_S


def spans_epochs(span_s: int) -> bool:
    """Whether ``span_s`` seconds cover more than one epoch: a span query's report, or a flow (a
    span query's estimate, a rollup) -- the one place a span is compared with the epoch.

    >>> spans_epochs(30), spans_epochs(3600)
    (False, True)
    """
    return span_s != EPOCH_S


def epoch_start(epoch: int) -> datetime:
    """Start of an epoch, as an aware datetime in Pacific time (the PeMS files' zone)."""
    return datetime.fromtimestamp(epoch * EPOCH_S, tz=PACIFIC)
