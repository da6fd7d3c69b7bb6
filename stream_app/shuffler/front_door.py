"""The shuffler's front door: devices upload over HTTP (``ptt shuffler --http-port P``).

``POST /v1/reports`` takes one device's reports of one epoch (bodies:
:mod:`~stream_app.shuffler.door_policy`), checks every report's device id and MAC with the
shuffler's own enrollment check, forwards each report's bytes unchanged as its own record to
the device topic -- no key and no header, as ``ptt replay --via-shuffler`` writes them --
and answers ``202`` only once the broker acknowledged
every record of the request (acks=all), with the (partition, offset) of each. A refused
request writes nothing and costs no dead letter: its answer is a JSON reason (``401
unauthenticated``; ``403 unknown_device``, ``bad_mac`` or what :meth:`FrontDoor.device_allowed`
says, e.g. ``revoked``; ``429 rate_limited`` past the device's rate; ``4xx`` for a malformed
request; ``503 busy`` past ``--http-max-in-flight``, ``503 broker_unavailable`` when the broker
does not acknowledge in time -- the client retries the whole request; a record written before
the failure is then written again, and the shuffler keeps one report per enrolled device and
slot). ``GET /v1/health`` answers ``200`` once the door is up.

What a client that does not finish costs is bounded: a connection whose request headers have
not arrived within ``--http-idle-timeout-s`` of its opening or its last answer is closed, a
body that has not arrived within ``--http-body-timeout-s`` is ``408 slow_body``, header lines
are at most ``--http-max-header-bytes``, and at most ``--http-max-connections`` connections (never more
than the file-descriptor limit less a reserve) are open: at the cap, the longest-open
connection without a request in progress is closed to make room (as nginx reuses its idle
keep-alive connections), or, with none, the new one is answered ``503 too_many_connections``.
An ``accept()`` that fails anyway (``EMFILE``: the limit lowered under it, or descriptors
used elsewhere) is counted and retried after 0.1 s by the door's own accept loop, never a
traceback per attempt nor a spin. A new connection costs the door no asyncio transport and
no aiohttp handler (protocol objects, a task, a timer) until its first request's headers are
in: the door reads its bare socket and gathers the bytes until the blank line that ends them
(or ``--http-max-header-bytes`` of them, past which aiohttp refuses the request as it would),
and one deadline task closes, oldest first, those whose headers are not in
``--http-idle-timeout-s`` after their opening (counted as ``slow_headers``); aiohttp's
keep-alive timer bounds a connection's later requests from its last answer. A slowloris thus
costs a buffer and a read per byte it sends.
The log has at most one line per refusal reason every ``--http-log-interval-s``, with its count.

It runs on its own thread and event loop (aiohttp, aiokafka) -- ``ptt shuffler`` runs it in a
process of its own (:mod:`~stream_app.shuffler.door_process`), so what reaches the door never
holds the shuffler's interpreter lock -- and :meth:`FrontDoor.stop` (the shuffler's
SIGTERM/SIGINT) stops taking connections, lets requests in flight finish (at most
``http_stop_grace_s``) and closes the producer. aiokafka's producer is not idempotent here:
its InitProducerId fails on the embedded broker (tests/benchmarks/bench_produce.py); acks=all
still makes a 202 durable.

Nothing it logs names a client: aiohttp's access log is off, and the server's own error lines
have their arguments (the peer's address among them) blanked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import resource
import socket
import threading
import time
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.connection import aiokafka_options, producer_options
from schemas.enrollment import Enrollment
from schemas.kafka_io import BrokerUnavailable, ensure_topics

from .door_policy import Accepted, DeviceCheck, DeviceRate, DoorLimits, Refusal, RefusalLog, parse_request, refusal
from .settings import ShufflerSettings

__all__ = ["FD_RESERVE", "FrontDoor", "connection_cap", "door_limits"]

log = logging.getLogger(__name__)
FD_RESERVE = 512  # file descriptors the door keeps for its own: its broker connections, logs, the revocation list


class _NoAddresses(logging.Filter):
    """aiohttp's server lines ("Error handling request from %s") without their arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = tuple("-" for _ in record.args) if isinstance(record.args, tuple) else None
        return True


_server_log = logging.getLogger(f"{__name__}.server")
_server_log.addFilter(_NoAddresses())


def door_limits(s: ShufflerSettings) -> DoorLimits:
    return DoorLimits(max_body_bytes=s.http_max_body_bytes, max_reports=s.http_max_reports,
                      device_reports_per_s=s.http_device_reports_per_s, device_burst=s.http_device_burst)


def connection_cap(wanted: int, reserve: int = FD_RESERVE) -> int:
    """The open connections the door allows: ``wanted``, at most this process's file-descriptor
    limit less ``reserve`` (the soft limit is first raised to the hard one), at least 16."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return _within(wanted, soft, reserve)


def _within(wanted: int, soft: int, reserve: int = FD_RESERVE) -> int:
    """``wanted`` connections under the soft file-descriptor limit ``soft`` less ``reserve``, at least 16."""
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft - reserve))


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json",
                        headers=headers)


def _closing_answer(r: Refusal, headers: bytes = b"") -> bytes:
    """A refusal as the bytes of a whole HTTP/1.1 answer that closes its connection: what the
    door sends on a bare socket itself, before aiohttp has it.

    >>> _closing_answer(refusal("busy", "x")).split(b"\\r\\n")[0]
    b'HTTP/1.1 503 Service Unavailable'
    """
    body = r.body()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (r.status, HTTPStatus(r.status).phrase.encode(), headers, len(body), body))


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class _Connection(asyncio.Protocol):
    """One accepted connection and what the door's connection cap needs -- when it opened and
    whether a request is in progress. Until its first request's headers are complete it is a
    bare socket the door reads itself (:meth:`read_head`, a reader on the loop; the bytes
    gathered in ``head``): no asyncio transport, aiohttp handler, task or timer yet -- a
    slowloris costs a buffer and a read per byte. Then the socket becomes asyncio's transport
    with this protocol in front of aiohttp's request handler, which is given what was gathered
    and everything after."""

    __slots__ = ("door", "sock", "inner", "transport", "busy", "head", "opened", "closed")

    def __init__(self, door: FrontDoor, sock: socket.socket) -> None:
        self.door, self.sock = door, sock
        self.inner: Any = None  # aiohttp's handler, once the first request's headers are in
        self.transport: Any = None
        self.busy = 0
        self.head: bytearray | None = bytearray()
        self.opened = time.monotonic()
        self.closed = False

    # -- before its first request's headers are in: the door reads the bare socket ---------------

    def read_head(self) -> None:
        head = self.head
        if head is None:
            return
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # its end (or a reset) before its headers: closed
            self.door._close(self)  # noqa: SLF001 - the door's own bookkeeping
            return
        seen = len(head)
        head += data
        # the headers' end: a blank line (a bare LF ends a line for aiohttp's parser too)
        if head.find(b"\n\r\n", max(0, seen - 2)) >= 0 or head.find(b"\n\n", max(0, seen - 1)) >= 0:
            self.door._hand_over(self)  # noqa: SLF001
        elif len(head) >= self.door.head_limit:  # never handed over: aiohttp would wait for its headers' end unbounded
            self.door._refuse_head(self)  # noqa: SLF001

    # -- after: asyncio's transport, aiohttp's handler behind this protocol ----------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self.closed:  # evicted while its transport was made
            transport.abort()
            return
        self.inner = self.door.handler()
        self.inner.connection_made(transport)
        head, self.head = self.head, None
        if head:
            self.inner.data_received(bytes(head))

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.door._conns.pop(self, None)  # noqa: SLF001
        if self.inner is not None:
            inner, self.inner = self.inner, None
            inner.connection_lost(exc)


_TOO_MANY = _closing_answer(refusal("too_many_connections", "the front door holds its most connections, every one "
                                                             "with a request in progress; retry after Retry-After"),
                            b"Retry-After: 1\r\n")


class FrontDoor:
    """The HTTP front door of one shuffler instance; :meth:`start` returns once it listens.
    ``device_check``: the extra check of an authenticated device id (a revocation list, say),
    :data:`~stream_app.shuffler.door_policy.DeviceCheck`."""

    def __init__(self, settings: ShufflerSettings, device_check: DeviceCheck | None = None) -> None:
        self.s = settings
        self.limits = door_limits(settings)
        self.enrollment: Enrollment = settings.enrollment()
        self.device_check = device_check
        self.accepted_requests = 0
        self.accepted_reports = 0
        self._log = RefusalLog(settings.http_log_interval_s)
        self.refused = self._log.total  # reason -> requests refused (connections, for too_many_connections)
        self._rate = DeviceRate(settings.http_device_reports_per_s, settings.http_device_burst)
        self._conns: dict[_Connection, None] = {}  # open connections, oldest first
        self._heading: dict[_Connection, None] = {}  # of those, the bare sockets before their headers, oldest first
        self._handing: set[asyncio.Task[None]] = set()  # transports being made for them
        self.head_limit = settings.http_max_header_bytes  # a first request's bytes gathered before aiohttp's parser
        self._head_too_large = _closing_answer(refusal(
            "headers_too_large", f"a request's headers end within {self.head_limit} bytes"))
        self.handler: Any = None  # aiohttp's request handlers' factory
        self.max_connections = settings.http_max_connections
        self.evicted = 0
        self.in_flight = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._producer: Any = None
        self._partitions: list[int] = []

    # -- lifecycle (the caller's thread) --------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> None:
        """Ensure the device topic, connect the producer, listen; raises what stopped it
        (:class:`~stream_app.cli.local_broker.PortInUse`, :class:`BrokerUnavailable`)."""
        s = self.s
        self.max_connections = connection_cap(s.http_max_connections)
        ensure_topics(s, {s.device_topic: s.device_partitions}, compacted=set())
        self._thread = threading.Thread(target=self._run, name="front-door", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.stop()
            raise BrokerUnavailable(f"the HTTP front door did not start within {timeout_s:g}s")
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        """Stop listening, finish what is in flight (bounded), close the producer."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        if thread is not None:
            thread.join(self.s.http_stop_grace_s + 15)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it in the caller
            self._failure = self._failure or exc
        finally:
            self._ready.set()

    # -- the server (its own thread and loop) ------------------------------------------------

    async def _serve(self) -> None:
        from stream_app.ports import PortInUse  # the command line's exit code 4

        s = self.s
        self._loop = loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_error)
        self._stopping = asyncio.Event()
        self._producer = AIOKafkaProducer(**aiokafka_options(s), **producer_options(s, s.device_topic), acks="all",
                                          enable_idempotence=False, linger_ms=s.http_linger_ms,
                                          max_request_size=8 * 1024 * 1024)
        try:
            await self._producer.start()
        except (KafkaError, OSError) as exc:
            with contextlib.suppress(Exception):
                await self._producer.stop()
            raise BrokerUnavailable(f"the front door's producer cannot reach the broker at "
                                    f"{s.bootstrap_servers} ({exc})") from None
        # a record's partition is its device's (device id mod partitions: where a shuffler with
        # several instances looks for all of a device's reports)
        self._partitions = sorted(await self._producer.partitions_for(s.device_topic))
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_post("/v1/reports", self._reports)
        app.router.add_get("/v1/health", self._health)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=_server_log,
                               shutdown_timeout=s.http_stop_grace_s, keepalive_timeout=s.http_idle_timeout_s,
                               max_line_size=s.http_max_header_bytes, max_field_size=s.http_max_header_bytes,
                               max_headers=32, lingering_time=1.0)
        await runner.setup()
        listener: socket.socket | None = None
        ticker = asyncio.create_task(self._tick())
        deadlines = asyncio.create_task(self._header_deadlines())
        accepting: asyncio.Task[None] | None = None
        try:
            handlers = runner.server
            if handlers is None:
                raise RuntimeError("aiohttp's runner has no server after setup")
            try:
                # not longer (bench_door_slow --load-procs 6: with 4,096 a fresh device waited behind
                # thousands of reconnecting slow clients past its 10 s timeout; 1,024 drops the excess
                # SYNs instead, retried by their clients a second later)
                listener = socket.create_server((s.http_host, s.http_port), backlog=1024)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(f"the HTTP port {s.http_host}:{s.http_port} is already in use; give another "
                                    "--http-port") from None
                raise
            listener.setblocking(False)
            self.handler = handlers
            accepting = asyncio.create_task(self._accept(listener))
            self._ready.set()
            await self._stopping.wait()
        finally:
            if accepting is not None:
                accepting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await accepting
            if listener is not None:
                listener.close()
            ticker.cancel()
            deadlines.cancel()
            for conn in list(self._heading):  # aiohttp's cleanup knows only its own handlers'
                self._close(conn)
            await runner.cleanup()
            await self._producer.stop()
            self._say(self._log.flush())

    async def _accept(self, listener: socket.socket) -> None:
        """The door's own accept loop (not asyncio's server: on EMFILE that retries its whole
        backlog at once and reports every failure -- 6,000 a second measured): a connection
        at a time, taken as a bare socket (:meth:`_take`); out of file descriptors, one failure
        counted and a pause of 0.1 s (never a spin), the connections waiting in the kernel's
        backlog meanwhile."""
        loop = asyncio.get_running_loop()
        taken = 0
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._log.add("accept_failed_out_of_file_descriptors", time.monotonic())
                    await asyncio.sleep(0.1)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the client gave up before it was taken
                raise
            self._take(loop, conn)
            taken += 1
            if taken % 64 == 0:
                await asyncio.sleep(0)  # a burst of connections does not hold the loop

    def _take(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        """A new connection: admitted (:meth:`_admit`) and read by the door until its first
        request's headers are in, or answered 503 ``too_many_connections`` and closed."""
        sock.setblocking(False)
        conn = _Connection(self, sock)
        if not self._admit(conn):
            with contextlib.suppress(OSError):
                sock.send(_TOO_MANY)
            sock.close()
            return
        self._heading[conn] = None
        loop.add_reader(sock.fileno(), conn.read_head)
        conn.read_head()  # what has arrived with the handshake (a device's whole request, often): read at once

    def _refuse_head(self, conn: _Connection) -> None:
        """A first request whose headers have not ended within ``head_limit`` bytes: answered 431
        ``headers_too_large`` and closed (aiohttp's parser would refuse a line that long, but
        would wait, with no deadline, for the end of many lines each under it)."""
        self._refuse_reason("headers_too_large")
        with contextlib.suppress(OSError):
            conn.sock.send(self._head_too_large)
        self._close(conn)

    def _hand_over(self, conn: _Connection) -> None:
        """A connection whose first request's headers are in (or past the limit): asyncio's
        transport for its socket, aiohttp's handler behind (:meth:`_Connection.connection_made`)."""
        del self._heading[conn]
        loop = asyncio.get_running_loop()
        loop.remove_reader(conn.sock.fileno())
        task = loop.create_task(self._connect(loop, conn))
        self._handing.add(task)
        task.add_done_callback(self._handing.discard)

    async def _connect(self, loop: asyncio.AbstractEventLoop, conn: _Connection) -> None:
        try:
            await loop.connect_accepted_socket(lambda: conn, conn.sock)
        except OSError:
            self._close(conn)
            conn.sock.close()

    def _close(self, conn: _Connection) -> None:
        """Close a connection at once: a bare socket before its headers, or its transport."""
        conn.closed = True
        self._conns.pop(conn, None)
        if conn in self._heading:
            del self._heading[conn]
            conn.head = None
            asyncio.get_running_loop().remove_reader(conn.sock.fileno())
            conn.sock.close()
        elif conn.transport is not None:
            conn.transport.abort()

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """The door loop's errors counted per message, logged as the refusals are (one line with
        its count an interval, no traceback)."""
        exc = context.get("exception")
        what = str(context.get("message") or "error")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
            what = "accept_failed_out_of_file_descriptors"
        elif exc is not None:
            what = f"{what} ({type(exc).__name__})"
        self._log.add(f"loop: {what}", time.monotonic())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.s.http_log_interval_s))
            self._say(self._log.due(time.monotonic()))

    async def _header_deadlines(self) -> None:
        """Close, oldest first, the connections whose first request's headers are not complete
        ``http_idle_timeout_s`` after their opening; sleep until the next one is due (a
        connection opened later is due later). One task for every connection, never a timer each;
        at most ``batch`` closed at a time, the loop's other work between (thousands opened in
        the same second are due in the same second: closed at once, they held a fresh device's
        request 2 s on a loaded core)."""
        timeout, batch = self.s.http_idle_timeout_s, 128
        while True:
            now, closed = time.monotonic(), 0
            heading = self._heading
            while heading and closed < batch:
                conn = next(iter(heading))
                if conn.opened + timeout > now:
                    break
                self._close(conn)
                closed += 1
            if closed:
                self._log.add("slow_headers", now, closed)
            if closed == batch:
                await asyncio.sleep(0)  # more may be due: the loop's other callbacks first
                continue
            due = next(iter(heading)).opened + timeout if heading else now + timeout
            await asyncio.sleep(max(0.05, due - now))

    def _say(self, lines: list[tuple[str, int]]) -> None:
        for reason, n in lines:
            log.warning("front door: %d refused (%s) since this reason's last line", n, reason)

    # -- connections -------------------------------------------------------------------------

    def _admit(self, conn: _Connection) -> bool:
        """A new connection: taken (at the cap, the longest-open connections without a request
        in progress are closed for it), or refused (every one is busy). The cap follows the
        file-descriptor limit as it is now (``prlimit`` may lower it under a running process)."""
        cap = _within(self.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        while len(self._conns) >= cap:
            victim = next((c for c in self._conns if not c.busy), None)
            if victim is None:
                self._refuse_reason("too_many_connections")
                return False
            self._close(victim)
            self.evicted += 1
            self._refuse_reason("evicted_idle_connection")
        self._conns[conn] = None
        return True

    def _refuse_reason(self, reason: str) -> None:
        self._log.add(reason, time.monotonic())

    # -- requests ----------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return _json(200, {"ok": True})

    def _refuse(self, r: Refusal, headers: dict[str, str] | None = None) -> web.Response:
        self._refuse_reason(r.reason)
        return web.Response(status=r.status, body=r.body(), content_type="application/json", headers=headers)

    def device_allowed(self, device: int) -> str | None:
        """The door's one check of an authenticated device id, once per request after its MACs
        verified: None if it may send, else the reason it is refused (403). Enrolled is
        allowed; ``device_check`` (a revocation list, say) may refuse more."""
        return None if self.device_check is None else self.device_check(device)

    async def _reports(self, request: web.Request) -> web.Response:
        if self.in_flight >= self.s.http_max_in_flight:
            return self._refuse(refusal("busy", f"{self.in_flight} requests in progress, at most "
                                                f"{self.s.http_max_in_flight}"), _retry_after(1))
        conn = request.transport.get_protocol() if request.transport is not None else None
        conn = conn if isinstance(conn, _Connection) else None
        self.in_flight += 1
        if conn is not None:
            conn.busy += 1
        try:
            return await self._report(request)
        finally:
            self.in_flight -= 1
            if conn is not None:
                conn.busy -= 1

    async def _report(self, request: web.Request) -> web.Response:
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            return self._refuse(refusal("too_large", f"{length} bytes, at most {self.limits.max_body_bytes}"),
                                {"Connection": "close"})
        try:
            async with asyncio.timeout(self.s.http_body_timeout_s):
                body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(refusal("too_large", f"more than {self.limits.max_body_bytes} bytes"),
                                {"Connection": "close"})
        except TimeoutError:
            return self._refuse(refusal("slow_body", f"the body did not arrive within {self.s.http_body_timeout_s:g}s"),
                                {"Connection": "close"})
        self.enrollment.refresh_revocation()  # one stat; the list re-read when its file changed
        got = parse_request(request.headers.get("Content-Type", ""), body, self.limits, self.enrollment)
        if isinstance(got, Refusal):
            return self._refuse(got)
        if got.device is None:  # cannot be: verified records name their (one) enrolled device
            return self._refuse(refusal("unauthenticated", "a report without a device id and MAC"))
        why = self.device_allowed(got.device)
        if why is not None:
            return self._refuse(refusal(why, "this device may not send reports"))
        wait = self._rate.take(got.device, len(got.records), time.monotonic())
        if wait is not None:
            return self._refuse(refusal("rate_limited", f"at most {self.limits.device_reports_per_s:g} reports/s per "
                                                        f"device (burst {self.limits.device_burst})"),
                                _retry_after(wait))
        return await self._forward(got, got.device)

    async def _forward(self, got: Accepted, device: int) -> web.Response:
        s = self.s
        if s.http_fault_hold_s and s.http_fault_point == "before_send":
            log.warning("fault injection: holding a request before its reports are sent")
            await asyncio.sleep(s.http_fault_hold_s)
        try:
            parts = self._partitions
            partition = parts[device % len(parts)]
            futures = [await self._producer.send(s.device_topic, value=raw, partition=partition)
                       for raw in got.records]
            metas = await asyncio.wait_for(asyncio.gather(*futures), timeout=s.http_ack_timeout_s)
        except (KafkaError, TimeoutError, OSError) as exc:
            self._refuse_reason("broker_unavailable")
            return _json(503, {"reason": "broker_unavailable",
                               "detail": f"the broker did not acknowledge every report ({type(exc).__name__}); "
                                         "send the whole request again"}, {"Retry-After": "1"})
        if s.http_fault_hold_s and s.http_fault_point == "after_ack":
            log.warning("fault injection: holding a request after its reports were acknowledged")
            await asyncio.sleep(s.http_fault_hold_s)
        self.accepted_requests += 1
        self.accepted_reports += len(metas)
        return _json(202, {"accepted": len(metas), "offsets": [[m.partition, m.offset] for m in metas]})

    def line(self) -> str:
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(self.refused.items())) or "none"
        return (f"front door: {self.accepted_reports:,} reports accepted in {self.accepted_requests:,} requests; "
                f"refused: {refused}")
