"""The replay's progress line on stderr -- with, after its first epochs, when it expects to be
done (:func:`eta_text`) -- and what it says when the replay falls behind the speed it was asked
for (``--speed``): by how much, and what limits it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from .settings import ReplaySettings

__all__ = ["BEHIND_AFTER_S", "BEHIND_BELOW", "ETA_AFTER_EPOCHS", "Progress", "behind_line", "eta_text",
           "what_limits"]

BEHIND_AFTER_S = 10.0  # the replay's pace is judged once it has run this long (its start is not its pace)
BEHIND_BELOW = 0.9  # behind: below this share of the requested epochs per second
ETA_AFTER_EPOCHS = 3  # the expected end is said once this many epochs are done (the first one is not the pace)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(round(seconds), 1)} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def eta_text(epochs: int, total: int, elapsed_s: float, now: datetime) -> str:
    """When a run of ``total`` epochs that has done ``epochs`` in ``elapsed_s`` seconds is done at
    its pace so far: the time left and the wall-clock time (``now``'s zone), to the minute; empty
    before :data:`ETA_AFTER_EPOCHS` epochs and once every epoch is done.

    >>> eta_text(20, 100, 60.0, datetime(2026, 11, 18, 6, 48))
    'done in ~4 min, at 06:52'
    >>> eta_text(10, 2880, 20.0, datetime(2026, 11, 18, 23, 0))
    'done in ~1 h 36 min, at 00:36 tomorrow'
    >>> eta_text(3, 4, 1.5, datetime(2026, 11, 18, 6, 48, 10))
    'done in ~1 s, at 06:48'
    >>> eta_text(2, 100, 1.0, datetime(2026, 11, 18, 6, 48)), eta_text(100, 100, 9.0, datetime(2026, 11, 18))
    ('', '')
    """
    if epochs < ETA_AFTER_EPOCHS or epochs >= total or elapsed_s <= 0:
        return ""
    left_s = (total - epochs) * elapsed_s / epochs
    at = now + timedelta(seconds=left_s + 30)  # to the nearest minute
    day = (at.date() - now.date()).days
    when = f"{at:%H:%M}" + ("" if day == 0 else " tomorrow" if day == 1 else f" on {at:%Y-%m-%d}")
    return f"done in ~{_duration(left_s)}, at {when}"


def what_limits(settings: ReplaySettings) -> str:
    """What sets a replay's pace when it cannot keep the requested speed: behind, it never waits
    for its pace, so its whole time goes to its producers' work -- privatizing and sending the
    reports and waiting for their acknowledgements, and on the device path one record or one
    HTTP request per device report."""
    n = settings.producers
    who = f"{n} producer process{'es' if n > 1 else ''} (--producers adds more, up to the cores)"
    if settings.via_shuffler and settings.transport == "http":
        return (f"{who} uploading one HTTP request per device and epoch to the shuffler's front door "
                f"({settings.http_concurrency} in flight)")
    if settings.via_shuffler:
        return f"{who} sending one record per device report to the device topic"
    return f"{who} privatizing and sending the reports to the broker"


def behind_line(speed: float, epochs: int, elapsed_s: float, limit: str) -> str | None:
    """The line that says a replay is behind ``speed`` (x real time), or None if it keeps up.

    >>> behind_line(120.0, 44, 40.0, "x")
    'replay: behind the requested 120x real time: 1.1 epochs/s of 4.0 (28%, 116 epochs behind); its time goes to x'
    >>> behind_line(120.0, 159, 40.0, "x") is None
    True
    """
    if speed <= 0 or elapsed_s < BEHIND_AFTER_S:
        return None
    want, rate = speed / 30.0, epochs / elapsed_s
    if rate >= BEHIND_BELOW * want:
        return None
    lag = int(want * elapsed_s) - epochs
    return (f"replay: behind the requested {speed:g}x real time: {rate:.1f} epochs/s of {want:.1f} "
            f"({100 * rate / want:.0f}%, {lag} epochs behind); its time goes to {limit}")


class Progress:
    """A one-line progress bar on stderr: epochs, epochs/s, reports/s, failures and, after the
    first epochs, when the replay expects to be done (:func:`eta_text`, local time); and, once, a
    line of its own when the replay falls behind its requested speed (:func:`behind_line`)."""

    def __init__(self, total: int, enabled: bool, speed: float = 0.0, limit: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        self.total = total
        self.enabled = enabled
        self.speed = speed
        self.limit = limit
        self.clock = clock
        self.start = clock()
        self.last = 0.0
        self.tty = sys.stderr.isatty()
        self.behind_said = False
        self.width = 0  # the longest line written over (a terminal's line is rewritten in place)

    def update(self, epochs: int, reports: int, failures: int, force: bool = False) -> None:
        now = self.clock()
        if not self.enabled or (not force and now - self.last < (0.2 if self.tty else 5.0)):
            return
        self.last = now
        dt = max(now - self.start, 1e-9)
        eta = eta_text(epochs, self.total, dt, datetime.fromtimestamp(now, UTC).astimezone())
        line = (f"epoch {epochs}/{self.total} ({100 * epochs / max(self.total, 1):.0f}%)  "
                f"{epochs / dt:.1f} epochs/s  {reports / dt:,.0f} reports/s  delivery failures {failures}"
                + (f"  {eta}" if eta else ""))
        if self.tty:  # a shorter line blanks what is left of the longer one
            line, self.width = line.ljust(self.width), max(self.width, len(line))
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        behind = None if self.behind_said or epochs >= self.total else behind_line(self.speed, epochs, dt, self.limit)
        if behind is not None:
            self.behind_said = True
            print(("\n" if self.tty else "") + behind, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)
