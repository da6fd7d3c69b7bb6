"""The front door's first-request gathering with a real broker (an in-process door): a new
connection's bytes are gathered on its bare socket until its first request's headers are in,
then handed to aiohttp; headers never finished are closed at their deadline."""

from __future__ import annotations

import http.client
import json
import math
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from schemas.device_binary import encode_device
from schemas.device_http import FRAMED, frame
from tests.devices import enrollment

from .kafka_helpers import drain
from .stream_helpers import wait_for
from .test_front_door import _door_settings

pytestmark = pytest.mark.integration


def _raw_request(records: list[bytes]) -> bytes:
    body = frame(records)
    return (b"POST /v1/reports HTTP/1.1\r\nHost: door\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (FRAMED.encode(), len(body)) + body)


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    r = http.client.HTTPResponse(sock)
    r.begin()
    return r.status, r.read()


def _closed_after(sock: socket.socket, t0: float, limit_s: float, trickle: bool = False) -> float:
    """Seconds from ``t0`` until the server closes ``sock`` (its end or a reset), sending a
    byte every 0.1 s meanwhile when ``trickle``; ``inf`` if not within ``limit_s``."""
    import select

    sock.setblocking(False)
    while time.monotonic() - t0 < limit_s:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - t0
            except BlockingIOError:
                continue
            except OSError:
                return time.monotonic() - t0
        elif trickle:
            try:
                sock.send(b"a")
            except OSError:
                return time.monotonic() - t0
    return math.inf


def test_headers_in_pieces_are_served_and_headers_never_finished_are_closed_at_their_deadline(
        broker: str, tmp_path: Path) -> None:
    """A new connection's bytes are gathered until its first request's headers end (no aiohttp
    handler before): a request whose headers arrive in pieces (the blank line split across
    four reads) is answered 202, and so are two requests sent at once. Headers that have
    not ended within --http-max-header-bytes -- one line past it, or 30 lines each well under
    it -- are answered 431 ``headers_too_large`` at once and closed, neither left to the
    deadline nor handed to aiohttp (whose parser has no deadline for them). A connection that
    sends nothing, and one that trickles a header a byte every 0.1 s, are closed
    --http-idle-timeout-s (2 s) after their opening -- not before -- and counted
    ``slow_headers``; a connection idle after its answer is still closed by aiohttp's
    keep-alive timer, the idle timeout after that answer."""
    from stream_app.shuffler.front_door import FrontDoor

    timeout = 2.0
    ss = _door_settings(broker, tmp_path).model_copy(update={"http_idle_timeout_s": timeout})
    door = FrontDoor(ss)
    door.start()
    e = enrollment()

    def records(d: int) -> list[bytes]:
        return [e.seal(encode_device("q", 1, 9_000_000, r, value=r), d) for r in (0, 1)]

    def connect() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", ss.http_port), timeout=10)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    pool = ThreadPoolExecutor(3)
    try:
        t_silent = time.monotonic()
        silent = connect()
        closing = {"silent": pool.submit(_closed_after, silent, t_silent, 3 * timeout + 5)}
        t_trickle = time.monotonic()
        trickling = connect()
        trickling.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: door\r\nX-Slow: ")
        closing["trickling"] = pool.submit(_closed_after, trickling, t_trickle, 3 * timeout + 5, True)
        pieces = connect()
        request = _raw_request(records(21))
        head = request.index(b"\r\n\r\n") + 4
        # the head in pieces of 16 bytes, its last 8 (the blank line among them) a byte at a time: a
        # few dozen sends, far inside the 2 s deadline however busy the machine
        cuts = [*range(0, head - 8, 16), *range(head - 8, head + 1)]
        for a, b in zip(cuts, cuts[1:], strict=False):
            pieces.send(request[a:b])
            time.sleep(0.002)  # paced pieces (each its own read on an idle machine), not a wait for an outcome
        t_body = time.monotonic()  # aiohttp's keep-alive timer starts after its answer, later than this
        pieces.sendall(request[head:])
        status, text = _answer(pieces)
        assert status == 202, text
        closing["idle_after_answer"] = pool.submit(_closed_after, pieces, t_body, 3 * timeout + 5)
        two = connect()
        two.sendall(_raw_request(records(22)) + _raw_request(records(23)))
        assert [_answer(two)[0], _answer(two)[0]] == [202, 202]
        two.close()
        big = connect()  # one line past the limit
        big.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: door\r\nX-Big: " + b"b" * (ss.http_max_header_bytes + 100))
        many = connect()  # 30 lines each well under it (aiohttp's parser would wait for their end)
        many.sendall(b"POST /v1/reports HTTP/1.1\r\nHost: door\r\n"
                     + b"".join(b"X-Many-%d: %s\r\n" % (i, b"m" * 200) for i in range(30)))
        t_big = time.monotonic()
        for sock in (big, many):
            status, text = _answer(sock)
            assert (status, json.loads(text)["reason"]) == (431, "headers_too_large"), (status, text)
            assert time.monotonic() - t_big < timeout / 2
            assert _closed_after(sock, time.monotonic(), 5) < 5  # the door closed it with its answer
            sock.close()
        closed = {k: f.result() for k, f in closing.items()}
        for s in (silent, trickling, pieces):
            s.close()
        assert all(timeout - 0.1 < t < 2 * timeout + 2 for t in closed.values()), closed
        wait_for(lambda: door.refused.get("slow_headers") == 2, 10, "the two closings counted")
    finally:
        pool.shutdown(wait=True)
        door.stop()
    written = Counter(bytes(r.value) for r in drain(ss, ss.device_topic, quiet_polls=2))
    assert written == Counter(records(21) + records(22) + records(23))
    assert (door.refused.get("slow_headers"), door.refused.get("headers_too_large")) == (2, 2), door.refused
    print(f"closed after (s): {closed}")
