"""Ports a process listens on: :class:`PortInUse` (the command line's exit code 4), whether a
loopback port is free, and a free one. Below both the command line (``stream_app/cli/``) and
the servers that bind ports themselves (the shuffler's front door), so neither imports the other."""

from __future__ import annotations

import socket

__all__ = ["PortInUse", "free_port", "port_free"]


class PortInUse(OSError):
    """A port we were asked to listen on is taken by another process."""


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on ``host:port`` and we could bind it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on now (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
