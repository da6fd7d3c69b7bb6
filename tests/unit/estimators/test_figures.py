"""The one source of the privacy figures (estimators/figures.py).

(a) Every place asks the same function: ``ptt plan``'s ``epsilon_shuffled`` and the worker's
    (``MechanismSpec.shuffled_epsilon``, at n rounded down to two significant digits) are
    ``epoch_epsilon`` at the same n and release, for the local, permuted and aggregate releases.
(b) No silent fallback: where the accounting cannot reach delta (its allowance for what it
    leaves out exceeds it), the plan's shuffled day is null with the reason, not the local day;
    the per-epoch aggregate figure at such a delta is still computed (0.0075 at the papers'
    scale, not the local 1.31), and NaN (null on the wire) where even one epoch cannot be.
(c) The labels and the plain-words sentence say what a figure is for and what it means.
"""

from __future__ import annotations

import math

import pytest

from estimators import figures, planning
from estimators.registry import get_spec


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alp", "unary", "krr", "sp"])
@pytest.mark.parametrize("release", ["permuted", "aggregate"])
def test_the_plan_and_the_worker_state_the_same_figure(name: str, release: str) -> None:
    spec = get_spec(name)
    mech = spec.build({}, 16)
    one = figures.epoch_epsilon(spec, mech, 16, 2000, release)
    assert spec.shuffled_epsilon(mech, 16, 2000, release=release) == one  # the worker's (n rounded by it)
    if release == "aggregate":  # the registry rounds the aggregate release's n itself too
        assert spec.shuffled_epsilon(mech, 16, 2039, release=release) == one or math.isinf(one)
    plan = planning.plan(name, 2000, 10, 16, release=release)
    assert plan["epsilon_shuffled"] == one or (math.isinf(one) and math.isinf(plan["epsilon_shuffled"]))
    assert figures.epoch_epsilon(spec, mech, 16, None, "local") == plan["epsilon"]


def test_sampling_privacy_has_no_shuffled_figure() -> None:
    spec = get_spec("sp")
    assert math.isinf(figures.epoch_epsilon(spec, spec.build({}, 16), 16, 2000, "aggregate"))


def test_below_the_accountings_allowance_the_day_is_null_with_the_reason_never_the_local_day() -> None:
    plan = planning.plan("alp", 2000, 10, 16, release="aggregate", delta=1.7361e-10)
    assert math.isnan(plan["epsilon_day_shuffled"]) and math.isnan(plan["epsilon_day_vehicle"])
    assert "no shuffled figure at delta 1.7361e-10" in plan["epsilon_day_shuffled_why"]
    # one epoch still has its own figure, below the local one (it fell back to it before)
    assert 0 < plan["epsilon_shuffled"] < 0.1 * plan["epsilon"]
    fine = planning.plan("alp", 2000, 10, 16, release="aggregate", delta=1e-6)
    assert 0 < fine["epsilon_day_shuffled"] < fine["epsilon_day"] and "epsilon_day_shuffled_why" not in fine


def test_one_epoch_below_its_allowance_is_nan_not_the_local_figure() -> None:
    spec = get_spec("alp")
    mech = spec.build({}, 16)
    assert math.isnan(figures.epoch_epsilon(spec, mech, 16, 2000, "aggregate", delta=1e-14))
    assert figures.epoch_epsilon(spec, mech, 16, 2000, "aggregate", delta=1e-10) < 0.1


def test_labels_say_the_release_and_the_crowd() -> None:
    assert figures.label(0.00436, "aggregate", 47_000) == ("epsilon 0.00436 per epoch, aggregate release among "
                                                           "n = 47,000 at delta 1e-06")
    assert "local" in figures.label(1.31, "local") and "n =" not in figures.label(1.31, "local")


def test_the_plain_words_put_a_figure_on_the_scale() -> None:
    assert "e^epsilon" in figures.plain_words() and "no meaningful protection" in figures.plain_words()
    assert figures.plain_words(0.325).endswith("strong.")
    assert figures.plain_words(2.47).endswith("what large deployments use.")
    assert figures.plain_words(25.9).endswith("no meaningful protection.")
    assert figures.plain_words(None) == figures.plain_words()


@pytest.mark.parametrize("release", ["aggregate", "permuted"])
def test_a_span_reports_figure_is_its_whole_reports(release: str) -> None:
    """The one figure of a span query (the worker's ``epsilon_shuffled``, ``ptt analyst list``) is
    the span report's, up to P stations each way, not a 30-s report's (fails with passages
    ignored: the 30-s figure understates what a span report costs); the local one is P times."""
    from estimators import budget, ledger
    spec = get_spec("unary")
    mech = spec.build({}, 12)
    one = ledger.report_epsilon_shuffled(spec, mech, 12, 2000, release)
    span = ledger.report_epsilon_shuffled(spec, mech, 12, 2000, release, passages=4)
    assert span > one and one == spec.shuffled_epsilon(mech, 12, 2000, release=release)
    acc = budget.epoch_account(spec, mech, 12, 2000, release, span_s=3600, passages=4)
    assert span == pytest.approx(budget.release_figures(acc, 2880, 1e-6)["epsilon_shuffled"], rel=1e-12)
    assert figures.epoch_epsilon(spec, mech, 12, None, "local", passages=4) == pytest.approx(
        4 * figures.epoch_epsilon(spec, mech, 12, None, "local"))
    with pytest.raises(ValueError, match="report_epsilon_shuffled"):
        figures.epoch_epsilon(spec, mech, 12, 2000, release, passages=4)
