"""``ptt replay --via-shuffler --transport http``: one producer's devices of one epoch as HTTP
requests to the shuffler's front door, one request per simulated device.

A request holds one device's reports of the epoch: every round of every query it answers --
a 30-s query's of this epoch, and a span query's one report of the span that ends with this
epoch (its epoch field the span's first; ``producers.replay``). The simulator's vehicles are
positions re-drawn per query and per span (``producers.fleet``), so "device j" of an epoch is
the j-th vehicle of each query -- a container for the reports that one device would send
together; the front door forwards each report as its own record and nothing links them after
the shuffler.

The front door answers each request with the (partition, offset) of its records; the replay's
source note of the epoch vouches for the device-topic offsets below which its reports lie
(:func:`send_source_epoch`), so they are merged into the sink's acknowledged
ends, as the Kafka path's acknowledgements are.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

import numpy as np

from estimators.reports import Bitmaps, Counts, Pairs, Values
from schemas import Query, SourceEpoch, encode_json
from schemas.device_binary import (
    encode_device_bitmap_rows,
    encode_device_bitmaps,
    encode_device_pairs,
    encode_device_values,
)
from schemas.enrollment import Enrollment

from .fleet import EpochReports
from .http_client import DeliveryFailed, DeviceClient, FrontDoorUnavailable, NotSent, Offsets
from .settings import ReplaySettings
from .sink import ReportSink
from .stopping import Stops

__all__ = ["CHUNK_DEVICES", "DeviceRequests", "device_records", "send_device_reports", "send_source_epoch"]

KIND_HEADER = "ptt-kind"

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
        """Send every device's request (a stop cuts between chunks, and within one: no request is
        sent, or sent again, after it); what the front door acknowledged is counted in ``sink``
        (reports, records, the device topic's acked ends), what failed as its delivery failures,
        what a stop left unsent not at all."""
        todo = [d for d in self.devices if d]
        for at in range(0, len(todo), CHUNK_DEVICES):
            if stop.requested:
                return
            chunk = todo[at:at + CHUNK_DEVICES]
            n = sum(len(d) for d in chunk)
            sink.sent_reports += n
            sink.sent_batches += n
            answers = client.send_many(chunk, stop)
            if all(isinstance(got, DeliveryFailed) for got in answers):  # not one got through: it is gone
                client.check()
                raise FrontDoorUnavailable(f"no request of {len(chunk)} got through to {client.url}: {answers[0]}")
            for device, got in zip(chunk, answers, strict=True):
                if isinstance(got, NotSent):  # the stop came first: an interrupted epoch's unsent share
                    sink.sent_reports -= len(device)
                    sink.sent_batches -= len(device)
                    continue
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


def device_records(q: Query, epoch: int, er: EpochReports, enrollment: Enrollment, first_device: int = 0
                   ) -> list[tuple[np.ndarray, list[bytes]]]:
    """Every participating device's report of every round of ``q`` in the binary layout
    (:mod:`schemas.device_binary`; station-valued reports encoded as one array per round),
    sealed with its device's key (:mod:`schemas.enrollment`: the vehicle at position ``v`` of
    this producer's epoch is enrolled device ``first_device + v``), per round with the simulated
    vehicle behind each (its index in this producer's epoch); a per-sensor device with no
    non-default answer has an empty ``pairs`` (it still counts). A per-sensor query with outputs
    {0, 1} and default 0 (unary RR, RR) sends a round as bitmaps unless its mechanism expects
    so few ones that station ids are smaller (:meth:`~estimators.PerStation.sparse_bits`: 8
    bytes a pair against ceil(V / 8); the same choice for every device of the round)."""
    out: list[tuple[np.ndarray, list[bytes]]] = []
    if not er.participants:  # refused (audit or day budget): no device sends anything
        return out
    bitmap_ok = q.per_station is not None and q.n_outputs == 2 and q.default_report == 0
    samplers = q.per_station
    for r, rnd in enumerate(er.rounds):
        vehicles = np.asarray(er.vehicles[r]) if isinstance(rnd, Values) else np.arange(er.participants)
        devices = (first_device + vehicles).tolist()
        smaller = bitmap_ok and samplers is not None and not samplers[r].sparse_bits()  # the mechanism's choice
        head = (q.query_id, q.version, epoch, r)
        match rnd:
            case Values():
                messages = encode_device_values(*head, rnd.value, np.asarray(devices))
            case Bitmaps() if smaller:
                messages = encode_device_bitmap_rows(*head, q.n_stations, rnd.rows, np.asarray(devices))
            case Pairs() if smaller and bool(np.all(rnd.output == 1)):
                messages = encode_device_bitmaps(*head, q.n_stations, er.participants, er.vehicles[r], rnd.station,
                                                 np.asarray(devices))
            case Pairs() | Bitmaps():  # station ids, grouped by device
                sparse = rnd.sparse(er.vehicles[r], q.n_stations)
                order = np.argsort(sparse.vehicle, kind="stable")
                bounds = np.searchsorted(sparse.vehicle[order], np.arange(er.participants + 1))
                messages = encode_device_pairs(*head, bounds, sparse.station[order], sparse.output[order],
                                               np.asarray(devices))
            case Counts():
                raise ValueError(f"{q.query_id}: a tally is not sent device by device")
        out.append((vehicles, enrollment.seal_messages(messages, devices)))
    return out


def send_device_reports(sink: ReportSink, q: Query, epoch: int, er: EpochReports, stop: Stops, enrollment: Enrollment,
                        first_device: int = 0) -> None:
    """--via-shuffler (Kafka): every device report (:func:`device_records`) as its own record,
    with no key and no header (docs/wire.md, "Device topic"), on the partition ``device id mod
    partitions`` (where a shuffler with several instances looks for all of a device's reports),
    handed over at once (:meth:`ReportSink.send_many`, librdkafka)."""
    parts = np.asarray(sink.partitions)
    for vehicles, records in device_records(q, epoch, er, enrollment, first_device):
        partitions = parts[(first_device + np.asarray(vehicles)) % len(parts)].tolist()
        if stop.requested or sink.send_many(records, stop=stop, partitions=partitions) < len(records):
            return

@functools.cache
def _notes_signer(settings: ReplaySettings) -> Enrollment:
    """The enrollment whose notes key signs this replay's source notes."""
    return settings.enrollment()


def send_source_epoch(sink: ReportSink, settings: ReplaySettings, epoch: int, no_data: AbstractSet[int],
                      interrupted: bool, index: int, count: int, opens: bool = False, ends: bool = False) -> None:
    """--via-shuffler: the epoch's source note (:class:`~schemas.SourceEpoch`) on the source-notes
    topic, once this producer's device reports of the epoch are acknowledged: the device-topic
    offsets they lie below, the stations without a source reading, whether the replay stopped
    in it; ``opens``: sent before the first epoch; ``ends``: its last epoch (a span query's span
    it ends inside is cut short there). The shuffler's trusted clock; fleet
    metadata, nothing per vehicle. Signed with the notes key (:meth:`Enrollment.sign_note`,
    derived from the enrollment secret): the shuffler refuses an unsigned note."""
    signer = _notes_signer(settings)  # read once per process: the secret was checked at start
    sink.flush()
    offsets = tuple(sorted((p, o) for (t, p), o in sink.acked_ends.items() if t == settings.device_topic))
    value = encode_json(signer.sign_note(SourceEpoch(
        epoch=epoch, readings_missing=tuple(sorted(no_data)), interrupted=interrupted, opens=opens, ends=ends,
        producer_index=index, producer_count=count, device_offsets=offsets)))
    sink.send(value, key=b"source-epoch", partition=0, topic=settings.source_topic,
              headers=[(KIND_HEADER, b"source_epoch")])
    sink.flush()
