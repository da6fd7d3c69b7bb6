"""From a closed window to estimate records (``stream_app.worker.estimate``) and metrics
(``stream_app.worker.metrics``): no Faust, no broker.

The window is filled the way the running system fills it: a seeded epoch of known truth
counts is privatized by ``producers.fleet.privatize`` (per-vehicle and tally modes), sent by
the producer's own ``producers.replay.send_round`` and ``send_markers`` into an in-memory
sink (batches keyed and partitioned by random batch ids, an end-of-epoch marker per round
and partition), each record goes through stage 1 (``stream_app.worker.decode.to_partials``), then
through the stage-record encoding (``records.encode_partial``/``decode_partial``) and is
added to a ``WindowState`` in a seeded random order (or through ``WindowPolicy``). The
``EpochResult`` arrays and its rendered records are compared with what the statistics core
computes directly from the privatized arrays: ``estimate``, ``score_interval`` at 0.95 and
0.99, and the sd at ``max(estimate, 0)`` (for per-sensor per-vehicle pairs the default
report is implied: ``participants - non-default`` per station and round, completed per
producer here (``tests/station_counts.py``), over all producers' summed counts in the app),
and the consistent vector (``project_capped_simplex`` of each estimator's estimates, the
participants as the cap; where the cap binds it sums to exactly the participants; null for
withheld epochs and stations without source data).

Also checked: ``QueryEstimators.build`` and the query's ``width`` per mechanism; ``render()``: one record
per station and estimator, each valid for ``schemas.estimates.Estimate`` (pydantic) AND for
the committed JSON Schema ``schemas/estimate.schema.json`` (by the small validator below:
the ``jsonschema`` package is not installed in the project's venv), numbers equal to the
arrays; withheld epochs (too few participants; per-sensor without markers or with a
producer's markers missing; interrupted; conflicting markers) render ``estimate`` null and
``bounds`` []; ``round_count_mismatch``, ``refused``, ``missing_batches``, ``late`` carried;
SP takes N = max(participants, reports of each round); the fresh mechanism end to end;
``StreamMonitor`` gauges from the scrape-time collector and withheld counters.

Randomness: seeded privatization; the assertions are exact identities (up to float
rounding), never statistical.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
import zlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import estimators as E
import producers.replay.transport
from estimators import StationCounts
from producers.fleet import Device, EpochReports, epoch_rng, privatize
from producers.replay import send_markers, send_round
from schemas import Query
from schemas.epochs import epoch_start
from schemas.estimates import ESTIMATE_SCHEMA_PATH, Estimate, estimate_json_schema
from stream_app.report import withheld_code
from stream_app.worker.decode import to_partials
from stream_app.worker.estimate import WITHHELD_CODES, EpochResult, QueryEstimators, epoch_result
from stream_app.worker.metrics import StreamMonitor
from stream_app.worker.records import BatchPartial, MarkerPartial, WindowId, decode_partial, encode_partial
from stream_app.worker.windows import CloseReason, Watermarks, WindowPolicy, WindowState
from tests.station_counts import pair_counts

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
MECHANISMS = ("sp", "alp", "rr", "fresh")
PER_SENSOR = ("alp", "rr", "fresh")
ESTIMATOR_NAMES = {"sp": ["sp_difference"], "alp": ["alp_yhat", "alp_bottom", "alp_average", "alp_gls"],
                   "rr": ["rr"], "fresh": ["fresh_difference"]}


@pytest.fixture(autouse=True)
def _seeded_batch_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch ids (and so the partition of every batch) from a fixed seed, not os.urandom."""
    rng = np.random.default_rng([SEED, 1])
    monkeypatch.setattr(producers.replay.transport, "new_batch_id", lambda: rng.bytes(16).hex())


def make_query(mechanism: str) -> Query:
    return Query(query_id=f"q-{mechanism}", analyst_id="analyst-1", version=2, sensors=SENSORS, mechanism=mechanism,
                 population=1_000, t_start=T0, t_end=T0 + timedelta(minutes=10))


QUERIES = {m: make_query(m) for m in MECHANISMS}
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
             headers: list[tuple[str, bytes]] | None = None, topic: str | None = None,
             reports: int | None = None) -> None:
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
    """One epoch of ``q`` by K producer processes, as the replay's direct transport does
    (``producers.replay.transport.Direct``)."""
    truths, modes = list(truths), list(modes)
    k = len(truths)
    devices = list(devices) if devices is not None else [Device()] * k
    settings = SimpleNamespace(batch_size=batch_size)
    out = []
    for index, (tc, mode, device) in enumerate(zip(truths, modes, devices, strict=True)):
        producer_id = f"p{index}-{index:08x}"
        st = stop or Stop()
        er = privatize(q, StationCounts(tc), epoch_rng(SEED, q, EPOCH, index), mode, device)
        sent: dict[tuple[str, int], dict[int, list[int]]] = {}
        for r in range(q.n_rounds):
            per_part = sent.setdefault((q.record_key, r), {p: [0, 0] for p in sink.partitions})
            if er.participants:
                send_round(sink, settings, producer_id, q, EPOCH, r, er.rounds[r], per_part, st)  # type: ignore[arg-type]
        send_markers(sink, producer_id, index, k, EPOCH, sent, {q.record_key: q},
                      {q.query_id: (er.participants, er.refused)}, mode, st.requested)
        out.append(er)
    return out


Item = BatchPartial | MarkerPartial


def stage1(records: list[tuple[bytes, int, str]]) -> list[Item]:
    """Stage 1 and the stage-record encoding between the stages."""
    out: list[Item] = []
    for value, partition, kind in records:
        for p in to_partials(value, partition, lookup):
            assert isinstance(p, BatchPartial | MarkerPartial), p
            assert isinstance(p, MarkerPartial) == (kind == "end_of_epoch")
            back = decode_partial(encode_partial(p))
            assert isinstance(back, BatchPartial | MarkerPartial) and back == p
            out.append(back)
    return out


def window_from(q: Query, records: list[tuple[bytes, int, str]], order_seed: int = 0,
                keep: Callable[[Item], bool] | None = None) -> WindowState:
    """Stage 1 then stage 2: decode every record, add it to a new window in a seeded order."""
    w = WindowState.new(WindowId(q.query_id, q.version, EPOCH), q.n_rounds, q.width)
    items = stage1(records)
    for i in np.random.default_rng([order_seed, 99]).permutation(len(items)):
        p = items[i]
        if keep is None or keep(p):
            assert w.add(p) == "added"
    return w


def result(q: Query, w: WindowState, closed_by: CloseReason = "markers", min_participants: int = 1) -> EpochResult:
    w.close(closed_by)
    return epoch_result(QE[q.mechanism], w, closed_by, CONF, min_participants)


def run(q: Query, modes: tuple[str, ...] = ("per-vehicle", "per-vehicle"), min_participants: int = 1,
        order_seed: int = 0, closed_by: CloseReason = "markers",
        **kw: Any) -> tuple[EpochResult, WindowState, list[EpochReports]]:
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH[:len(modes)], modes, sink, **kw)
    w = window_from(q, sink.records, order_seed)
    assert w.markers_complete(N_PARTITIONS)
    return result(q, w, closed_by, min_participants), w, reports


def rendered(res: EpochResult) -> list[Estimate]:
    """The records as the app publishes them, each checked against the model and the schema."""
    schema = committed_schema()
    out = []
    for key, value in res.render():
        d = json.loads(value)
        assert validate(d, schema, schema) == [], d
        e = Estimate.model_validate_json(value)
        assert key == str(e.station).encode()
        out.append(e)
    assert len(out) == res.n_records() == res.query.n_stations * len(res.query.spec.estimator_names)
    return out


# ---------------------------------------------------------------------------------------
# the statistics core, directly
# ---------------------------------------------------------------------------------------
def direct_counts(q: Query, reports: list[EpochReports]) -> np.ndarray:
    """Per-station counts (V, R, O) from the privatized arrays, without the stream app."""
    mech = q.build()
    if q.per_station is None:
        rc = np.zeros((q.n_rounds, mech.n_outputs), dtype=np.int64)
        for er in reports:
            for r, arrays in enumerate(rnd.arrays() for rnd in er.rounds):
                if "counts" in arrays:
                    rc[r] += arrays["counts"]
                elif "value" in arrays:
                    rc[r] += np.bincount(arrays["value"], minlength=mech.n_outputs)
        return E.station_counts(mech, rc)
    counts = np.zeros((q.n_stations, q.n_rounds, mech.n_outputs), dtype=np.int64)
    for er in reports:
        if not er.participants:
            continue
        for r, arrays in enumerate(rnd.arrays() for rnd in er.rounds):
            if "counts" in arrays:
                counts[:, r] += arrays["counts"].reshape(q.n_stations, mech.n_outputs)
        if er.rounds[0].layout == "pairs":  # the default report is implied by the producer's participants
            pairs = [E.SparseReports(vehicle=np.zeros_like(a["station"]), station=a["station"], output=a["output"])
                     for a in (rnd.arrays() for rnd in er.rounds)]
            counts += pair_counts(q.spec, mech, q.n_stations, pairs, er.participants)
    return counts


def direct_estimates(q: Query, counts: np.ndarray, n: int) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for name, est in QE[q.mechanism].estimators.items():
        values = est.estimate(counts, n)
        sd = np.sqrt(np.maximum(est.variance(np.maximum(values, 0.0), n), 0.0))
        bounds = {c: est.score_interval(values, n, c) for c in CONF}
        out[name] = {"estimate": values, "sd": sd, "consistent": E.project_capped_simplex(values, float(n)),
                     **{f"lo{c}": bounds[c][0] for c in CONF},
                     **{f"hi{c}": bounds[c][1] for c in CONF}}
    return out


def assert_matches(res: EpochResult, q: Query, counts: np.ndarray, n: int) -> None:
    """Arrays and rendered records equal the statistics core's numbers."""
    assert res.withheld is None and res.withheld_code is None and res.participants == n
    want = direct_estimates(q, counts, n)
    assert list(res.values) == ESTIMATOR_NAMES[q.mechanism]
    for name, v in res.values.items():
        w = want[name]
        np.testing.assert_allclose(v.estimate, w["estimate"], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(v.sd, w["sd"], rtol=1e-12, atol=1e-9)
        assert v.consistent is not None
        np.testing.assert_allclose(v.consistent, w["consistent"], rtol=1e-12, atol=1e-9)
        for j, c in enumerate(CONF):
            np.testing.assert_allclose(v.lower[j], w[f"lo{c}"], rtol=1e-12, atol=1e-9)
            np.testing.assert_allclose(v.upper[j], w[f"hi{c}"], rtol=1e-12, atol=1e-9)
    records = rendered(res)
    assert [(e.estimator, e.station) for e in records] == [(name, s) for name in ESTIMATOR_NAMES[q.mechanism]
                                                           for s in SENSORS]
    for e in records:
        i = SENSORS.index(e.station)
        v = res.values[e.estimator]
        assert e.withheld is None and e.participants == n
        assert e.estimate == float(v.estimate[i]) and e.sd == float(v.sd[i])  # exactly the arrays
        assert v.consistent is not None and e.consistent == float(v.consistent[i])
        assert [b.confidence for b in e.bounds] == list(CONF)
        for j, b in enumerate(e.bounds):
            assert (b.lower, b.upper) == (float(v.lower[j, i]), float(v.upper[j, i]))
            assert 0.0 <= b.lower <= b.upper <= n
        assert all(math.isfinite(x) for x in (e.estimate, e.sd, *(v for b in e.bounds for v in (b.lower, b.upper))))
    for name in ESTIMATOR_NAMES[q.mechanism]:  # one vector per (query, epoch, estimator): consistent
        cons = np.array([e.consistent for e in records if e.estimator == name], dtype=np.float64)
        assert cons.min() >= 0.0 and cons.sum() <= n * (1 + 1e-12)


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
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_build_estimators_and_width(mechanism: str) -> None:
    q = QUERIES[mechanism]
    qe = QueryEstimators.build(q)
    mech = q.build()
    assert qe.query is q
    assert list(qe.estimators) == ESTIMATOR_NAMES[mechanism]
    assert all(isinstance(e, E.LinearEstimator) and e.name == name for name, e in qe.estimators.items())
    if mechanism == "sp":
        assert qe.query.width == mech.n_outputs == V + 1
        ref = {"sp_difference": E.sp_difference(mech)}
    elif mechanism == "alp":
        assert qe.query.width == V * mech.n_outputs == V * 3
        ref = E.alp_estimators(mech)
    elif mechanism == "rr":
        assert qe.query.width == V * mech.n_outputs == V * 2
        ref = {"rr": E.rr_estimator(mech)}
    else:
        assert qe.query.width == V * mech.n_outputs == V * 2
        ref = {"fresh_difference": E.fresh_difference(mech)}
    for name, est in qe.estimators.items():
        np.testing.assert_array_equal(np.broadcast_to(est.weights, ref[name].weights.shape), ref[name].weights)
        np.testing.assert_array_equal(est.mean, ref[name].mean)


# ---------------------------------------------------------------------------------------
# estimates from a window equal the statistics core's
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_estimates_equal_the_statistics_core(mechanism: str, mode: str) -> None:
    q = QUERIES[mechanism]
    res, w, reports = run(q, (mode, mode))
    n = sum(er.participants for er in reports)
    assert n == int(sum(t.sum() for t in TRUTH))
    assert w.participants() == (n, []) and w.missing_batches() == 0 and w.duplicates == 0
    if mode == "per-vehicle":  # batches were split (batch size 40) and spread over the partitions
        assert len(w.seen) > 2 * q.n_rounds
    counts = direct_counts(q, reports)
    assert_matches(res, q, counts, n)
    # reports: station-valued, one per vehicle and round; per-sensor, the non-default answers -- what
    # per-vehicle pairs carry, and what a tally holds beside its implied defaults (so both modes agree)
    default = q.spec.default_report(q.build())
    want = int(counts.sum() - counts[:, :, default].sum()) if q.spec.per_sensor else n * q.n_rounds
    if not q.spec.per_sensor or mode == "per-vehicle":
        assert want == int(w.reports.sum()) == sum(sum(er.reports) for er in reports)
    for e in rendered(res):
        assert (e.query_id, e.query_version, e.mechanism, e.epoch) == (q.query_id, 2, mechanism, EPOCH)
        assert e.reports == want
        assert e.epsilon == q.epsilon and e.closed_by == "markers"
        assert (e.refused, e.missing_batches, e.late) == (0, 0, 0)
        assert e.round_count_mismatch == (res.round_reports[1] - res.round_reports[0] if q.n_rounds == 2 else 0)
        assert sum(res.round_reports) == want
        if mechanism == "sp":
            assert e.round_count_mismatch == 0


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_implied_default_reports_of_per_vehicle_pairs(mechanism: str) -> None:
    """Per station and round, the default report's count is participants minus the
    non-default reports (``MechanismSpec.complete``)."""
    q = QUERIES[mechanism]
    _, w, reports = run(q)
    n = sum(er.participants for er in reports)
    mech = q.build()
    counts = q.spec.complete(mech, q.n_stations, w.counts, n)
    assert counts.shape == (V, q.n_rounds, mech.n_outputs)
    np.testing.assert_array_equal(counts, direct_counts(q, reports))
    assert np.all(counts.sum(axis=2) == n)
    d = q.default_report
    assert d is not None
    nondefault = counts.sum(axis=2) - counts[:, :, d]
    np.testing.assert_array_equal(counts[:, :, d], n - nondefault)
    # the window itself holds only the non-default pairs: its default column is empty
    assert not w.counts.reshape(q.n_rounds, V, -1)[:, :, d].any()


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_mixed_tally_and_per_vehicle_producers(mechanism: str) -> None:
    q = QUERIES[mechanism]
    res, w, reports = run(q, ("tally", "per-vehicle"))
    assert w.tallied.tolist() == [reports[0].participants] * q.n_rounds
    assert_matches(res, q, direct_counts(q, reports), sum(er.participants for er in reports))


def test_sp_mixed_tally_and_per_vehicle_producers() -> None:
    q = QUERIES["sp"]
    res, w, reports = run(q, ("per-vehicle", "tally"))
    assert w.tallied.tolist() == [reports[1].participants] * 2
    assert_matches(res, q, direct_counts(q, reports), sum(er.participants for er in reports))


@pytest.mark.parametrize("mechanism", ["sp", "alp", "fresh"])
def test_estimates_do_not_depend_on_arrival_order(mechanism: str) -> None:
    q = QUERIES[mechanism]
    a, _, _ = run(q, order_seed=1)
    b, _, _ = run(q, order_seed=2)
    assert [v for _, v in a.render()] == [v for _, v in b.render()]


def test_redelivered_records_change_nothing() -> None:
    """Every record delivered twice (at-least-once delivery): same estimates, all duplicates counted."""
    q = QUERIES["alp"]
    once, _, _ = run(q)
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = WindowState.new(WindowId(q.query_id, q.version, EPOCH), q.n_rounds, q.width)
    twice = stage1(sink.records + sink.records)
    outcomes = [w.add(twice[i]) for i in np.random.default_rng(3).permutation(len(twice))]
    assert outcomes.count("duplicate") == w.duplicates == len(sink.records)
    again = result(q, w)
    assert [v for _, v in again.render()] == [v for _, v in once.render()]


@pytest.mark.parametrize("mechanism", ["sp", "fresh"])
@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
def test_end_to_end_through_the_policy(mechanism: str, mode: str) -> None:
    """decode -> policy (markers close the epoch) -> epoch_result, with the window and the
    watermark persisted as bytes after every stage-2 batch of 7 records. Records keep their
    order within a source partition (Kafka's guarantee, kept by stage 1); the partitions
    interleave in a seeded random way."""
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, (mode, mode), sink)
    decoded = stage1(sink.records)
    queues = [[p for p in decoded if p.source_partition == part] for part in range(N_PARTITIONS)]
    picks = np.random.default_rng(8).permutation([part for part in range(N_PARTITIONS) for _ in queues[part]])
    items = [queues[part].pop(0) for part in picks]
    policy = WindowPolicy(n_source_partitions=N_PARTITIONS)
    stored: dict[WindowId, bytes] = {}
    wm_bytes: bytes | None = None
    closed = []
    for s in range(0, len(items), 7):
        wm = Watermarks.decode(wm_bytes)
        out = policy.apply(wm, lambda wid: WindowState.decode(stored[wid]) if wid in stored else None,
                           lambda wid: (q.n_rounds, q.width) if wid.query_id == q.query_id else None, items[s:s + 7])
        closed += [epoch_result(QE[mechanism], st, reason, CONF, 1) for st, reason in out.closed]
        stored.update({wid: st.encode() for wid, st in out.touched.items()})
        if wm.dirty:
            wm_bytes = wm.encode()
    assert [(r.epoch, r.closed_by) for r in closed] == [(EPOCH, "markers")]
    assert_matches(closed[0], q, direct_counts(q, reports), sum(er.participants for er in reports))


# ---------------------------------------------------------------------------------------
# the contract: render, fields, JSON, schema
# ---------------------------------------------------------------------------------------
def test_committed_schema_is_current() -> None:
    regenerated = estimate_json_schema()
    assert committed_schema() == regenerated
    assert ESTIMATE_SCHEMA_PATH.read_text() == json.dumps(regenerated, indent=2, sort_keys=True) + "\n"


def test_validator_is_not_vacuous() -> None:
    schema = estimate_json_schema()
    res, _, _ = run(QUERIES["rr"])
    good = json.loads(res.render()[0][1])
    assert validate(good, schema, schema) == []
    bad = [{k: v for k, v in good.items() if k != "station"}, {**good, "vehicle": 1}, {**good, "epoch": -1},
           {**good, "estimator": "nope"}, {**good, "bounds": [{"confidence": 1.5, "lower": 0, "upper": 1}]},
           {**good, "epoch_start": "2026-11-18T08:00:00"}, {**good, "estimate": "3"}, {**good, "kind": "x"},
           {**good, "closed_by": "nope"}, {**good, "mechanism": "nope"}]
    for b in bad:
        assert validate(b, schema, schema), b


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_rendered_json_has_the_contract_fields_and_validates(mechanism: str) -> None:
    q = QUERIES[mechanism]
    res, _, _ = run(q)
    expected_start = epoch_start(EPOCH)
    for (key, value), e in zip(res.render(), rendered(res), strict=True):
        d = json.loads(value)
        assert set(d) == set(Estimate.model_fields)  # every field, nothing else
        assert d["kind"] == "estimate" and d["station"] in SENSORS and d["withheld"] is None
        assert key == str(d["station"]).encode()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d([+-]\d\d:\d\d|Z)", d["epoch_start"]), d["epoch_start"]
        assert d["epoch_start"].endswith("-08:00")  # Pacific standard time on 2026-11-18
        start = datetime.fromisoformat(d["epoch_start"])
        assert start == expected_start and int(start.timestamp()) == EPOCH * 30
        assert [b["confidence"] for b in d["bounds"]] == [0.95, 0.99]
        assert all(set(b) == {"confidence", "lower", "upper"} for b in d["bounds"])
        # the hand-rendered JSON says what pydantic would have written
        assert json.loads(e.model_dump_json()) == {**d, "bounds": [dict(b) for b in d["bounds"]]}


# ---------------------------------------------------------------------------------------
# withheld
# ---------------------------------------------------------------------------------------
def assert_withheld(res: EpochResult, q: Query, code: str, reason: str) -> list[Estimate]:
    assert res.withheld_code == code and res.withheld is not None and reason in res.withheld, res.withheld
    assert code in WITHHELD_CODES
    assert withheld_code(res.withheld) == code  # what ptt report reads back from the text on the wire
    assert res.values == {}
    records = rendered(res)
    assert len(records) == len(ESTIMATOR_NAMES[q.mechanism]) * V
    for (_, value), e in zip(res.render(), records, strict=True):
        assert e.withheld == res.withheld
        assert (e.estimate, e.sd, e.bounds, e.consistent) == (None, None, (), None)
        d = json.loads(value)
        assert d["estimate"] is None and d["bounds"] == [] and d["sd"] is None and d["consistent"] is None
    return records


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_withheld_below_min_participants(mechanism: str) -> None:
    q = QUERIES[mechanism]
    n = int(sum(t.sum() for t in TRUTH))
    res, _, _ = run(q, min_participants=n + 1)
    records = assert_withheld(res, q, "too_few_participants", f"fewer than {n + 1}")
    assert all(e.participants == n for e in records)
    ok, _, _ = run(q, min_participants=n)
    assert ok.withheld is None and all(e.withheld is None for e in rendered(ok))


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_per_sensor_without_markers_is_withheld(mechanism: str) -> None:
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: isinstance(p, BatchPartial))
    res = result(q, w, "watermark")
    records = assert_withheld(res, q, "participants_unknown", "participants unknown")
    assert all(e.participants == 0 and e.closed_by == "watermark" for e in records)


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_per_sensor_with_a_producers_markers_missing_is_withheld(mechanism: str) -> None:
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: not (isinstance(p, MarkerPartial) and p.producer_index == 1))
    assert not w.markers_complete(N_PARTITIONS)
    res = result(q, w, "watermark")
    assert_withheld(res, q, "participants_unknown", "no marker from producer(s) [1]")


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
def test_sp_without_markers_takes_n_from_the_reports(mode: str) -> None:
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, (mode, mode), sink)
    w = window_from(q, sink.records, keep=lambda p: isinstance(p, BatchPartial))
    assert w.participants() == (None, []) and w.markers == {}
    res = result(q, w, "wall_clock")
    n = sum(er.participants for er in reports)
    assert max(w.reports.tolist()) == n
    assert_matches(res, q, direct_counts(q, reports), n)
    assert all(e.closed_by == "wall_clock" and e.missing_batches == 0 for e in rendered(res))


def test_sp_with_a_producers_markers_missing_does_not_undercount_n() -> None:
    """SP N = max(participants, reports of each round): with producer 1's markers lost, the
    round-0 markers say producer 0's vehicles only, but every vehicle sent one report per
    round, so N is at least the reports of a round. Since some producer's markers did come,
    the missing one's reports may be missing too: the epoch is withheld with the reason."""
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    w = window_from(q, sink.records, keep=lambda p: not (isinstance(p, MarkerPartial) and p.producer_index == 1))
    assert w.participants() == (reports[0].participants, [1])
    res = result(q, w, "watermark")
    n = sum(er.participants for er in reports)
    assert res.participants == max(w.reports.tolist()) == n > reports[0].participants
    assert res.withheld_code == "participants_unknown" and "producer(s) [1]" in (res.withheld or "")
    assert all(e.estimate is None and e.participants == n for e in rendered(res))


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_watermark_close_with_some_partitions_markers_missing_is_withheld(mechanism: str) -> None:
    """Every producer's round-0 marker came (on partition 0), but partition 2's markers never did:
    the batches sent there are unaccounted for, so the epoch is withheld as missing_markers --
    even though partition 2's batches did arrive here (nothing proves it)."""
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    items = stage1(sink.records)
    w = window_from(q, sink.records, keep=lambda p: not (isinstance(p, MarkerPartial) and p.source_partition == 2))
    w.close("watermark")
    res = epoch_result(QE[mechanism], w, "watermark", CONF, 1, N_PARTITIONS)
    assert_withheld(res, q, "missing_markers", "partition")
    whole = window_from(q, sink.records)  # the same epoch with every marker is published
    assert whole.markers_complete(N_PARTITIONS) and len(items) > 0
    whole.close("watermark")
    assert epoch_result(QE[mechanism], whole, "watermark", CONF, 1, N_PARTITIONS).withheld is None


def test_sp_round_count_mismatch_and_missing_batches() -> None:
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    reports = produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    decoded = stage1(sink.records)
    first_round1 = next(i for i, p in enumerate(decoded) if isinstance(p, BatchPartial) and p.round == 1)
    lost = decoded[first_round1]
    assert isinstance(lost, BatchPartial) and lost.reports == 40
    w = window_from(q, sink.records[:first_round1] + sink.records[first_round1 + 1:])
    assert w.markers_complete(N_PARTITIONS)  # the markers all came; one batch did not
    res = result(q, w)
    n = sum(er.participants for er in reports)
    assert res.round_count_mismatch == -lost.reports and res.missing_batches == 1
    records = rendered(res)
    assert all(e.round_count_mismatch == -lost.reports and e.missing_batches == 1 for e in records)
    assert all(e.reports == 2 * n - lost.reports and e.participants == n for e in records)
    # a batch the markers announce never came: the difference would be biased -> withheld, stated
    assert res.withheld_code == "missing_batches" and all(e.estimate is None for e in records)


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_mismatch_is_zero_for_one_round_mechanisms(mechanism: str) -> None:
    res, _, _ = run(QUERIES[mechanism])
    assert res.round_count_mismatch == 0 and {e.round_count_mismatch for e in rendered(res)} == {0}


@pytest.mark.parametrize("mechanism", MECHANISMS)
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
    res = result(q, w)
    assert res.refused == int(TRUTH[1].sum()) and all(e.refused == res.refused for e in rendered(res))
    assert_matches(res, q, direct_counts(q, reports[:1]), reports[0].participants)


def test_late_records_are_carried() -> None:
    q = QUERIES["rr"]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("tally", "tally"), sink)
    w = window_from(q, sink.records)
    w.close("markers")
    late = stage1(sink.records[:1])[0]
    assert w.add(late) == "late"
    res = epoch_result(QE["rr"], w, "markers", CONF, 1)
    assert res.late == 1 and {e.late for e in rendered(res)} == {1}


def test_an_interrupted_epoch_is_withheld() -> None:
    """A producer stopped by Ctrl-C in the middle of an epoch marks it ``interrupted`` with
    exactly what was sent; its markers still complete the window (no batch is missing), but
    round 1 holds a fraction of the reports: withheld, code "interrupted"."""
    q = QUERIES["sp"]
    sink = MemorySink(N_PARTITIONS)
    n = int(TRUTH[0].sum())
    per_round = -(-n // 40)  # batches of 40 reports
    reports = produce(q, TRUTH[:1], ("per-vehicle",), sink, stop=Stop(after=per_round + 3))
    w = window_from(q, sink.records)
    assert w.markers_complete(N_PARTITIONS) and w.missing_batches() == 0
    assert w.interrupted()
    assert w.reports.tolist() == [n, 3 * 40] and reports[0].participants == n
    assert_withheld(result(q, w), q, "interrupted", "interrupted")


@pytest.mark.parametrize("mechanism", ["sp", "alp"])
def test_conflicting_markers_withhold_the_epoch_in_any_order(mechanism: str) -> None:
    """Changed on purpose: a second, different marker for a producer slot (a producer
    restarted and re-sent under a new id) is not resolved by producer-id order; the epoch is
    withheld with code "conflicting_markers", whichever marker arrived first."""
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    items = stage1(sink.records)
    m0 = next(p for p in items if isinstance(p, MarkerPartial) and p.producer_index == 0 and p.round == 0)
    impostor = MarkerPartial(**{**m0.__dict__, "producer_id": "p0-restarted", "participants": m0.participants - 5})
    codes = []
    for first in (True, False):
        w = WindowState.new(WindowId(q.query_id, q.version, EPOCH), q.n_rounds, q.width)
        for p in ([impostor] if first else []) + items + ([] if first else [impostor]):
            w.add(p)
        assert w.conflicting == {(0, 0, m0.source_partition)}
        res = result(q, w)
        assert_withheld(res, q, "conflicting_markers", f"round 0 producer 0 partition {m0.source_partition}")
        codes.append([v for _, v in res.render()])
    assert codes[0] == codes[1]  # the withheld records (participants, missing_batches) too


def test_infinite_epsilon_is_null_and_estimates_reject_nan() -> None:
    """JSON has no infinity: an infinite query epsilon (no device would answer) is published
    as null, and NaN/inf estimates or bounds are refused by the model."""
    from pydantic import ValidationError

    common = {"query_id": "q", "query_version": 1, "mechanism": "rr", "estimator": "rr", "epoch": 1,
              "epoch_start": datetime(2026, 11, 18, tzinfo=UTC), "station": 7, "sd": None, "bounds": (),
              "reports": 0, "participants": 0, "withheld": "refused", "closed_by": "markers",
              "round_count_mismatch": 0, "late": 0, "refused": 10, "missing_batches": 0}
    e = Estimate(estimate=None, epsilon=None, **common)
    assert Estimate.model_validate_json(e.model_dump_json()) == e
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            Estimate(estimate=bad, epsilon=1.0, **common)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_nan_sd_withholds_the_epoch_instead_of_writing_invalid_json(mechanism: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN variance would render ``"sd":nan`` (not JSON); the epoch is withheld as internal."""
    q = QUERIES[mechanism]
    name, est = next(iter(QE[mechanism].estimators.items()))

    class NanVariance:
        def __getattr__(self, attr: str) -> Any:
            return getattr(est, attr)

        def variance(self, v: Any, ns: Any) -> Any:
            return np.full(np.shape(v), np.nan)

    monkeypatch.setitem(QE[mechanism].estimators, name, NanVariance())
    res, _, _ = run(q)
    assert_withheld(res, q, "internal", "non-finite")


def test_an_infinite_epsilon_query_renders_null() -> None:
    q = Query(query_id="q-inf", analyst_id="a", version=1, sensors=(7, 8), mechanism="rr",
              params={"pi2": 0.0}, population=10, t_start=datetime(2026, 11, 18, tzinfo=UTC),
              t_end=datetime(2026, 11, 19, tzinfo=UTC))
    assert q.epsilon == float("inf")
    qe = QueryEstimators.build(q)
    w = WindowState.new(WindowId(q.query_id, 1, 5), 1, qe.query.width)
    w.close("watermark")
    res = epoch_result(qe, w, "watermark", (0.95,), 1)
    out = res.render()
    assert len(out) == 2
    for _, value in out:
        assert json.loads(value)["epsilon"] is None
        assert Estimate.model_validate_json(value).epsilon is None


# ---------------------------------------------------------------------------------------
# metrics: StreamMonitor and the scrape-time StationArrays
# ---------------------------------------------------------------------------------------
def samples(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, parsed from the exposition text."""
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def est_labels(q: Query, name: str, station: int, conf: float | None = None) -> tuple[tuple[str, str], ...]:
    d = {"query": q.query_id, "mechanism": q.mechanism, "estimator": name, "station": str(station)}
    if conf is not None:
        d["confidence"] = f"{conf:g}"
    return tuple(sorted(d.items()))


@pytest.mark.parametrize("mechanism", ["alp", "fresh"])
def test_monitor_exposes_per_station_estimates_and_bounds(mechanism: str) -> None:
    q = QUERIES[mechanism]
    res, _, _ = run(q)
    reg = CollectorRegistry()
    mon = StreamMonitor(reg)
    mon.on_epoch_closed(res)
    got = samples(reg)
    for name, v in res.values.items():
        for i, s in enumerate(SENSORS):
            assert got[("ptt_estimate_vehicles", est_labels(q, name, s))] == pytest.approx(v.estimate[i], rel=1e-12)
            for j, c in enumerate(CONF):
                assert got[("ptt_estimate_lower_vehicles", est_labels(q, name, s, c))] == \
                    pytest.approx(v.lower[j, i], rel=1e-12)
                assert got[("ptt_estimate_upper_vehicles", est_labels(q, name, s, c))] == \
                    pytest.approx(v.upper[j, i], rel=1e-12)
    n_est = sum(1 for k in got if k[0] == "ptt_estimate_vehicles")
    assert n_est == res.n_records()
    assert sum(1 for k in got if k[0] == "ptt_estimate_lower_vehicles") == res.n_records() * len(CONF)
    assert reg.get_sample_value("ptt_epochs_closed_total", {"query": q.query_id, "closed_by": "markers"}) == 1.0
    assert reg.get_sample_value("ptt_epoch_participants", {"query": q.query_id}) == res.participants
    assert reg.get_sample_value("ptt_suppressed_estimates_total", {"query": q.query_id}) == 0.0


def test_monitor_withheld_epoch_counts_and_keeps_the_gauges() -> None:
    q = QUERIES["rr"]
    ok, _, _ = run(q)
    n = int(sum(t.sum() for t in TRUTH))
    withheld, _, _ = run(q, min_participants=n + 1)
    assert withheld.withheld_code == "too_few_participants"
    reg = CollectorRegistry()
    mon = StreamMonitor(reg)
    mon.on_epoch_closed(ok)
    before = {k: v for k, v in samples(reg).items() if k[0].startswith("ptt_estimate_")}
    assert before
    mon.on_epoch_closed(withheld)
    after = {k: v for k, v in samples(reg).items() if k[0].startswith("ptt_estimate_")}
    assert after == before  # the per-station gauges keep the last published values
    labels = {"query": q.query_id, "reason": "too_few_participants"}
    assert reg.get_sample_value("ptt_withheld_epochs_total", labels) == 1.0
    for code in WITHHELD_CODES:
        if code != "too_few_participants":  # exist at zero
            assert reg.get_sample_value("ptt_withheld_epochs_total", {"query": q.query_id, "reason": code}) == 0.0
    assert reg.get_sample_value("ptt_suppressed_estimates_total", {"query": q.query_id}) == withheld.n_records()


def test_monitor_truth_leaves_nan_stations_out() -> None:
    reg = CollectorRegistry()
    mon = StreamMonitor(reg)
    mon.on_truth(EPOCH, SENSORS, [3.0, float("nan"), 0.0, 7.5])
    got = {dict(k[1])["station"]: v for k, v in samples(reg).items() if k[0] == "ptt_ground_truth_vehicles"}
    assert got == {str(SENSORS[0]): 3.0, str(SENSORS[2]): 0.0, str(SENSORS[3]): 7.5}
    assert reg.get_sample_value("ptt_ground_truth_epoch") == EPOCH


# ---------------------------------------------------------------------------------------
# missing source readings: no truth, and the estimates say so
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_stations_without_a_source_reading_are_marked(mechanism: str) -> None:
    """A replay's markers name the stations whose source reading is missing this epoch; their
    estimates carry data_quality "no_source_data" (the others "ok"), the monitor counts them,
    and the numbers themselves are unchanged."""
    import dataclasses

    from prometheus_client import CollectorRegistry, generate_latest

    from stream_app.worker.metrics import StreamMonitor

    q = QUERIES[mechanism]
    plain, w, _ = run(q)
    flagged = dict(w.markers)
    for slot, m in flagged.items():
        if slot[0] == 0:
            w.markers[slot] = dataclasses.replace(m, readings_missing=(2,))
    res = result(q, w)
    assert res.no_source_data == frozenset({2})
    out = rendered(res)
    assert {e.station for e in out if e.data_quality == "no_source_data"} == {q.sensors[1]}
    assert all(e.data_quality == "ok" for e in out if e.station != q.sensors[1])
    assert [e.estimate for e in out] == [e.estimate for e in rendered(plain)]
    # the projection still runs over every station; a station without truth publishes null
    assert [e.consistent for e in out if e.station != q.sensors[1]] == [
        e.consistent for e in rendered(plain) if e.station != q.sensors[1]]
    assert all(e.consistent is None for e in out if e.station == q.sensors[1])
    monitor = StreamMonitor(CollectorRegistry())
    monitor.on_epoch_closed(res)
    text = generate_latest(monitor.registry).decode()
    assert f'ptt_no_source_data_estimates_total{{query="{q.query_id}"}} {float(len(q.spec.estimator_names))}' in text
    back = type(w).decode(w.encode())  # persisted with the window
    assert back.no_source_data() == frozenset({2})


# ---------------------------------------------------------------------------------------
# several closed windows estimated at once (a backlog closes many epochs per batch)
# ---------------------------------------------------------------------------------------
def _impossible_copy(q: Query, w: WindowState) -> WindowState:
    """``w`` with every participant claiming one output in round 0 (row totals still add up),
    for SP another one in round 1: the headline's plausibility check withholds it for some
    output."""
    mech = q.build()
    n, _ = w.participants()
    assert n
    for face in range(mech.n_outputs):
        forged = copy.deepcopy(w)
        if q.spec.per_sensor:
            row = forged.counts[0, :mech.n_outputs]
            row[:] = 0
            row[face] = n
        else:
            forged.counts[:, :] = 0  # round 0 all at one face, round 1 all at another
            forged.counts[0, face] = n
            forged.counts[-1, (face + 1) % mech.n_outputs] = n
        forged.close("markers")
        if epoch_result(QE[q.mechanism], forged, "markers", CONF, 1).withheld_code == "impossible_counts":
            return forged
    raise AssertionError("no forged window was implausible")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_windows_estimated_together_equal_one_by_one(mechanism: str) -> None:
    """``epoch_results`` stacks the windows' arithmetic; every result (values, withheld text,
    rendered bytes) equals ``epoch_result`` on each window alone, whatever mix of published,
    withheld before estimation and implausible windows is stacked."""
    q = QUERIES[mechanism]
    windows: list[tuple[WindowState, CloseReason]] = []
    for seed, modes in enumerate([("per-vehicle", "per-vehicle"), ("tally", "tally"), ("tally", "per-vehicle")]):
        _, w, _ = run(q, modes, order_seed=seed)
        windows.append((w, "markers"))
    windows.insert(1, (_impossible_copy(q, windows[0][0]), "markers"))
    sink = MemorySink(N_PARTITIONS)  # no markers: per-sensor ones are withheld before any arithmetic
    produce(q, TRUTH, ("per-vehicle", "per-vehicle"), sink)
    lone = window_from(q, sink.records, keep=lambda p: isinstance(p, BatchPartial))
    lone.close("watermark")
    windows.append((lone, "watermark"))
    together = E_results(q, windows)
    alone = [epoch_result(QE[q.mechanism], w, why, CONF, 1) for w, why in windows]
    assert [r.withheld_code for r in together] == [r.withheld_code for r in alone]
    assert together[1].withheld_code == "impossible_counts" and together[0].withheld is None
    assert sum(r.withheld is None for r in together) == (3 if q.spec.per_sensor else 4)  # SP: N from reports
    for a, b in zip(together, alone, strict=True):
        assert a.render() == b.render()
        assert a.extra == b.extra


def E_results(q: Query, windows: list[tuple[WindowState, CloseReason]]) -> list[EpochResult]:  # noqa: N802
    from stream_app.worker.estimate import epoch_results

    return epoch_results(QE[q.mechanism], windows, CONF, 1)


@pytest.mark.parametrize("mechanism", ["sp", "alp"])
def test_born_late_epoch_is_withheld_as_late_unless_its_markers_completed_it(mechanism: str) -> None:
    """A window opened after the watermark had passed its epoch: closed by the watermark
    (incomplete) it is withheld as ``late``; closed by its complete markers it is published as
    any other -- the same numbers as the epoch on time."""
    q = QUERIES[mechanism]
    sink = MemorySink(N_PARTITIONS)
    produce(q, TRUTH[:1], ("per-vehicle",), sink)
    on_time = result(q, window_from(q, sink.records))
    late = window_from(q, sink.records)
    late.born_late = True
    complete = result(q, late)
    assert complete.withheld is None and [e.model_dump() for e in rendered(complete)] == [
        e.model_dump() for e in rendered(on_time)]
    partial = window_from(q, sink.records)
    partial.born_late = True
    res = result(q, partial, "watermark")
    assert res.withheld_code == "late" and "after the watermark" in (res.withheld or "")
    assert all(e.estimate is None for e in rendered(res))


# ---------------------------------------------------------------------------------------
# the consistent estimate where the cap binds
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_consistent_estimate_where_the_participants_cap_binds(mechanism: str, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Nearly every vehicle at a station: the first of a few seeded epochs whose unbiased
    estimates sum past the participants for some estimator (about every other epoch does), and
    the published consistent vector is the projection -- non-negative and summing to exactly
    the participants there. The unbiased estimate and its bounds are unchanged by it (equal to
    the statistics core's)."""
    q = QUERIES[mechanism]
    truths = (np.array([0, 80, 120, 160, 40]), np.array([0, 70, 90, 30, 110]))
    n = int(sum(int(t.sum()) for t in truths))
    for seed in range(SEED, SEED + 20):  # P(none of 20 binds) ~ 2^-20 at about one in two
        monkeypatch.setattr(sys.modules[__name__], "SEED", seed)
        sink = MemorySink(N_PARTITIONS)
        reports = produce(q, truths, ("per-vehicle", "tally"), sink)
        res = result(q, window_from(q, sink.records))
        binding = [name for name, v in res.values.items() if np.maximum(v.estimate, 0).sum() > n]
        if binding:
            break
    assert binding, {name: float(np.maximum(v.estimate, 0).sum()) for name, v in res.values.items()}
    assert_matches(res, q, direct_counts(q, reports), n)
    for name in binding:
        cons = res.values[name].consistent
        assert cons is not None
        np.testing.assert_allclose(cons.sum(), n, rtol=1e-12)
        assert cons.min() >= 0.0 and np.any(cons < np.maximum(res.values[name].estimate, 0.0))


def test_a_span_flow_over_a_reading_gap_is_published_without_a_number() -> None:
    """A span query's station with an epoch of no source reading in the span: its row carries no
    number (estimate, sd, bounds and consistent null), flagged no_source_data, as a rollup's over
    the same gap; the other stations' rows are unchanged. (It was published as a number.)"""
    import dataclasses

    q = Query.model_validate({**QUERIES["rr"].model_dump(), "span_s": 300})
    _, w, _ = run(q)
    for slot, m in dict(w.markers).items():
        if slot[0] == 0:
            w.markers[slot] = dataclasses.replace(m, readings_missing=(2,))
    w.close("markers")
    res = epoch_result(QueryEstimators.build(q), w, "markers", CONF, 1)
    assert res.no_source_data == frozenset({2}) == res.blank
    out = rendered(res)
    gap = [e for e in out if e.station == q.sensors[1]]
    assert gap and all(e.estimate is None and e.sd is None and e.data_quality == "no_source_data" for e in gap)
    assert all(e.estimate is not None for e in out if e.station != q.sensors[1])
    one_epoch = result(QUERIES["rr"], run(QUERIES["rr"])[1])
    assert not one_epoch.blank  # a 30-s epoch's row keeps its number, flagged
