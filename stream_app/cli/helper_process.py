"""One way to run a helper process: :class:`HelperProcess`, in the spirit of mode's ``Service``
behind Faust -- a name, its command, its environment, a readiness check and its log, with
:meth:`~HelperProcess.start` (tried again on fresh ports when its port was taken),
:meth:`~HelperProcess.wait_ready` (a condition polled until a deadline, never a fixed sleep)
and :meth:`~HelperProcess.stop` (SIGTERM, then SIGKILL after the grace).

``ptt demo``'s worker, shuffler and Prometheus are each one (stream_app/cli/demo.py), the
embedded broker runs on one (:class:`~.local_broker.LocalBroker`), and
:class:`~.supervise.Watch` watches them. A helper runs in its own process group (a terminal's
Ctrl-C reaches only the command, which stops its helpers in order) and, on Linux, dies with
its parent.

>>> import sys
>>> h = HelperProcess("sleeper", [sys.executable, "-c", "import signal; signal.pause()"])
>>> h.start().running
True
>>> h.stop(grace_s=5.0); h.running, how_it_ended(h.returncode or 0)
(False, 'was killed by signal 15 (SIGTERM)')
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..ports import free_port
from .errors import EXIT_HELPER, CliError

__all__ = ["HelperFailed", "HelperProcess", "NotReady", "Ports", "child_options", "how_it_ended", "log_tail",
           "stop_all", "terminate", "terminate_all", "wait_until"]

#: the ports a helper listens on, in the order its command and readiness check take them
Ports = tuple[int, ...]


class HelperFailed(CliError):
    """A helper process exited while it should have been running (exit code 8)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_HELPER)


class NotReady(HelperFailed):
    """A helper that exited as it started (``returncode``) or did not become ready in time
    (``returncode`` None); the message names it and quotes its log. Exit code 8."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


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


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the process that started it dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child_options() -> dict[str, Any]:
    """Popen options for a helper process that the parent stops itself: its own process group
    (a terminal's Ctrl-C reaches only the parent, which then stops the helpers in order) and,
    on Linux, death with the parent."""
    opts: dict[str, Any] = {"process_group": 0}
    if sys.platform.startswith("linux"):
        preexec: Callable[[], None] = _die_with_parent
        opts["preexec_fn"] = preexec
    return opts


def terminate_all(procs: Iterable[subprocess.Popen[bytes] | None], timeout_s: float = 2.0) -> None:
    """SIGTERM every child at once, wait up to ``timeout_s`` in total, SIGKILL the stragglers."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + timeout_s
    for p in live:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float = 2.0) -> None:
    """SIGTERM a child process, wait for it, SIGKILL it if it will not go."""
    terminate_all([proc], timeout_s)


def stop_all(helpers: Iterable[HelperProcess | None], grace_s: float = 2.0) -> None:
    """:meth:`HelperProcess.stop` for several at once: one grace for all (none is ``None``d)."""
    terminate_all([h.proc for h in helpers if h is not None], grace_s)


def wait_until(holds: Callable[[], bool], timeout_s: float, poll_s: float = 0.1,
               check: Callable[[], None] = lambda: None) -> bool:
    """Poll ``holds`` until it is true (True) or ``timeout_s`` has passed (False); ``check`` is
    called before each poll and may raise (a helper that exited meanwhile).

    >>> import itertools
    >>> calls = itertools.count()
    >>> wait_until(lambda: next(calls) == 2, timeout_s=5, poll_s=0.01), wait_until(lambda: False, 0.05, 0.01)
    (True, False)
    """
    deadline = time.monotonic() + timeout_s
    while True:
        check()
        if holds():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))


class HelperProcess:
    """A helper process (module docstring). ``command`` and ``env`` (added to this process's
    environment) are given as they are or as functions of the ports it is to listen on, and so
    is ``ready``, its readiness check (by default: it runs). ``port_taken(returncode)``: a start
    that failed so is tried again on fresh ports (``fresh_port``, one each), ``attempts`` times
    in all, and :attr:`note` says so (``" (port 6066 was taken, using 41234)"``). ``log``: its
    stdout and stderr, written anew at each start (None: discarded). ``own_group``: its own
    process group, dying with its parent (:func:`child_options`)."""

    def __init__(self, name: str, command: Sequence[str] | Callable[[Ports], Sequence[str]], *,
                 env: Mapping[str, str] | Callable[[Ports], Mapping[str, str]] | None = None,
                 ready: Callable[[Ports], bool] | None = None, log: Path | None = None, ports: Ports = (),
                 port_taken: Callable[[int], bool] = lambda code: False, attempts: int = 3,
                 fresh_port: Callable[[], int] = free_port, timeout_s: float = 60.0, poll_s: float = 0.3,
                 own_group: bool = True) -> None:
        self.name, self.command, self.env, self.ready, self.log = name, command, env, ready, log
        self.ports, self.port_taken, self.attempts, self.fresh_port = ports, port_taken, attempts, fresh_port
        self.timeout_s, self.poll_s, self.own_group = timeout_s, poll_s, own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.note = ""

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process on :attr:`ports`, without waiting for it."""
        argv = list(self.command(self.ports) if callable(self.command) else self.command)
        added = self.env(self.ports) if callable(self.env) else self.env
        env = {**os.environ, **added} if added else None
        options = child_options() if self.own_group else {}
        if self.log is None:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,  # noqa: S603
                                         stderr=subprocess.STDOUT, **options)
        else:
            with self.log.open("wb") as fh:  # the child keeps its own copy
                self.proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT,  # noqa: S603
                                             **options)
        return self.proc

    def start(self, check: Callable[[], None] = lambda: None) -> HelperProcess:
        """Start it and wait until it is ready (:meth:`wait_ready`; ``check`` as there). A start
        whose port was taken (``port_taken``) is tried again on fresh ports; otherwise, or at the
        last attempt, the :class:`NotReady` is raised, the process stopped."""
        for attempt in range(self.attempts):
            self.launch()
            try:
                self.wait_ready(check)
                return self
            except NotReady as exc:
                self.stop(grace_s=1.0)  # one that never became ready is not left behind
                if attempt == self.attempts - 1 or self.ports == () or not self.port_taken(self.returncode or 0):
                    raise exc from None
                taken, self.ports = self.ports, tuple(self.fresh_port() for _ in self.ports)
                self.note = f" (port {taken[0]} was taken, using {self.ports[0]})"
        raise AssertionError("unreachable: the last attempt returns or raises")

    def wait_ready(self, check: Callable[[], None] = lambda: None, timeout_s: float | None = None) -> None:
        """Poll the readiness check until it holds; :class:`NotReady` if the process exits
        meanwhile or ``timeout_s`` (default: its own) passes. ``check`` is called at every poll
        and may raise (:meth:`~.supervise.Watch.check`: a helper started before has exited)."""
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        ready = self.ready

        def exited() -> None:
            if self.returncode is not None:
                raise NotReady(f"the {self.name} {how_it_ended(self.returncode)} at start: {self._quoted()}",
                               self.returncode)
            check()

        if not wait_until(lambda: ready is None or ready(self.ports), timeout_s, self.poll_s, exited):
            raise NotReady(f"the {self.name} did not become ready within {timeout_s:.0f}s: {self._quoted()}", None)

    def _quoted(self) -> str:
        return f"{log_tail(self.log)} (its log: {self.log})"

    @property
    def returncode(self) -> int | None:
        """None while it runs (or before it started), else how it ended (:func:`how_it_ended`)."""
        return self.proc.poll() if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM) without waiting: :meth:`stop` then waits what is left of a grace."""
        if self.running and self.proc is not None:
            self.proc.terminate()

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited after ``grace_s``; nothing if it has exited."""
        terminate(self.proc, grace_s)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
