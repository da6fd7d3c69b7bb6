"""The front door in a process of its own (``ptt shuffler --http-port``): what the internet
reaches cannot take the shuffler's CPU, memory or file descriptors.

:class:`DoorProcess` has :class:`~stream_app.shuffler.front_door.FrontDoor`'s life cycle --
:meth:`~DoorProcess.start` returns once the door listens or raises what stopped it
(:class:`~stream_app.ports.PortInUse`, :class:`~schemas.kafka_io.BrokerUnavailable`), and
:meth:`~DoorProcess.stop` lets requests in flight finish and returns the door's summary line --
but the door runs in a child process (``spawn``): its event loop, its parsing of every slow or
hostile byte and its connections no longer share the shuffler's interpreter lock, so a flood
of slow connections does not delay the shuffler's releases (tests/benchmarks/
bench_door_release.py measures the release lag under 20,000 of them). The two share nothing
but the settings: the door verifies, limits and writes device reports to the device topic,
which the shuffler reads as from any writer.

The child ignores SIGINT (a Ctrl-C on the terminal reaches the whole process group; the
shuffler stops it in order), stops on SIGTERM, and stops by itself within a second when its
parent is gone. A door process that exits while the shuffler runs is a failure the shuffler
reports (:attr:`DoorProcess.failure`; ``ptt shuffler`` exits 8 naming it).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from schemas.connection import client_logs
from schemas.kafka_io import BrokerUnavailable

from .settings import ShufflerSettings

__all__ = ["DoorProcess"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _child(settings: ShufflerSettings, levels: tuple[int, int], conn: Connection, parent: int) -> None:
    """The door process: start the door, say so (or what stopped it), serve until asked to
    stop (the pipe, SIGTERM, or the parent gone), then send the door's summary line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=levels[0], format=_FORMAT)
    client_logs(levels[1])
    from .front_door import FrontDoor

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        door = FrontDoor(settings)  # reads the enrollment (and revocation list) anew: it can fail here too
        door.start()
    except Exception as exc:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(("failed", (type(exc).__name__, str(exc))))
        return
    conn.send(("ready", os.getpid()))

    def asked() -> None:
        try:
            conn.recv()
        except (EOFError, OSError):
            pass
        stop.set()

    threading.Thread(target=asked, name="door-stop", daemon=True).start()
    while not stop.wait(0.5):
        if os.getppid() != parent:  # the shuffler is gone: nobody will ask
            break
    door.stop()
    try:
        conn.send(("stopped", door.line()))
    except (BrokenPipeError, OSError):
        pass


def _raised(name: str, message: str) -> BaseException:
    """What stopped the door, as the shuffler's command line knows it (a port in use: exit 4;
    a broker it cannot reach: exit 3), else a plain error with the door's words."""
    from stream_app.ports import PortInUse

    known: dict[str, type[Exception]] = {"PortInUse": PortInUse, "BrokerUnavailable": BrokerUnavailable}
    return known[name](message) if name in known else RuntimeError(f"the front door did not start: {name}: {message}")


class DoorProcess:
    """``ptt shuffler``'s front door in its own process (module docstring). ``on_exit``: called
    (from a watcher thread) when the door process ends without having been asked to."""

    def __init__(self, settings: ShufflerSettings, on_exit: Callable[[str], None] | None = None) -> None:
        self.s = settings
        self.on_exit = on_exit
        self.failure: str | None = None
        self.pid: int | None = None
        self._proc: Any = None
        self._conn: Connection | None = None
        self._stopping = threading.Event()
        self._line = "front door: stopped before it reported"

    def start(self, timeout_s: float = 60.0) -> None:
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        root = logging.getLogger()
        levels = (root.level, logging.getLogger("kafka").getEffectiveLevel())
        self._proc = proc = ctx.Process(target=_child, args=(self.s, levels, theirs, os.getpid()),
                                        name="ptt-front-door", daemon=False)
        proc.start()
        theirs.close()
        self._conn = ours
        if not ours.poll(timeout_s):
            self._kill()
            raise BrokerUnavailable(f"the HTTP front door did not start within {timeout_s:g}s")
        try:
            what, value = ours.recv()
        except EOFError:
            proc.join(5)
            raise RuntimeError(f"the front door's process exited as it started (exit code {proc.exitcode})") from None
        if what == "failed":
            proc.join(10)
            raise _raised(*value)
        self.pid = int(value)
        threading.Thread(target=self._watch, name="door-watch", daemon=True).start()

    def _watch(self) -> None:
        self._proc.join()
        if not self._stopping.is_set():
            self.failure = (f"the front door's process (pid {self.pid}) exited with code {self._proc.exitcode} while "
                            "the shuffler was running; devices cannot upload: restart the shuffler")
            if self.on_exit is not None:
                self.on_exit(self.failure)

    def stop(self) -> str:
        """Ask the door to stop (requests in flight finish, at most ``http_stop_grace_s``); its
        summary line. A door that does not stop in time is killed."""
        self._stopping.set()
        conn, proc = self._conn, self._proc
        if conn is None or proc is None:
            return self._line
        try:
            conn.send("stop")
            if conn.poll(self.s.http_stop_grace_s + 15):
                what, value = conn.recv()
                if what == "stopped":
                    self._line = str(value)
        except (EOFError, BrokenPipeError, OSError):
            pass
        proc.join(5)
        self._kill()
        return self._line

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(5)

    def line(self) -> str:
        return self._line
