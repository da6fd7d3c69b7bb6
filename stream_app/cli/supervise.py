"""The processes a command starts, watched all the time (``ptt demo``: the broker, the worker,
the shuffler and its front door, Prometheus; the benchmarks' too).

A helper that exits while it should be running is a failure the moment it is seen: which one,
how it ended and the end of its log, in one line (:class:`HelperFailed`, exit code 8). The
main thread checks at its own waits (:meth:`Watch.check`); while it is inside a call that
only a signal can stop (the replay, :meth:`Watch.interrupting`), a thread polls the helpers
every 0.2 s and asks that call to stop the way Ctrl-C does (SIGTERM to this process, which the
replay's :class:`~producers.stopping.StopFlag` takes as a clean stop), so a dead worker ends a
replay within a second instead of after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .helper_process import HelperFailed, HelperProcess, how_it_ended, log_tail

__all__ = ["POLL_S", "HelperFailed", "Watch", "how_it_ended", "log_tail"]

POLL_S = 0.2  # how often the watching thread looks at the helpers


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Watch:
    """The helpers (:class:`~.helper_process.HelperProcess`) a command started, each watched
    from the moment it is added until :meth:`retire` (when the command stops them itself)."""

    def __init__(self, interrupt: Callable[[], None] = _interrupt_self) -> None:
        self.helpers: list[tuple[str, HelperProcess]] = []
        self._interrupt = interrupt
        self._retired = False
        self.failure: str | None = None  # the first failure seen, as :meth:`check` raises it

    def add(self, helper: HelperProcess, name: str | None = None) -> None:
        """Watch a started helper, named in its failure as ``name`` (default: its own name)."""
        self.helpers.append((name or helper.name, helper))

    def dead(self) -> str | None:
        """The first helper that has exited, as the failure's line; None while all run (or retired)."""
        if self._retired:
            return None
        if self.failure is None:
            for name, h in self.helpers:
                code = h.returncode
                if code is not None:
                    where = f" (its log: {h.log})" if h.log is not None else ""
                    self.failure = f"the {name} {how_it_ended(code)}: {log_tail(h.log)}{where}"
                    break
        return self.failure

    def check(self) -> None:
        """:class:`HelperFailed` if a helper has exited."""
        failure = self.dead()
        if failure is not None:
            raise HelperFailed(failure)

    def retire(self) -> None:
        """Stop watching: the command is stopping its helpers itself."""
        self._retired = True

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        """Around a call that only a signal stops (the replay): once a helper has exited, ask it
        to stop (SIGTERM to this process, every half second until the call has returned, so one
        that lands before the call's handler is installed is not the last); :meth:`check` after
        the block raises the failure. SIGTERM is swallowed meanwhile outside the call's own
        handler (never the default, which would end this process without stopping the helpers)."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(POLL_S):
                if self.dead() is not None:
                    while not done.is_set():
                        self._interrupt()
                        done.wait(0.5)

        previous: Any = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        thread = threading.Thread(target=watch, name="helper-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            signal.signal(signal.SIGTERM, previous)
