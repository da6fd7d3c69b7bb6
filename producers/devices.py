"""``ptt replay --via-shuffler --transport http``: one producer's devices of one epoch as HTTP
requests to the shuffler's front door, one request per simulated device.

A request holds one device's reports of the epoch: every round of every query it answers.
The simulator's vehicles are positions re-drawn per query (``producers.fleet``), so "device j"
of an epoch is the j-th vehicle of each query -- a container for the reports that one device
would send together; the front door forwards each report as its own record and nothing links
them after the shuffler.

The front door answers each request with the (partition, offset) of its records; the replay's
source note of the epoch vouches for the device-topic offsets below which its reports lie
(:func:`producers.replay.send_source_epoch`), so they are merged into the sink's acknowledged
ends, as the Kafka path's acknowledgements are.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .http_client import DeliveryFailed, DeviceClient, FrontDoorUnavailable, Offsets
from .sink import ReportSink
from .stopping import Stops

__all__ = ["CHUNK_DEVICES", "DeviceRequests"]

CHUNK_DEVICES = 2000  # devices sent between two looks at a stop


class DeviceRequests:
    """The requests of one epoch, device by device.

    >>> d = DeviceRequests()
    >>> d.add([(np.array([1, 0]), [b"a1", b"a0"]), (np.array([0, 1]), [b"b0", b"b1"])])
    >>> d.add([(np.array([0]), [b"c0"])])
    >>> d.devices
    [[b'a0', b'b0', b'c0'], [b'a1', b'b1']]
    """

    def __init__(self) -> None:
        self.devices: list[list[bytes]] = []

    def add(self, rounds: Iterable[tuple[np.ndarray, list[bytes]]]) -> None:
        """One query's rounds: per round the vehicle behind each record, and the records."""
        for vehicles, records in rounds:
            if len(vehicles):
                need = int(vehicles.max()) + 1
                self.devices.extend([] for _ in range(need - len(self.devices)))
            for v, record in zip(vehicles.tolist(), records, strict=True):
                self.devices[v].append(record)

    def send(self, client: DeviceClient, sink: ReportSink, device_topic: str, stop: Stops) -> None:
        """Send every device's request (a stop cuts between chunks); what the front door
        acknowledged is counted in ``sink`` (reports, records, the device topic's acked ends),
        what failed as its delivery failures."""
        todo = [d for d in self.devices if d]
        for at in range(0, len(todo), CHUNK_DEVICES):
            if stop.requested:
                return
            chunk = todo[at:at + CHUNK_DEVICES]
            n = sum(len(d) for d in chunk)
            sink.sent_reports += n
            sink.sent_batches += n
            answers = client.send_many(chunk)
            if all(isinstance(got, DeliveryFailed) for got in answers):  # not one got through: it is gone
                client.check()
                raise FrontDoorUnavailable(f"no request of {len(chunk)} got through to {client.url}: {answers[0]}")
            for device, got in zip(chunk, answers, strict=True):
                if isinstance(got, BaseException):
                    sink.failed += len(device)
                    sink.failure_reasons[type(got).__name__] += len(device)
                    continue
                self._acked(sink, device_topic, got)

    @staticmethod
    def _acked(sink: ReportSink, topic: str, offsets: Offsets) -> None:
        for p, o in offsets:
            where = (topic, p)
            sink.acked_ends[where] = max(sink.acked_ends.get(where, 0), o + 1)
        sink.acked_reports += len(offsets)
        sink.acked_batches += len(offsets)
