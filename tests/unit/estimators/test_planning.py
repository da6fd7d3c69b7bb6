"""The ``ptt plan`` contract: other tools read its JSON, so the names and values are tested."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

import estimators as E
from estimators import planning
from stream_app.cli import main

REQUIRED = {"epsilon", "epsilon_closed_form", "epsilon_day_basic", "epsilon_day_advanced", "sd",
            "halfwidth_95", "halfwidth_99"}


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main(["plan", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", planning.MECHANISMS)
def test_every_mechanism_has_the_contract_keys(mechanism: str, capsys: pytest.CaptureFixture[str]) -> None:
    stations = str(E.get_spec(mechanism).max_stations or 3)
    out = _plan_json(capsys, mechanism, "--population", "10000", "--expected-yes", "100", "--stations", stations)
    assert REQUIRED <= set(out)
    eps = out["epsilon"]
    assert isinstance(eps, float) and eps > 0
    assert out["epsilon_day_basic"] == pytest.approx(2880 * eps)
    assert out["epsilon_day_advanced"] == pytest.approx(E.advanced_composition(eps, 2880, 1e-6))
    sd = out["sd"]
    assert isinstance(sd, float)
    assert out["halfwidth_95"] == pytest.approx(norm.ppf(0.975) * sd)
    assert out["halfwidth_99"] == pytest.approx(norm.ppf(0.995) * sd)


@pytest.mark.slow
def test_alp_matches_the_estimators_and_warns(capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's sobering number: sd ≈ 980 for Yes = 100 at 48,719 vehicles."""
    out = _plan_json(capsys, "alp", "--population", "48719", "--expected-yes", "100")
    mech = E.alp_optimal()
    ests = E.alp_estimators(mech, design_yes=100, design_n=48719)
    comp = out["sd_by_estimator"]
    assert isinstance(comp, dict)
    for name in ("alp_yhat", "alp_bottom", "alp_average", "alp_gls"):
        assert comp[name] == pytest.approx(float(np.sqrt(ests[name].variance(100, 48719))[0]))
    assert out["sd"] == comp["alp_average"]
    assert 960 < out["sd"] < 1000  # type: ignore[operator]
    assert comp["alp_gls"] <= min(comp["alp_yhat"], comp["alp_bottom"], comp["alp_average"])
    assert out["epsilon_per_answer"] == pytest.approx(math.log(3.5))  # brute force: the "No" report
    assert out["stations"] == 1 and out["epsilon"] == out["epsilon_per_answer"]  # one sensor: one answer
    assert out["epsilon_closed_form"] == pytest.approx(E.alp_epsilon_closed_form(**mech.params))
    crowd = E.crowd_size(48619, 0.05, 0.98)
    assert out["crowd_size_mean"] == pytest.approx(crowd.mean)
    assert out["crowd_size_p01"] == crowd.p01
    assert any("not a useful setting" in w for w in out["warnings"])  # type: ignore[union-attr]
    assert main(["plan", "alp", "--population", "48719", "--expected-yes", "100"]) == 0
    text = capsys.readouterr().out
    assert "WARNING: not a useful setting" in text and "980.9" in text


@pytest.mark.slow
def test_sp_at_paper_scale(capsys: pytest.CaptureFixture[str]) -> None:
    """3,220 stations, pis = 0.45: epsilon ≈ 7.9 (eq. 29) and sd = sqrt(Yes (1-pis)/pis)."""
    out = _plan_json(capsys, "sp", "--population", "47719", "--expected-yes", "300", "--stations", "3220")
    assert out["epsilon"] == pytest.approx(out["epsilon_closed_form"])
    assert 7.8 < out["epsilon"] < 8.0  # type: ignore[operator]
    assert out["sd"] == pytest.approx(math.sqrt(300 * 0.55 / 0.45))
    assert out["epsilon_linked_rounds"] is None  # infinite, written as JSON null
    assert any("never be linkable" in w for w in out["warnings"])  # type: ignore[union-attr]
    assert not any("not a useful" in w for w in out["warnings"])  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("mechanism,stations", [("alp", "3220"), ("rr", "3"), ("krr", "3220")])
def test_the_plan_prints_the_shuffled_figures_beside_the_local_ones(mechanism: str, stations: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's commands: per epoch at n = the population and per day, with the trust
    assumption; ALP's day at the papers' parameters is at most 2.5."""
    out = _plan_json(capsys, mechanism, "--population", "47719", "--expected-yes", "100", "--stations", stations)
    spec = E.get_spec(mechanism)
    mech = spec.build({}, int(stations))
    assert out["shuffle_size"] == 47719
    permuted = spec.shuffled_epsilon(mech, int(stations), 47719, 1e-6)
    assert out["release"] == "aggregate"  # the default: what the shuffler releases
    if spec.aggregate_plds(mech, int(stations), 1000) is None:  # no exact accounting: the clone bound
        assert out["epsilon_shuffled"] == pytest.approx(permuted)
        assert out["epsilon_day_shuffled"] == out["epsilon_day_shuffled_permuted"]
    else:
        assert out["epsilon_shuffled"] < 0.5 * permuted
        assert out["epsilon_day_shuffled"] < 0.5 * out["epsilon_day_shuffled_permuted"]  # type: ignore[operator]
    assert 0 < out["epsilon_shuffled"] < out["epsilon"]  # type: ignore[operator]
    assert 0 < out["epsilon_day_shuffled"] < out["epsilon_day"]  # type: ignore[operator]
    assert out["shuffle_trust"] == E.TRUST_ASSUMPTION
    if mechanism == "alp":
        assert out["epsilon_day_shuffled"] <= 2.5  # type: ignore[operator]
    # a smaller crowd (k-ary RR's exact histogram over 3,220 stations at 500 composes slowly: 5,000)
    crowd = "5000" if mechanism == "krr" else "500"
    small = _plan_json(capsys, mechanism, "--population", "47719", "--expected-yes", "100", "--stations", stations,
                       "--shuffle-size", crowd)
    assert small["shuffle_size"] == int(crowd) and small["epsilon_shuffled"] > out["epsilon_shuffled"]  # type: ignore[operator]
    assert main(["plan", mechanism, "--population", "47719", "--expected-yes", "100", "--shuffle-size", "0"]) == 2
    assert "--shuffle-size must be >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_params_override_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_json(capsys, "rr", "--population", "1000", "--expected-yes", "10",
                     "--param", "pi1=0.5", "--param", "pi2=0.5")
    assert out["params"] == {"pi1": 0.5, "pi2": 0.5}
    assert out["epsilon"] == pytest.approx(math.log(3.0))


@pytest.mark.parametrize("argv, message", [
    (["alp", "--param", "foo=1"], "unknown: foo"),
    (["rr", "--param", "pi1=1.5"], "pi1 must be a probability"),
    (["sp-binary", "--param", "pi0=0.6"], "pi0 + pis must be < 1"),
])
def test_bad_requests_are_clear_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", *argv, "--population", "100", "--expected-yes", "5"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_expected_yes_above_population_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "sp", "--population", "10", "--expected-yes", "50"]) == 2
    assert "--expected-yes" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_is_installed() -> None:
    exe = shutil.which("ptt", path=str(Path(sys.executable).parent))
    assert exe is not None, "the ptt console script is not installed next to the interpreter"
    done = subprocess.run([exe, "plan", "sp-binary", "--population", "1000", "--expected-yes", "50", "--json"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(done.stdout)["estimator"] == "sp_difference"
