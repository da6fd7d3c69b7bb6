"""Rollups that stay honest (``stream_app.worker.rollups``):

* **order**: the same epochs arriving in different orders (and batches, through the stored
  state) give bit-identical rollups -- estimates, variances and the rendered rows. Float sums in
  arrival order differ in the last bits (a deliberate breakage: sums kept as floats fail it);
* the exact sum (:func:`fixed_sum`, :func:`add_fixed`) equals the correctly rounded sum of its
  summands (``math.fsum``) within the grid's quantum per summand and an ulp, over magnitudes
  from 1e-8 to 1e7 of both signs;
* **missing is not a flow**: a station with an epoch of no source data is published without a
  number in rows (estimate, sd, consistent null, bounds empty), frames (null columns), the long
  table (empty bounds) and metrics (no series), flagged ``no_source_data``; the other stations
  keep their sums; ``ptt_no_source_data_estimates_total`` counts such rollup rows;
* a state stored with float sums (before the exact ones) is still read.
"""

from __future__ import annotations

import functools
import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
from prometheus_client import CollectorRegistry

from schemas import Query
from schemas.estimates import Estimate
from schemas.wire import FRAME_LENGTH
from stream_app.worker.estimate import EpochResult, QueryEstimators, StationEstimates
from stream_app.worker.frames import decode_frame, encode_frame, frame_rows, long_table
from stream_app.worker.metrics import StreamMonitor
from stream_app.worker.records import decode_partial, encode_partial
from stream_app.worker.rollups import (
    FIXED_BITS,
    RollupId,
    RollupPolicy,
    RollupState,
    add_fixed,
    fixed_sum,
    from_fixed,
    rollup_result,
    summary_of,
)

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # on the hour
E0 = int(T0.timestamp()) // 30
V = 40
Q = Query(query_id="q-unary", analyst_id="a", version=1, sensors=tuple(400_001 + i for i in range(V)),
          mechanism="rr", population=5_000, t_start=T0, t_end=T0 + timedelta(hours=1))
QE = QueryEstimators.build(Q)
CONF = (0.95, 0.99)


def epoch(e: int, rng: np.random.Generator, gaps: frozenset[int] = frozenset()) -> EpochResult:
    n = int(rng.integers(3_000, 5_000))
    res = EpochResult(query=Q, epoch=e, closed_by="markers", confidences=CONF, participants=n, reports=n,
                      round_reports=[n], late=0, refused=0, missing_batches=0, withheld=None, no_source_data=gaps)
    for name in Q.spec.estimator_names:
        est = rng.normal(15, 141, V) * 10.0 ** rng.integers(-3, 3, V)  # magnitudes that round differently
        sd = rng.uniform(100, 200, V) / 7
        res.values[name] = StationEstimates(est, sd, np.stack([est - 1] * 2), np.stack([est + 1] * 2))
    return res


def hour(seed: int, gaps: dict[int, frozenset[int]] | None = None) -> list[EpochResult]:
    rng = np.random.default_rng(seed)
    return [epoch(E0 + i, rng, (gaps or {}).get(i, frozenset())) for i in range(120)]


def decided_hour(results: list[EpochResult], order: np.ndarray, batches: int) -> RollupState:
    """Feed the summaries (through their wire encoding) in ``order`` and ``batches``, storing every
    touched state as bytes between batches (as the changelog does); the decided hourly rollup."""
    items = [decode_partial(encode_partial(summary_of(results[i]))) for i in order]
    store: dict[bytes, bytes] = {}
    policy = RollupPolicy(spans=(120,))
    decided: list[RollupState] = []
    for chunk in np.array_split(np.arange(len(items)), batches):
        out = policy.apply(lambda rid: RollupState.decode(store[rid.key]) if rid.key in store else None,
                           [items[i] for i in chunk])
        decided += out.decided
        store.update({rid.key: st.encode() for rid, st in out.touched.items()})
    (st,) = decided
    return st


def test_two_arrival_orders_give_bit_identical_rollups() -> None:
    results = hour(seed=11)
    rng = np.random.default_rng(12)
    ref = decided_hour(results, np.arange(120), batches=1)
    ref_rows = rollup_result(QE, ref, CONF).render()
    differ = 0
    for trial in range(4):
        st = decided_hour(results, rng.permutation(120), batches=1 + 7 * trial)
        assert st.estimate is not None and ref.estimate is not None
        assert st.variance is not None and ref.variance is not None
        # bit for bit: the same bytes, not merely close
        assert st.estimate.tobytes() == ref.estimate.tobytes() and st.variance.tobytes() == ref.variance.tobytes()
        assert rollup_result(QE, st, CONF).render() == ref_rows
        floats = np.zeros(V)
        for i in rng.permutation(120):
            floats += results[i].values["rr"].estimate
        differ += int(np.sum(floats != ref.estimate[0]))
    assert differ > 0  # float sums in arrival order do differ: the check above can fail


def test_the_exact_sum_is_the_sum_of_its_summands() -> None:
    rng = np.random.default_rng(13)
    x = rng.normal(0, 1, (120, 7)) * 10.0 ** rng.integers(-8, 7, (120, 7))
    total = from_fixed(functools.reduce(add_fixed, (fixed_sum(row) for row in x)))
    for j in range(7):
        exact = math.fsum(x[:, j].tolist())
        assert abs(total[j] - exact) <= 120 * 2.0 ** -FIXED_BITS + 2 * math.ulp(exact)


def test_a_station_without_source_data_in_an_epoch_has_no_number() -> None:
    gaps = {3: frozenset({2}), 70: frozenset({2, 9})}  # station indices 2 and 9 lack an epoch each
    results = hour(seed=14, gaps=gaps)
    st = decided_hour(results, np.arange(120), batches=3)
    res = rollup_result(QE, st, CONF)
    assert res.withheld is None and res.no_source_data == res.blank == frozenset({2, 9})
    rows = [json.loads(v) for _, v in res.render()]
    for r in rows:
        Estimate.model_validate(r)
        blank = r["station"] in (Q.sensors[1], Q.sensors[8])
        assert (r["data_quality"] == "no_source_data") == blank
        if blank:
            assert r["estimate"] is None and r["sd"] is None and r["bounds"] == [] and r["consistent"] is None
        else:
            assert isinstance(r["estimate"], float) and len(r["bounds"]) == 2
    ok = [i for i in range(V) if i + 1 not in (2, 9)]
    total = np.sum([x.values["rr"].estimate for x in results], axis=0)
    np.testing.assert_allclose(res.values["rr"].estimate[ok], total[ok], rtol=1e-12)
    # frames carry exactly the rows; the long table has no bounds for them
    frame = decode_frame(encode_frame(res))
    assert list(frame_rows(frame)) == rows
    long = long_table(frame).to_pylist()
    assert [len(r["bounds"]) for r in long] == [0 if r["data_quality"] == "no_source_data" else 2 for r in long]
    assert [r["estimate"] for r in long] == [r["estimate"] for r in rows]
    # metrics: no series for them; the rows flagged are counted
    reg = CollectorRegistry()
    mon = StreamMonitor(reg)
    mon.on_rollup(res)
    text = mon.arrays.expose(reg).decode()
    flows = [ln for ln in text.splitlines() if ln.startswith("ptt_rollup_vehicles{")]
    assert len(flows) == V - 2 and not any(f'station="{Q.sensors[1]}"' in ln for ln in flows)
    assert reg.get_sample_value("ptt_no_source_data_estimates_total", {"query": Q.query_id}) == 2


def test_a_state_with_float_sums_is_still_read() -> None:
    rng = np.random.default_rng(15)
    st = RollupState.new(RollupId(Q.query_id, 1, 120, E0))
    st.add(summary_of(epoch(E0, rng)))
    raw = st.encode()
    (hlen,) = FRAME_LENGTH.unpack_from(raw, 4)
    head = json.loads(raw[8:8 + hlen])
    assert head.pop("fixed") == FIXED_BITS
    assert st.estimate is not None and st.variance is not None
    h = json.dumps(head, separators=(",", ":")).encode()
    old = raw[:4] + FRAME_LENGTH.pack(len(h)) + h + st.estimate.astype("<f8").tobytes() + st.variance.astype(
        "<f8").tobytes()
    back = RollupState.decode(old)
    assert back.estimate is not None and back.estimate.tobytes() == st.estimate.tobytes()
