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

Statistics: per feature, a chi-square test of independence between the round-1 and round-2
value of the feature over the vehicles, computed per epoch (``scipy.stats.chi2_contingency``)
and summed over the epochs (each epoch's partitions and keys are drawn anew, so pooling the
tables would mix their margins). The fleet seed is fixed, so the index and batch-place tests
are deterministic; partition, offset, key and timestamp depend on the replay's random batch
ids. Each test fails at p < 1e-4: the family of six fails a correct implementation with
probability < 6e-4.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from scipy import stats

from producers.fleet import Device, epoch_rng, privatize, query_truth_counts, split_fleet
from producers.replay import KIND_HEADER, default_queries, fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from schemas import DecodedBatch, decode_record
from schemas.kafka_io import publish_query

from .kafka_helpers import drain

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
        er = privatize(q, tc, epoch_rng(s.seed, q, epoch, 0), s.mode, device)
        for r in range(2):
            sent, vehicles = er.rounds[r]["value"], er.vehicles[r]
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
