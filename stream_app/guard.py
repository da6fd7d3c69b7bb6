"""The worker's watch over its broker: a lost broker stops the worker with one line.

Faust and aiokafka retry a broker that is gone forever, logging errors (or, after an
embedded broker's restart, ``UnknownTopicOrPartition``) without ever giving up. The guard
asks the broker about the worker's topics every few seconds, in a thread of its own (so it
sees a loss even while Faust is still starting or recovering), and feeds the answers to
:class:`~schemas.kafka_io.BrokerHealth`: silent for ``broker_loss_timeout_s``, a topic gone
(absent from the answers for :func:`~schemas.kafka_io.confirm_period_s`) or recreated, and the
broker is lost. Its baseline (:meth:`BrokerGuard.know`) is what the broker showed once the
worker had ensured its topics: a topic about to be created is never gone. The worker's own
publishes report failures that outlast the same bound (:meth:`BrokerGuard.failing`). Then
``on_lost`` runs once: the worker is asked to stop (Faust's own SIGTERM path) and the command
exits with one line and exit code 7 (see :func:`stream_app.worker.app.run_worker`). Faust flushes its
producer before it stops, which never ends while the broker is gone; so the stop gets
:func:`stop_grace_s`, then the process ends anyway: nothing it still holds could reach the
broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from schemas.kafka_io import BrokerWatch
from schemas.settings import BrokerLossSettings

__all__ = ["BrokerGuard", "check_interval_s", "stop_grace_s"]

log = logging.getLogger(__name__)


def check_interval_s(timeout_s: float) -> float:
    """How often the guard asks the broker: a sixth of the loss timeout, within [0.5 s, 5 s].

    >>> check_interval_s(30.0), check_interval_s(1.0), check_interval_s(600.0)
    (5.0, 0.5, 5.0)
    """
    return min(5.0, max(0.5, timeout_s / 6))


def stop_grace_s(timeout_s: float) -> float:
    """How long a worker that lost its broker may take to stop before the process is ended:
    the loss timeout, within [2 s, 10 s].

    >>> stop_grace_s(30.0), stop_grace_s(3.0), stop_grace_s(0.5)
    (10.0, 3.0, 2.0)
    """
    return min(10.0, max(2.0, timeout_s))


class BrokerGuard:
    """Watches ``topics`` on the broker of ``settings``; :attr:`lost` says why once it is lost.

    ``start(on_lost)`` runs the checks in a daemon thread; :meth:`declare` (any thread) gives
    a verdict of the caller's own. ``on_lost`` is called exactly once, from the thread that
    reached the verdict. :meth:`settle` lets exactly one of two reporters (the worker's clean
    stop, or the deadline after :func:`stop_grace_s`) print the error."""

    def __init__(self, settings: BrokerLossSettings, topics: set[str] | list[str]) -> None:
        self.timeout_s = settings.broker_loss_timeout_s
        self.interval_s = check_interval_s(self.timeout_s)
        self._watch = BrokerWatch(settings, topics, self.timeout_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_lost: Callable[[str], None] | None = None
        self._settled = False
        self.lost: str | None = None

    def know(self, topic_ids: dict[str, str]) -> None:
        """The watched topics' ids as the broker showed them once they were ensured
        (:func:`~schemas.kafka_io.ensure_topics`): later answers are compared with these.
        Before :meth:`start`."""
        shown: dict[str, str | None] = {t: topic_ids[t] for t in self._watch.topics if t in topic_ids}
        self._watch.health.seen(shown, self._watch.clock())

    def start(self, on_lost: Callable[[str], None]) -> None:
        self._on_lost = on_lost
        self._thread = threading.Thread(target=self._run, name="ptt-broker-guard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while self.lost is None:  # the first check at once
                verdict = self._watch.check()
                if verdict is not None:
                    self.declare(verdict)
                if self._stop.wait(self.interval_s):
                    break
        finally:
            self._watch.close()

    def failing(self, what: str, since: float, why: str) -> str | None:
        """``what`` has failed without a break since ``since`` (time.monotonic()); past the loss
        timeout the broker counts as lost. Returns the verdict, if any."""
        if self.lost is None and time.monotonic() - since > self.timeout_s:
            self.declare(f"{what} failed for {time.monotonic() - since:.1f}s: {why}")
        return self.lost

    def declare(self, reason: str) -> None:
        """The broker is lost (the first reason sticks); calls ``on_lost`` once."""
        with self._lock:
            if self.lost is not None:
                return
            self.lost = reason
        self._stop.set()
        if self._on_lost is not None:
            self._on_lost(reason)

    def settle(self) -> bool:
        """True for the first caller only: that one reports the loss."""
        with self._lock:
            first, self._settled = not self._settled, True
            return first

    def stop(self) -> None:
        self._stop.set()
