"""The mechanism registry: every layer asks it, so it must hold every mechanism completely.

Deterministic checks (no statistics): layouts, widths, accumulate/complete against a per-pair
tally written out in the test, clear errors for unknown names, and that no layer outside the
registry compares or holds a mechanism's name.
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
from scipy.stats import norm

import estimators as E
from estimators.registry import REGISTRY, SpecError, UnknownMechanism, get_spec, mechanism_names
from estimators.reports import round_from_arrays
from tests.paths import ROOT


def test_unknown_mechanism_is_a_clear_error_never_a_default() -> None:
    with pytest.raises(UnknownMechanism, match=r"unknown mechanism 'nope'; choose one of sp, sp-binary, alp"):
        get_spec("nope")
    with pytest.raises(E.PlanError, match="unknown mechanism"):
        E.build_mechanism("nope", {}, 3)


@pytest.mark.parametrize("name", mechanism_names())
def test_every_spec_is_complete(name: str) -> None:
    spec = get_spec(name)
    v = spec.max_stations or 4
    mech = spec.build({}, v)
    assert mech.n_rounds == spec.n_rounds
    ests = spec.estimators(mech)
    assert tuple(ests) == spec.estimator_names and spec.headline in ests
    assert spec.width(mech, v) == (v * mech.n_outputs if spec.per_sensor else v + 1)
    assert spec.layout == ("pairs" if spec.per_sensor else "values")
    eps = spec.report_epsilon(mech, v)
    assert eps >= spec.answer_epsilon(mech) - 1e-12  # the whole report never leaks less than one answer
    assert set(spec.extra_statistics(mech, 1000)) == set(spec.extra_names)


def test_unknown_parameter_names_the_allowed_ones() -> None:
    with pytest.raises(E.PlanError, match=r"alp takes parameters .*pisNo.*; unknown: pisno"):
        get_spec("alp").build({"pisno": 0.1}, 3)


@pytest.mark.parametrize("name", [n for n in mechanism_names() if get_spec(n).per_sensor])
def test_per_sensor_accumulate_and_complete_equal_the_core(name: str) -> None:
    """Per-vehicle pairs summed by accumulate() and completed with the participants equal a
    per-pair tally written out here: one count per (station, report) pair the devices sent,
    and every vehicle that sent no pair for a station counted at that round's default report
    (the product has this one path; nothing else in the code turns pairs into counts)."""
    spec = get_spec(name)
    v, n = 5, 400
    mech = spec.build({}, v)
    rng = np.random.default_rng(11)
    truths = rng.integers(0, v + 1, size=n)
    counts = np.zeros((spec.n_rounds, spec.width(mech, v)), dtype=np.int64)
    want = np.zeros((v, spec.n_rounds, mech.n_outputs), dtype=np.int64)
    for r, ps in enumerate(spec.per_station(mech, v)):
        pairs = ps.sample_sparse(rng, truths)
        counts[r] = spec.accumulate(mech, v, E.Pairs(pairs.station, pairs.output))
        for station, output in zip(pairs.station.tolist(), pairs.output.tolist(), strict=True):
            want[station - 1, r, output] += 1
        silent = n - want[:, r, :].sum(axis=1)  # vehicles that sent no pair for the station
        want[:, r, int(np.argmax(ps.mechanism.output_table(0)[0]))] += silent
    assert counts.sum() > 0 and np.all(want.sum(axis=2) == n)
    np.testing.assert_array_equal(spec.complete(mech, v, counts, n), want)


@pytest.mark.parametrize("name", mechanism_names())
def test_tally_rows_must_sum_to_the_vehicles(name: str) -> None:
    spec = get_spec(name)
    v = spec.max_stations or 3
    mech = spec.build({}, v)
    width = spec.width(mech, v)
    good = np.zeros(width, dtype=np.int64)
    rows = good.reshape(v if spec.per_sensor else 1, mech.n_outputs)
    rows[:, 0] = 10
    assert spec.accumulate(mech, v, E.Counts(good, 10)).sum() == rows.size // mech.n_outputs * 10
    with pytest.raises(SpecError, match="sum to the 11 vehicles"):
        spec.accumulate(mech, v, E.Counts(good, 11))
    other = "pairs" if not spec.per_sensor else "values"
    with pytest.raises(SpecError, match=f"wrong_layout: {other} for a {name} query"):
        spec.accumulate(mech, v, E.Pairs(np.ones(1, dtype=np.int64), np.ones(1, dtype=np.int64))
                        if not spec.per_sensor else E.Values(np.zeros(1, dtype=np.int64)))


def test_pairs_carrying_the_default_report_are_refused() -> None:
    spec = get_spec("alp")
    mech = spec.build({}, 3)
    d = spec.default_report(mech)
    assert d == E.ALP_BOTTOM
    with pytest.raises(SpecError, match="non-default"):
        spec.accumulate(mech, 3, E.Pairs(np.array([1]), np.array([d])))


def test_fresh_sample_rounds_are_independent_per_sensor_mechanisms() -> None:
    spec = get_spec("fresh")
    mech = spec.build({}, 3)
    rounds = spec.round_mechanisms(mech)
    assert len(rounds) == 2
    for r, m in enumerate(rounds):
        np.testing.assert_allclose(m.output_table(0), mech.output_table(r))


def test_the_estimate_schema_and_query_schema_enumerate_the_registry() -> None:
    from schemas import Query
    from schemas.estimates import Estimate

    assert Query.model_json_schema()["properties"]["mechanism"]["enum"] == list(mechanism_names(queryable_only=True))
    est = Estimate.model_json_schema()["properties"]
    assert est["estimator"]["enum"] == list(E.all_estimator_names())
    assert set(E.all_estimator_names()) == {n for s in REGISTRY.values() for n in s.estimator_names}


def test_no_layer_compares_a_mechanism_name() -> None:
    """The registry is the only place that knows mechanisms by name."""
    pattern = re.compile(r"(mechanism\w*(\[[^\]]*\])?|\.name)\s*(==|!=|\bin\b)\s*\(?"
                         r"""["'](sp|alp|rr|fresh|sp-binary|krr)["']""")
    offenders = []
    for pkg in ("estimators", "producers", "stream_app", "schemas", "deploy"):
        for path in (ROOT / pkg).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


def test_no_layer_names_a_mechanism() -> None:
    """Outside the statistics core, no code holds a registered mechanism's name as a string
    (a hard-coded list of mechanisms, a comparison, a dashboard selector): every layer asks the
    registry. Docstrings name them freely (a string constant that is a whole name is code)."""
    names = set(mechanism_names())
    offenders = []
    for pkg in ("producers", "stream_app", "schemas", "deploy"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert offenders == []


@pytest.mark.parametrize("name", ["rr", "alp", "sp", "fresh", "krr"])
def test_consistency_check_equals_a_grid_search(name: str) -> None:
    """``consistent`` (closed-form minimum of a convex function) agrees with a brute-force
    search over every admissible count Y in [0, N]."""
    spec = get_spec(name)
    mech = spec.build({}, 3)
    est = spec.estimators(mech, stations=np.array([1]))[spec.headline]
    n = 400
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.uniform(-300, 700, 300), [0.0, n, -1e4, 1e4]])
    got = est.consistent(values, n, 0.999)
    alpha, beta = est.variance_coefficients(n)
    k = float(norm.ppf(0.9995) ** 2)
    ys = np.linspace(0, n, 40_001)
    slack = est.lattice_step[0] / 2
    gap = np.maximum(np.abs(values[:, None] - ys[None, :]) - slack, 0.0)
    want = (gap**2 <= k * np.maximum(alpha[0] + beta[0] * ys[None, :], 0.0) + 1e-6).any(axis=1)
    assert np.array_equal(got, want)
    assert not want.all() and want.any()  # both outcomes occur


def test_a_round_is_counted_by_its_type() -> None:
    """``accumulate`` takes a typed round: a bitmap round counts as its set bits' pairs (station, 1),
    pairs as they are; a record's arrays become their round by its layout (``round_from_arrays``)."""
    spec = get_spec("unary")
    mech = spec.build({}, 10)
    bits = np.random.default_rng(3).random((20, 10)) < 0.3
    rows = E.Bitmaps(np.packbits(bits, axis=1, bitorder="little"), int(bits.sum()))
    pairs = rows.sparse(np.arange(20), 10)
    as_pairs = spec.accumulate(mech, 10, E.Pairs(pairs.station, pairs.output))
    np.testing.assert_array_equal(spec.accumulate(mech, 10, rows), as_pairs)
    np.testing.assert_array_equal(as_pairs.reshape(10, 2)[:, 1], bits.sum(axis=0))
    wire = E.Pairs(pairs.station, pairs.output).arrays()
    np.testing.assert_array_equal(spec.accumulate(mech, 10, round_from_arrays("pairs", wire, 0)), as_pairs)
    with pytest.raises(SpecError, match="wrong_layout: pairs for a sp query"):
        get_spec("sp").accumulate(get_spec("sp").build({}, 10), 10, rows)
