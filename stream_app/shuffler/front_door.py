"""The shuffler's front door: devices upload over HTTP (``ptt shuffler --http-port P``).

``POST /v1/reports`` takes one device's reports of one epoch (bodies:
:mod:`~stream_app.shuffler.door_policy`), forwards each report's bytes unchanged as its own
record to the device topic -- a fresh random key, header ``ptt-kind: device_report`` only, as
``ptt replay --via-shuffler`` writes them -- and answers ``202`` only once the broker
acknowledged every record of the request (acks=all), with the (partition, offset) of each;
``4xx`` with a JSON reason when the request is refused (nothing of it is written), ``503`` when
the broker does not acknowledge in time (the client retries the whole request; a record
written before the failure is then written again, and the shuffler keeps one report per
enrolled device and slot). ``GET /v1/health`` answers ``200`` once the door is up.

It runs in the shuffler's process, on its own thread and event loop (aiohttp, aiokafka): the
shuffler's loop is untouched, and :meth:`FrontDoor.stop` (the shuffler's SIGTERM/SIGINT) stops
taking connections, lets requests in flight finish (at most ``http_stop_grace_s``) and closes
the producer. aiokafka's producer is not idempotent here: its InitProducerId fails on the
embedded broker (tests/benchmarks/bench_produce.py); acks=all still makes a 202 durable.

Nothing it logs names a client: aiohttp's access log is off, and the server's own error lines
have their arguments (the peer's address among them) blanked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import secrets
import threading
import time
import weakref
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.connection import aiokafka_options, producer_options
from schemas.device_binary import device_of
from schemas.kafka_io import BrokerUnavailable, ensure_topics

from .door_policy import Accepted, DoorLimits, Refusal, TokenBucket, parse_request, refusal
from .release import KIND_HEADER
from .settings import ShufflerSettings

__all__ = ["FrontDoor", "door_limits"]

log = logging.getLogger(__name__)
_HEADERS = [(KIND_HEADER, b"device_report")]


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
                      rate_per_s=s.http_rate_per_s, burst=s.http_burst)


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type="application/json",
                        headers=headers)


def _refused(r: Refusal, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=r.status, body=r.body(), content_type="application/json", headers=headers)


class FrontDoor:
    """The HTTP front door of one shuffler instance; :meth:`start` returns once it listens."""

    def __init__(self, settings: ShufflerSettings) -> None:
        self.s = settings
        self.limits = door_limits(settings)
        self.accepted_requests = 0
        self.accepted_reports = 0
        self.refused: dict[str, int] = {}
        self._buckets: weakref.WeakKeyDictionary[Any, TokenBucket] = weakref.WeakKeyDictionary()
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
        self._loop = asyncio.get_running_loop()
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
        # a record's partition is drawn here, uniformly (aiokafka's partitioner hashes each key in
        # pure Python: a third of the door's time per report, measured)
        self._partitions = sorted(await self._producer.partitions_for(s.device_topic))
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_post("/v1/reports", self._reports)
        app.router.add_get("/v1/health", self._health)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, logger=_server_log,
                               shutdown_timeout=s.http_stop_grace_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, s.http_host, s.http_port, backlog=1024)
            try:
                await site.start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(f"the HTTP port {s.http_host}:{s.http_port} is already in use; give another "
                                    "--http-port") from None
                raise
            self._ready.set()
            await self._stopping.wait()
        finally:
            await runner.cleanup()
            await self._producer.stop()

    async def _health(self, request: web.Request) -> web.Response:
        return _json(200, {"ok": True})

    def _bucket(self, request: web.Request) -> TokenBucket:
        conn = request.transport if request.transport is not None else request.protocol
        bucket = self._buckets.get(conn)
        if bucket is None:
            bucket = self._buckets[conn] = TokenBucket(self.limits.rate_per_s, self.limits.burst, time.monotonic())
        return bucket

    def _refuse(self, r: Refusal, headers: dict[str, str] | None = None) -> web.Response:
        self.refused[r.reason] = self.refused.get(r.reason, 0) + 1
        return _refused(r, headers)

    async def _reports(self, request: web.Request) -> web.Response:
        bucket = self._bucket(request)
        now = time.monotonic()
        if not bucket.take(now):
            wait = bucket.retry_after(now)
            return self._refuse(refusal("rate_limited", f"at most {self.limits.rate_per_s:g} requests/s per "
                                                        f"connection (burst {self.limits.burst})"),
                                {"Retry-After": str(max(1, round(wait + 0.5)))})
        length = request.content_length
        if length is not None and length > self.limits.max_body_bytes:
            return self._refuse(refusal("too_large", f"{length} bytes, at most {self.limits.max_body_bytes}"),
                                {"Connection": "close"})
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(refusal("too_large", f"more than {self.limits.max_body_bytes} bytes"),
                                {"Connection": "close"})
        got = parse_request(request.headers.get("Content-Type", ""), body, self.limits)
        if isinstance(got, Refusal):
            return self._refuse(got)
        return await self._forward(got)

    async def _forward(self, got: Accepted) -> web.Response:
        s = self.s
        if s.http_fault_hold_s and s.http_fault_point == "before_send":
            log.warning("fault injection: holding a request before its reports are sent")
            await asyncio.sleep(s.http_fault_hold_s)
        keys = secrets.token_bytes(16 * len(got.records))
        try:
            parts = self._partitions
            futures = [await self._producer.send(s.device_topic, value=raw, key=keys[16 * i:16 * i + 16],
                                                 partition=_partition(raw, parts), headers=_HEADERS)
                       for i, raw in enumerate(got.records)]
            metas = await asyncio.wait_for(asyncio.gather(*futures), timeout=s.http_ack_timeout_s)
        except (KafkaError, TimeoutError, OSError) as exc:
            self.refused["broker_unavailable"] = self.refused.get("broker_unavailable", 0) + 1
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
                f"refused requests: {refused}")


def _partition(raw: bytes, parts: list[int]) -> int:
    """A report's device partition: its device's (id mod partitions: where a shuffler with
    several instances looks for all of a device's reports), or, naming no device (refused by
    the shuffler as unauthenticated), one drawn uniformly."""
    device = device_of(raw)
    return parts[device % len(parts)] if device is not None else parts[secrets.randbelow(len(parts))]
