"""A long computation's sign of life on a terminal: ``ptt plan`` at the papers' scale takes
seconds to minutes; after :data:`QUIET_S` a line on stderr says what is being computed and for how
long, rewritten each second and cleared at the end. Nothing when stderr is not a terminal or the
output is machine-read (``--json``).

>>> import io
>>> with Working("planning", io.StringIO(), enabled=True, quiet_s=0.0, every_s=0.01) as w:
...     w.wait_ticks(2)
>>> w.ticks >= 2
True
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["QUIET_S", "Working"]

QUIET_S = 2.0


class Working:
    """``with Working("planning unary over 3,220 stations"):`` around the computation."""

    def __init__(self, what: str, stream: TextIO | None = None, enabled: bool | None = None,
                 quiet_s: float = QUIET_S, every_s: float = 1.0) -> None:
        self.what = what
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.quiet_s, self.every_s = quiet_s, every_s
        self.ticks = 0
        self._done = threading.Event()
        self._ticked = threading.Condition()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> Working:
        self._start = time.monotonic()
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="ptt-working", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            if self.ticks:
                self.stream.write("\r\x1b[K")  # the line cleared: the result follows on a clean line
                self.stream.flush()

    def wait_ticks(self, n: int, timeout_s: float = 10.0) -> None:
        """Wait until the line was written ``n`` times (tests)."""
        with self._ticked:
            self._ticked.wait_for(lambda: self.ticks >= n, timeout_s)

    def _run(self) -> None:
        if self._done.wait(self.quiet_s):
            return
        while not self._done.is_set():
            self.stream.write(f"\r{self.what}: {time.monotonic() - self._start:.0f} s")
            self.stream.flush()
            with self._ticked:
                self.ticks += 1
                self._ticked.notify_all()
            self._done.wait(self.every_s)
