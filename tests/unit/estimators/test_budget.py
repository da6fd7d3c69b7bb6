"""Day budgets (estimators/budget.py, estimators/fleet.py, ``ptt plan --release/--day-budget``,
``ptt plan fleet``). Deterministic (no Monte Carlo)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from estimators import budget, fleet
from estimators import fit as fitting
from estimators.registry import get_spec
from stream_app.cli import main


@pytest.mark.parametrize(("b", "want"), [(2.5, 138.2), (4.0, 90.6), (8.0, 49.6)])
def test_curator_reference(b: float, want: float) -> None:
    assert budget.central_limit_sd(b, 1e-6, 2880) == pytest.approx(want, abs=0.05)


@pytest.mark.parametrize(("eps", "mu"), [(0.5, 1.0), (2.5, 3.7), (1.0, 0.3)])
def test_gaussian_delta_is_the_gaussian_mechanisms(eps: float, mu: float) -> None:
    """Against the Gaussian mechanism's own PLD, L ~ N(mu^2/2, mu^2), integrated numerically."""
    def integrand(x: float) -> float:
        return -math.expm1(eps - x) * float(norm.pdf(x, mu * mu / 2, mu))

    exact = quad(integrand, eps, mu * mu / 2 + 40 * mu, epsabs=1e-14, limit=200)[0]
    assert budget.gaussian_delta(eps, mu) == pytest.approx(exact, rel=1e-6, abs=1e-14)


def test_share_epsilon_splits_mu_squared() -> None:
    half = fleet.share_epsilon(2.5, 0.5, 1e-6)
    mu = 2.5 / 10  # any: check the defining property instead
    assert half < 2.5 and mu > 0
    # two halves compose (mu^2 adds) back to the whole
    m_half = budget.central_limit_sd(half, 1e-6, 2880)
    assert m_half == pytest.approx(budget.central_limit_sd(2.5, 1e-6, 2880, share=0.5), rel=1e-6)


def test_unary_fit_is_within_budget_and_tight() -> None:
    spec = get_spec("unary")
    n, v, epochs, b = 2_000, 10, 100, 1.5
    fit = fitting.fit_budget(spec, v, n, 50, b, "aggregate", epochs, 1e-6)
    assert fit["fits"]
    q = fit["chosen"]["q"]

    def day(qq: float, coarse: bool) -> float:
        acc = budget.epoch_account(spec, spec.build({"q": qq}, v), v, n, "aggregate")
        return budget.pld_day_epsilon(list(acc.plds), epochs, 1e-6, coarse=coarse)

    assert day(q, coarse=False) <= b
    assert day(q * 0.97, coarse=True) > b  # a clearly less noisy setting would not fit: the search is tight
    assert fit["sd"] == pytest.approx(math.sqrt(n * q * (1 - q)) / (1 - 2 * q), rel=1e-9)


def test_a_budget_search_chooses_the_same_whatever_ran_before_it_in_the_process() -> None:
    """What ``ptt plan --day-budget`` prints depends on its arguments alone: a search after another
    one (in the same process, with the day figures it evaluated still cached) chooses what it
    chooses in a fresh process; within one planning run (a shared ``History``) a later search may
    start from the brackets of the earlier ones. Deliberate breakage: brackets taken from the
    process-wide cache of days (as they were) make the search after the first one evaluate other
    members (its ``tried``, which ``--json`` prints; the members evaluated decide the choice)."""
    spec = get_spec("unary")
    n, v, epochs = 2_000, 10, 100
    fitting._DAYS.clear()
    fresh = fitting.fit_budget(spec, v, n, 50, 1.2, "aggregate", epochs, 1e-6)
    for before in (1.5, 0.9, 1.19):
        fitting.fit_budget(spec, v, n, 50, before, "aggregate", epochs, 1e-6)
        after = fitting.fit_budget(spec, v, n, 50, 1.2, "aggregate", epochs, 1e-6)
        assert after["chosen"] == fresh["chosen"] and after["tried"] == fresh["tried"], before
    history: fitting.History = {}
    fitting.fit_budget(spec, v, n, 50, 1.19, "aggregate", epochs, 1e-6, history=history)
    shared = fitting.fit_budget(spec, v, n, 50, 1.2, "aggregate", epochs, 1e-6, history=history)
    assert len(shared["tried"]) < len(fresh["tried"])  # the run's own brackets do shorten its later search


@pytest.mark.slow
def test_fleet_day_is_within_budget() -> None:
    r = fleet.fleet_plan(3_000, 50, 5, release="aggregate", epochs=40, delta=1e-6, day_budget=2.0,
                         mechanisms=("alp", "rr"))
    assert r["epsilon_day_vehicle"] <= 2.0
    for name in ("alp", "rr"):
        q = r["queries"][name]
        assert q["fits"] is False or (q["sd"] > 0 and q["central_limit_sd"] > 0)
    assert r["epsilon_day_vehicle_local"] >= r["epsilon_day_vehicle"]


def test_fleet_without_budget_composes_every_query() -> None:
    r = fleet.fleet_plan(3_000, 50, 5, epochs=40, mechanisms=("rr", "unary"))
    alone = [r["queries"][n]["epsilon_day_shuffled"] for n in ("rr", "unary")]
    assert r["epsilon_day_vehicle"] >= max(alone) - 1e-9
    assert r["epsilon_day_vehicle"] <= sum(alone) + 0.02


def test_a_query_without_a_shuffled_bound_leaves_the_vehicles_day_without_one() -> None:
    """Sampling Privacy has no shuffled bound (its rounds share one die): a vehicle that answers
    it has no finite day, whatever the other queries cost (the old sum skipped it: 114 at the
    demo's size)."""
    r = fleet.fleet_plan(3_000, 50, 5, epochs=40, mechanisms=("sp", "rr"))
    assert math.isinf(r["epsilon_day_vehicle"])
    assert math.isfinite(r["queries"]["rr"]["epsilon_day_shuffled"])


def test_plan_cli_release_and_headline(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "unary", "--population", "5000", "--expected-yes", "50", "--stations", "5", "--epochs", "50"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["release"] == "aggregate" and out["headline_epsilon"] == "epsilon_day_vehicle"
    assert out["epsilon_day_vehicle"] <= out["epsilon_day_shuffled_permuted"]
    assert main([*argv, "--release", "permuted", "--json"]) == 0
    perm = json.loads(capsys.readouterr().out)
    assert perm["epsilon_day_vehicle"] == out["epsilon_day_shuffled_permuted"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("HEADLINE: epsilon_day_vehicle = ")
    assert main([*argv, "--day-budget", "-1"]) == 2
    assert "--day-budget must be a positive number" in capsys.readouterr().err
    assert main([*argv, "--day-budget", "1", "--param", "q=0.3"]) == 2
    assert "give no --param" in capsys.readouterr().err


@pytest.mark.slow
def test_a_budget_nothing_fits_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "alp", "--population", "200", "--expected-yes", "5", "--stations", "3", "--epochs", "2880",
            "--day-budget", "0.01"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot meet a day budget of 0.01" in err and "Traceback" not in err
    assert np.isfinite(budget.central_limit_sd(0.01))


def test_alp_family_mixes_the_yes_row_toward_the_no_row() -> None:
    """mix = 0 is the papers' ALP; at mix the Yes row is (1 - mix) Yes + mix No and the No row
    is unchanged (a truth-independent post-processing), so the day epsilon falls as mix grows."""
    spec, fam = get_spec("alp"), fitting.FAMILIES["alp"].fallback
    assert fam is not None and fam.to_params is not None and fam.private_when_larger and fam.bisect
    base = spec.build({}, 3).output_table(0)
    assert fam.to_params(spec.defaults, 0.0) == pytest.approx(dict(spec.defaults))
    days = []
    for mix in (0.0, 0.3, 0.6):
        table = spec.build(fam.to_params(spec.defaults, mix), 3).output_table(0)
        np.testing.assert_allclose(table[0], base[0], atol=1e-15)
        np.testing.assert_allclose(table[1], (1 - mix) * base[1] + mix * base[0], atol=1e-15)
        acc = budget.epoch_account(spec, spec.build(fam.to_params(spec.defaults, mix), 3), 3, 2_000, "aggregate")
        days.append(budget.pld_day_epsilon(list(acc.plds), 50, 1e-6))
    assert days[0] > days[1] > days[2] > 0


@pytest.mark.slow
def test_alp_spends_a_larger_budget_on_its_sampling_rates_and_mixes_below_the_smallest() -> None:
    """Through the aggregate release's exact accounting ALP's sampling rate s is the accuracy
    knob: a budget above the papers' day is spent on a larger s (a smaller sd, never above the
    budget); a budget below what even the grid's smallest s costs is met by mixing the Yes row
    toward the No row (the fallback family)."""
    spec = get_spec("alp")
    n, v, epochs = 2_000, 3, 50

    def day(params: dict[str, float]) -> float:
        acc = budget.epoch_account(spec, spec.build(params, v), v, n, "aggregate")
        return budget.pld_day_epsilon(list(acc.plds), epochs, 1e-6, coarse=True)

    papers = day({})
    loose = fitting.fit_budget(spec, v, n, 20, 3 * papers, "aggregate", epochs, 1e-6, tol=1e-2)
    assert loose["fits"] and loose["chosen"]["s"] > spec.defaults["pisYes1"]
    assert day(loose["params"]) <= 3 * papers
    assert loose["sd"] < fitting.headline_sd(spec, spec.build({}, v), 20, n)
    fam = fitting.FAMILIES["alp"]
    smallest = day(fam.to_params(spec.defaults, min(fam.grid))) if fam.to_params else float("nan")
    tight = fitting.fit_budget(spec, v, n, 20, smallest / 2, "aggregate", epochs, 1e-6, tol=1e-2)
    assert tight["fits"] and tight["chosen"]["mix"] > 0
    assert day(tight["params"]) <= smallest / 2
    assert tight["sd"] > fitting.headline_sd(spec, spec.build({}, v), 20, n)


@pytest.mark.parametrize("share", [0.3, 0.6, 1.0, 2.0])
def test_alps_probed_grid_search_chooses_what_trying_every_member_chooses(share: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid search skips a member whose probe (a day composed from a few assignments of the
    others: a lower bound) is past the budget: the same choice and the same full figures as
    computing every member's day, at budgets between the grid's members; and every probe is at
    most its member's full day (the probe less its grid's rounding). Deliberate breakage:
    a probe computed among half the devices (above the full day, not under it: fewer others hide
    a device less) fails at 3 of these 4 budgets."""
    spec, fam = get_spec("alp"), fitting.FAMILIES["alp"]
    n, v, epochs = 3_000, 3, 200
    papers = fitting._day_of(spec, fam, 0.05, v, n, "aggregate", epochs, 1e-6)
    budget_ = share * papers * 4
    probed = fitting.fit_budget(spec, v, n, 20, budget_, "aggregate", epochs, 1e-6)
    skipped = [t for t in probed["tried"] if "epsilon_day_at_least" in t]
    for t in skipped:
        assert fitting._day_of(spec, fam, t["s"], v, n, "aggregate", epochs, 1e-6) >= t["epsilon_day_at_least"] \
            > budget_
    fitting._DAYS.clear()
    fitting._PROBES.clear()
    monkeypatch.setattr(fitting, "_probe_of", lambda *args: -math.inf)  # no member skipped: every day computed
    every = fitting.fit_budget(spec, v, n, 20, budget_, "aggregate", epochs, 1e-6)
    assert not any("epsilon_day_at_least" in t for t in every["tried"])
    assert probed["params"] == every["params"] and probed["sd"] == every["sd"]
    full = {t["s"]: t["epsilon_day"] for t in every["tried"]}
    assert all(full[t["s"]] == t["epsilon_day"] for t in probed["tried"] if "epsilon_day" in t)
    assert share > 1.0 or skipped  # the tighter budgets do skip members


@pytest.mark.slow
def test_fleet_plan_runs_the_default_queries_within_a_budget() -> None:
    """With no --query-mechanisms the fleet is the registry's default queries (those with a
    whole-day bound): the vehicle's day meets the budget with each query's sd and curator sd."""
    from estimators.registry import default_query_mechanisms

    r = fleet.fleet_plan(3_000, 50, 5, epochs=40, day_budget=2.0)
    assert r["mechanisms"] == list(default_query_mechanisms()) and "sp" not in r["mechanisms"]
    assert r["left_out"] == [] and r["epsilon_day_vehicle"] <= 2.0
    for q in r["queries"].values():
        assert q["fits"] and q["sd"] > 0 and 0 < q["central_limit_sd"] < q["sd"] * 1.2


def test_plan_fleet_cli_takes_query_mechanisms(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "fleet", "--population", "3000", "--expected-yes", "50", "--stations", "5", "--epochs", "40"]
    assert main([*argv, "--query-mechanisms", "sp,unary", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mechanisms"] == ["sp", "unary"] and math.isinf(out["epsilon_day_vehicle"] or math.inf)
    assert main([*argv, "--query-mechanisms", "unary,nope"]) == 2
    assert "unknown query mechanism 'nope'" in capsys.readouterr().err
    assert main(["plan", "unary", "--population", "30", "--expected-yes", "5", "--query-mechanisms", "sp"]) == 2
