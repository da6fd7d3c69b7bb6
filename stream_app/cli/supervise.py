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
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EXIT_HELPER, CliError

__all__ = ["POLL_S", "Helper", "HelperFailed", "Watch", "how_it_ended", "log_tail"]

POLL_S = 0.2  # how often the watching thread looks at the helpers


class HelperFailed(CliError):
    """A helper process exited while it should have been running (exit code 8)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_HELPER)


@dataclass
class Helper:
    name: str  # as the user reads it: "stream-app worker", "shuffler", "broker", "Prometheus"
    proc: subprocess.Popen[bytes]
    log: Path | None


def how_it_ended(code: int) -> str:
    """A process's return code in words.

    >>> how_it_ended(4), how_it_ended(-9)
    ('exited with code 4', 'was killed by signal 9 (SIGKILL)')
    """
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def log_tail(path: Path | None, lines: int = 3, width: int = 400) -> str:
    """The end of a helper's log as one quoted piece: its one-line error if it printed one
    (``ptt <command>: error: ...``), else its last ``lines`` non-empty lines joined by `` | ``,
    at most ``width`` characters (the end kept).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "w.log"
    ...     _ = p.write_text("starting\\nptt worker: error: the metrics port 6066 is in use; give another\\n")
    ...     log_tail(p)
    '"ptt worker: error: the metrics port 6066 is in use; give another"'
    """
    if path is None:
        return "(no log)"
    try:
        with path.open("rb") as fh:
            fh.seek(max(fh.seek(0, os.SEEK_END) - 64_000, 0))
            text = fh.read().decode(errors="replace")
    except OSError:
        return f"(its log {path} cannot be read)"
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if not kept:
        return "(its log is empty)"
    errors = [line for line in kept if line.startswith("ptt ") and ": error: " in line]
    quoted = errors[-1] if errors else " | ".join(kept[-lines:])
    if len(quoted) > width:
        quoted = "..." + quoted[-(width - 3):]
    return f'"{quoted}"'


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Watch:
    """The helpers a command started, each watched from the moment it is added until
    :meth:`retire` (when the command stops them itself)."""

    def __init__(self, interrupt: Callable[[], None] = _interrupt_self) -> None:
        self.helpers: list[Helper] = []
        self._interrupt = interrupt
        self._retired = False
        self.failure: str | None = None  # the first failure seen, as :meth:`check` raises it

    def add(self, name: str, proc: subprocess.Popen[bytes], log: Path | None) -> None:
        self.helpers.append(Helper(name, proc, log))

    def dead(self) -> str | None:
        """The first helper that has exited, as the failure's line; None while all run (or retired)."""
        if self._retired:
            return None
        if self.failure is None:
            for h in self.helpers:
                code = h.proc.poll()
                if code is not None:
                    where = f" (its log: {h.log})" if h.log is not None else ""
                    self.failure = f"the {h.name} {how_it_ended(code)}: {log_tail(h.log)}{where}"
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
