"""``ptt plan --span`` and ``ptt plan fleet`` with spans: the span is checked before anything is
computed, a span plan's figures are the span's (its curator at the same span, P and budget),
and every query of a fleet is compared with a curator at exactly the budget it got.
Deterministic (no Monte Carlo)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from estimators import budget, planning
from stream_app.cli import main, plan_fleet
from stream_app.cli.errors import EXIT_USAGE


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["plan", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("computed before the span was checked")


@pytest.mark.parametrize(("argv", "why"), [
    (["krr", "--span", "3600"], "per-sensor"),
    (["sp", "--span", "300"], "per-sensor"),
    (["unary", "--span", "45"], "divides a day"),
    (["unary", "--span", "3600", "--max-passages", "121"], "max passages"),
    (["unary", "--span", "300", "--max-passages", "0"], "max passages"),
    (["fleet", "--span", "100"], "divides a day"),
])
def test_a_span_a_query_cannot_have_is_refused_before_anything_is_computed(
        argv: list[str], why: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning, "plan", _never)
    monkeypatch.setattr(plan_fleet, "fleet_plan", _never)
    code = main(["plan", *argv, "--population", "47719", "--expected-yes", "1800", "--stations", "3220",
                 "--day-budget", "2.5"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USAGE and why in err and len(err.splitlines()) == 1, err


def test_fleet_query_names_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "fleet", "--population", "899", "--expected-yes", "10", "--stations", "16"]
    for spec, why in (("unary@3600,krr@300", "per-sensor"), ("unary@3601", "divides a day"),
                      ("unary,unary", "twice"), ("unary@x", "MECH@SPAN")):
        assert main([*base, "--query-mechanisms", spec]) == EXIT_USAGE
        assert why in capsys.readouterr().err


@pytest.mark.slow
def test_an_hourly_plan_is_the_30s_plan_per_hour(capsys: pytest.CaptureFixture[str]) -> None:
    """At P = 120 (V >= 240) an hourly report's day composes what 120 epochs do, so a day budget
    chooses the same parameters and the hourly flow's sd is the 30-s count's; the curator is the
    same 138.2 (L2 sqrt 240, 24 releases). Without the span the sd of an hourly flow summed from
    30-s estimates would be sqrt(120) times larger."""
    argv = ["unary", "--release", "aggregate", "--population", "2000", "--expected-yes", "50", "--stations", "300",
            "--day-budget", "2.5"]
    hour = _json(capsys, *argv, "--span", "3600")
    assert hour["span_s"] == 3600 and hour["max_passages"] == 120 and hour["releases"] == 24
    assert hour["epsilon_day_vehicle"] <= 2.5
    assert hour["central_limit_sd"] == pytest.approx(
        budget.central_limit_sd(2.5, 1e-6, 2880, span_s=3600, passages=120, n_stations=300), rel=1e-12)
    assert hour["central_limit_sd"] == pytest.approx(138.16, abs=0.01)
    assert hour["central_limit_sd"] <= hour["sd"] <= 1.1 * hour["central_limit_sd"]
    thirty = _json(capsys, *argv)
    assert thirty["span_s"] == 30 and thirty["max_passages"] == 1
    assert hour["params"] == thirty["params"] and hour["sd"] == thirty["sd"]
    assert hour["epsilon_day_vehicle"] == pytest.approx(thirty["epsilon_day_vehicle"], abs=1e-9)


@pytest.mark.slow
def test_a_passage_cap_lowers_the_curators_limit_and_the_plans_sd(capsys: pytest.CaptureFixture[str]) -> None:
    """P = 20 an hour: L2 sqrt 40 instead of sqrt 240, so both sds drop by about sqrt 6."""
    argv = ["unary", "--release", "aggregate", "--population", "2000", "--expected-yes", "50", "--stations", "300",
            "--day-budget", "2.5", "--span", "3600"]
    capped = _json(capsys, *argv, "--max-passages", "20")
    assert capped["max_passages"] == 20 and capped["epsilon_day_vehicle"] <= 2.5
    assert capped["central_limit_sd"] == pytest.approx(138.16 / math.sqrt(6), rel=1e-3)
    assert capped["central_limit_sd"] <= capped["sd"] <= 1.1 * capped["central_limit_sd"]


@pytest.mark.slow
def test_a_fleet_is_compared_with_curators_at_the_budget_each_query_got(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33's bar: no query's sd below its curator's. Without a day budget each query's
    curator is at that query's own day (computed at a share of it, ALP's sd 133.8 read as better
    than a curator's 178.3: this fails). With a day budget each curator is at the query's share
    (budget_share), and unary RR, within a few % of its curator, stays within 1.15 of it (a curator
    at the whole budget instead of the share is 1.4 times below: this fails)."""
    base = ["fleet", "--population", "899", "--expected-yes", "10", "--stations", "16"]
    free = _json(capsys, *base)
    for name, q in free["queries"].items():
        assert q["sd"] >= q["central_limit_sd"], (name, q["sd"], q["central_limit_sd"])
        assert q["curator_budget"] == q["epsilon_day_shuffled"]
    split = _json(capsys, *base, "--day-budget", "2.5", "--query-mechanisms", "alp,unary,unary@3600")
    assert split["epsilon_day_vehicle"] <= 2.5
    for name, q in split["queries"].items():
        assert q["fits"] and q["curator_budget"] == q["budget_share"] < 2.5
        assert q["epsilon_day_shuffled"] <= q["budget_share"] + 1e-9
        assert q["central_limit_sd"] == pytest.approx(budget.central_limit_sd(
            q["budget_share"], 1e-6, 2880, span_s=q["span_s"], passages=q["max_passages"], n_stations=16), rel=1e-12)
        assert q["sd"] >= q["central_limit_sd"], (name, q["sd"], q["central_limit_sd"])
        if q["mechanism"] == "unary":
            assert q["sd"] <= 1.15 * q["central_limit_sd"], (name, q["sd"], q["central_limit_sd"])
    hourly, live = split["queries"]["unary@3600"], split["queries"]["unary"]
    assert hourly["span_s"] == 3600 and hourly["max_passages"] == 16  # P capped at the 16 stations
    assert hourly["sd"] < live["sd"] * math.sqrt(120) / 5  # an hourly flow, against 120 summed 30-s counts
