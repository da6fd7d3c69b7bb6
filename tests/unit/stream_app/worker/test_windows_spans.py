"""Windows of a span query (``Query.span_s``: one report per device per span, keyed by the span's
first epoch) under :class:`stream_app.worker.windows.WindowPolicy`, beside a 30-s query's.

* the watermark closes a span window only once it has passed the span's LAST epoch by the
  allowed lateness (the 30-s window of the span's first epoch closes long before): the test
  fails if the span's length is ignored;
* the wall clock closes it only after the span's end plus the grace;
* its markers close it at once (rule 1, as for an epoch);
* its first record is ``born_late`` only if the watermark passed the span's last epoch;
* an empty (gap) span window is not closed by the stall rule before the span has ended;
* window state and watermark state keep the span across encode/decode (a restart).
"""

from __future__ import annotations

import numpy as np

from stream_app.worker.records import BatchPartial, Gap, MarkerPartial, Tick, WindowId
from stream_app.worker.windows import Watermarks, WindowPolicy, WindowState

SPAN = 10  # epochs: a 5-minute span
S = 59_832_960  # a span start (a multiple of 10)
LATE = 2


def shape(wid: WindowId) -> tuple[int, ...]:
    return (1, 2, SPAN) if wid.query_id == "flow" else (1, 2)


def batch(query: str, epoch: int, partition: int = 0, bid: str | None = None) -> BatchPartial:
    return BatchPartial(query, 1, epoch, 0, partition, "p", bid or f"{query}-{epoch}-{partition}".ljust(32, "x"), 1,
                        True, np.array([1, 0]))


def marker(query: str, epoch: int, partition: int = 0, batches: int = 1) -> MarkerPartial:
    return MarkerPartial(query, 1, epoch, 0, partition, "p", 0, 1, batches, batches, 5, 0, False)


def closed(out: object) -> dict[tuple[str, int], str]:
    return {(st.wid.query_id, st.wid.epoch): reason for st, reason in out.closed}  # type: ignore[attr-defined]


def run(policy: WindowPolicy, wm: Watermarks, store: dict[WindowId, WindowState], items: list[object]
        ) -> dict[tuple[str, int], str]:
    out = policy.apply(wm, store.get, shape, items)  # type: ignore[arg-type]
    store.update(out.touched)
    return closed(out)


def test_the_watermark_closes_a_span_window_only_past_its_last_epoch() -> None:
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=LATE)
    wm, store = Watermarks(), dict[WindowId, WindowState]()
    got = run(policy, wm, store, [batch("flow", S), batch("live", S)])
    assert got == {}
    # the 30-s query moves the watermark on; its epoch S closes at S + LATE + 1
    got = run(policy, wm, store, [batch("live", S + LATE + 1)])
    assert got == {("live", S): "watermark"}
    for e in range(S + LATE + 2, S + SPAN + LATE):  # up to the span's last epoch + the lateness
        got = run(policy, wm, store, [batch("live", e)])
        assert ("flow", S) not in got, e
    got = run(policy, wm, store, [batch("live", S + SPAN + LATE)])
    assert got.get(("flow", S)) == "watermark"
    assert not store[WindowId("flow", 1, S)].born_late


def test_the_wall_clock_closes_a_span_window_only_after_the_span_s_end() -> None:
    grace = 60.0
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=LATE, wall_clock_grace_s=grace)
    wm, store = Watermarks(), dict[WindowId, WindowState]()
    run(policy, wm, store, [batch("flow", S), batch("live", S)])
    got = run(policy, wm, store, [Tick((S + 1) * 30 + grace + 1)])
    assert got == {("live", S): "wall_clock"}
    got = run(policy, wm, store, [Tick((S + SPAN) * 30 + grace - 1)])
    assert got == {}
    got = run(policy, wm, store, [Tick((S + SPAN) * 30 + grace + 1)])
    assert got == {("flow", S): "wall_clock"}


def test_markers_close_a_span_window_at_once() -> None:
    policy = WindowPolicy(n_source_partitions=2, allowed_lateness_epochs=LATE)
    wm, store = Watermarks(), dict[WindowId, WindowState]()
    got = run(policy, wm, store, [batch("flow", S, 0), marker("flow", S, 0), marker("flow", S, 1, batches=0)])
    assert got == {("flow", S): "markers"}


def test_a_span_s_first_record_is_late_only_past_its_last_epoch() -> None:
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=LATE)
    wm, store = Watermarks(), dict[WindowId, WindowState]()
    run(policy, wm, store, [batch("live", S + SPAN + LATE - 1)])
    run(policy, wm, store, [batch("flow", S), batch("live", S)])
    assert not store[WindowId("flow", 1, S)].born_late
    assert store[WindowId("live", 1, S)].born_late  # a 30-s epoch that far back is
    wm2, store2 = Watermarks(), dict[WindowId, WindowState]()
    run(policy, wm2, store2, [batch("live", S + SPAN + LATE)])
    run(policy, wm2, store2, [batch("flow", S)])
    assert store2[WindowId("flow", 1, S)].born_late


def test_an_empty_span_window_is_not_stall_closed_before_its_span_ends() -> None:
    grace = 60.0
    policy = WindowPolicy(n_source_partitions=1, allowed_lateness_epochs=LATE, wall_clock_grace_s=grace,
                          stall_close_s=5.0, live_horizon_s=0.0)
    wm, store = Watermarks(), dict[WindowId, WindowState]()
    now = (S + 2) * 30 + grace  # the gap span S has not ended
    run(policy, wm, store, [Tick(now), batch("flow", S + SPAN), Gap("flow", 1, S, 0, S + SPAN)])
    got = run(policy, wm, store, [Tick(now + 10)])
    assert ("flow", S) not in got
    got = run(policy, wm, store, [Tick((S + SPAN) * 30 + grace + 10), Tick((S + SPAN) * 30 + grace + 20)])
    assert got.get(("flow", S)) == "watermark" and store[WindowId("flow", 1, S)].empty


def test_span_state_survives_encode_and_decode() -> None:
    st = WindowState.new(WindowId("flow", 1, S), 1, 2, SPAN)
    st.add(batch("flow", S))
    back = WindowState.decode(st.encode())
    assert back.span == SPAN and back.last_epoch == S + SPAN - 1
    assert WindowState.decode(WindowState.new(WindowId("live", 1, S), 1, 2).encode()).span == 1
    wm = Watermarks()
    wm.track(WindowId("flow", 1, S), S + SPAN - 1)
    wm.track(WindowId("live", 1, S))
    again = Watermarks.decode(wm.encode())
    assert again.open == {WindowId("flow", 1, S): S + SPAN - 1, WindowId("live", 1, S): S}
