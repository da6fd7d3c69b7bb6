"""From a closed window to estimate records (``stream_app.estimate``): no Faust, no broker.

The window is filled the way the running system fills it: a seeded epoch of known truth
counts is privatized by ``producers.fleet.privatize`` (per-vehicle and tally modes), sent by
the producer's own ``producers.replay._send_round`` and ``_send_markers`` into an in-memory
sink (batches keyed and partitioned by random batch ids, an end-of-epoch marker per round
and partition), each record goes through stage 1 (``stream_app.decode.to_partials``) and is
added to a ``Window`` in a seeded random order. The estimates are then compared with what
the statistics core computes directly from the privatized arrays: ``estimate``,
``score_interval`` at 0.95 and 0.99, and the sd at ``max(estimate, 0)`` (for ALP/RR
per-vehicle pairs the default report is implied: ``participants - non-default`` per
station, as ``PerStation.counts_from_sparse`` does).

Also checked: ``QueryEstimators.build`` and ``width`` per mechanism; the contract fields of
``Estimate`` and their JSON, validated against ``schemas/estimate.schema.json`` (which is
regenerated here and compared with the committed file, so it cannot go stale); withheld
estimates (too few participants; ALP/RR without markers or with a producer's markers
missing); ``round_count_mismatch``, ``refused``, ``missing_batches``, ``late`` carried; SP
without markers takes N from the reports.

Two failing tests show bugs: SP with one producer's markers missing publishes N from the
other producers only (N below the reports of a round, bounds clipped at it), and an epoch
the producers marked ``interrupted`` is published as a normal one from a fraction of the
reports.

Randomness: seeded privatization; the assertions are exact identities (up to float
rounding), never statistical.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import estimators as E
from producers.fleet import Device, EpochReports, epoch_rng, privatize
from producers.pems import epoch_start
from producers.replay import ReplaySummary, _send_markers, _send_round
from schemas import Query
from schemas.estimates import ESTIMATE_SCHEMA_PATH, Estimate, estimate_json_schema
from stream_app.decode import to_partials
from stream_app.estimate import QueryEstimators, _per_station_counts, estimates_for
from stream_app.windows import Partial, Window

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # 08:00 Pacific
E0 = int(T0.timestamp()) // 30
EPOCH = E0 + 3
SENSORS = (400_001, 400_017, 400_230, 401_002)
V = len(SENSORS)
SEED = 20261118
CONF = (0.95, 0.99)
N_PARTITIONS = 3
# truth counts (V + 1,) per producer: index 0 = at none of the sensors
TRUTH = (np.array([210, 14, 0, 41, 3]), np.array([160, 9, 5, 28, 0]))
ESTIMATOR_NAMES = {"sp": ["sp_difference"], "alp": ["alp_yhat", "alp_bottom", "alp_average", "alp_gls"],
                   "rr": ["rr"]}


def make_query(mechanism: str) -> Query:
    return Query(query_id=f"q-{mechanism}", analyst_id="analyst-1", version=2, sensors=SENSORS, mechanism=mechanism,
                 population=1_000, t_start=T0, t_end=T0 + timedelta(minutes=10))


QUERIES = {m: make_query(m) for m in ("sp", "alp", "rr")}
QE = {m: QueryEstimators.build(q) for m, q in QUERIES.items()}


def lookup(query_id: str, version: int) -> Query | None:
    return next((q for q in QUERIES.values() if (q.query_id, q.version) == (query_id, version)), None)


# ---------------------------------------------------------------------------------------
# the producer side, without Kafka
# ---------------------------------------------------------------------------------------
class MemorySink:
    """Stands in for producers.sink.ReportSink: same partitioning idea (by key), no broker."""

    def __init__(self, n_partitions: int) -> None:
        self.partitions = list(range(n_partitions))
        self.records: list[tuple[bytes, int, str]] = []  # value, partition, kind header

    def partition_for(self, key: bytes) -> int:
        return zlib.crc32(key) % len(self.partitions)

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: list[tuple[str, bytes]] | None = None, topic: str | None = None) -> None:
        assert partition is not None
        kind = dict(headers or []).get("ptt-kind", b"").decode()
        self.records.append((value, partition, kind))

    def flush(self) -> None:
        pass


class Stop:
    """``stop.requested`` turns true after ``after`` checks (None: never), like a Ctrl-C."""

    def __init__(self, after: int | None = None) -> None:
        self.after = after
        self.checks = 0

    @property
    def requested(self) -> bool:
        self.checks += 1
        return self.after is not None and self.checks > self.after


def produce(q: Query, truths: Iterable[np.ndarray], modes: Iterable[str], sink: MemorySink, batch_size: int = 40,
            devices: Iterable[Device] | None = None, stop: Stop | None = None) -> list[EpochReports]:
    """One epoch of ``q`` by K producer processes, as producers/replay.py ``_run_epochs`` does."""
    truths, modes = list(truths), list(modes)
    k = len(truths)
    devices = list(devices) if devices is not None else [Device()] * k
    settings = SimpleNamespace(batch_size=batch_size)
    out = []
    for index, (tc, mode, device) in enumerate(zip(truths, modes, devices, strict=True)):
        producer_id = f"p{index}-{index:08x}"
        st = stop or Stop()
        er = privatize(q, tc, epoch_rng(SEED, q, EPOCH, index), mode, device)
        sent: dict[tuple[str, int], dict[int, list[int]]] = {}
        for r in range(q.n_rounds):
            per_part = sent.setdefault((q.record_key, r), {p: [0, 0] for p in sink.partitions})
            if er.participants:
                _send_round(sink, settings, producer_id, q, EPOCH, r, er.rounds[r], er.reports[r],  # type: ignore[arg-type]
                            per_part, ReplaySummary(), st)  # type: ignore[arg-type]
        _send_markers(sink, producer_id, index, k, EPOCH, sent, {q.record_key: q},
                      {q.query_id: (er.participants, er.refused)}, mode, st.requested)
        out.append(er)
    return out


def window_from(q: Query, records: list[tuple[bytes, int, str]], order_seed: int = 0,
                keep: Any = None) -> Window:
    """Stage 1 then stage 2: decode every record, add it to a new window in a seeded order."""
    w = Window.new(q.query_id, q.version, EPOCH, q.n_rounds, QE[q.mechanism].width)
    order = np.random.default_rng([order_seed, 99]).permutation(len(records))
    for i in order:
        value, partition, kind = records[i]
        p = to_partials(value, partition, lookup)
        assert isinstance(p, Partial), p
        assert p.kind == ("marker" if kind == "end_of_epoch" else "batch")
        if keep is None or keep(p):
            assert w.add(p) == "added"
    return w


def run(q: Query, modes: tuple[str, ...] = ("per-vehicle", "per-vehicle"), min_participants: int = 1,
        order_seed: int = 0, closed_by: str = "markers",
        **kw: Any) -> tuple[list[Estimate], Window, list[EpochReports]]:
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH[:len(modes)], modes, sink, **kw)
    w = window_from(q, sink.records, order_seed)
    assert w.markers_complete(N_PARTITIONS)
    w.close(closed_by)  # type: ignore[arg-type]
    out = estimates_for(QE[q.mechanism], w, closed_by, epoch_start(EPOCH), CONF, min_participants)  # type: ignore[arg-type]
    return out, w, reports


# ---------------------------------------------------------------------------------------
# the statistics core, directly
# ---------------------------------------------------------------------------------------
def direct_counts(q: Query, reports: list[EpochReports]) -> np.ndarray:
    mech = q.build()
    ps = q.per_station[0] if q.per_station else None
    if ps is None:
        rc = np.zeros((q.n_rounds, mech.n_outputs), dtype=np.int64)
        for er in reports:
            for r, arrays in enumerate(er.rounds):
                if "counts" in arrays:
                    rc[r] += arrays["counts"]
                elif "value" in arrays:
                    rc[r] += np.bincount(arrays["value"], minlength=mech.n_outputs)
        return E.station_counts(mech, rc)
    counts = np.zeros((q.n_stations, mech.n_outputs), dtype=np.int64)
    for er in reports:
        arrays = er.rounds[0]
        if not er.participants:
            continue
        if "counts" in arrays:
            counts += arrays["counts"].reshape(q.n_stations, mech.n_outputs)
        else:
            sparse = E.SparseReports(vehicle=np.zeros_like(arrays["station"]), station=arrays["station"],
                                     output=arrays["output"])
            counts += ps.counts_from_sparse(sparse, er.participants)
    return counts[:, None, :]


def direct_estimates(q: Query, counts: np.ndarray, n: int) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for name, est in QE[q.mechanism].estimators.items():
        values = est.estimate(counts, n)
        sd = np.sqrt(np.maximum(est.variance(np.maximum(values, 0.0), n), 0.0))
        bounds = {c: est.score_interval(values, n, c) for c in CONF}
        out[name] = {"estimate": values, "sd": sd, **{f"lo{c}": bounds[c][0] for c in CONF},
                     **{f"hi{c}": bounds[c][1] for c in CONF}}
    return out


def assert_matches(records: list[Estimate], q: Query, counts: np.ndarray, n: int) -> None:
    want = direct_estimates(q, counts, n)
    assert [(e.estimator, e.station) for e in records] == [(name, s) for name in ESTIMATOR_NAMES[q.mechanism]
                                                           for s in SENSORS]
    for e in records:
        i = SENSORS.index(e.station)
        w = want[e.estimator]
        assert e.withheld is None and e.participants == n
        assert e.estimate == pytest.approx(w["estimate"][i], rel=1e-12, abs=1e-9)
        assert e.sd == pytest.approx(w["sd"][i], rel=1e-12, abs=1e-9)
        assert [b.confidence for b in e.bounds] == list(CONF)
        for b in e.bounds:
            assert b.lower == pytest.approx(w[f"lo{b.confidence}"][i], rel=1e-12, abs=1e-9)
            assert b.upper == pytest.approx(w[f"hi{b.confidence}"][i], rel=1e-12, abs=1e-9)
            assert 0.0 <= b.lower <= b.upper <= n
        assert all(math.isfinite(x) for x in (e.estimate, e.sd, *(v for b in e.bounds for v in (b.lower, b.upper))))


# ---------------------------------------------------------------------------------------
# a small JSON Schema validator (the keywords pydantic emits for Estimate)
# ---------------------------------------------------------------------------------------
_TYPES = {"string": lambda x: isinstance(x, str), "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
          "number": lambda x: isinstance(x, int | float) and not isinstance(x, bool),
          "array": lambda x: isinstance(x, list), "object": lambda x: isinstance(x, dict),
          "null": lambda x: x is None, "boolean": lambda x: isinstance(x, bool)}
_KNOWN = {"$defs", "$ref", "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum",
          "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "format", "title",
          "description", "default"}


def validate(x: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    unknown = set(schema) - _KNOWN
    if unknown:
        return [f"{path}: validator does not know {sorted(unknown)}"]
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return validate(x, root["$defs"][name], root, path)
    errors: list[str] = []
    if "anyOf" in schema:
        if all(validate(x, s, root, path) for s in schema["anyOf"]):
            errors.append(f"{path}: matches none of anyOf")
    if "type" in schema and not _TYPES[schema["type"]](x):
        return [f"{path}: {x!r} is not {schema['type']}"]
    if "enum" in schema and x not in schema["enum"]:
        errors.append(f"{path}: {x!r} not in {schema['enum']}")
    if "const" in schema and x != schema["const"]:
        errors.append(f"{path}: {x!r} != {schema['const']!r}")
    if "minimum" in schema and x < schema["minimum"]:
        errors.append(f"{path}: {x} < {schema['minimum']}")
    if "maximum" in schema and x > schema["maximum"]:
        errors.append(f"{path}: {x} > {schema['maximum']}")
    if "exclusiveMinimum" in schema and x <= schema["exclusiveMinimum"]:
        errors.append(f"{path}: {x} <= {schema['exclusiveMinimum']}")
    if "exclusiveMaximum" in schema and x >= schema["exclusiveMaximum"]:
        errors.append(f"{path}: {x} >= {schema['exclusiveMaximum']}")
    if schema.get("format") == "date-time":
        try:
            if datetime.fromisoformat(x).tzinfo is None:
                errors.append(f"{path}: date-time without a zone")
        except ValueError:
            errors.append(f"{path}: {x!r} is not a date-time")
    if isinstance(x, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing {k}" for k in schema.get("required", []) if k not in x]
        if schema.get("additionalProperties") is False:
            errors += [f"{path}: extra {k}" for k in x if k not in props]
        for k, v in x.items():
            if k in props:
                errors += validate(v, props[k], root, f"{path}.{k}")
    if isinstance(x, list) and "items" in schema:
        for i, v in enumerate(x):
            errors += validate(v, schema["items"], root, f"{path}[{i}]")
    return errors


def committed_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(ESTIMATE_SCHEMA_PATH.read_text())
    return schema


# ---------------------------------------------------------------------------------------
# QueryEstimators
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_build_estimators_and_width(mechanism: str) -> None:
    q = QUERIES[mechanism]
    qe = QueryEstimators.build(q)
    mech = q.build()
    assert qe.query is q
    assert list(qe.estimators) == ESTIMATOR_NAMES[mechanism]
    assert all(isinstance(e, E.LinearEstimator) and e.name == name for name, e in qe.estimators.items())
    if mechanism == "sp":
        assert qe.width == mech.n_outputs == V + 1
        ref = {"sp_difference": E.sp_difference(mech)}
    elif mechanism == "alp":
        assert qe.width == V * mech.n_outputs == V * 3
        ref = E.alp_estimators(mech)
    else:
        assert qe.width == V * mech.n_outputs == V * 2
        ref = {"rr": E.rr_estimator(mech)}
    for name, est in qe.estimators.items():
        np.testing.assert_array_equal(np.broadcast_to(est.weights, ref[name].weights.shape), ref[name].weights)
        np.testing.assert_array_equal(est.mean, ref[name].mean)


# ---------------------------------------------------------------------------------------
# estimates from a window equal the statistics core's
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_estimates_equal_the_statistics_core(mechanism: str, mode: str) -> None:
    q = QUERIES[mechanism]
    records, w, reports = run(q, (mode, mode))
    n = sum(er.participants for er in reports)
    assert n == int(sum(t.sum() for t in TRUTH))
    assert w.participants() == (n, []) and w.missing_batches() == 0 and w.duplicates == 0
    if mode == "per-vehicle":  # batches were split (batch size 40) and spread over the partitions
        assert len(w.seen) > 2 * q.n_rounds
    assert_matches(records, q, direct_counts(q, reports), n)
    for e in records:
        assert (e.query_id, e.query_version, e.mechanism, e.epoch) == (q.query_id, 2, mechanism, EPOCH)
        assert e.reports == sum(w.reports) == sum(sum(er.reports) for er in reports)
        assert e.epsilon == q.epsilon and e.closed_by == "markers"
        assert (e.refused, e.missing_batches, e.late) == (0, 0, 0)
        assert e.round_count_mismatch == 0


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_implied_default_reports_of_per_vehicle_pairs(mechanism: str) -> None:
    """Per station, the ⊥ (ALP) / "0" (RR) count is participants minus the non-default reports."""
    q = QUERIES[mechanism]
    _, w, reports = run(q)
    n = sum(er.participants for er in reports)
    counts = _per_station_counts(QE[mechanism], w, n)
    np.testing.assert_array_equal(counts, direct_counts(q, reports))
    assert np.all(counts.sum(axis=2) == n)
    d = q.per_station.default  # type: ignore[union-attr]
    nondefault = counts[:, 0, :].sum(axis=1) - counts[:, 0, d]
    np.testing.assert_array_equal(counts[:, 0, d], n - nondefault)


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_mixed_tally_and_per_vehicle_producers(mechanism: str) -> None:
    q = QUERIES[mechanism]
    records, w, reports = run(q, ("tally", "per-vehicle"))
    assert w.full_vehicles == [reports[0].participants]
    assert_matches(records, q, direct_counts(q, reports), sum(er.participants for er in reports))


@pytest.mark.parametrize("mechanism", ["sp", "alp"])
def test_estimates_do_not_depend_on_arrival_order(mechanism: str) -> None:
    q = QUERIES[mechanism]
    a, _, _ = run(q, order_seed=1)
    b, _, _ = run(q, order_seed=2)
    assert [e.model_dump() for e in a] == [e.model_dump() for e in b]


def test_redelivered_records_change_nothing() -> None:
    """Every record delivered twice (at-least-once delivery): same estimates, all duplicates counted."""
    q = QUERIES["alp"]
    once, _, _ = run(q)
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = Window.new(q.query_id, q.version, EPOCH, q.n_rounds, QE["alp"].width)
    twice = sink.records + sink.records
    results = []
    for i in np.random.default_rng(3).permutation(len(twice)):
        p = to_partials(twice[i][0], twice[i][1], lookup)
        assert isinstance(p, Partial)
        results.append(w.add(p))
    assert results.count("duplicate") == w.duplicates == len(sink.records)
    w.close("markers")
    again = estimates_for(QE["alp"], w, "markers", epoch_start(EPOCH), CONF, 1)
    assert [e.model_dump() for e in again] == [e.model_dump() for e in once]


# ---------------------------------------------------------------------------------------
# the contract: fields, JSON, schema
# ---------------------------------------------------------------------------------------
def test_committed_schema_is_current() -> None:
    regenerated = estimate_json_schema()
    assert committed_schema() == regenerated
    assert ESTIMATE_SCHEMA_PATH.read_text() == json.dumps(regenerated, indent=2, sort_keys=True) + "\n"


def test_validator_is_not_vacuous() -> None:
    schema = estimate_json_schema()
    records, _, _ = run(QUERIES["rr"])
    good = json.loads(records[0].model_dump_json())
    assert validate(good, schema, schema) == []
    bad = [{k: v for k, v in good.items() if k != "station"}, {**good, "vehicle": 1}, {**good, "epoch": -1},
           {**good, "estimator": "nope"}, {**good, "bounds": [{"confidence": 1.5, "lower": 0, "upper": 1}]},
           {**good, "epoch_start": "2026-11-18T08:00:00"}, {**good, "estimate": "3"}, {**good, "kind": "x"}]
    for b in bad:
        assert validate(b, schema, schema), b


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_estimate_json_has_the_contract_fields_and_validates(mechanism: str) -> None:
    q = QUERIES[mechanism]
    records, _, _ = run(q)
    schema = committed_schema()
    expected_start = epoch_start(EPOCH)
    for e in records:
        d = json.loads(e.model_dump_json())
        assert validate(d, schema, schema) == []
        for f in ("query_id", "query_version", "mechanism", "estimator", "epoch", "epoch_start", "station",
                  "estimate", "sd", "bounds", "reports", "participants", "epsilon", "withheld", "closed_by",
                  "round_count_mismatch", "late", "refused", "missing_batches"):
            assert f in d, f
        assert d["kind"] == "estimate" and d["station"] in SENSORS and d["withheld"] is None
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d([+-]\d\d:\d\d|Z)", d["epoch_start"]), d["epoch_start"]
        assert d["epoch_start"].endswith("-08:00")  # Pacific standard time on 2026-11-18
        start = datetime.fromisoformat(d["epoch_start"])
        assert start == expected_start and int(start.timestamp()) == EPOCH * 30
        assert [b["confidence"] for b in d["bounds"]] == [0.95, 0.99]
        assert all(set(b) == {"confidence", "lower", "upper"} for b in d["bounds"])
        assert Estimate.model_validate_json(e.model_dump_json()) == e


# ---------------------------------------------------------------------------------------
# withheld
# ---------------------------------------------------------------------------------------
def assert_withheld(records: list[Estimate], q: Query, reason: str) -> None:
    assert len(records) == len(ESTIMATOR_NAMES[q.mechanism]) * V
    schema = committed_schema()
    for e in records:
        assert e.withheld is not None and reason in e.withheld, e.withheld
        assert (e.estimate, e.sd, e.bounds) == (None, None, ())
        assert validate(json.loads(e.model_dump_json()), schema, schema) == []


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_withheld_below_min_participants(mechanism: str) -> None:
    q = QUERIES[mechanism]
    n = int(sum(t.sum() for t in TRUTH))
    records, _, _ = run(q, min_participants=n + 1)
    assert_withheld(records, q, f"fewer than {n + 1}")
    assert all(e.participants == n for e in records)
    ok, _, _ = run(q, min_participants=n)
    assert all(e.withheld is None for e in ok)


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_per_sensor_without_markers_is_withheld(mechanism: str) -> None:
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: p.kind == "batch")
    w.close("watermark")
    records = estimates_for(QE[mechanism], w, "watermark", epoch_start(EPOCH), CONF, 1)
    assert_withheld(records, q, "participants unknown")
    assert all(e.participants == 0 and e.closed_by == "watermark" for e in records)


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_per_sensor_with_a_producers_markers_missing_is_withheld(mechanism: str) -> None:
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: not (p.kind == "marker" and p.producer_index == 1))
    assert not w.markers_complete(N_PARTITIONS)
    w.close("watermark")
    records = estimates_for(QE[mechanism], w, "watermark", epoch_start(EPOCH), CONF, 1)
    assert_withheld(records, q, "no marker from producer(s) [1]")


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
def test_sp_without_markers_takes_n_from_the_reports(mode: str) -> None:
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, (mode, mode), sink)
    w = window_from(q, sink.records, keep=lambda p: p.kind == "batch")
    assert w.participants() == (None, []) and w.markers == {}
    w.close("wall_clock")
    records = estimates_for(QE["sp"], w, "wall_clock", epoch_start(EPOCH), CONF, 1)
    n = sum(er.participants for er in reports)
    assert max(w.reports) == n
    assert_matches(records, q, direct_counts(q, reports), n)
    assert all(e.closed_by == "wall_clock" and e.missing_batches == 0 for e in records)


def test_sp_round_count_mismatch_and_missing_batches() -> None:
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    decoded = [to_partials(value, part, lookup) for value, part, _ in sink.records]
    first_round1 = next(i for i, p in enumerate(decoded)
                        if isinstance(p, Partial) and p.kind == "batch" and p.round == 1)
    lost = decoded[first_round1]
    assert isinstance(lost, Partial) and lost.reports == 40
    records_left = sink.records[:first_round1] + sink.records[first_round1 + 1:]
    w = window_from(q, records_left)
    assert w.markers_complete(N_PARTITIONS)  # the markers all came; one batch did not
    w.close("markers")
    records = estimates_for(QE["sp"], w, "markers", epoch_start(EPOCH), CONF, 1)
    n = sum(er.participants for er in reports)
    assert all(e.round_count_mismatch == -lost.reports and e.missing_batches == 1 for e in records)
    assert all(e.reports == 2 * n - lost.reports and e.participants == n for e in records)
    assert all(e.withheld is None for e in records)  # published, with the mismatch stated


def test_mismatch_is_zero_for_one_round_mechanisms() -> None:
    for m in ("alp", "rr"):
        records, _, _ = run(QUERIES[m])
        assert {e.round_count_mismatch for e in records} == {0}


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_a_refusing_producer_is_carried(mechanism: str) -> None:
    """Producer 1's devices blacklist a sensor: it sends no batches, only markers saying so."""
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    devices = [Device(), Device(blacklist=frozenset({SENSORS[2]}))]
    reports = produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink, devices=devices)
    assert reports[1].participants == 0 and reports[1].refused == int(TRUTH[1].sum())
    assert all(kind == "end_of_epoch" for _, part, kind in sink.records[-N_PARTITIONS * q.n_rounds:])
    w = window_from(q, sink.records)
    assert w.markers_complete(N_PARTITIONS)
    w.close("markers")
    records = estimates_for(QE[mechanism], w, "markers", epoch_start(EPOCH), CONF, 1)
    assert all(e.refused == int(TRUTH[1].sum()) for e in records)
    assert_matches(records, q, direct_counts(q, reports[:1]), reports[0].participants)


def test_late_records_are_carried() -> None:
    q = QUERIES["rr"]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("tally", "tally"), sink)
    w = window_from(q, sink.records)
    w.close("markers")
    late = to_partials(sink.records[0][0], sink.records[0][1], lookup)
    assert isinstance(late, Partial) and w.add(late) == "late"
    records = estimates_for(QE["rr"], w, "markers", epoch_start(EPOCH), CONF, 1)
    assert {e.late for e in records} == {1}


# ---------------------------------------------------------------------------------------
# bugs
# ---------------------------------------------------------------------------------------
def test_sp_with_a_producers_markers_missing_does_not_undercount_n() -> None:
    """BUG (stream_app/estimate.py, estimates_for, sp branch): ``n = participants if
    participants is not None else max(w.reports)`` ignores ``missing_producers``. With producer
    1's markers lost (window closed by the watermark), N is producer 0's participants only,
    while the counts hold both producers' reports: N is below the reports of a round (each
    vehicle sends one report per round), the variance uses the wrong N and every upper bound
    is clipped at it. Expected: withheld, or N at least the reports of each round (as without
    markers); actual: participants = producer 0's vehicles, published."""
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: not (p.kind == "marker" and p.producer_index == 1))
    w.close("watermark")
    assert w.participants() == (reports[0].participants, [1])
    records = estimates_for(QE["sp"], w, "watermark", epoch_start(EPOCH), CONF, 1)
    for e in records:
        assert e.withheld is not None or e.participants >= max(w.reports), \
            f"N={e.participants} < {max(w.reports)} reports in a round, published"


def test_an_interrupted_epoch_is_not_published_as_complete() -> None:
    """BUG (stream_app/estimate.py, estimates_for; stream_app/windows.py keeps the flag but
    nothing reads it): a producer stopped by Ctrl-C in the middle of an epoch marks it
    ``interrupted`` with exactly what was sent (producers/replay.py); its markers still complete
    the window, and the estimates are published as normal ones -- N = all participants, counts
    of round 1 from a fraction of the reports, missing_batches 0 -- so the Sampling Privacy
    difference (round 2 - round 1) is far off. Expected: withheld (or otherwise marked);
    actual: withheld is None."""
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    n = int(TRUTH[0].sum())
    per_round = -(-n // 40)  # batches of 40 reports
    reports = produce(q, TRUTH[:1], ("per-vehicle",), sink, stop=Stop(after=per_round + 3))
    w = window_from(q, sink.records)
    assert w.markers_complete(N_PARTITIONS) and w.missing_batches() == 0
    assert any(m["interrupted"] for m in w.markers.values())
    assert w.reports == [n, 3 * 40] and reports[0].participants == n
    w.close("markers")
    records = estimates_for(QE["sp"], w, "markers", epoch_start(EPOCH), CONF, 1)
    assert all(e.withheld is not None for e in records), [e.estimate for e in records]


def test_infinite_epsilon_is_null_and_estimates_reject_nan() -> None:
    """JSON has no infinity: an infinite query epsilon (no device would answer) is published
    as null, and NaN/inf estimates or bounds are refused by the model."""
    from datetime import UTC, datetime

    import pytest as _pytest
    from pydantic import ValidationError

    from schemas.estimates import Estimate

    common = {"query_id": "q", "query_version": 1, "mechanism": "rr", "estimator": "rr", "epoch": 1,
              "epoch_start": datetime(2026, 11, 18, tzinfo=UTC), "station": 7, "sd": None, "bounds": (),
              "reports": 0, "participants": 0, "withheld": "refused", "closed_by": "markers",
              "round_count_mismatch": 0, "late": 0, "refused": 10, "missing_batches": 0}
    e = Estimate(estimate=None, epsilon=None, **common)
    assert Estimate.model_validate_json(e.model_dump_json()) == e
    for bad in (float("nan"), float("inf")):
        with _pytest.raises(ValidationError):
            Estimate(estimate=bad, epsilon=1.0, **common)


def test_estimates_for_an_infinite_epsilon_query_publish_null() -> None:
    from datetime import UTC, datetime

    from schemas import Query
    from stream_app.estimate import QueryEstimators, estimates_for
    from stream_app.windows import Window

    q = Query(query_id="q-inf", analyst_id="a", version=1, sensors=(7, 8), mechanism="rr",
              params={"pi2": 0.0}, population=10, t_start=datetime(2026, 11, 18, tzinfo=UTC),
              t_end=datetime(2026, 11, 19, tzinfo=UTC))
    assert q.epsilon == float("inf")
    qe = QueryEstimators.build(q)
    w = Window.new(q.query_id, 1, 5, 1, qe.width)
    out = estimates_for(qe, w, "watermark", datetime(2026, 11, 18, tzinfo=UTC), (0.95,), 1)
    assert out and all(e.epsilon is None for e in out)
    assert all(e.model_dump_json() for e in out)
