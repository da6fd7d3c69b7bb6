"""producers.http_client.DeviceClient: a stop ends a batch of requests at once, however many
attempts its requests had left (a front door gone mid-epoch: every request refused, each
retried with back-off for ~16 s)."""

from __future__ import annotations

import socket
import threading
import time

from producers.http_client import DeliveryFailed, DeviceClient, NotSent


class _Stop:
    def __init__(self) -> None:
        self.requested = False


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection is refused at once
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_stop_ends_the_retries_of_a_batch_of_requests() -> None:
    stop = _Stop()
    with DeviceClient(f"http://127.0.0.1:{_closed_port()}", concurrency=2) as client:
        timer = threading.Timer(0.5, lambda: setattr(stop, "requested", True))
        timer.start()
        t0 = time.monotonic()
        answers = client.send_many([[b"a"], [b"b"], [b"c"], [b"d"]], stop)
        took = time.monotonic() - t0
    assert took < 2.0, took  # without the stop: 2 waves of 8 attempts, ~16 s each
    assert all(isinstance(a, NotSent) for a in answers), answers
    assert not any(isinstance(a, DeliveryFailed) for a in answers)  # not sent is no delivery failure


def test_without_a_stop_every_attempt_is_made() -> None:
    with DeviceClient(f"http://127.0.0.1:{_closed_port()}", attempts=3) as client:
        (answer,) = client.send_many([[b"a"]], _Stop())
    assert isinstance(answer, DeliveryFailed) and "after 3 attempts" in str(answer), answer
    assert client.retries == 2
