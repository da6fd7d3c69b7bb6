"""The published shuffled epsilon (``stream_app.worker.estimate``: ``ShuffledEpsilon``,
``epoch_results``; its rows, frame header, long table, metrics and JSON Schema).

Checked: the value is ``spec.shuffled_epsilon(mech, V, n', delta)`` at ``n'`` = the window's
smallest attested size rounded DOWN to 2 significant digits, computed once per (query, version,
n'); a lie (a size above what a producer released) or a missing attestation gives null and the
reason, counted by the monitor, while the estimates are still published and ``epsilon`` kept;
rows carrying it validate against the committed JSON Schema, where it is optional and nullable;
frames carry it in their header, and a header from before it reads as null.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

import estimators.shuffle
from schemas import EndOfEpoch, Query, decode_record, encode_json
from stream_app.settings import WorkerSettings
from stream_app.worker.decode import to_partials
from stream_app.worker.estimate import EpochResult, ShuffledEpsilon, epoch_results, round_down_2sig
from stream_app.worker.frames import decode_frame, encode_frame, frame_rows, long_table
from stream_app.worker.metrics import StreamMonitor
from stream_app.worker.records import MarkerPartial, decode_partial, encode_partial
from stream_app.worker.windows import WindowState
from tests.unit.stream_app.worker.test_estimate import CONF, N_PARTITIONS, QE, QUERIES, committed_schema, run, validate

DELTA = 1e-6


def attest(w: WindowState, q: Query, extra: dict[tuple[int, int], int] | None = None) -> dict[tuple[int, int], int]:
    """Every marker of ``w`` attests what its producer released in its round (plus ``extra``);
    the sizes per (round, producer)."""
    released: dict[tuple[int, int], int] = {}
    for (r, i, _), m in w.markers.items():
        released[(r, i)] = m.participants if q.spec.per_sensor else released.get((r, i), 0) + m.reports
    sizes = {k: v + (extra or {}).get(k, 0) for k, v in released.items()}
    w.markers = {slot: replace(m, shuffle_size=sizes[slot[:2]]) for slot, m in w.markers.items()}
    return sizes


def close(q: Query, w: WindowState, shuffled: ShuffledEpsilon | None) -> EpochResult:
    (res,) = epoch_results(QE[q.mechanism], [(w, "markers")], CONF, 1, N_PARTITIONS, shuffled)
    return res


@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr"])
def test_the_value_is_the_specs_at_the_smallest_size_rounded_down(mechanism: str) -> None:
    q = QUERIES[mechanism]
    _, w, _ = run(q)
    sizes = attest(w, q)
    n = min(sizes.values())
    assert n >= 100 and n != round_down_2sig(n), "the test needs a size that rounding changes"
    res = close(q, w, ShuffledEpsilon(DELTA))
    want: float | None = q.spec.shuffled_epsilon(q.build(), q.n_stations, n - n % 10 ** (len(str(n)) - 2), DELTA)
    if want is not None and math.isinf(want):  # no shuffled bound (Sampling Privacy's linked rounds): null
        want = None
    assert res.withheld is None and res.shuffle_null is None
    assert res.epsilon_shuffled == want
    rows = [json.loads(v) for _, v in res.render()]
    schema = committed_schema()
    assert all(r["epsilon_shuffled"] == want and validate(r, schema, schema) == [] for r in rows)


def test_rounding_down_is_what_is_published_when_it_matters() -> None:
    """ALP's bound depends on n: the published value is at n' < n, the larger (conservative) one."""
    q = QUERIES["alp"]
    at_n = q.spec.shuffled_epsilon(q.build(), q.n_stations, 12_345, DELTA)
    at_rounded = q.spec.shuffled_epsilon(q.build(), q.n_stations, 12_000, DELTA)
    assert ShuffledEpsilon(DELTA).get(q, 12_345) == at_rounded > at_n


def test_not_attested_gives_null_and_the_estimates_stay() -> None:
    q = QUERIES["sp"]
    res, w, _ = run(q)  # the direct replay's markers: no shuffle size
    again = close(q, w, ShuffledEpsilon(DELTA))
    assert again.epsilon_shuffled is None and again.shuffle_null == "not_attested" and again.withheld is None
    assert res.epsilon_shuffled is None  # without a cache: not computed at all
    assert all(json.loads(v)["epsilon_shuffled"] is None for _, v in again.render())


@pytest.mark.parametrize("mechanism", ["sp", "alp"])
def test_a_lie_gives_null_counted_and_the_estimates_stay(mechanism: str) -> None:
    q = QUERIES[mechanism]
    honest, w, _ = run(q)
    attest(w, q, extra={(1 if q.n_rounds > 1 else 0, 1): 1})  # producer 1 claims one report more than it released
    res = close(q, w, ShuffledEpsilon(DELTA))
    assert res.epsilon_shuffled is None and res.shuffle_null == "exceeds_released"
    assert res.withheld is None and res.header()["epsilon"] == honest.header()["epsilon"] is not None
    assert {k: v.estimate.tolist() for k, v in res.values.items()} == {
        k: v.estimate.tolist() for k, v in honest.values.items()}
    monitor = StreamMonitor(CollectorRegistry())
    monitor.on_epoch_closed(res)
    labels = {"query": q.query_id, "reason": "exceeds_released"}
    assert monitor.registry.get_sample_value("ptt_epsilon_shuffled_null_epochs_total", labels) == 1.0
    assert monitor.registry.get_sample_value(
        "ptt_epsilon_shuffled_null_epochs_total", {**labels, "reason": "not_attested"}) == 0.0


def test_the_gauge_follows_the_latest_epoch() -> None:
    q = QUERIES["alp"]
    _, w, _ = run(q)
    attest(w, q)
    good = close(q, w, ShuffledEpsilon(DELTA))
    monitor = StreamMonitor(CollectorRegistry())
    labels = {"query": q.query_id, "mechanism": q.mechanism}
    monitor.on_epoch_closed(good)
    assert monitor.registry.get_sample_value("ptt_query_epsilon_shuffled", labels) == good.epsilon_shuffled
    assert monitor.registry.get_sample_value("ptt_query_epsilon", labels) == q.epsilon
    monitor.on_epoch_closed(replace(good, epsilon_shuffled=None, shuffle_null="not_attested"))
    assert monitor.registry.get_sample_value("ptt_query_epsilon_shuffled", labels) is None  # no stale number


def count_bound_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The shuffle sizes the bound is computed at from now on (it still computes)."""
    calls: list[int] = []
    real = estimators.shuffle.shuffled_epsilon

    def counting(ratios: Any, n: int, delta: float = 1e-6) -> float:
        calls.append(n)
        return real(ratios, n, delta)

    monkeypatch.setattr(estimators.shuffle, "shuffled_epsilon", counting)
    return calls


def test_computed_once_per_query_version_and_rounded_size(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_bound_calls(monkeypatch)
    cache = ShuffledEpsilon(DELTA)
    q = QUERIES["alp"]
    values = [cache.get(q, n) for n in (12_345, 12_399, 12_000, 11_999, 12_345)]
    assert calls == [12_000, 11_000]
    assert values[0] == values[1] == values[2] == values[4] != values[3]
    assert cache.cached(q, 12_050) and not cache.cached(QUERIES["rr"], 12_050)
    cache.warm([(QUERIES["rr"], 12_050, "permuted")])
    assert calls[-1] == 12_000 and cache.cached(QUERIES["rr"], 12_001)


def test_rounding_down_never_rounds_up() -> None:
    for n in [*range(1, 2_000), 99_999, 100_001, 123_456_789]:
        r = round_down_2sig(n)
        assert r <= n and r >= 0.9 * n - 1e-9 and len(str(r).rstrip("0")) <= 2, (n, r)


@pytest.mark.parametrize("delta", [0.0, -1e-6, 0.5, 1.0, math.nan])
def test_delta_is_validated(delta: float) -> None:
    with pytest.raises(ValidationError):
        WorkerSettings(shuffle_delta=delta)
    if not 0 < delta < 1:
        with pytest.raises(ValueError, match="delta"):
            ShuffledEpsilon(delta)
    assert WorkerSettings().shuffle_delta == 1e-6


def test_the_schema_field_is_optional_and_nullable() -> None:
    schema = committed_schema()
    assert "epsilon_shuffled" not in schema.get("required", [])
    q = QUERIES["rr"]
    res, _, _ = run(q)
    row = json.loads(res.render()[0][1])
    old = {k: v for k, v in row.items() if k != "epsilon_shuffled"}  # a row from before the field
    for r in (row, old, {**row, "epsilon_shuffled": 0.25}, {**row, "epsilon_shuffled": None}):
        assert validate(r, schema, schema) == [], r
    assert validate({**row, "epsilon_shuffled": "0.25"}, schema, schema) != []


def test_frames_carry_it_and_older_headers_read_as_null() -> None:
    q = QUERIES["alp"]
    _, w, _ = run(q)
    attest(w, q)
    res = close(q, w, ShuffledEpsilon(DELTA))
    frame = decode_frame(encode_frame(res))
    assert frame.header["epsilon_shuffled"] == res.epsilon_shuffled is not None
    assert list(frame_rows(frame)) == [json.loads(v) for _, v in res.render()]
    assert set(long_table(frame).column("epsilon_shuffled").to_pylist()) == {res.epsilon_shuffled}
    old = replace(frame, header={k: v for k, v in frame.header.items() if k != "epsilon_shuffled"})
    assert {r["epsilon_shuffled"] for r in frame_rows(old)} == {None}
    assert set(long_table(old).column("epsilon_shuffled").to_pylist()) == {None}


MARKER = dict(producer_id="shuf-0", producer_index=0, producer_count=1, query_id="q-sp", query_version=2,
              epoch=QUERIES["sp"].epoch_range()[0], round=0, partition=0, reports_to_partition=5,
              batches_to_partition=1, reports_total=5, batches_total=1, participants=5, refused=0, mode="per-vehicle")


def test_markers_from_before_the_field_decode_and_unattested_ones_are_sent_without_it() -> None:
    old = json.dumps({"kind": "end_of_epoch", **MARKER}).encode()  # a marker as written before the field
    m = decode_record(old)
    assert isinstance(m, EndOfEpoch) and m.shuffle_size is None
    assert b"shuffle_size" not in encode_json(m) and decode_record(encode_json(m)) == m
    attested = EndOfEpoch(**MARKER, shuffle_size=5)
    assert decode_record(encode_json(attested)) == attested
    with pytest.raises(ValidationError):
        EndOfEpoch(**MARKER, shuffle_size=0)


def test_a_size_above_the_population_is_a_bad_marker() -> None:
    q = QUERIES["sp"]

    def lookup(query_id: str, version: int) -> Query | None:
        return q if (query_id, version) == (q.query_id, q.version) else None

    for size, ok in ((q.population, True), (q.population + 1, False)):
        (res,) = to_partials(encode_json(EndOfEpoch(**MARKER, shuffle_size=size)), 0, lookup)
        if ok:
            assert isinstance(res, MarkerPartial) and res.shuffle_size == size
        else:
            assert not isinstance(res, MarkerPartial) and res.reason == "bad_marker" and "shuffle size" in res.detail


def test_a_failing_bound_is_null_once_never_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def failing(ratios: Any, n: int, delta: float = 1e-6) -> float:
        calls.append(n)
        raise FloatingPointError("no bound here")

    monkeypatch.setattr(estimators.shuffle, "shuffled_epsilon", failing)
    q = QUERIES["alp"]
    _, w, _ = run(q)
    attest(w, q)
    cache = ShuffledEpsilon(DELTA)
    res = close(q, w, cache)
    assert res.epsilon_shuffled is None and res.withheld is None and res.values
    close(q, w, cache)
    assert len(calls) == 1  # cached as failed: not retried on the event loop


@pytest.mark.parametrize("release", ["aggregate", "permuted"])
def test_the_release_is_published_and_its_epsilon_asked_for(release: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The markers' release reaches the rows, the frame header and the long table, and the
    epsilon is the spec's for that release (asked with ``release=``; cached per release)."""
    q = QUERIES["alp"]
    _, w, _ = run(q)
    n = min(attest(w, q).values())
    w.markers = {slot: replace(m, release=release) for slot, m in w.markers.items()}
    asked: list[str] = []
    real = type(q.spec).shuffled_epsilon

    def spy(self: Any, mech: Any, v: int, size: int, delta: float = 1e-6, release: str = "permuted") -> float:
        asked.append(release)
        return real(self, mech, v, size, delta, release=release) + (1.0 if release == "aggregate" else 0.0)

    monkeypatch.setattr(type(q.spec), "shuffled_epsilon", spy)
    cache = ShuffledEpsilon(DELTA)
    res = close(q, w, cache)
    want = (real(q.spec, q.build(), q.n_stations, round_down_2sig(n), DELTA, release=release)
            + (1.0 if release == "aggregate" else 0.0))
    assert asked == [release] and res.release == release and res.epsilon_shuffled == want
    assert cache.cached(q, n, release) and not cache.cached(q, n, "aggregate" if release == "permuted" else "permuted")
    rows = [json.loads(v) for _, v in res.render()]
    schema = committed_schema()
    assert all(r["release"] == release and validate(r, schema, schema) == [] for r in rows)
    frame = decode_frame(encode_frame(res))
    assert frame.header["release"] == release and list(frame_rows(frame)) == rows
    assert set(long_table(frame).column("release").to_pylist()) == {release}
    old = replace(frame, header={k: v for k, v in frame.header.items() if k != "release"})  # a frame from before
    assert {r["release"] for r in frame_rows(old)} == {None}


def test_mixed_releases_give_null_and_the_direct_path_no_release() -> None:
    q = QUERIES["sp"]
    _, w, _ = run(q)
    attest(w, q)
    w.markers = {slot: replace(m, release="aggregate" if slot[1] == 0 else "permuted") for slot, m in w.markers.items()}
    res = close(q, w, ShuffledEpsilon(DELTA))
    assert (res.epsilon_shuffled, res.shuffle_null, res.release, res.withheld) == (None, "mixed_release", None, None)
    direct, w2, _ = run(q)
    again = close(q, w2, ShuffledEpsilon(DELTA))
    assert again.release is None and all(json.loads(v)["release"] is None for _, v in again.render())


def test_a_marker_with_a_release_round_trips_and_an_unknown_one_is_refused() -> None:
    attested = EndOfEpoch(**MARKER, shuffle_size=5, release="aggregate")
    assert decode_record(encode_json(attested)) == attested
    assert b"release" not in encode_json(EndOfEpoch(**MARKER, shuffle_size=5))
    with pytest.raises(ValidationError):
        EndOfEpoch(**MARKER, shuffle_size=5, release="counts")  # type: ignore[arg-type]
    (p,) = to_partials(encode_json(attested), 0, lambda qid, v: QUERIES["sp"])
    assert isinstance(p, MarkerPartial) and p.release == "aggregate"


@pytest.mark.parametrize("reason", ["no_reports", "below_min_crowd", "notes_refused", "release_mismatch"])
def test_a_shuffler_withheld_epoch_is_withheld_with_its_reason(reason: str) -> None:
    """Issue 24, item 4: a shuffler's markers for an epoch it withheld attest nothing and name
    the reason; the marker round trips the wire, stage 1 and the stage record, the window state
    keeps it across a restart, and the epoch is withheld with that code (the text names it) --
    while a marker that names a reason but attests reports is refused, as is an unknown reason."""
    held = {**MARKER, "reports_to_partition": 0, "batches_to_partition": 0, "reports_total": 0,
            "batches_total": 0, "participants": 0}
    m = EndOfEpoch(**held, withheld=reason)  # type: ignore[arg-type]
    assert decode_record(encode_json(m)) == m
    assert b"withheld" not in encode_json(EndOfEpoch(**MARKER))  # the others are sent as before the field
    for lie in ({"participants": 3}, {"reports_total": 3}, {"shuffle_size": 3}, {"interrupted": True}):
        with pytest.raises(ValidationError, match="attests nothing"):
            EndOfEpoch(**{**held, **lie}, withheld=reason)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        EndOfEpoch(**held, withheld="too_quiet")  # type: ignore[arg-type]
    (p,) = to_partials(encode_json(m), 0, lambda qid, v: QUERIES["sp"])
    assert isinstance(p, MarkerPartial) and p.withheld == reason
    assert decode_partial(encode_partial(p)) == p
    with pytest.raises(ValueError, match="withheld"):
        decode_partial(encode_partial(replace(p, withheld="too_quiet")))
    q = QUERIES["sp"]
    published, w, _ = run(q)
    assert published.withheld is None
    w.markers = {slot: replace(x, withheld=reason, participants=0, reports=0, batches=0)
                 for slot, x in w.markers.items()}
    again = WindowState.decode(w.encode())
    assert again.markers == w.markers and again.withheld_by_producer() == reason
    res = close(q, again, ShuffledEpsilon(DELTA))
    assert res.withheld_code == reason and res.withheld is not None and res.withheld.startswith(reason)
    rows = [json.loads(v) for _, v in res.render()]
    schema = committed_schema()
    assert rows and all(r["withheld"] == res.withheld and r["estimate"] is None and validate(r, schema, schema) == []
                        for r in rows)
