"""What a span query's closed window publishes (``stream_app.worker.stage2`` with ``estimate``, ``frames``,
``metrics`` and ``rollups``), pure:

* its result, rows, frame header and long table carry ``span_s`` = the query's span, and the
  frame is keyed by its window (not as a rollup);
* its estimates are the per-station linear estimator's, as for an epoch (the same counts give
  the same numbers under a 30-s query), and ``consistent`` is projected with the cap P x n (a
  vehicle passes up to P stations of a span), so the consistent sum may exceed n;
* it feeds no rollup (``rolls_up``), while a 30-s query does;
* its station series are the flows' (``ptt_rollup_vehicles`` with ``span_s``), not the 30-s
  ``ptt_estimate_vehicles``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from prometheus_client import CollectorRegistry

from schemas import Query
from schemas.estimates import Estimate
from stream_app.worker.estimate import QueryEstimators
from stream_app.worker.frames import decode_frame, long_table
from stream_app.worker.metrics import StreamMonitor
from stream_app.worker.records import BatchPartial, MarkerPartial, WindowId
from stream_app.worker.rollups import rolls_up
from stream_app.worker.stage2 import OutputSettings, epoch_outputs, frame_key, publish_chunks
from stream_app.worker.windows import Outcome, WindowState

T0 = datetime(2026, 11, 18, 16, 0, tzinfo=UTC)  # on the hour
E0 = int(T0.timestamp()) // 30
SENSORS = (400_001, 400_002, 400_003, 400_004)
N = 400
FLOW = Query(query_id="flow", analyst_id="a", version=1, sensors=SENSORS, mechanism="rr", population=1_000,
             span_s=300, t_start=T0, t_end=T0 + timedelta(hours=1))
LIVE = FLOW.model_copy(update={"query_id": "live", "span_s": 30})
OUT = OutputSettings(confidences=(0.95,), min_participants=1, n_source_partitions=1)


def known(qid: str, version: int) -> Query | None:
    return {"flow": FLOW, "live": LIVE}.get(qid)


def closed_window(q: Query, yes: list[int]) -> WindowState:
    """A window of ``q`` at E0 whose tally says ``yes[i]`` of N answered yes at station i+1."""
    counts = np.array([[N - y, y] for y in yes], dtype=np.int64).ravel()
    st = WindowState.new(WindowId(q.query_id, 1, E0), q.n_rounds, q.width, q.epochs_per_span)
    st.add(BatchPartial(q.query_id, 1, E0, 0, 0, "p", "b" * 32, N, True, counts))
    st.add(MarkerPartial(q.query_id, 1, E0, 0, 0, "p", 0, 1, N, 1, N, 0, False))
    st.close("markers")
    return st


def results(q: Query, yes: list[int]) -> list:  # type: ignore[type-arg]
    outcome = Outcome(closed=[(closed_window(q, yes), "markers")])
    return list(epoch_outputs(outcome, known, QueryEstimators.build, OUT))


def test_a_span_query_s_outputs_carry_its_span() -> None:
    (res,) = results(FLOW, [300, 250, 200, 150])
    assert res.withheld is None and res.span_s == 300 and res.epoch == E0
    rows, frames, _ = next(iter(publish_chunks([res], limit=10 ** 9, rows=True, frames=True)))
    for _, value in rows:
        e = Estimate.model_validate_json(value)
        assert e.span_s == 300 and e.epoch == E0
    (key, frame), = frames
    assert key == WindowId("flow", 1, E0).key == frame_key(res)
    f = decode_frame(frame)
    assert f.header["span_s"] == 300
    assert set(long_table(f).column("span_s").to_pylist()) == {300}


def test_a_span_query_estimates_per_station_as_an_epoch_does_with_a_span_s_cap() -> None:
    yes = [300, 250, 200, 150]  # the true passages add up to well over N: each vehicle passed several
    (span,) = results(FLOW, yes)
    (live,) = results(LIVE, yes)
    for name, v in span.values.items():
        np.testing.assert_array_equal(v.estimate, live.values[name].estimate)
        assert v.consistent is not None and live.values[name].consistent is not None
        assert float(v.consistent.sum()) > N  # the cap is P x N (P = 4 stations here), not N
        assert float(live.values[name].consistent.sum()) <= N + 1e-9
    assert FLOW.passages * N >= float(span.values["rr"].consistent.sum())


def test_only_30_s_queries_are_rolled_up() -> None:
    assert rolls_up(LIVE) and not rolls_up(FLOW)


def test_a_span_query_s_series_are_the_flows() -> None:
    (res,) = results(FLOW, [300, 250, 200, 150])
    reg = CollectorRegistry()
    mon = StreamMonitor(reg)
    mon.on_epoch_closed(res)
    text = mon.arrays.expose(reg).decode()
    flows = [ln for ln in text.splitlines() if ln.startswith("ptt_rollup_vehicles{")]
    assert len(flows) == len(SENSORS) * len(FLOW.spec.estimator_names)
    assert all('span_s="300"' in ln and 'query="flow"' in ln for ln in flows)
    assert not [ln for ln in text.splitlines() if ln.startswith("ptt_estimate_vehicles{")]
    (live,) = results(LIVE, [30, 25, 20, 15])
    mon.on_epoch_closed(live)
    text = mon.arrays.expose(reg).decode()
    assert [ln for ln in text.splitlines() if ln.startswith("ptt_estimate_vehicles{") and 'query="live"' in ln]
