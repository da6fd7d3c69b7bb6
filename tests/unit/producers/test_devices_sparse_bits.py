"""A bit-valued mechanism that expects few ones (unary RR at the planner's q for 10M vehicles:
~0.5 noise bits of 3,220) is drawn and sent sparsely, as station ids: PerStation.sparse_bits
chooses from the mechanism alone, sample_sparse_sets then never draws the N x V grid, the device
path (``mix_pairs=False``) gets the direct path's pairs grouped by vehicle, device_records sends
them as pair reports, and the shuffler's intake (stream_app.shuffler.columns.decode_batch)
decodes them. Rates: each bound is 5 sd of a binomial rate (false-failure < 6e-7 each).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

import estimators as E
from estimators import Pairs, StationSets, per_station
from producers.fleet import Device, EpochReports, privatize
from producers.replay import device_records
from schemas import Query
from stream_app.shuffler.columns import decode_batch
from tests.devices import enrollment
from tests.unit.producers.test_fleet import SEED, sensors


def _sets(seed: int, n: int, v: int, most: int) -> StationSets:
    """Each vehicle a uniform set of 0..``most`` distinct stations of 1..V, sorted."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, most + 1, size=n)
    vehicle = np.repeat(np.arange(n), sizes)
    station = np.concatenate([np.sort(rng.choice(v, size=k, replace=False)) + 1 for k in sizes])
    return StationSets(n, vehicle, station.astype(np.int64))


def test_the_mechanism_chooses_its_encoding_by_its_expected_ones() -> None:
    """Pairs (8 bytes each) when the expected ones take fewer bytes than the bitmap's ceil(V/8)."""
    for q, v, sparse in ((0.2, 3220, False), (1.7e-4, 3220, True), (0.01, 600, True), (0.03, 600, False),
                         (0.01, 64, False)):
        ps = E.PerStation(E.symmetric_unary(q), v)
        assert ps.sparse_bits() is sparse, (q, v)
        assert ps.expected_ones() == pytest.approx(q * (v - 1) + (1 - q))
    assert not E.PerStation(E.alp_optimal(), 3220).sparse_bits()  # not bits: its own sparse pairs


def test_sparse_bits_skip_the_grid_and_keep_the_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    """At q = 0.002 over 500 stations the 1 bits come from geometric skips (the grid sampler is
    never called), by vehicle then station, each set's stations from the Yes row (1 - q) and
    every other cell from the No row (q)."""
    q, v, n = 0.002, 500, 20_000
    ps = E.PerStation(E.symmetric_unary(q), v)
    assert ps.sparse_bits()

    def no_grid(*_: object) -> None:
        raise AssertionError("the N x V grid was drawn")

    monkeypatch.setattr(per_station, "bernoulli_cells", no_grid)
    sets = _sets(1, n, v, 6)
    pairs = ps.sample_sparse_sets(np.random.default_rng(2), sets)
    assert np.all(pairs.output == 1)
    assert np.all(np.diff(pairs.vehicle * (v + 1) + pairs.station) > 0)  # by vehicle then station, no repeats
    own = set(zip(sets.vehicle.tolist(), sets.station.tolist(), strict=True))
    got = list(zip(pairs.vehicle.tolist(), pairs.station.tolist(), strict=True))
    yes = sum(g in own for g in got)
    m_yes, m_no = len(own), n * v - len(own)
    assert abs(yes / m_yes - (1 - q)) < 5 * np.sqrt(q * (1 - q) / m_yes)
    assert abs((len(got) - yes) / m_no - q) < 5 * np.sqrt(q * (1 - q) / m_no)


def _flows_query(v: int, q: float) -> Query:
    t0 = datetime(2026, 11, 18, tzinfo=UTC)
    return Query(query_id="flows", analyst_id="a", version=1, sensors=sensors(v), mechanism="unary",
                 params={"q": q}, population=100, span_s=300, t_start=t0, t_end=t0 + timedelta(days=1))


def test_the_device_path_sends_the_direct_paths_pairs_as_station_ids() -> None:
    """A span report at a small q: the device path's pairs are the direct path's (same triples,
    grouped by vehicle), every device sends one pair report (no bitmap) and the shuffler's
    intake decodes each, authenticated, into exactly its vehicle's stations."""
    v, n = 800, 3000
    q = _flows_query(v, 0.001)
    assert q.per_station is not None and q.per_station[0].sparse_bits()
    sets = _sets(3, n, v, 5)
    mixed = privatize(q, sets, np.random.default_rng(SEED), "per-vehicle", Device(1e4))
    grouped = privatize(q, sets, np.random.default_rng(SEED), "per-vehicle", Device(1e4), mix_pairs=False)
    assert isinstance(grouped.rounds[0], Pairs)

    def triples(er: EpochReports) -> list[tuple[int, int, int]]:
        r = er.rounds[0]
        assert isinstance(r, Pairs)
        return sorted(zip(er.vehicles[0].tolist(), r.station.tolist(), r.output.tolist(), strict=True))

    assert triples(grouped) == triples(mixed) and len(triples(mixed)) > n
    want: dict[int, list[int]] = {}
    for veh, st, _ in triples(grouped):
        want.setdefault(veh, []).append(st)
    (vehicles, records), = device_records(q, 1000, grouped, enrollment(), first_device=11)
    assert len(records) == n and vehicles.tolist() == list(range(n))
    assert sum(map(len, records)) / n < -(-v // 8)  # on average smaller than a bitmap's bytes alone
    got = decode_batch(records, enrollment())
    assert all(r is None for r in got.reasons)
    assert np.all(got.width == -1) and np.all(got.npairs >= 0)  # pair reports, no bitmap
    assert sorted(got.device.tolist()) == list(range(11, 11 + n))
    for i in range(n):
        at, k = int(got.pair_at[i]), int(got.npairs[i])
        assert got.pair_station[at:at + k].tolist() == want.get(int(got.device[i]) - 11, [])
        assert np.all(got.pair_output[at:at + k] == 1)


def test_a_refused_report_sends_nothing() -> None:
    """A report the devices refuse (here their epsilon limit) has no round to send."""
    q = _flows_query(40, 0.001)
    er = privatize(q, _sets(4, 10, 40, 3), np.random.default_rng(SEED), "per-vehicle", Device(0.1),
                        mix_pairs=False)
    assert er.refused == 10 and device_records(q, 1000, er, enrollment()) == []
