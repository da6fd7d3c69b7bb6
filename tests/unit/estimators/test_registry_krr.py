"""The registry's ``krr``: k-ary randomized response over a query's V sensors (k = V + 1).

Deterministic checks: its epsilons, its shuffled-accounting parameters (the variation ratio of
its output table), its estimator against the k-ary RR formula, and one query run end to end
(fleet, wire, stage 1, window, estimates) against the statistics core on the same reports.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest

import estimators as E
from estimators import StationCounts
from producers.fleet import Device, privatize
from schemas import Query
from tests.unit.estimators.test_registry_add_mechanism import one_epoch_through_the_stream

SPEC = E.get_spec("krr")


def test_spec_shape_and_defaults() -> None:
    assert SPEC.n_rounds == 1 and not SPEC.per_sensor and SPEC.layout == "values"
    assert SPEC.estimator_names == ("krr",) and SPEC.headline == "krr"
    assert not SPEC.default_query and "krr" not in E.default_query_mechanisms()
    mech = SPEC.build({}, 7)
    assert mech.station_valued and mech.n_truths == mech.n_outputs == 8 == SPEC.width(mech, 7)
    assert mech.params["epsilon"] == 1.31


@pytest.mark.parametrize("v", [1, 3, 3_220])
@pytest.mark.parametrize("eps", [0.5, math.log(3.0), 1.31, 4.0])
def test_epsilons_are_the_parameter(v: int, eps: float) -> None:
    """One report per epoch: the closed form, the brute force over the table and the whole
    report's epsilon are all ``epsilon``, whatever V."""
    mech = SPEC.build({"epsilon": eps}, v)
    assert SPEC.closed_form_epsilon(mech) == eps
    assert SPEC.answer_epsilon(mech) == pytest.approx(eps, rel=1e-12)
    assert SPEC.report_epsilon(mech, v) == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("v", [1, 3, 50, 400, 3220])
@pytest.mark.parametrize("eps", [0.5, math.log(3.0), 1.31, 4.0])
def test_shuffle_ratios_are_the_kary_variation_ratio(v: int, eps: float) -> None:
    """``spec.shuffle_ratios`` (the station-valued path: the variation ratio of the output
    table): one round, ``p = q = e^eps`` and ``beta = (e^eps - 1)/(e^eps + k - 1)`` -- two
    truths' rows differ only at their own two outputs, each by ``(e^eps - 1)/(e^eps + k - 1)``."""
    k = v + 1
    mech = SPEC.build({"epsilon": eps}, v)
    (ratio,) = SPEC.shuffle_ratios(mech, v)
    assert ratio.beta == pytest.approx(math.expm1(eps) / (math.exp(eps) + k - 1), rel=1e-12)
    assert ratio.p == pytest.approx(math.exp(eps), rel=1e-12)
    assert ratio.q == pytest.approx(math.exp(eps), rel=1e-12)
    assert math.isfinite(SPEC.shuffled_epsilon(mech, v, 47_719))


def test_estimator_is_the_kary_rr_formula() -> None:
    """Per station v: ``(C_v - N/(e^eps + k - 1)) / ((e^eps - 1)/(e^eps + k - 1))``, named ``krr``,
    equal to the core's ``rr_estimator``; ``stations`` selects rows."""
    v, eps = 4, 1.31
    k = v + 1
    mech = SPEC.build({}, v)
    ests = SPEC.estimators(mech)
    est = ests["krr"]
    assert est.name == "krr" and E.rr_estimator(mech).name == "rr"
    counts = np.array([[[900, 100]], [[800, 200]], [[950, 50]], [[1_000, 0]]], dtype=np.int64)
    n = 1_000
    p_no = 1.0 / (math.exp(eps) + k - 1)
    want = (counts[:, 0, 1] - n * p_no) / (math.expm1(eps) / (math.exp(eps) + k - 1))
    np.testing.assert_allclose(est.estimate(counts, n), want, rtol=1e-12)
    np.testing.assert_allclose(est.estimate(counts, n), E.rr_estimator(mech).estimate(counts, n), rtol=1e-12)
    two = SPEC.estimators(mech, stations=np.array([2, 4]))["krr"]
    np.testing.assert_allclose(two.estimate(counts[[1, 3]], n), want[[1, 3]], rtol=1e-12)


def test_a_krr_query_runs_end_to_end() -> None:
    """Per-vehicle reports of a krr query: privatized by the fleet, encoded and decoded on the
    wire (layout ``values``), accumulated by stage 1, closed by the window policy and estimated:
    the published estimate equals the core's estimator on the core's tally of the same values."""
    v, n = 5, 4_000
    q = Query(query_id="q-krr", analyst_id="a", version=1, sensors=(11, 12, 13, 14, 15), mechanism="krr",
              population=n, t_start=datetime(2026, 11, 18, tzinfo=UTC), t_end=datetime(2026, 11, 19, tzinfo=UTC))
    assert q.epsilon == pytest.approx(1.31, rel=1e-12)
    epoch = q.epoch_range()[0]
    truth = np.array([n - 1_000, 400, 300, 200, 100, 0])
    er = privatize(q, StationCounts(truth), np.random.default_rng(7), "per-vehicle", Device())
    assert er.rounds[0].layout == "values"
    arrays = er.rounds[0].arrays()
    res = one_epoch_through_the_stream(q, epoch, er)
    assert res.withheld is None and list(res.values) == ["krr"]
    mech = q.build()
    counts = E.station_counts(mech, np.bincount(arrays["value"], minlength=v + 1)[None, :])
    want = E.rr_estimator(mech).estimate(counts, n)
    np.testing.assert_allclose(res.values["krr"].estimate, want)
    assert np.abs(want - truth[1:]).max() < 6 * math.sqrt(float(np.max(E.rr_estimator(mech).variance(400, n))))
