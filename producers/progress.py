"""The replay's progress line on stderr, and what it says when the replay falls behind the
speed it was asked for (``--speed``): by how much, and what limits it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .settings import ReplaySettings

__all__ = ["BEHIND_AFTER_S", "BEHIND_BELOW", "Progress", "behind_line", "what_limits"]

BEHIND_AFTER_S = 10.0  # the replay's pace is judged once it has run this long (its start is not its pace)
BEHIND_BELOW = 0.9  # behind: below this share of the requested epochs per second


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
    """A one-line progress bar on stderr: epochs, epochs/s, reports/s, failures; and, once, a
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

    def update(self, epochs: int, reports: int, failures: int, force: bool = False) -> None:
        now = self.clock()
        if not self.enabled or (not force and now - self.last < (0.2 if self.tty else 5.0)):
            return
        self.last = now
        dt = max(now - self.start, 1e-9)
        line = (f"epoch {epochs}/{self.total} ({100 * epochs / max(self.total, 1):.0f}%)  "
                f"{epochs / dt:.1f} epochs/s  {reports / dt:,.0f} reports/s  delivery failures {failures}")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        behind = None if self.behind_said or epochs >= self.total else behind_line(self.speed, epochs, dt, self.limit)
        if behind is not None:
            self.behind_said = True
            print(("\n" if self.tty else "") + behind, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)
