"""Stage 1 (``stream_app.worker.decode.to_partials``, what ``stage1_pass`` runs per record): one
record of the reports topic -> a :class:`BatchPartial`, a :class:`MarkerPartial` or a
:class:`Rejected` reason (one per marker for a marker set). No Faust, no broker.

Records are built with the real encoders (``schemas.encode_batch``, ``encode_json``) for
queries built with ``schemas.Query`` (``sp``, ``alp``, ``rr`` over four sensors, valid for
ten 30-second epochs; ``fresh`` too where per-sensor behaviour is checked), looked up by a
plain function. Checked:

* ``values`` batch -> counts equal to ``np.bincount`` (not tallied); ``pairs`` batch ->
  counts at ``(station - 1) * n_outputs + output``; tally counts (``sp``: ``V + 1``;
  per-sensor: ``V x outputs`` row-major, rows summing to the vehicles, else
  ``mismatched_sizes``; also for ``sp``) -> ``tallied``;
* markers -> ``MarkerPartial`` with every field carried, source partition = the partition
  the record arrived on;
* rejection reasons: the decoder's own (``empty``, ``bad_encoding``, ``truncated``,
  ``bad_json_record``, ``bad_header``, ``size_mismatch``, ``bad_layout``, ``out_of_range``),
  ``unknown_query``, ``outside_query_window`` (both ends, for batches, markers and single
  reports), ``bad_round``, ``mismatched_sizes``, ``wrong_layout``, ``bad_marker`` (index,
  partition, producer count above ``max_producers``, participants + refused above the
  population, report/batch counts out of bounds), ``out_of_bounds`` (reports above the
  population -- x stations for pairs -- or a tally count above it), ``unexpected_record``;
  every reason of ``decode.REASONS`` but ``internal_error`` (the app's) is produced;
* per-sensor pairs carrying the default report are refused (``out_of_range``);
* single reports (``sp`` value, per-sensor pairs) -> one-report partials;
* ``Rejected.letter`` -> a ``DeadLetter`` with base64 of at most 4 KiB and the true length.

Random arrays come from fixed seeds; nothing is asserted statistically.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from schemas import (
    MAX_MARKERS_PER_SET,
    EndOfEpoch,
    EndOfEpochSet,
    GroundTruth,
    Query,
    SingleReport,
    encode_batch,
    encode_json,
    new_batch_id,
)
from schemas.estimates import DeadLetter
from stream_app.worker.decode import (
    DEFAULT_MAX_PRODUCERS,
    REASONS,
    Rejected,
    Stage1Result,
    UnknownQueryWait,
    stage1_pass,
    to_partials,
)
from stream_app.worker.records import BatchPartial, MarkerPartial, WindowId
from stream_app.worker.windows import WindowState

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # 08:00 Pacific, a multiple of 30 s
E0 = int(T0.timestamp()) // 30
N_EPOCHS = 10
SENSORS = (400_001, 400_017, 400_230, 401_002)
V = len(SENSORS)


def make_query(mechanism: str, query_id: str | None = None, version: int = 1,
               sensors: tuple[int, ...] = SENSORS) -> Query:
    return Query(query_id=query_id or f"q-{mechanism}", analyst_id="analyst-1", version=version, sensors=sensors,
                 mechanism=mechanism, population=10_000, t_start=T0, t_end=T0 + timedelta(seconds=30 * N_EPOCHS))


QUERIES = {m: make_query(m) for m in ("sp", "alp", "rr", "fresh")}
PER_SENSOR = ("alp", "rr", "fresh")


def lookup(query_id: str, version: int) -> Query | None:
    for q in QUERIES.values():
        if (q.query_id, q.version) == (query_id, version):
            return q
    return None


def n_out(q: Query) -> int:
    return q.build().n_outputs


def header(q: Query, kind: str, layout: str, reports: int, **over: Any) -> dict[str, Any]:
    """The header fields exactly as ``producers.replay.send_round`` builds them."""
    h: dict[str, Any] = {"query_id": q.query_id, "query_version": q.version, "epoch": E0 + 2, "round": 0,
                         "producer_id": "p0-0123abcd", "n_stations": q.n_stations, "n_outputs": n_out(q),
                         "kind": kind, "layout": layout, "batch_id": new_batch_id(), "reports": reports}
    h.update(over)
    return h


def values_record(q: Query, values: np.ndarray, **over: Any) -> bytes:
    return encode_batch(header(q, "reports", "values", int(values.size), **over), {"value": values})


def pairs_record(q: Query, station: np.ndarray, output: np.ndarray, **over: Any) -> bytes:
    return encode_batch(header(q, "reports", "pairs", int(station.size), **over),
                        {"station": station, "output": output})


def tally_record(q: Query, counts: np.ndarray, reports: int, **over: Any) -> bytes:
    return encode_batch(header(q, "tally", "counts", reports, **over), {"counts": counts})


def eoe(q: Query, **over: Any) -> EndOfEpoch:
    f: dict[str, Any] = {"producer_id": "p1-89abcdef", "producer_index": 1, "producer_count": 3,
                         "query_id": q.query_id, "query_version": q.version, "epoch": E0 + 2, "round": 0,
                         "partition": 2, "reports_to_partition": 120, "batches_to_partition": 3,
                         "reports_total": 400, "batches_total": 9, "participants": 380, "refused": 7,
                         "mode": "per-vehicle"}
    f.update(over)
    return EndOfEpoch(**f)


def single(q: Query, **over: Any) -> SingleReport:
    f: dict[str, Any] = {"query_id": q.query_id, "query_version": q.version, "epoch": E0 + 2,
                         "batch_id": new_batch_id()}
    f.update(over)
    return SingleReport(**f)


def one_result(value: bytes | None, partition: int, lk: Callable[[str, int], Query | None],
               max_producers: int = DEFAULT_MAX_PRODUCERS) -> Stage1Result:
    """Stage 1's one result for a record that is not a marker set."""
    out = to_partials(value, partition, lk, max_producers)
    assert len(out) == 1, out
    return out[0]


def accepted(value: bytes | None, partition: int = 0) -> BatchPartial | MarkerPartial:
    out = one_result(value, partition, lookup)
    assert isinstance(out, BatchPartial | MarkerPartial), out
    return out


def accepted_batch(value: bytes | None, partition: int = 0) -> BatchPartial:
    out = accepted(value, partition)
    assert isinstance(out, BatchPartial), out
    return out


def accepted_marker(value: bytes | None, partition: int = 0) -> MarkerPartial:
    out = accepted(value, partition)
    assert isinstance(out, MarkerPartial), out
    return out


def rejected(value: bytes | None, partition: int = 0) -> Rejected:
    out = one_result(value, partition, lookup)
    assert isinstance(out, Rejected), out
    return out


# ---------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("rnd", [0, 1])
def test_values_batch_gives_full_counts_equal_to_bincount(rnd: int) -> None:
    q = QUERIES["sp"]
    values = np.random.default_rng(11 + rnd).integers(0, V + 1, size=257)
    values[:3] = V  # the largest index is in
    raw = values_record(q, values, round=rnd, epoch=E0 + 5)
    p = accepted_batch(raw, partition=3)
    assert not p.tallied  # per-vehicle reports, not an exact tally
    assert p.counts.tolist() == np.bincount(values, minlength=V + 1).tolist()
    assert len(p.counts) == n_out(q) == V + 1
    assert (p.query_id, p.query_version, p.epoch, p.round) == (q.query_id, 1, E0 + 5, rnd)
    assert (p.source_partition, p.reports, p.producer_id) == (3, 257, "p0-0123abcd")
    assert p.batch_id == json.loads(raw[8:8 + int.from_bytes(raw[4:8], "big")])["batch_id"]
    assert p.window == WindowId(q.query_id, 1, E0 + 5)


def test_values_batch_with_no_reports() -> None:
    p = accepted_batch(values_record(QUERIES["sp"], np.zeros(0, dtype=np.int64)))
    assert p.counts.tolist() == [0] * (V + 1) and p.reports == 0


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_pairs_batch_gives_sparse_counts(mechanism: str) -> None:
    q = QUERIES[mechanism]
    o = n_out(q)
    default = q.default_report
    rng = np.random.default_rng(23)
    station = rng.integers(1, V + 1, size=300)
    others = np.array([x for x in range(o) if x != default])
    output = others[rng.integers(0, others.size, size=300)]
    p = accepted_batch(pairs_record(q, station, output), partition=1)
    assert not p.tallied and p.reports == 300 and p.source_partition == 1
    want = np.zeros((V, o), dtype=np.int64)
    for s, out in zip(station, output, strict=True):
        want[s - 1, out] += 1
    assert p.counts.tolist() == want.ravel().tolist()
    assert p.counts.size == V * o
    # the station-major layout puts station s's outputs at (s - 1) * o ... s * o - 1
    assert p.counts[(int(station[0]) - 1) * o + int(output[0])] >= 1


def test_sp_tally_counts_pass_through() -> None:
    q = QUERIES["sp"]
    counts = np.array([50, 3, 0, 7, 12])
    p = accepted_batch(tally_record(q, counts, reports=72, round=1))
    assert p.tallied and p.counts.tolist() == counts.tolist() and p.reports == 72 and p.round == 1


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_per_sensor_tally_counts_pass_through(mechanism: str) -> None:
    q = QUERIES[mechanism]
    assert q.per_station is not None
    n = 90
    for rnd, ps in enumerate(q.per_station):
        counts = ps.tally(np.random.default_rng(5), np.array([10, 0, 3, 1]), n)
        assert counts.shape == (V, n_out(q)) and np.all(counts.sum(axis=1) == n)
        p = accepted_batch(tally_record(q, counts.ravel(), reports=n, round=rnd))
        assert p.tallied and p.reports == n and p.round == rnd
        assert p.counts.tolist() == counts.ravel().tolist()


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_per_sensor_tally_rows_must_sum_to_the_vehicles(mechanism: str) -> None:
    q = QUERIES[mechanism]
    counts = np.full((V, n_out(q)), 10)
    counts[2, 0] += 1  # station 3 has one report too many
    rej = rejected(tally_record(q, counts.ravel(), reports=10 * n_out(q)))
    assert rej.reason == "mismatched_sizes"
    assert "sum" in rej.detail


def test_sp_tally_must_sum_to_the_vehicles() -> None:
    """A Sampling Privacy tally whose counts do not sum to its ``reports`` (used for N without
    markers and for round_count_mismatch) is refused, as per-sensor tallies are."""
    q = QUERIES["sp"]
    out = one_result(tally_record(q, np.array([50, 3, 0, 7, 12]), reports=10), 0, lookup)
    assert isinstance(out, Rejected) and out.reason == "mismatched_sizes", out


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_pairs_with_the_default_report_are_rejected(mechanism: str) -> None:
    """Per-sensor pairs are by contract the NON-default reports; the default is implied in
    stage 2 (``MechanismSpec.complete``: default = participants - row sum). A pair carrying the
    default would be counted twice, so it is refused."""
    q = QUERIES[mechanism]
    d = q.default_report
    assert d is not None
    batch_out = one_result(pairs_record(q, np.array([1, 2]), np.array([d, d])), 0, lookup)
    single_out = one_result(encode_json(single(q, pairs=((1, d),))), 0, lookup)
    assert isinstance(batch_out, Rejected) and batch_out.reason == "out_of_range", batch_out
    assert isinstance(single_out, Rejected) and single_out.reason == "out_of_range", single_out


# ---------------------------------------------------------------------------------------
# markers
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["sp", "alp", "rr", "fresh"])
def test_marker_carries_its_fields(mechanism: str) -> None:
    q = QUERIES[mechanism]
    rnd = q.n_rounds - 1
    m = eoe(q, round=rnd, interrupted=True)
    p = accepted(encode_json(m), partition=2)
    assert p == MarkerPartial(query_id=q.query_id, query_version=1, epoch=E0 + 2, round=rnd, source_partition=2,
                              producer_id="p1-89abcdef", producer_index=1, producer_count=3, reports=120, batches=3,
                              participants=380, refused=7, interrupted=True)
    assert p.window == WindowId(q.query_id, 1, E0 + 2)


def test_marker_must_arrive_on_its_partition() -> None:
    q = QUERIES["alp"]
    rej = rejected(encode_json(eoe(q, partition=2)), partition=1)
    assert rej.reason == "bad_marker" and "partition" in rej.detail
    assert accepted(encode_json(eoe(q, partition=0)), partition=0).source_partition == 0


@pytest.mark.parametrize(("index", "count"), [(3, 3), (5, 1)])
def test_marker_producer_index_below_count(index: int, count: int) -> None:
    rej = rejected(encode_json(eoe(QUERIES["rr"], producer_index=index, producer_count=count)), partition=2)
    assert rej.reason == "bad_marker"
    assert accepted(encode_json(eoe(QUERIES["rr"], producer_index=count - 1, producer_count=count)),
                    partition=2).producer_index == count - 1


def test_markers_and_batches_of_one_epoch_fill_a_window() -> None:
    """Stage 1's partials are what stage 2's window takes (widths and keys agree)."""
    q = QUERIES["alp"]
    w = WindowState.new(WindowId(q.query_id, q.version, E0 + 2), q.n_rounds, q.width)
    assert q.width == V * n_out(q)
    b = accepted(pairs_record(q, np.array([1, 4, 4]), np.array([1, 0, 1])), partition=0)
    m = accepted(encode_json(eoe(q, producer_id="p0-0123abcd", producer_index=0, producer_count=1, partition=0,
                                 batches_to_partition=1, participants=50, refused=0)), partition=0)
    assert b.window == m.window == w.wid
    assert w.add(b) == "added" and w.add(m) == "added"
    assert w.markers_complete(1) and w.missing_batches() == 0 and w.participants() == (50, [])


# ---------------------------------------------------------------------------------------
# rejections
# ---------------------------------------------------------------------------------------
def _frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    h = json.dumps(head).encode()
    return b"PTT1" + len(h).to_bytes(4, "big") + h + body


@pytest.mark.parametrize(("value", "reason"), [
    (None, "empty"),
    (b"", "empty"),
    (b"garbage, not a record", "bad_encoding"),
    (b"\x00\x01\x02", "bad_encoding"),
    (b"PTT1\x00", "truncated"),
    (b"PTT1\x00\x00\x01\x00{}", "truncated"),
    (b"{}", "bad_json_record"),
    (b'{"kind": "report"', "bad_json_record"),
    (b'{"kind": "estimate", "query_id": "q-sp"}', "bad_json_record"),
    (_frame({"kind": "reports"}), "bad_header"),
], ids=["none", "empty", "text", "binary", "short-frame", "short-header", "empty-json", "broken-json",
        "other-kind", "bad-header"])
def test_undecodable_records_keep_the_decoders_reason(value: bytes | None, reason: str) -> None:
    rej = rejected(value)
    assert rej.reason == reason and rej.detail


def test_trailing_bytes_are_a_size_mismatch() -> None:
    raw = values_record(QUERIES["sp"], np.array([0, 1, 2]))
    assert rejected(raw + b"\x00").reason == "size_mismatch"


@pytest.mark.parametrize("make", [
    lambda q: values_record(q, np.array([1, 2]), query_id="q-nobody"),
    lambda q: values_record(q, np.array([1, 2]), query_version=2),
    lambda q: encode_json(eoe(q, query_id="q-nobody", partition=0)),
    lambda q: encode_json(eoe(q, query_version=7, partition=0)),
    lambda q: encode_json(single(q, value=1, query_version=2)),
], ids=["batch-id", "batch-version", "marker-id", "marker-version", "single-version"])
def test_unknown_query_or_version(make: Any) -> None:
    rej = rejected(make(QUERIES["sp"]))
    assert rej.reason == "unknown_query"


@pytest.mark.parametrize("epoch", [E0 - 1, E0 + N_EPOCHS, E0 + 1000, 0])
def test_epoch_outside_the_query_window(epoch: int) -> None:
    q = QUERIES["sp"]
    for raw in (values_record(q, np.array([1]), epoch=epoch), encode_json(eoe(q, epoch=epoch, partition=0)),
                encode_json(single(q, value=1, epoch=epoch))):
        rej = rejected(raw)
        assert rej.reason == "outside_query_window", raw
        assert str(epoch) in rej.detail


@pytest.mark.parametrize("epoch", [E0, E0 + N_EPOCHS - 1])
def test_first_and_last_epoch_of_the_query_are_inside(epoch: int) -> None:
    q = QUERIES["sp"]
    assert accepted(values_record(q, np.array([1]), epoch=epoch)).epoch == epoch
    assert accepted(encode_json(eoe(q, epoch=epoch, partition=0))).epoch == epoch


def test_query_window_not_on_epoch_boundaries() -> None:
    """An epoch is inside if it overlaps [t_start, t_end): floor of t_start, ceiling of t_end."""
    q = Query(query_id="q-odd", analyst_id="a", version=1, sensors=SENSORS, mechanism="sp", population=100,
              t_start=T0 + timedelta(seconds=10), t_end=T0 + timedelta(seconds=70))
    local = {("q-odd", 1): q}
    for epoch, inside in [(E0 - 1, False), (E0, True), (E0 + 1, True), (E0 + 2, True), (E0 + 3, False)]:
        out = one_result(values_record(q, np.array([1]), epoch=epoch), 0, lambda i, v: local.get((i, v)))
        assert isinstance(out, BatchPartial) == inside, (epoch, out)


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
def test_round_one_of_a_one_round_query(mechanism: str) -> None:
    q = QUERIES[mechanism]
    o = n_out(q)
    for raw in (pairs_record(q, np.array([1]), np.array([1]), round=1),
                tally_record(q, np.full(V * o, 5), reports=5 * o, round=1),
                encode_json(eoe(q, round=1, partition=0)),
                encode_json(single(q, round=1, pairs=((1, 1),)))):
        rej = rejected(raw)
        assert rej.reason == "bad_round", raw
    assert accepted(values_record(QUERIES["sp"], np.array([1]), round=1)).round == 1


@pytest.mark.parametrize("over", [{"n_stations": V + 1}, {"n_stations": V - 1}, {"n_outputs": V + 2}],
                         ids=["more-stations", "fewer-stations", "more-outputs"])
def test_sp_batch_sizes_must_match_the_query(over: dict[str, int]) -> None:
    rej = rejected(values_record(QUERIES["sp"], np.array([1, 1, 0]), **over))
    assert rej.reason == "mismatched_sizes"


@pytest.mark.parametrize("mechanism", ["alp", "rr"])
@pytest.mark.parametrize("over", [{"n_stations": V + 1}, {"n_outputs": 4}], ids=["stations", "outputs"])
def test_per_sensor_batch_sizes_must_match_the_query(mechanism: str, over: dict[str, int]) -> None:
    rej = rejected(pairs_record(QUERIES[mechanism], np.array([1]), np.array([1]), **over))
    assert rej.reason == "mismatched_sizes"


def test_wrong_layout_for_the_mechanism() -> None:
    sp, alp, rr = QUERIES["sp"], QUERIES["alp"], QUERIES["rr"]
    cases = [
        pairs_record(sp, np.array([1, 2]), np.array([1, 1])),  # pairs for Sampling Privacy
        tally_record(sp, np.full(V * (V + 1), 1), reports=V),  # a V x outputs tally for SP
        values_record(alp, np.array([0, 1, 2])),  # station values for a per-sensor query
        values_record(rr, np.array([0, 1])),
        tally_record(alp, np.array([5, 3, 2]), reports=10),  # one row instead of V rows
        tally_record(rr, np.array([6, 4]), reports=10),
    ]
    for raw in cases:
        assert rejected(raw).reason == "wrong_layout"


def test_ground_truth_on_the_reports_topic() -> None:
    gt = GroundTruth(epoch=E0, epoch_start=T0, stations=SENSORS, flows=(3, 0, 5, 1))
    rej = rejected(encode_json(gt))
    assert rej.reason == "unexpected_record"


# ---------------------------------------------------------------------------------------
# single reports
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "rnd"), [(0, 0), (3, 1), (V, 0)])
def test_single_sp_report(value: int, rnd: int) -> None:
    r = single(QUERIES["sp"], value=value, round=rnd)
    p = accepted_batch(encode_json(r), partition=2)
    want = [0] * (V + 1)
    want[value] = 1
    assert (p.tallied, p.reports, p.counts.tolist()) == (False, 1, want)
    assert (p.round, p.source_partition, p.producer_id, p.batch_id) == (rnd, 2, "device", r.batch_id)


@pytest.mark.parametrize("mechanism", PER_SENSOR)
def test_single_per_sensor_report(mechanism: str) -> None:
    q = QUERIES[mechanism]
    o = n_out(q)
    nd = [x for x in range(o) if x != q.default_report]
    pairs = ((1, nd[0]), (4, nd[-1]), (2, nd[0]))
    p = accepted_batch(encode_json(single(q, pairs=pairs)))
    want = [0] * (V * o)
    for s, out in pairs:
        want[(s - 1) * o + out] += 1
    assert (p.tallied, p.reports, p.counts.tolist(), p.producer_id) == (False, 3, want, "device")
    empty = accepted_batch(encode_json(single(q, pairs=())))  # a device whose reports are all the default
    assert empty.reports == 0 and empty.counts.tolist() == [0] * (V * o)


@pytest.mark.parametrize(("mechanism", "fields"), [
    ("sp", {"value": V + 1}),
    ("sp", {"value": 255}),
    ("sp", {"pairs": ((1, 1),)}),
    ("alp", {"value": 1}),
    ("alp", {"pairs": ((V + 1, 1),)}),
    ("alp", {"pairs": ((1, 1), (2, 3))}),
    ("rr", {"pairs": ((1, 2),)}),
    ("rr", {"pairs": ((V + 5, 1),)}),
], ids=["sp-value", "sp-value-255", "sp-pairs", "alp-value", "alp-station", "alp-output", "rr-output",
        "rr-station"])
def test_single_report_out_of_range(mechanism: str, fields: dict[str, Any]) -> None:
    rej = rejected(encode_json(single(QUERIES[mechanism], **fields)))
    assert rej.reason == "out_of_range"


def test_single_report_schema_violations_are_bad_json() -> None:
    q = QUERIES["alp"]
    base = json.loads(encode_json(single(q, pairs=((1, 1),))))
    for bad in ({**base, "pairs": [[0, 1]]}, {**base, "value": 1}, {**base, "vehicle_id": "x"},
                {**base, "round": 2}):
        assert rejected(json.dumps(bad).encode()).reason == "bad_json_record"


# ---------------------------------------------------------------------------------------
# dead letters
# ---------------------------------------------------------------------------------------
def test_dead_letter_keeps_at_most_4_kib_and_the_true_length() -> None:
    value = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes
    rej = rejected(value)
    letter = rej.letter("ptt.reports", 3, 12_345, value)
    assert isinstance(letter, DeadLetter)
    assert (letter.kind, letter.reason, letter.detail) == ("dead_letter", rej.reason, rej.detail)
    assert (letter.topic, letter.partition, letter.offset) == ("ptt.reports", 3, 12_345)
    assert letter.value_bytes == len(value) == 10_244
    assert base64.b64decode(letter.value_b64) == value[:4096]
    assert DeadLetter.model_validate_json(letter.model_dump_json()) == letter


def test_dead_letter_of_a_short_or_missing_value() -> None:
    small = b"nope"
    letter = Rejected("bad_encoding", "x").letter("t", 0, 0, small)
    assert base64.b64decode(letter.value_b64) == small and letter.value_bytes == 4
    none = Rejected("empty", "record has no value").letter("t", 1, 2, None)
    assert none.value_b64 == "" and none.value_bytes == 0
    exact = bytes(4096)
    assert base64.b64decode(Rejected("r", "d").letter("t", 0, 0, exact).value_b64) == exact
    short = Rejected("r", "d").letter("t", 0, 0, exact, prefix=64)  # the shuffler's letter of an unvouched record
    assert base64.b64decode(short.value_b64) == exact[:64] and short.value_bytes == len(exact)


def test_dead_letter_detail_is_bounded() -> None:
    letter = Rejected("internal_error", "x" * 5000).letter("t", 0, 0, b"v")
    assert letter.detail == "x" * 2000


def test_every_rejection_makes_a_valid_dead_letter() -> None:
    q = QUERIES["alp"]
    samples = [None, b"zz", values_record(QUERIES["sp"], np.array([1]), epoch=E0 - 5),
               encode_json(eoe(q, partition=3)), encode_json(single(q, value=0)),
               encode_json(GroundTruth(epoch=E0, epoch_start=T0, stations=(1,), flows=(2,)))]
    for i, raw in enumerate(samples):
        rej = rejected(raw, partition=1)
        letter = rej.letter("ptt.reports", 1, i, raw)
        assert letter.reason == rej.reason and letter.value_bytes == len(raw or b"")
        back = json.loads(letter.model_dump_json())
        assert set(back) == {"kind", "reason", "detail", "topic", "partition", "offset", "value_b64", "value_bytes"}


# ---------------------------------------------------------------------------------------
# bounds: what one record may claim
# ---------------------------------------------------------------------------------------
def test_marker_producer_count_above_the_configured_maximum() -> None:
    q = QUERIES["sp"]
    at = encode_json(eoe(q, producer_count=8, producer_index=7, partition=0))
    above = encode_json(eoe(q, producer_count=9, producer_index=0, partition=0))
    assert accepted_marker(at).producer_count == 8
    assert isinstance(one_result(at, 0, lookup, max_producers=8), MarkerPartial)
    out = one_result(above, 0, lookup, max_producers=8)
    assert isinstance(out, Rejected) and out.reason == "bad_marker" and "maximum" in out.detail
    big = encode_json(eoe(q, producer_count=65, producer_index=0, partition=0))
    assert rejected(big).reason == "bad_marker"  # the default maximum is 64


@pytest.mark.parametrize("mechanism", ["sp", "alp"])
def test_marker_participants_and_refused_within_the_population(mechanism: str) -> None:
    q = QUERIES[mechanism]  # population 10,000
    assert accepted_marker(encode_json(eoe(q, participants=9_990, refused=10, partition=0))).participants == 9_990
    rej = rejected(encode_json(eoe(q, participants=9_991, refused=10, partition=0)))
    assert rej.reason == "bad_marker" and "population" in rej.detail
    assert rejected(encode_json(eoe(q, participants=0, refused=10_001, partition=0))).reason == "bad_marker"


@pytest.mark.parametrize(("mechanism", "over"), [
    ("sp", {"reports_total": 10_001, "reports_to_partition": 10}),
    ("sp", {"reports_to_partition": 10_001, "reports_total": 10_001}),
    ("sp", {"reports_to_partition": 401}),  # more to one partition than in total (400)
    ("sp", {"batches_to_partition": 10}),  # more than in total (9)
    ("sp", {"batches_total": 10_001, "batches_to_partition": 3}),
    ("alp", {"reports_total": 40_001, "reports_to_partition": 1}),  # pairs: population x 4 stations
], ids=["sp-total", "sp-to-partition", "part-above-total", "batches-above-total", "sp-batches", "alp-total"])
def test_marker_report_and_batch_counts_out_of_bounds(mechanism: str, over: dict[str, int]) -> None:
    rej = rejected(encode_json(eoe(QUERIES[mechanism], partition=0, **over)))
    assert rej.reason == "bad_marker" and "bounds" in rej.detail


def test_per_sensor_marker_reports_may_reach_population_times_stations() -> None:
    """Pairs: one report per vehicle and sensor, so up to population x V reports."""
    q = QUERIES["alp"]
    m = accepted_marker(encode_json(eoe(q, partition=0, reports_total=40_000, reports_to_partition=40_000)))
    assert m.reports == 40_000


def test_batch_reports_above_the_population_are_out_of_bounds() -> None:
    small = make_query("sp", query_id="q-small")
    small = Query(**{**small.model_dump(), "population": 5})
    tiny = {("q-small", 1): small}

    def lk(i: str, v: int) -> Query | None:
        return tiny.get((i, v))

    ok = one_result(values_record(small, np.array([0, 1, 2, 3, 4])), 0, lk)
    assert isinstance(ok, BatchPartial) and ok.reports == 5
    out = one_result(values_record(small, np.array([0, 1, 2, 3, 4, 4])), 0, lk)
    assert isinstance(out, Rejected) and out.reason == "out_of_bounds", out
    single_too_many = one_result(tally_record(small, np.array([6, 0, 0, 0, 0]), reports=6), 0, lk)
    assert isinstance(single_too_many, Rejected) and single_too_many.reason == "out_of_bounds"


def test_pairs_batch_may_hold_population_times_stations_reports() -> None:
    q = Query(**{**QUERIES["rr"].model_dump(), "query_id": "q-rr-small", "population": 2})
    local = {("q-rr-small", 1): q}

    def lk(i: str, v: int) -> Query | None:
        return local.get((i, v))

    station = np.repeat(np.arange(1, V + 1), 2)  # every vehicle says "1" about every sensor
    ok = one_result(pairs_record(q, station, np.ones_like(station)), 0, lk)
    assert isinstance(ok, BatchPartial) and ok.reports == 2 * V
    more = np.append(station, 1)
    out = one_result(pairs_record(q, more, np.ones_like(more)), 0, lk)
    assert isinstance(out, Rejected) and out.reason == "out_of_bounds", out


@pytest.mark.parametrize("mechanism", ["sp", "rr"])
def test_tally_count_above_the_population_is_out_of_bounds(mechanism: str) -> None:
    """A count above the population is impossible whatever the header's ``reports`` says
    (checked before the row sums), as are ``reports`` above it."""
    q = QUERIES[mechanism]
    o = n_out(q)
    rows = 1 if mechanism == "sp" else V
    counts = np.zeros((rows, o), dtype=np.int64)
    counts[:, 0] = 10_001
    rej = rejected(tally_record(q, counts.ravel(), reports=10_001))
    assert rej.reason == "out_of_bounds" and "reports" in rej.detail
    rej = rejected(tally_record(q, counts.ravel(), reports=5))
    assert rej.reason == "out_of_bounds" and "count of 10001" in rej.detail
    counts[:, 0] = 10_000
    assert accepted_batch(tally_record(q, counts.ravel(), reports=10_000)).reports == 10_000


# ---------------------------------------------------------------------------------------
# every reason
# ---------------------------------------------------------------------------------------
def _bad_layout_record() -> bytes:
    q = QUERIES["sp"]
    h = header(q, "tally", "values", 1)  # a tally must use layout counts
    return encode_batch(h, {"value": np.array([1])})


def test_every_reason_but_internal_error_is_produced() -> None:
    """Each reason of ``decode.REASONS`` comes out of ``to_partials`` for some record (only
    ``internal_error`` is the app's, for an exception, and ``too_far_ahead`` the window
    policy's, which knows the partitions' epochs)."""
    sp, alp = QUERIES["sp"], QUERIES["alp"]
    small = Query(**{**sp.model_dump(), "query_id": "q-small", "population": 1})
    span = Query(**{**alp.model_dump(), "query_id": "q-span", "span_s": 300})
    local = {("q-small", 1): small, ("q-span", 1): span}

    def lk(i: str, v: int) -> Query | None:
        return local.get((i, v)) or lookup(i, v)

    samples = {
        "empty": b"",
        "bad_encoding": b"garbage",
        "truncated": b"PTT1\x00",
        "bad_header": _frame({"kind": "reports"}),
        "size_mismatch": values_record(sp, np.array([1])) + b"\x00",
        "bad_layout": _bad_layout_record(),
        "out_of_range": encode_json(single(sp, value=V + 1)),
        "bad_json_record": b"{}",
        "unknown_query": values_record(sp, np.array([1]), query_id="q-nobody"),
        "outside_query_window": values_record(sp, np.array([1]), epoch=E0 - 1),
        "misaligned_span": encode_json(eoe(span, partition=0)),  # epoch E0 + 2: not a 5-minute span's first
        "bad_round": encode_json(eoe(alp, round=1, partition=0)),
        "mismatched_sizes": values_record(sp, np.array([1]), n_stations=V + 1),
        "wrong_layout": values_record(alp, np.array([1])),
        "bad_marker": encode_json(eoe(sp, partition=1)),
        "out_of_bounds": values_record(small, np.array([1, 2])),
        "unexpected_record": encode_json(GroundTruth(epoch=E0, epoch_start=T0, stations=SENSORS, flows=(1, 2, 3, 4))),
    }
    got = {}
    for reason, raw in samples.items():
        out = one_result(raw, 0, lk)
        assert isinstance(out, Rejected), (reason, out)
        got[reason] = out.reason
    assert got == {r: r for r in samples}
    assert set(samples) == set(REASONS) - {"internal_error", "too_far_ahead"}


def test_markers_naming_missing_readings_must_name_the_querys_stations() -> None:
    q = QUERIES["sp"]
    good = accepted(encode_json(eoe(q, readings_missing=(1, V))), partition=2)
    assert isinstance(good, MarkerPartial) and good.readings_missing == (1, V)
    for bad in ((V + 1,), (2, 2)):
        out = rejected(encode_json(eoe(q, readings_missing=bad)), partition=2)
        assert out.reason == "bad_marker" and "readings_missing" in out.detail


# ---------------------------------------------------------------------------------------
# marker sets: one record per (producer, epoch, partition) for every query and round
# ---------------------------------------------------------------------------------------
def test_a_marker_set_gives_one_result_per_marker_each_bounded_on_its_own() -> None:
    sp, rr = QUERIES["sp"], QUERIES["rr"]
    good = [eoe(sp, round=0), eoe(sp, round=1), eoe(rr, round=0)]
    out = to_partials(encode_json(EndOfEpochSet(markers=tuple(good))), 2, lookup)
    assert [(m.query_id, m.round) for m in out if isinstance(m, MarkerPartial)] == \
        [(sp.query_id, 0), (sp.query_id, 1), (rr.query_id, 0)]
    assert out == [one_result(encode_json(m), 2, lookup) for m in good]  # the same as one record each
    # one marker out of bounds: only it is refused, and the reason says which
    bad = [good[0], eoe(rr, round=0, participants=10_000), good[1]]
    out = to_partials(encode_json(EndOfEpochSet(markers=tuple(bad))), 2, lookup)
    assert isinstance(out[0], MarkerPartial) and isinstance(out[2], MarkerPartial)
    assert isinstance(out[1], Rejected) and out[1].reason == "bad_marker" and out[1].detail.startswith("marker 2 of 3")
    # an unknown query inside a set is that marker's unknown_query (stage 1 then waits for it)
    ghost = eoe(make_query("rr", query_id="q-ghost"), round=0)
    out = to_partials(encode_json(EndOfEpochSet(markers=(good[0], ghost))), 2, lookup)
    assert isinstance(out[1], Rejected) and out[1].reason == "unknown_query"


@pytest.mark.parametrize("over", [{"epoch": E0 + 3}, {"partition": 1}, {"producer_id": "p9-other"},
                                  {"producer_count": 2}, {"interrupted": True}, {"round": 0}])
def test_an_incoherent_marker_set_is_refused_whole(over: dict[str, Any]) -> None:
    sp = QUERIES["sp"]
    raw = json.dumps({"kind": "end_of_epoch_set", "markers": [
        json.loads(encode_json(eoe(sp, round=0))), json.loads(encode_json(eoe(sp, **{"round": 1, **over})))]}).encode()
    out = to_partials(raw, 2, lookup)
    assert len(out) == 1 and isinstance(out[0], Rejected) and out[0].reason == "bad_json_record", out


def test_a_marker_set_is_bounded() -> None:
    sp = QUERIES["sp"]
    raw = json.dumps({"kind": "end_of_epoch_set", "markers": []}).encode()
    assert to_partials(raw, 2, lookup)[0].reason == "bad_json_record"  # type: ignore[union-attr]
    one = json.loads(encode_json(eoe(sp, round=0)))
    many = [{**one, "query_id": f"q{i}"} for i in range(MAX_MARKERS_PER_SET + 1)]
    raw = json.dumps({"kind": "end_of_epoch_set", "markers": many}).encode()
    assert to_partials(raw, 2, lookup)[0].reason == "bad_json_record"  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------
# stage 1's pass over a batch: order per source partition, and when records may wait
# ---------------------------------------------------------------------------------------

def _epoch_batch(epoch: int, partition: int) -> tuple[bytes, int]:
    return values_record(QUERIES["sp"], np.array([1, 2]), epoch=epoch), partition


def test_stage1_pass_holds_everything_behind_a_waiting_record_of_its_partition() -> None:
    """The start-up race that lost epochs 0-4: the query cache filled (in its reader thread)
    while a batch was being decided, so the epoch-0 record waited and the epoch-5..11 records
    behind it were forwarded first. Now nothing of a partition overtakes its waiting record."""
    calls = {"n": 0}

    def filling(query_id: str, version: int) -> Query | None:  # unknown on the first call only
        calls["n"] += 1
        return None if calls["n"] == 1 else lookup(query_id, version)

    records = [_epoch_batch(E0, 0), _epoch_batch(E0 + 5, 0), _epoch_batch(E0 + 1, 1), _epoch_batch(E0 + 6, 0)]
    step = stage1_pass(records, filling, may_wait=True)
    assert step.waiting == [0, 1, 3]  # partition 0 waits whole
    assert [i for i, _ in step.done] == [2]  # partition 1 goes on
    again = stage1_pass([records[i] for i in step.waiting], filling, may_wait=True)
    assert again.waiting == []
    epochs = [[r.window.epoch for r in rs if isinstance(r, BatchPartial)] for _, rs in again.done]
    assert epochs == [[E0], [E0 + 5], [E0 + 6]]  # in order


def test_stage1_pass_dead_letters_unknown_queries_when_it_may_not_wait() -> None:
    records = [_epoch_batch(E0, 0), (b"junk", 0)]
    step = stage1_pass(records, lambda q, v: None, may_wait=False)
    assert step.waiting == []
    assert [[r.reason for r in rs if isinstance(r, Rejected)] for _, rs in step.done] == [
        ["unknown_query"], ["bad_encoding"]]


def test_unknown_query_wait_policy() -> None:
    w = UnknownQueryWait(started_s=10.0, grace_s=5.0, patience_s=60.0)
    assert w.may_wait(14.9) and w.may_wait(69.9) and not w.may_wait(70.0)  # not caught up: patience
    done = UnknownQueryWait(10.0, 5.0, 60.0, caught_up=True)
    assert done.may_wait(14.9) and not done.may_wait(15.0)  # caught up: the grace only
    assert done.pause_s(14.8) == pytest.approx(0.2) and w.pause_s(14.8) == 0.5
    assert UnknownQueryWait(10.0, 0.0, 60.0, caught_up=True).may_wait(10.0) is False  # no budget left
