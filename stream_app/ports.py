"""Ports a process listens on: :class:`PortInUse` (the command line's exit code 4), whether a
loopback port is free, and a free one. Below both the command line (``stream_app/cli/``) and
the servers that bind ports themselves (the shuffler's front door), so neither imports the other.

A free port is drawn below the kernel's ephemeral range, so that no outgoing connection (whose
local port the kernel takes from that range) can take it between its choice and its bind:

>>> low, high = ephemeral_range()
>>> 1024 < low <= high < 65536
True
>>> free_port() < low and port_free(free_port())
True
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

__all__ = ["PortInUse", "ephemeral_range", "free_port", "port_free"]

_LOWEST = 10_000  # below: the well-known and the commonly configured ports


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


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A loopback port nothing listens on now, drawn at random below the ephemeral range (another
    process may still take it before it is bound, but no outgoing connection will); any free
    port if that range leaves too little room below it."""
    low = ephemeral_range()[0]
    for _ in range(100 if low - _LOWEST >= 1000 else 0):
        port = _LOWEST + secrets.randbelow(low - _LOWEST)
        if port_free(port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
