"""Privacy on the wire: a real replay's bytes, drained from the real broker, do not link a
vehicle's two Sampling Privacy rounds.

Sampling Privacy's guarantee holds only while a vehicle's round-1 and round-2 reports cannot be
linked (docs/statistics.md, "Privacy accounting": linked, its epsilon is infinite).
``tests/unit/producers/test_fleet.py`` checks that on ``privatize()``'s arrays in memory; here the
reports are followed onto the wire. A per-vehicle replay (3 stations, 4 epochs, 800 vehicles,
batches of 100 over 3 partitions) runs into the session's broker; the test recomputes from the
fleet's seed (``producers.fleet``, pure) which simulated vehicle sent every report, finds
each report's record by content, and then asks whether anything a reader of the topic sees
about a vehicle's round-1 report -- the partition and offset of its record, its index within
the batch, the batch's place in the round, the record's key and timestamp -- says anything
about where its round-2 report is. It also checks that no record header carries anything that
varies with the vehicles (a fixed allow-list) and that keys are fresh random batch ids. What the
shuffler writes instead, under either release, is checked in ``tests/integration/test_shuffler.py``
(``_assert_nothing_links``): its aggregate release is one tally per (query, version, epoch, round)
equal to the counts of the device reports sent, a function of their multiset alone.

Enrollment (schemas/enrollment.py): a device report names its enrolled device (id and MAC) to
the shuffler only. ``test_nothing_the_shuffler_writes_names_a_device`` feeds a shuffler
reports of devices with distinctive ids (every byte in 0x80..0xEF: no JSON text and no batch
array of small station indices holds such a byte by chance) -- admitted ones, copies, bad MACs,
unknown and unauthenticated devices, binary and JSON -- and finds neither an id (its bytes
either way round, decimal or hex) nor any MAC (bytes, hex) in anything the shuffler writes:
released batches and markers, dead letters (their text and their kept bytes), its state log,
its log and its /metrics.

Statistics: per feature, a chi-square test of independence between the round-1 and round-2
value of the feature over the vehicles, computed per epoch (``scipy.stats.chi2_contingency``)
and summed over the epochs (each epoch's partitions and keys are drawn anew, so pooling the
tables would mix their margins). The fleet seed is fixed, so the index and batch-place tests
are deterministic; partition, offset, key and timestamp depend on the replay's random batch
ids. Each test fails at p < 1e-4: the family of six fails a correct implementation with
probability < 6e-4.
"""

from __future__ import annotations

import base64
import functools
import urllib.request
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaProducer
from scipy import stats

from estimators import StationCounts
from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.replay import KIND_HEADER, default_queries, fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from schemas import DecodedBatch, DeviceReport, decode_device_record, decode_record, encode_json
from schemas.device_binary import encode_device
from schemas.enrollment import Enrollment
from schemas.estimates import DeadLetter
from schemas.kafka_io import publish_query
from tests.devices import ENROLLMENT_SECRET, enrollment

from .kafka_helpers import drain
from .stream_helpers import wait_for
from .test_shuffler import ShufflerProcess, _drain_decoded, _hand_fed_query, _send_notes, _setup

pytestmark = pytest.mark.integration

P_MIN = 1e-4  # per feature; six features: family-wise false failure < 6e-4
FLEET, BATCH, EPOCHS = 800, 100, 4
#: every header a record of the reports topic may carry: the record kind, nothing else
ALLOWED_HEADERS = {((KIND_HEADER, b"reports"),), ((KIND_HEADER, b"end_of_epoch"),)}


def _stratified_p(pairs: dict[int, list[tuple[Any, Any]]]) -> tuple[float, int]:
    """Chi-square independence of (round-1 value, round-2 value), per epoch, summed over
    the epochs: (p-value, degrees of freedom). An epoch in which the feature takes one value
    in a round carries no information about the other round (0 degrees of freedom)."""
    statistic, dof = 0.0, 0
    for got in pairs.values():
        rows = sorted({a for a, _ in got}, key=str)
        cols = sorted({b for _, b in got}, key=str)
        if len(rows) < 2 or len(cols) < 2:
            continue
        table = np.zeros((len(rows), len(cols)), np.int64)
        for a, b in got:
            table[rows.index(a), cols.index(b)] += 1
        res = stats.chi2_contingency(table, correction=False)
        statistic += float(res.statistic)
        dof += int(res.dof)
    return (float(stats.chi2.sf(statistic, dof)) if dof else 1.0), dof


def test_a_vehicles_rounds_are_not_linked_on_the_wire(replay_settings: ReplaySettings) -> None:
    s = replay_settings.model_copy(update={"synthetic_stations": 3, "max_epochs": EPOCHS, "batch_size": BATCH,
                                           "expand_to": FLEET, "mode": "per-vehicle", "producers": 1})
    day = load_day(s)
    fleet = fleet_size_for(day, s)
    assert fleet == FLEET
    q = default_queries(day, fleet, ("sp",))[0]  # Sampling Privacy, the two-round query (opt-in)
    assert q.mechanism == "sp" and q.n_rounds == 2
    publish_query(s, q)
    summary = replay(s, progress=False)
    assert summary.epochs == EPOCHS and summary.delivery_failures == 0
    records = drain(s, s.reports_topic)

    # --- headers and keys: nothing per vehicle, keys are fresh batch ids ------------------
    assert {tuple(rec.headers) for rec in records} == ALLOWED_HEADERS
    batches: list[tuple[Any, DecodedBatch]] = []
    for rec in records:
        item = decode_record(rec.value)
        if isinstance(item, DecodedBatch):
            assert rec.key == item.header.batch_id.encode()
            batches.append((rec, item))
    keys = [rec.key for rec, _ in batches]
    assert len(set(keys)) == len(keys) == EPOCHS * 2 * FLEET // BATCH  # never one key for two records
    first: dict[tuple[int, int], Any] = {}  # the JSON headers of a round differ only in the batch id
    for _, b in batches:
        h = first.setdefault((b.header.epoch, b.header.round), b.header)
        assert h.model_copy(update={"batch_id": b.header.batch_id}) == b.header

    # --- which vehicle sent each report, and where it landed --------------------------------
    # per round: the vehicle's record (partition, offset, key, timestamp) and index in it
    device = Device(s.device_epsilon_limit, frozenset(s.device_blacklist))
    where: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}  # (epoch, round) -> vehicle -> place
    for i in range(EPOCHS):
        epoch = int(day.epochs[i])
        tc = query_truth_counts(split_fleet(s.seed, epoch, day.flows[i], fleet, 1)[0], day.stations, q)
        er = privatize(q, StationCounts(tc), epoch_rng(s.seed, q, epoch, 0), s.mode, device)
        for r in range(2):
            sent, vehicles = er.rounds[r].arrays()["value"], er.vehicles[r]
            mine = [(rec, b) for rec, b in batches if (b.header.epoch, b.header.round) == (epoch, r)]
            assert sum(b.header.reports for _, b in mine) == FLEET
            offsets: dict[int, list[int]] = defaultdict(list)
            for rec, _ in mine:
                offsets[rec.partition].append(rec.offset)
            stamps = sorted({rec.timestamp for rec, _ in mine})
            place: dict[int, dict[str, Any]] = {}
            for rec, b in mine:
                values = b.arrays["value"]
                start = next(k for k in range(0, FLEET, BATCH)  # the record holding these reports
                             if np.array_equal(sent[k:k + values.size], values))
                for j in range(values.size):
                    place[int(vehicles[start + j])] = {
                        "partition": rec.partition,
                        "offset": sorted(offsets[rec.partition]).index(rec.offset),  # rank in its partition
                        "index": 4 * j // values.size,  # quarter of the batch
                        "batch": start // BATCH,  # the record's place in the round
                        "key": int(rec.key[:1], 16) // 4,
                        "time": 4 * stamps.index(rec.timestamp) // len(stamps),
                    }
            assert sorted(place) == list(range(FLEET))  # every vehicle found exactly once
            where[(epoch, r)] = place

    # --- independence of round 1 and round 2, feature by feature -----------------------------
    results = {}
    for feature in ("partition", "offset", "index", "batch", "key", "time"):
        pairs = {int(day.epochs[i]): [(where[(int(day.epochs[i]), 0)][v][feature],
                                       where[(int(day.epochs[i]), 1)][v][feature]) for v in range(FLEET)]
                 for i in range(EPOCHS)}
        results[feature] = _stratified_p(pairs)
    # position within the round is always informative enough to test (8 batches of 4 quarters)
    assert results["index"][1] == EPOCHS * 9 and results["batch"][1] == EPOCHS * 49, results
    assert all(p > P_MIN for p, _ in results.values()), results


def _distinctive_ids(rng: np.random.Generator, n: int) -> list[int]:
    raw = rng.integers(0x80, 0xF0, size=(n, 4), dtype=np.uint8)
    return sorted({int.from_bytes(bytes(r), "little") for r in raw})


def test_nothing_the_shuffler_writes_names_a_device(broker: str, tmp_path: Path) -> None:
    rs, ws, ss = _setup(broker, tmp_path, 1, min_crowd=3, device_partitions=1, release="permuted",
                        enrolled_devices=0xF0000000)
    ss = ss.model_copy(update={"device_partitions": 1})
    q = _hand_fed_query(ss, "q-ids", 1)
    e = q.epoch_range()[0] + 1
    ids = _distinctive_ids(np.random.default_rng(5), 40)
    big = Enrollment(ENROLLMENT_SECRET.encode(), 0xF0000000)
    unknown = 0xF5E5D5C5  # beyond the enrolled ids
    outsider = Enrollment(b"an operator this shuffler does not know", 2**32)
    values: list[bytes] = []
    for r in (0, 1):
        for j, d in enumerate(ids):
            if j % 2:  # binary and JSON
                values.append(big.seal(encode_device(q.query_id, 1, e, r, value=j % 3), d))
            else:
                values.append(encode_json(big.sign_report(DeviceReport(query_id=q.query_id, query_version=1,
                                                                       epoch=e, round=r, value=j % 3), d)))
    values += values[:10]  # copies: duplicate_report
    values += [outsider.seal(encode_device(q.query_id, 1, e, 0, value=1), d) for d in ids[:5]]  # bad_mac
    values += [outsider.seal(encode_device(q.query_id, 1, e, 0, value=1), unknown),
               encode_json(outsider.sign_report(DeviceReport(query_id=q.query_id, query_version=1, epoch=e,
                                                             value=1), unknown))]  # unknown_device
    values += [encode_device(q.query_id, 1, e, 0, value=1)]  # unauthenticated
    cut = big.seal(encode_device(q.query_id, 1, e, 0, value=1), ids[0])
    values += [cut + b"xx"]  # bad_encoding, sealed
    macs = {cut[-16:]}
    for v in values[:-1]:
        got = decode_device_record(v)
        if isinstance(got, DeviceReport) and got.mac is not None:
            macs.add(bytes.fromhex(got.mac))
    assert len(macs) >= 2 * len(ids) + 5
    producer = KafkaProducer(**ss.client_kwargs(), acks="all")
    for v in values:
        producer.send(ss.device_topic, key=uuid.uuid4().bytes, value=v)
    producer.flush()
    producer.close()
    _send_notes(ss, e, e)
    log = tmp_path / "shuffler.log"
    shuffler = ShufflerProcess(ss, log).start()
    try:
        wanted = Counter({"duplicate_report": 10, "bad_mac": 5, "unknown_device": 2, "unauthenticated": 1,
                          "bad_encoding": 1})

        def letters() -> list[Any]:
            return drain(ss, ss.dead_letter_topic, quiet_polls=1)

        wait_for(lambda: Counter(DeadLetter.model_validate_json(r.value).reason for r in letters()) == wanted
                 and len(_drain_decoded(ss)[1]) == ss.partitions, 60, f"dead letters {dict(wanted)} and markers")
        batches, markers = _drain_decoded(ss)
        assert sorted(int(v) for _, b in batches for v in b.arrays["value"]) == sorted(2 * [j % 3 for j in
                                                                                         range(len(ids))])
        assert {x.participants for _, m in markers for x in m.markers} == {len(ids)}
        metrics = urllib.request.urlopen(f"http://{ss.metrics_host}:{ss.metrics_port}/metrics",  # noqa: S310
                                         timeout=10).read()
    finally:
        assert shuffler.stop() == 130, log.read_text()[-3000:]
    written: list[tuple[str, bytes]] = [("metrics", metrics), ("log", log.read_bytes())]
    read: dict[str, list[Any]] = {}

    def records_of(topic: str) -> bool:  # each topic has records by now; under load a first
        read[topic] = drain(ss, topic, quiet_polls=1)  # poll can bring none (a metadata refresh)
        return bool(read[topic])

    for topic in (ss.reports_topic, ss.dead_letter_topic, ss.state_topic):
        wait_for(functools.partial(records_of, topic), 60, f"the records of {topic}")
        for rec in read[topic]:
            written.append((topic, (rec.key or b"") + b"|" + (rec.value or b"") + b"|" + repr(rec.headers).encode()))
            if topic == ss.dead_letter_topic:
                letter = DeadLetter.model_validate_json(rec.value)
                written.append(("dead letter bytes", base64.b64decode(letter.value_b64)))
    assert {t for t, _ in written} >= {ss.reports_topic, ss.dead_letter_topic, ss.state_topic}
    # the hex needles (8 hex digits) could occur by chance in the salt, batch ids and digests the
    # shuffler writes (~10 kB of hex): with 41 ids and 3 hex forms, false failure < 1e-3
    for d in [*ids, unknown]:
        le, be = d.to_bytes(4, "little"), d.to_bytes(4, "big")
        needles = (le, be, str(d).encode(), le.hex().encode(), be.hex().encode(), f"{d:x}".encode())
        for where, data in written:
            assert not any(n in data for n in needles), f"device {d:#x} in {where}"
    for mac in macs:
        for where, data in written:
            assert mac not in data and mac.hex().encode() not in data, f"a MAC in {where}"
    for where, data in written:  # no member names a device or a MAC either
        assert b'"device"' not in data and b'"mac"' not in data, where
    assert enrollment().devices < 0xF0000000  # the suite's default enrollment would refuse these ids
