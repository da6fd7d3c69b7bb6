"""How a replay stops (docs/wire.md, "Ctrl-C"): the signal handling of one process
(:class:`StopFlag`: the first Ctrl-C or SIGTERM asks for a clean stop, a second Ctrl-C forces
quit) and the one stop epoch every producer of a replay agrees on (:class:`StopPlan`)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

__all__ = ["FORCE_QUIT_GRACE_S", "STOP_NOTICE", "STOP_NOTICE_TTY", "Halt", "StopFlag", "StopPlan", "Stops",
           "before_forced_quit", "children_ignore_stop_signals", "forced_quit", "pause_until"]


FORCE_QUIT_GRACE_S = 2.0  # after a second Ctrl-C: time left for cleanup before the process ends regardless
_EXIT_INTERRUPTED = 130  # as the ``ptt`` command line's (README: exit codes)


def _say(text: str) -> None:
    """A line on stderr from a signal handler: unbuffered (no reentrant write into a buffered
    stream the interrupted code may be using), and never an error (stderr may be a closed pipe)."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass


#: the first Ctrl-C's line; on a terminal it starts a line of its own (the terminal has echoed
#: ``^C`` onto the progress bar's line, which ends in a carriage return, not a newline)
STOP_NOTICE = "ptt: stopping cleanly; Ctrl-C again to quit at once\n"
STOP_NOTICE_TTY = "\n" + STOP_NOTICE


def _stderr_is_terminal() -> bool:
    try:
        return os.isatty(2)
    except OSError:
        return False


_AT_FORCED_QUIT: list[Callable[[], None]] = []  # :func:`before_forced_quit`'s, newest last


@contextlib.contextmanager
def before_forced_quit(cleanup: Callable[[], None]) -> Iterator[None]:
    """Within the block, a forced quit (:func:`forced_quit`: ``os._exit``, which runs no
    ``finally`` and no ``atexit``) runs ``cleanup`` first -- for what must not outlive the
    process, such as a secret on disk."""
    _AT_FORCED_QUIT.append(cleanup)
    try:
        yield
    finally:
        _AT_FORCED_QUIT.remove(cleanup)


def forced_quit(end: Callable[[int], object] = os._exit) -> None:
    """The second Ctrl-C's end of the process, exit code 130: the cleanups registered with
    :func:`before_forced_quit` (newest first; one that fails does not stop the others), then
    ``end`` (the process's, ``os._exit``)."""
    _say("ptt: forced quit (second Ctrl-C): what was not yet acknowledged or marked may be lost\n")
    for cleanup in reversed(list(_AT_FORCED_QUIT)):
        with contextlib.suppress(Exception):
            cleanup()
    end(_EXIT_INTERRUPTED)


def _quit_after(seconds: float) -> None:
    """End the process with exit code 130 in ``seconds`` if it has not ended by then."""
    timer = threading.Timer(seconds, forced_quit)
    timer.daemon = True
    timer.start()


class StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to stop at its next safe point instead of
    raising wherever it lands (possibly inside the Kafka client); the first one says so on
    stderr (not in a replay's producer processes: their parent does). A second Ctrl-C forces
    quit: KeyboardInterrupt at once, and the process ends with exit code 130 at the latest
    :data:`FORCE_QUIT_GRACE_S` later, even when the graceful stop is still waiting (e.g. for a
    broker that does not answer)."""

    def __init__(self, notice: bool = True) -> None:
        self.event = threading.Event()
        self.notice = notice and mp.parent_process() is None
        self._previous: Any = None
        self._unraisable: Any = sys.unraisablehook

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = self._ignored
        return self

    def _ignored(self, info: Any) -> None:
        """The second Ctrl-C's KeyboardInterrupt can land in code whose exceptions the
        interpreter only prints and drops (a weakref callback, a ``__del__``): "Exception ignored
        in ... Traceback" on the user's terminal, and the forced quit did not happen there. Send
        the signal again a moment later (from a thread: raised in this hook, it would be dropped
        too), until it lands where it propagates; the forced quit's timer ends the process
        regardless."""
        if info.exc_type is KeyboardInterrupt:
            again = threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT))
            again.daemon = True
            again.start()
            return
        self._unraisable(info)

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.event.is_set():
            _quit_after(FORCE_QUIT_GRACE_S)
            raise KeyboardInterrupt
        if self.notice and not self.event.is_set():
            _say(STOP_NOTICE_TTY if _stderr_is_terminal() else STOP_NOTICE)
        self.event.set()

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            sys.unraisablehook = self._unraisable

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if a stop was requested."""
        return self.event.wait(seconds) if seconds > 0 else self.event.is_set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()


class StopPlan:
    """Where every producer of one replay stops (docs/wire.md, "Ctrl-C"): at one epoch for all.

    A stop (Ctrl-C or SIGTERM, to the parent or to any producer process) fixes, once, the
    stop epoch: the newest epoch any producer had begun. Every producer completes every epoch
    before it -- one a producer is still in is finished, not cut -- then marks the stop epoch
    interrupted with exactly what it sent of it (nothing, if it had not begun it); a producer
    that had finished the stop epoch leaves it complete. No epoch after it is begun. So every
    epoch on the wire has every producer's markers and is either complete or flagged
    interrupted, and only the last one can be flagged.

    ``state`` = [stop epoch count (-1: no stop yet), epochs begun by producer 0, 1, ...]:
    shared memory with a process lock across producer processes, a list and a thread lock in
    one process. The lock is never taken in a signal handler (the handler only sets a flag).
    """

    RUN, EMPTY, STOP = range(3)  # what :meth:`begin` says about an epoch

    def __init__(self, state: Any, lock: Any) -> None:
        self.state = state
        self.lock = lock

    @classmethod
    def local(cls, producers: int = 1) -> StopPlan:
        return cls([-1] + [0] * producers, threading.Lock())

    @property
    def requested(self) -> bool:
        return bool(self.state[0] >= 0)

    def request(self) -> int:
        """Fix the stop (the first call decides): epochs ``0 .. n - 1`` are sent, ``n - 1``
        possibly interrupted; returns ``n``."""
        with self.lock:
            if self.state[0] < 0:
                self.state[0] = max(self.state[1:])
            return int(self.state[0])

    def begin(self, index: int, i: int) -> int:
        """May producer ``index`` begin its epoch ``i`` (counted from the replay's start)?
        ``RUN`` (recorded as begun), ``EMPTY`` (the stop epoch, not begun before the stop:
        mark it interrupted with nothing sent) or ``STOP``."""
        with self.lock:
            n = int(self.state[0])
            if n < 0 or i < n - 1:
                self.state[1 + index] = i + 1
                return self.RUN
            return self.EMPTY if i == n - 1 else self.STOP

    def cuts(self, i: int) -> bool:
        """Is epoch ``i`` (one this producer has begun) the stop epoch? Set once, never changed."""
        n = int(self.state[0])
        return n >= 0 and i >= n - 1


class Stops(Protocol):
    @property
    def requested(self) -> bool: ...


class Halt:
    """``requested`` for :func:`send_round`: this epoch is to be cut short now."""

    def __init__(self, cut: Callable[[int], bool], i: int) -> None:
        self.cut, self.i = cut, i

    @property
    def requested(self) -> bool:
        return self.cut(self.i)


def pause_until(until: float, stop: StopFlag, plan: StopPlan) -> None:
    """Pacing: wait until ``until`` (time.time()), or a stop -- this process's signal, or the
    plan a peer or the parent fixed (a producer still starting up ignores signals)."""
    while not (stop.requested or plan.requested) and (left := until - time.time()) > 0:
        stop.wait(min(left, 0.05))


@contextlib.contextmanager
def children_ignore_stop_signals() -> Iterator[None]:
    """Start producer processes ignoring SIGINT and SIGTERM (an ignored signal stays ignored
    across exec; a handler does not) until they install their own handlers, so a Ctrl-C or
    the parent's SIGTERM during their start-up cannot kill one before it can follow the
    StopPlan. A signal to this process while the children are being started is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


