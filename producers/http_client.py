"""A small device client of the shuffler's front door (``POST /v1/reports``, docs/wire.md,
"Devices over HTTP"): each request one device's reports of one epoch, framed
(:mod:`schemas.device_http`).

:class:`DeviceClient` keeps a pool of keep-alive connections on its own event loop thread and
sends many devices' requests at once (``concurrency`` in flight). A request the front door did
not answer ``202`` -- the connection failed or was cut, no answer in time, ``503`` (the broker
did not acknowledge), ``429`` (rate) -- is sent again whole, with back-off, up to ``attempts``
times; the reports of one request are then all written again, and the shuffler keeps one report
per enrolled device and slot. A ``4xx`` refusal is not retried: :class:`Refused` with the
front door's reason. A stop (Ctrl-C, or a helper of ``ptt demo`` gone) is seen every
:data:`STOP_POLL_S`: no request is sent, or sent again, after it (:class:`NotSent`); those in
flight are answered or fail as usual. Without it a front door gone mid-epoch kept the replay
retrying every device of the epoch, 32 at a time and ~16 s each.

>>> DeviceClient.backoff_s(0), DeviceClient.backoff_s(3)
(0.1, 0.8)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import aiohttp

from schemas.device_http import FRAMED, frame
from schemas.kafka_io import BrokerUnavailable

from .stopping import Stops

__all__ = ["STOP_POLL_S", "DeliveryFailed", "DeviceClient", "FrontDoorUnavailable", "NotSent", "Offsets", "Refused"]

Offsets = list[tuple[int, int]]
T = TypeVar("T")
STOP_POLL_S = 0.1  # how often a wait for requests (and a back-off) looks at a stop


class Refused(Exception):
    """The front door refused a request (4xx): its reason and detail."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(f"{status} {reason}: {detail}")
        self.status, self.reason, self.detail = status, reason, detail


class DeliveryFailed(Exception):
    """No ``202`` after every attempt: the last failure."""


class NotSent(Exception):
    """A request not sent (or not sent again after a failed attempt): the replay stopped."""


class FrontDoorUnavailable(BrokerUnavailable):
    """The front door does not answer (at start, or no request of a whole chunk got through):
    the command's one line and exit code 3, as for an unreachable broker."""


class DeviceClient:
    """Devices' uploads to one front door ``url`` (``http://host:port``)."""

    def __init__(self, url: str, concurrency: int = 32, attempts: int = 8, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/v1/reports"
        self.concurrency = concurrency
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.retries = 0  # requests sent again (each attempt after the first)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="device-client", daemon=True)
        self._thread.start()
        self._session: aiohttp.ClientSession | None = self._call(self._open()).result()

    @staticmethod
    def backoff_s(attempt: int) -> float:
        """The wait before attempt ``attempt + 1``: 0.1 s doubling, at most 5 s."""
        return float(min(5.0, 0.1 * 2 ** attempt))

    def _call(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.concurrency, keepalive_timeout=30)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def _post(self, body: bytes, content_type: str, halt: threading.Event | None = None) -> Offsets:
        if self._session is None:
            raise DeliveryFailed("the client is closed")
        last = "no attempt"
        for attempt in range(self.attempts):
            if halt is not None and halt.is_set():
                raise NotSent("stopped before it was sent" if not attempt else f"stopped after {last}")
            if attempt:
                self.retries += 1
            wait = self.backoff_s(attempt)
            try:
                async with self._session.post(self.url, data=body, headers={"Content-Type": content_type}) as r:
                    text = await r.read()
                    if r.status == 202:
                        return [(int(p), int(o)) for p, o in json.loads(text)["offsets"]]
                    try:
                        got = json.loads(text)
                        reason, detail = str(got["reason"]), str(got.get("detail", ""))
                    except (ValueError, KeyError, TypeError):
                        reason, detail = f"http_{r.status}", text[:200].decode(errors="replace")
                    if r.status not in (429, 503):
                        raise Refused(r.status, reason, detail)
                    last = f"{r.status} {reason}"
                    with contextlib.suppress(ValueError):
                        wait = max(wait, float(r.headers.get("Retry-After", "0")))
            except (aiohttp.ClientError, TimeoutError) as exc:  # cut, refused, reset, no answer in time
                last = f"{type(exc).__name__}: {exc}"
            until = self._loop.time() + wait
            while (left := until - self._loop.time()) > 0 and not (halt is not None and halt.is_set()):
                await asyncio.sleep(min(left, STOP_POLL_S))
        raise DeliveryFailed(f"no 202 from {self.url} after {self.attempts} attempts ({last})")

    async def _post_all(self, bodies: Sequence[bytes], content_type: str, halt: threading.Event | None = None
                        ) -> list[Offsets | BaseException]:
        gate = asyncio.Semaphore(self.concurrency)

        async def one(body: bytes) -> Offsets:
            async with gate:
                return await self._post(body, content_type, halt)

        return list(await asyncio.gather(*(one(b) for b in bodies), return_exceptions=True))

    async def _health(self, timeout_s: float) -> str | None:
        if self._session is None:
            return "the client is closed"
        try:
            async with self._session.get(self.url.replace("/v1/reports", "/v1/health"),
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return None if r.status == 200 else f"GET /v1/health answered {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def check(self, timeout_s: float = 10.0) -> None:
        """:class:`FrontDoorUnavailable` unless the front door answers its health check."""
        why = self._call(self._health(timeout_s)).result()
        if why is not None:
            raise FrontDoorUnavailable(f"cannot reach the shuffler's front door at {self.url} ({why}); is `ptt "
                                       "shuffler --http-port` running there? Set --front-door-url")

    def send(self, records: Sequence[bytes]) -> Offsets:
        """One device's reports of one epoch in one request; the (partition, offset) of each."""
        return self._call(self._post(frame(records), FRAMED)).result()

    def send_many(self, devices: Sequence[Sequence[bytes]], stop: Stops | None = None
                  ) -> list[Offsets | BaseException]:
        """Many devices' requests, ``concurrency`` at once; per device the offsets of its reports,
        or what failed it (:class:`Refused`, :class:`DeliveryFailed`; :class:`NotSent` once
        ``stop.requested``, looked at in this thread every :data:`STOP_POLL_S`)."""
        halt = threading.Event()
        done = self._call(self._post_all([frame(d) for d in devices], FRAMED, halt))
        while True:
            try:
                return done.result(timeout=None if stop is None or halt.is_set() else STOP_POLL_S)
            except FutureTimeout:
                if stop is not None and stop.requested:
                    halt.set()

    def send_bodies(self, bodies: Sequence[bytes], content_type: str) -> list[Offsets | BaseException]:
        """Ready-made bodies of ``content_type`` (tests: any body a device could send)."""
        return self._call(self._post_all(bodies, content_type)).result()

    def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._call(self._session.close()).result(timeout=10)
            self._session = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> DeviceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
