"""Slow clients against an HTTP server (the shuffler's front door, or nginx in front of it), for
the tests and the benchmarks alike: a slowloris connection sends a request's first header bytes,
then one more byte at every :func:`tick`, and never finishes its headers. Used by
tests/integration/test_front_door.py and the front door's benchmarks.

"""

from __future__ import annotations

import socket

__all__ = ["HEAD", "open_slow", "tick"]

HEAD = b"POST /v1/reports HTTP/1.1\r\nHost: door\r\nX-Slow: "


def open_slow(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A new slow connection (non-blocking once its first bytes are sent); ``OSError`` when it
    cannot be opened."""
    s = socket.create_connection((host, port), timeout=5)
    try:
        s.sendall(HEAD)
    except OSError:
        s.close()
        raise
    s.setblocking(False)
    return s


def tick(live: list[socket.socket]) -> tuple[list[socket.socket], int]:
    """One more header byte on each connection the server has not closed (a read that sees its
    end or an error, or a send that fails): (those still open, how many were closed -- each
    closed here too)."""
    still, closed = [], 0
    for s in live:
        try:
            if s.recv(4096) == b"":
                raise ConnectionResetError
        except BlockingIOError:
            try:
                s.send(b"a")
                still.append(s)
                continue
            except OSError:
                pass
        except OSError:
            pass
        closed += 1
        s.close()
    return still, closed
