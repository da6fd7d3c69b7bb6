"""docs/adding-a-mechanism.md, executed: one new spec in the registry, and a query using it
goes through the fleet, stage 1, the window policy and the estimates with no other change."""

from __future__ import annotations

from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

import estimators.registry as registry
import schemas.query as query_module
from estimators import SparseReports, StationCounts, linear, mechanisms
from producers.fleet import Device, privatize
from schemas import Query, encode_batch, new_batch_id
from stream_app.worker.decode import to_partials
from stream_app.worker.estimate import EpochResult, QueryEstimators, epoch_result
from stream_app.worker.records import BatchPartial, MarkerPartial
from stream_app.worker.windows import Watermarks, WindowPolicy
from tests.station_counts import pair_counts


def my_rr(p_yes: float = 0.7, p_no: float = 0.2) -> mechanisms.Mechanism:
    table = np.array([[1 - p_no, p_no], [1 - p_yes, p_yes]])
    return mechanisms.table_mechanism("my_rr", table, {"p_yes": p_yes, "p_no": p_no}, output_labels=("0", "1"))


SPEC = registry.MechanismSpec(
    name="my-rr", summary="a two-probability randomized response asked about each sensor",
    defaults={"p_yes": 0.7, "p_no": 0.2}, n_rounds=1, per_sensor=True,
    estimator_names=("my_rr",), headline="my_rr",
    build_fn=lambda p, v: my_rr(p["p_yes"], p["p_no"]),
    estimators_fn=lambda m, stations, design: {
        "my_rr": linear.count_estimator("my_rr", linear.station_view(m), 1)},
    closed_form_fn=lambda m: float("nan"),
)


@pytest.fixture
def with_my_rr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REGISTRY", MappingProxyType({**registry.REGISTRY, "my-rr": SPEC}))
    monkeypatch.setattr(query_module, "MECHANISM_NAMES", (*query_module.MECHANISM_NAMES, "my-rr"))


def one_epoch_through_the_stream(q: Query, epoch: int, er: Any) -> EpochResult:
    """A one-round query's privatized epoch (``er``, from :func:`privatize`) as one batch and its
    marker through stage 1, the window policy and the estimate: what the worker publishes."""
    value = encode_batch({"kind": "reports", "query_id": q.query_id, "query_version": q.version, "epoch": epoch,
                          "round": 0, "batch_id": new_batch_id(), "producer_id": "p0", "reports": er.reports[0],
                          "layout": er.rounds[0].layout, "n_stations": q.n_stations, "n_outputs": q.n_outputs},
                         er.rounds[0].arrays())
    (part,) = to_partials(value, 0, lambda qid, ver: q)
    assert isinstance(part, BatchPartial)
    marker = MarkerPartial(q.query_id, q.version, epoch, 0, 0, "p0", 0, 1, er.reports[0], 1, q.population, 0, False)
    out = WindowPolicy(1).apply(Watermarks(), lambda w: None, lambda w: (q.n_rounds, q.width), [part, marker])
    (state, reason), = out.closed
    return epoch_result(QueryEstimators.build(q), state, reason, (0.95,), 20)


def test_a_new_spec_runs_end_to_end(with_my_rr: None) -> None:
    v, n = 4, 2000
    q = Query(query_id="q-new", analyst_id="a", version=1, sensors=(11, 12, 13, 14), mechanism="my-rr",
              population=n, t_start=datetime(2026, 11, 18, tzinfo=UTC), t_end=datetime(2026, 11, 19, tzinfo=UTC))
    assert q.epsilon == pytest.approx(np.log(0.7 / 0.2) + np.log(0.8 / 0.3))  # a move flips two answers
    epoch = q.epoch_range()[0]
    truth = np.array([n - 400, 100, 100, 100, 100])
    er = privatize(q, StationCounts(truth), np.random.default_rng(5), "per-vehicle", Device())
    arrays = er.rounds[0].arrays()
    res = one_epoch_through_the_stream(q, epoch, er)
    assert res.withheld is None
    est = res.values["my_rr"].estimate
    # the core's own count estimator on the core's own tally of the same pairs
    pairs = SparseReports(np.zeros_like(arrays["station"]), arrays["station"], arrays["output"])
    counts = pair_counts(q.spec, q.build(), v, [pairs], n)
    want = linear.count_estimator("my_rr", linear.station_view(q.build()), 1).estimate(counts, n)
    np.testing.assert_allclose(est, want)
