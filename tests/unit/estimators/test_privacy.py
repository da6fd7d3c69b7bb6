"""Privacy accounting: brute-force epsilon, the papers' closed forms, amplification,
composition, Haystack crowd sizes and the device-side query audit.

The brute force in this module (:func:`brute_epsilon`) is the definition typed in again:
``max over outputs o and ordered truth pairs (t, t') of ln(P(o|t) / P(o|t'))``, with an
output possible under one truth and impossible under another giving infinity. The output
tables themselves are checked against the papers in ``tests/unit/estimators/test_mechanisms.py``.

Documented differences between the papers' closed forms and the brute force (asserted
below, with numbers):

* Differential Privacy by Sampling eq. 30 (randomized response) takes only the "Yes" report. For ``pi2 <= 1/2``
  that is the maximum (pi1=0.8, pi2=0.2: both ln 21 = 3.0445); for ``pi2 > 1/2`` the "No"
  report leaks more: pi1=0.8, pi2=0.8 prints ln 6 = 1.7918, the brute force is
  ln 21 = 3.0445.
* Anonymized Local Privacy eqs. 8-11 (Anonymized Local Privacy) take the "Yes" report in the Yes/No
  direction and the "No" report in the No/Yes direction only. With the paper's parameters
  the printed value is ln(0.0965/0.049) = 0.6777 while the "No" report in the Yes/No
  direction gives ln(0.0035/0.001) = ln 3.5 = 1.2528 (the brute force). At the smaller
  ``pisNo`` of the paper's Table II: 5.9760 vs ln 700 = 6.5511 (pisNo = 0.00025) and
  8.2786 vs ln 7000 = 8.8537 (pisNo = 0.000025).
* Differential Privacy by Sampling eq. 29 must be maximized over ALL truths including 0 ("at no monitored
  station"); the paper's "V' in 1..V" misses the leak of output 0 when pi_0 is the
  smallest face.
* On Sampling, Anonymization, and Differential Privacy, Theorem 1 (amplification by
  sampling), is about add/remove-one neighbouring datasets where a record that is not
  sampled leaves no trace. For a local report where the non-sampled owner is *visible* (it
  sends ⊥) and neighbours differ in one owner's value (replace-one, the local-DP question),
  the sampling coin cancels and the epsilon is NOT amplified.

Monte Carlo: only the crowd-size check, crowds made by the project's ALP samplers (fixed
seed; per-assertion false-failure rate <= 5.7e-7 for a correct implementation, 5 sigma;
< 1e-5 for the module).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from scipy import special, stats

import estimators as E
from tests.station_counts import pair_counts

REL = 1e-12


# ---------------------------------------------------------------------------------------
# The brute force, written out independently of estimators.privacy
# ---------------------------------------------------------------------------------------
def brute_epsilon(table: np.ndarray) -> float:
    """max over outputs and ordered truth pairs of ln(P(o|t)/P(o|t')), pair by pair."""
    tab = np.asarray(table, dtype=float)
    best = 0.0
    for o in range(tab.shape[1]):
        col = tab[:, o]
        for p in col:
            for q in col:
                if p > 0 and q == 0:
                    return math.inf
                if p > 0:
                    best = max(best, math.log(p / q))
    return best


def brute_epsilon_columns(table: np.ndarray) -> float:
    """Same quantity for tables too large for the pairwise loop: for a fixed output the
    largest ratio over ordered pairs is max(column) / min(column)."""
    tab = np.asarray(table, dtype=float)
    hi, lo = tab.max(axis=0), tab.min(axis=0)
    used = hi > 0
    if np.any(lo[used] == 0):
        return math.inf
    return float(max(math.log(h) - math.log(low) for h, low in zip(hi[used], lo[used], strict=True)))


def test_the_two_brute_forces_agree() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        tab = rng.dirichlet(np.ones(5), size=6)
        assert brute_epsilon(tab) == pytest.approx(brute_epsilon_columns(tab), rel=REL)
    tab[2, 3] = 0.0
    assert brute_epsilon(tab) == brute_epsilon_columns(tab) == math.inf


# ---------------------------------------------------------------------------------------
# local_epsilon on hand-made tables
# ---------------------------------------------------------------------------------------
HAND_MADE = [
    ("ln 2", [[0.5, 0.5], [0.25, 0.75]], math.log(2)),
    ("identical rows", [[0.2, 0.3, 0.5], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]], 0.0),
    ("one row", [[0.1, 0.9]], 0.0),
    ("possible under one truth only", [[1.0, 0.0], [0.5, 0.5]], math.inf),
    ("possible under one truth of three", [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.4, 0.4, 0.2]], math.inf),
    ("impossible under every truth is ignored", [[0.5, 0.5, 0.0], [0.4, 0.6, 0.0]], math.log(1.25)),
    ("max over all pairs, not adjacent rows", [[0.3, 0.7], [0.2, 0.8], [0.1, 0.9]], math.log(3)),
    ("reverse direction", [[0.9, 0.1], [0.6, 0.4]], math.log(4)),
    ("epsilon-RR ln 3", [[0.75, 0.25], [0.25, 0.75]], math.log(3)),
]


@pytest.mark.parametrize(("what", "table", "expected"), HAND_MADE, ids=[h[0] for h in HAND_MADE])
def test_local_epsilon_hand_made(what: str, table: list[list[float]], expected: float) -> None:
    tab = np.array(table)
    got = E.local_epsilon(tab)
    assert brute_epsilon(tab) == pytest.approx(expected, rel=REL, abs=0)
    if math.isinf(expected):
        assert got == math.inf
    else:
        assert got == pytest.approx(expected, rel=REL, abs=1e-15)


def test_local_epsilon_chunking_gives_the_same_answer() -> None:
    rng = np.random.default_rng(11)
    tab = rng.dirichlet(np.full(6, 3.0), size=1500)
    expected = brute_epsilon_columns(tab)
    for chunk in (1, 7, 512, 1499, 1500, 5000):
        assert E.local_epsilon(tab, chunk=chunk) == pytest.approx(expected, rel=REL)
    # the extreme rows of a column in different chunks
    tab2 = np.full((1200, 2), 0.5)
    tab2[3] = [0.2, 0.8]
    tab2[1190] = [0.9, 0.1]
    for chunk in (1, 64, 512, 2000):
        assert E.local_epsilon(tab2, chunk=chunk) == pytest.approx(math.log(8), rel=REL)
    # a zero in the last chunk only
    tab[1450, 2] = 0.0
    tab[1450] /= tab[1450].sum()
    for chunk in (1, 7, 512, 5000):
        assert E.local_epsilon(tab, chunk=chunk) == math.inf


def test_local_epsilon_rejects_non_tables() -> None:
    with pytest.raises(ValueError, match="2-d"):
        E.local_epsilon(np.array([0.5, 0.5]))


@pytest.mark.parametrize("table", [[[math.nan, 1.0], [0.5, 0.5]], [[math.nan, math.nan], [0.5, 0.5]]],
                         ids=["one nan cell", "nan row"])
def test_local_epsilon_does_not_fail_open_on_nan(table: list[list[float]]) -> None:
    """A NaN cell makes the epsilon unknown; reporting a finite number (ln 2, even 0 for a
    NaN row) would under-state the leak. Either refusing the table (ValueError) or
    returning NaN/inf is acceptable."""
    try:
        got = E.local_epsilon(np.array(table))
    except ValueError:
        return
    assert not math.isfinite(got)


# ---------------------------------------------------------------------------------------
# mechanism_epsilon for every mechanism
# ---------------------------------------------------------------------------------------
def _sp_nonuniform() -> E.Mechanism:
    return E.sampling_privacy(4, 0.4, [0.02, 0.3, 0.05, 0.13, 0.1])


MECHANISMS: dict[str, Callable[[], E.Mechanism]] = {
    "rr-paper": lambda: E.two_coin_rr(0.8, 0.2),
    "rr-pi2-high": lambda: E.two_coin_rr(0.8, 0.8),
    "rr-pi2-zero": lambda: E.two_coin_rr(0.8, 0.0),
    "rr-pi1-zero": lambda: E.two_coin_rr(0.0, 0.3),
    "eps_rr": lambda: E.epsilon_rr(1.1),
    "kary": lambda: E.kary_rr(6, 2.0),
    "sp_binary-default": lambda: E.sp_binary(),
    "sp_binary-0.1-0.6": lambda: E.sp_binary(0.1, 0.6),
    "sp-uniform-V5": lambda: E.sampling_privacy(5, 0.45),
    "sp-nonuniform-V4": _sp_nonuniform,
    "fresh-default": lambda: E.fresh_sample(),
    "fresh-crossing": lambda: E.fresh_sample(0.3, 0.1, 0.2, 0.4),
    "alp_noise": lambda: E.alp_sampling_noise(0.05, 0.05),
    "alp_pd": lambda: E.alp_plausible_deniability(),
    "alp-paper": lambda: E.alp_optimal(),
    "alp-other": lambda: E.alp_optimal(0.3, 0.2, 0.7, 0.1, 0.4, 0.5),
}


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_mechanism_epsilon_equals_brute_force(name: str) -> None:
    m = MECHANISMS[name]()
    me = E.mechanism_epsilon(m)
    per_round = [brute_epsilon(m.output_table(r)) for r in range(m.n_rounds)]
    assert len(me.per_round) == m.n_rounds
    for got, want in zip(me.per_round, per_round, strict=True):
        assert got == pytest.approx(want, rel=REL, abs=1e-12)
    assert me.epsilon == pytest.approx(max(per_round), rel=REL, abs=1e-12)
    linked = brute_epsilon(m.joint_table())
    assert me.epsilon_linked == pytest.approx(linked, rel=REL, abs=1e-12)
    assert E.linked_epsilon(m) == pytest.approx(linked, rel=REL, abs=1e-12)
    if m.n_rounds == 1:
        assert me.epsilon_linked == me.epsilon


def test_known_epsilons() -> None:
    assert E.mechanism_epsilon(E.two_coin_rr(0.8, 0.2)).epsilon == pytest.approx(math.log(21), rel=REL)
    for eps in (0.0, 0.3, 1.0, 5.0):
        assert E.mechanism_epsilon(E.epsilon_rr(eps)).epsilon == pytest.approx(eps, rel=REL, abs=1e-12)
        assert E.mechanism_epsilon(E.kary_rr(11, eps)).epsilon == pytest.approx(eps, rel=REL, abs=1e-12)
    # ALP toy of eq. 2: Yes owners never say "No" -> infinite
    assert E.mechanism_epsilon(E.alp_sampling_noise()).epsilon == math.inf
    assert E.mechanism_epsilon(E.two_coin_rr(0.8, 0.0)).epsilon == math.inf
    assert E.mechanism_epsilon(E.two_coin_rr(0.0, 0.3)).epsilon == 0.0


# ---------------------------------------------------------------------------------------
# Linked rounds: the Sampling Privacy invariant, the fresh-sample variant
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sp_binary-default", "sp_binary-0.1-0.6", "sp-uniform-V5", "sp-nonuniform-V4"])
def test_sampling_privacy_linked_rounds_are_infinite(name: str) -> None:
    """PRIVACY INVARIANT (Differential Privacy by Sampling §4.2): a (round 1, round 2) pair 0 -> V' happens only for
    the sampled face, so linked rounds reveal the truth. Rounds must never be linkable."""
    m = MECHANISMS[name]()
    me = E.mechanism_epsilon(m)
    assert me.per_round[0] == 0.0  # round 1 is truth-independent
    assert math.isfinite(me.per_round[1]) and me.per_round[1] > 0
    assert me.epsilon == me.per_round[1]
    assert me.epsilon_linked == math.inf
    assert brute_epsilon(m.joint_table()) == math.inf


@pytest.mark.parametrize("name", ["fresh-default", "fresh-crossing"])
def test_fresh_sample_linked_epsilon(name: str) -> None:
    m = MECHANISMS[name]()
    me = E.mechanism_epsilon(m)
    joint = brute_epsilon(m.joint_table())
    assert me.epsilon_linked == pytest.approx(joint, rel=REL, abs=1e-12)
    # independent coins: the joint likelihood ratio is the product of the rounds' ratios
    assert me.epsilon_linked <= sum(me.per_round) + 1e-12
    assert me.epsilon_linked >= me.epsilon - 1e-12
    t1, t2 = m.output_table(0), m.output_table(1)
    by_hand = max(abs(math.log(t1[1, a] / t1[0, a]) + math.log(t2[1, b] / t2[0, b]))
                  for a in range(2) for b in range(2))
    assert me.epsilon_linked == pytest.approx(by_hand, rel=REL, abs=1e-12)


def test_fresh_sample_linked_can_be_below_the_per_round_sum() -> None:
    # round 1 leaks towards "Yes" on report 1, round 2 towards "No" on report 1: the worst
    # pair of reports cannot hit both maxima at once
    me = E.mechanism_epsilon(E.fresh_sample(0.3, 0.1, 0.2, 0.4))
    assert me.epsilon_linked < sum(me.per_round) - 0.1


# ---------------------------------------------------------------------------------------
# Closed forms vs brute force
# ---------------------------------------------------------------------------------------
SP_BINARY_GRID = [(pi0, pis) for pi0 in (0.01, 0.1, 0.275, 0.5, 0.8)
                  for pis in (0.05, 0.25, 0.45, 0.7) if pi0 + pis < 1]


@pytest.mark.parametrize(("pi0", "pis"), SP_BINARY_GRID)
def test_sp_binary_closed_form_eqs_21_25_equal_brute_force(pi0: float, pis: float) -> None:
    m = E.sp_binary(pi0, pis)
    brute = brute_epsilon(m.output_table(1))
    assert E.sp_binary_epsilon_closed_form(pi0, pis) == pytest.approx(brute, rel=REL)
    assert brute == pytest.approx(max(math.log((pi0 + pis) / pi0), math.log((1 - pi0) / (1 - pi0 - pis))), rel=REL)
    assert brute_epsilon(m.output_table(0)) == 0.0


def _sp_grid() -> list[tuple[str, list[float], float]]:
    rng = np.random.default_rng(29)
    out: list[tuple[str, list[float], float]] = []
    for v in (1, 2, 10, 60):
        for pis in (0.1, 0.45, 0.8):
            out.append((f"uniform-V{v}-{pis}", [(1 - pis) / (v + 1)] * (v + 1), pis))
    for v in (1, 3, 8, 40):
        for pis in (0.25, 0.45):
            pi = rng.dirichlet(np.full(v + 1, 0.7)) * (1 - pis)
            pi = np.maximum(pi, 1e-6)
            pi *= (1 - pis) / pi.sum()
            out.append((f"dirichlet-V{v}-{pis}", pi.tolist(), pis))
    return out


SP_GRID = _sp_grid()


@pytest.mark.parametrize(("what", "pi", "pis"), SP_GRID, ids=[g[0] for g in SP_GRID])
def test_sp_closed_form_eq_29_equals_brute_force(what: str, pi: list[float], pis: float) -> None:
    m = E.sampling_privacy(len(pi) - 1, pis, pi)
    brute = brute_epsilon_columns(m.output_table(1))
    assert E.sp_epsilon_closed_form(pi, pis) == pytest.approx(brute, rel=REL)
    assert E.mechanism_epsilon(m).epsilon == pytest.approx(brute, rel=REL)


def test_sp_closed_form_must_include_truth_zero() -> None:
    """Eq. 29 over V' in 1..V only (the paper's wording) misses output 0 when pi_0 is the
    smallest face: here ln((0.02 + 0.4)/0.02) = ln 21 = 3.0445 vs ln(0.45/0.05) = ln 9."""
    pi, pis = [0.02, 0.3, 0.05, 0.13, 0.1], 0.4
    brute = brute_epsilon(_sp_nonuniform().output_table(1))
    assert brute == pytest.approx(math.log(21), rel=REL)
    assert E.sp_epsilon_closed_form(pi, pis) == pytest.approx(brute, rel=REL)
    stations_only = max(math.log((p + pis) / p) for p in pi[1:])
    assert stations_only == pytest.approx(math.log(9), rel=REL)
    assert stations_only < brute


@pytest.fixture(scope="module")
def sp_3220() -> E.Mechanism:
    return E.sampling_privacy(3220, 0.45)


def test_sp_closed_form_paper_scale_3220_stations(sp_3220: E.Mechanism) -> None:
    """3,220 PeMS stations (Anonymized Local Privacy §VII-A), pis = 0.45, uniform pi_v = 0.55/3221:
    epsilon = ln(1 + 0.45 * 3221 / 0.55) = 7.877 ("about 7.9" in the reference)."""
    pi_v = 0.55 / 3221
    expected = math.log((pi_v + 0.45) / pi_v)
    brute = brute_epsilon_columns(sp_3220.output_table(1))
    assert brute == pytest.approx(expected, rel=REL)
    assert E.sp_epsilon_closed_form([pi_v] * 3221, 0.45) == pytest.approx(brute, rel=REL)
    assert round(brute, 1) == 7.9
    assert brute == pytest.approx(7.8772, abs=1e-4)


@pytest.mark.slow
def test_sp_3220_stations_linked_rounds_infinite_without_the_dense_table(sp_3220: E.Mechanism) -> None:
    with pytest.raises(ValueError, match="too large"):
        sp_3220.joint_table()
    me = E.mechanism_epsilon(sp_3220)
    assert me.per_round[0] == 0.0
    assert me.epsilon == pytest.approx(7.8772, abs=1e-4)
    assert me.epsilon_linked == math.inf


RR_LOW = [(pi1, pi2) for pi1 in (0.05, 0.3, 0.5, 0.8, 0.95) for pi2 in (0.01, 0.2, 0.35, 0.5)]


@pytest.mark.parametrize(("pi1", "pi2"), RR_LOW)
def test_rr_closed_form_eq_30_equals_brute_force_for_pi2_at_most_half(pi1: float, pi2: float) -> None:
    brute = brute_epsilon(E.two_coin_rr(pi1, pi2).output_table())
    assert E.rr_epsilon_closed_form(pi1, pi2) == pytest.approx(brute, rel=REL)


def test_rr_closed_form_paper_parameters_ln_21() -> None:
    brute = brute_epsilon(E.two_coin_rr(0.8, 0.2).output_table())
    assert brute == pytest.approx(math.log(21), rel=REL)
    assert E.rr_epsilon_closed_form(0.8, 0.2) == pytest.approx(math.log(21), rel=REL)


RR_HIGH = [(pi1, pi2) for pi1 in (0.05, 0.3, 0.8, 0.95) for pi2 in (0.51, 0.65, 0.8, 0.99)]


@pytest.mark.parametrize(("pi1", "pi2"), RR_HIGH)
def test_rr_closed_form_eq_30_is_smaller_for_pi2_above_half(pi1: float, pi2: float) -> None:
    """Documented difference: eq. 30 takes the "Yes" report only; for pi2 > 1/2 the "No"
    report's ratio (1 - (1-pi1) pi2) / ((1-pi1)(1-pi2)) is larger."""
    brute = brute_epsilon(E.two_coin_rr(pi1, pi2).output_table())
    no_report = math.log((1 - (1 - pi1) * pi2) / ((1 - pi1) * (1 - pi2)))
    assert brute == pytest.approx(no_report, rel=REL)
    assert E.rr_epsilon_closed_form(pi1, pi2) < brute


def test_rr_closed_form_pi2_08_prints_ln_6_brute_force_ln_21() -> None:
    assert E.rr_epsilon_closed_form(0.8, 0.8) == pytest.approx(math.log(6), rel=REL)
    assert E.mechanism_epsilon(E.two_coin_rr(0.8, 0.8)).epsilon == pytest.approx(math.log(21), rel=REL)


ALP_PAPER = (0.05, 0.05, 0.95, 0.98, 0.05, 0.98)


def test_alp_closed_form_paper_parameters() -> None:
    """Seed 004 §VII-A parameters: eq. 11 prints ln(0.0965/0.049) = 0.6777; the brute force
    is ln 3.5 = 1.2528 from the "No" report (0.0035 under Yes vs 0.001 under No), a
    direction eq. 8 does not take; ⊥ gives only ln(0.95/0.9) = 0.054."""
    closed = E.alp_epsilon_closed_form(*ALP_PAPER)
    assert closed == pytest.approx(math.log(0.0965 / 0.049), rel=REL)
    assert closed == pytest.approx(0.678, abs=5e-4)
    brute = brute_epsilon(E.alp_optimal(*ALP_PAPER).output_table())
    assert brute == pytest.approx(math.log(3.5), rel=REL)
    assert brute == pytest.approx(1.2528, abs=1e-4)
    assert E.mechanism_epsilon(E.alp_optimal(*ALP_PAPER)).epsilon == pytest.approx(brute, rel=REL)


@pytest.mark.parametrize(("pis_no", "closed", "brute"), [
    (0.00025, math.log(0.0965 / 0.000245), math.log(700)),
    (0.000025, math.log(0.0965 / 0.0000245), math.log(7000)),
])
def test_alp_closed_form_table_ii_sampling_rates(pis_no: float, closed: float, brute: float) -> None:
    args = (0.05, 0.05, 0.95, 0.98, pis_no, 0.98)
    assert E.alp_epsilon_closed_form(*args) == pytest.approx(closed, rel=1e-9)
    assert brute_epsilon(E.alp_optimal(*args).output_table()) == pytest.approx(brute, rel=1e-9)


@pytest.mark.parametrize("args", [
    (0.05, 0.05, 0.95, 0.98, 0.05, 0.5),  # the "No" report in the No/Yes direction (eq. 10) is the max
    (0.05, 0.05, 0.95, 0.98, 0.01, 0.8),  # the "Yes" report in the Yes/No direction (eq. 9) is the max
    (0.3, 0.2, 0.9, 0.9, 0.1, 0.9),
])
def test_alp_closed_form_agrees_when_eq_8_takes_the_worst_report(args: tuple[float, ...]) -> None:
    assert E.alp_epsilon_closed_form(*args) == pytest.approx(brute_epsilon(E.alp_optimal(*args).output_table()),
                                                             rel=1e-9)


def test_alp_closed_form_is_never_above_brute_force_and_agrees_exactly_when_expected() -> None:
    """Eq. 11 is the max of two of the six directed log ratios, so it is <= the brute force,
    with equality exactly when one of those two is the largest."""
    agree = disagree = 0
    for y1 in (0.02, 0.05, 0.3):
        for y2 in (0.02, 0.05, 0.2):
            for pi1 in (0.6, 0.95):
                for pi2 in (0.3, 0.98):
                    for n in (0.00025, 0.01, 0.05, 0.4):
                        for pi3 in (0.2, 0.5, 0.98):
                            args = (y1, y2, pi1, pi2, n, pi3)
                            tab = E.alp_optimal(*args).output_table()
                            brute = brute_epsilon(tab)
                            closed = E.alp_epsilon_closed_form(*args)
                            assert closed <= brute + 1e-12
                            no, yes = tab
                            eq9 = math.log(yes[E.ALP_YES] / no[E.ALP_YES])
                            eq10 = math.log(no[E.ALP_NO] / yes[E.ALP_NO])
                            if max(eq9, eq10) >= brute - 1e-12:
                                assert closed == pytest.approx(brute, rel=1e-9)
                                agree += 1
                            else:
                                assert closed < brute
                                disagree += 1
    assert agree > 0 and disagree > 0


# Boundary parameters that the constructors accept and where the brute force is infinite.
# The closed forms divide by zero there (ZeroDivisionError), which also crashes
# ``estimators.planning.plan`` for e.g. ``rr --pi2 0``.
BOUNDARY: list[tuple[str, Callable[[], float], Callable[[], E.Mechanism]]] = [
    ("rr pi2=0 (eq. 30 denominator 0)", lambda: E.rr_epsilon_closed_form(0.8, 0.0), lambda: E.two_coin_rr(0.8, 0.0)),
    ("rr pi1=1 (eq. 30 denominator 0)", lambda: E.rr_epsilon_closed_form(1.0, 0.2), lambda: E.two_coin_rr(1.0, 0.2)),
    ("alp pisNo=0 (eq. 9 denominator 0)", lambda: E.alp_epsilon_closed_form(0.05, 0.05, 0.95, 0.98, 0.0, 0.98),
     lambda: E.alp_optimal(pisNo=0.0)),
]


@pytest.mark.parametrize(("what", "closed", "mech"), BOUNDARY, ids=[b[0] for b in BOUNDARY])
def test_closed_forms_return_infinity_at_the_boundary(what: str, closed: Callable[[], float],
                                                      mech: Callable[[], E.Mechanism]) -> None:
    assert brute_epsilon(mech().output_table()) == math.inf
    assert closed() == math.inf


# ---------------------------------------------------------------------------------------
# Amplification by sampling (On Sampling, Anonymization, and Differential Privacy Theorem 1)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [0.0, 0.1, 1.0, math.log(21), 7.9])
@pytest.mark.parametrize("beta", [0.0, 0.01, 0.05, 0.5, 1.0])
def test_amplified_epsilon_formula(eps: float, beta: float) -> None:
    expected = math.log(1 + beta * (math.exp(eps) - 1))
    assert E.amplified_epsilon(eps, beta) == pytest.approx(expected, rel=REL, abs=1e-15)
    assert E.amplified_epsilon(eps, beta) <= eps + 1e-15


def test_amplified_epsilon_edges() -> None:
    assert E.amplified_epsilon(2.0, 1.0) == pytest.approx(2.0, rel=REL)
    assert E.amplified_epsilon(2.0, 0.0) == 0.0
    assert E.amplified_epsilon(math.inf, 0.3) == math.inf
    assert E.amplified_epsilon(math.inf, 0.0) == 0.0
    betas = np.linspace(0, 1, 21)
    vals = [E.amplified_epsilon(1.5, float(b)) for b in betas]
    assert all(a < b for a, b in zip(vals, vals[1:], strict=False))
    for bad in (-0.01, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"sampling_rate must be in \[0, 1\]"):
            E.amplified_epsilon(1.0, bad)


def _wrapped_geometric(m: int, eps: float) -> np.ndarray:
    """Discrete Laplace noise wrapped onto Z_m: (count + Z) mod m is a finite-output
    eps'-DP release of a count under add/remove-one (shifting by one changes the
    probabilities by at most the factor e^eps', eps' <= eps because of the wrap)."""
    a = math.exp(-eps)
    z = np.arange(m)
    g = np.array([sum(a ** abs(int(v) + k * m) for k in range(-60, 61)) for v in z])
    return g / g.sum()


@pytest.mark.parametrize("beta", [0.02, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("eps", [0.3, 1.0, 2.5])
def test_amplification_theorem_add_remove_brute_force(beta: float, eps: float) -> None:
    """What Theorem 1 means: datasets D and D + {x} (add/remove one record), every record
    kept with prob. beta independently, then an eps-DP (add/remove) algorithm A on the
    sample; a record not sampled leaves no trace. A = (number of 1-records in the sample +
    wrapped discrete Laplace noise) mod m.

    The neighbours' output tables are built exactly and their brute-force epsilon compared
    with ln(1 + beta (e^eps_A - 1)), eps_A being A's own brute-force epsilon:
    equal when the rest of the dataset contributes nothing to the count; below it when the
    other records are sampled too (extra smoothing)."""
    m = 11
    noise = _wrapped_geometric(m, eps)
    q0, q1 = noise, np.roll(noise, 1)  # A without / with the record x = 1
    eps_a = brute_epsilon(np.stack([q0, q1]))
    assert 0 < eps_a <= eps + 1e-12
    absent, present = q0, (1 - beta) * q0 + beta * q1
    got = brute_epsilon(np.stack([absent, present]))
    assert got == pytest.approx(E.amplified_epsilon(eps_a, beta), rel=1e-10)
    assert got < eps_a

    # three other records with value 1, each sampled with prob. beta as well
    base = np.zeros(m)
    for k in range(4):
        base[k % m] += stats.binom.pmf(k, 3, beta)
    q0c = sum(base[k] * np.roll(noise, k) for k in range(m))  # circular convolution
    q1c = np.roll(q0c, 1)
    got_c = brute_epsilon(np.stack([q0c, (1 - beta) * q0c + beta * q1c]))
    assert got_c <= E.amplified_epsilon(eps_a, beta) + 1e-12


@pytest.mark.parametrize("beta", [0.01, 0.05, 0.5, 1.0])
@pytest.mark.parametrize("eps", [0.5, 1.0, math.log(21)])
def test_amplification_does_not_apply_to_a_visible_bottom_under_replace_one(beta: float, eps: float) -> None:
    """The local question (one owner's report, neighbours = the owner's truth changed) with
    "sample w.p. beta then eps-RR, else output ⊥": P(o|t) = beta * RR(o|t), P(⊥|t) = 1 - beta.
    The sampling coin is the same under both truths and cancels: the epsilon stays eps, above
    amplified_epsilon(eps, beta) for beta < 1. Theorem 1 needs add/remove neighbours where
    a non-sampled record is indistinguishable from an absent one; it must not be used to
    shrink the per-owner epsilon of a report that makes non-participation visible."""
    rr = E.epsilon_rr(eps).output_table()
    table = np.column_stack([beta * rr, np.full(2, 1 - beta)])
    got = E.local_epsilon(table)
    assert got == pytest.approx(brute_epsilon(table), rel=REL)
    assert got == pytest.approx(eps, rel=1e-12)
    if beta < 1:
        assert E.amplified_epsilon(eps, beta) < got


def test_no_sampling_means_no_leak() -> None:
    table = np.column_stack([0.0 * E.epsilon_rr(1.0).output_table(), np.ones(2)])
    assert E.local_epsilon(table) == 0.0


# ---------------------------------------------------------------------------------------
# Composition over epochs
# ---------------------------------------------------------------------------------------
EPOCHS_PER_DAY = 2880  # 30-second epochs


def test_basic_composition() -> None:
    assert E.basic_composition(0.5, 10) == pytest.approx(5.0, rel=REL)
    assert E.basic_composition(math.log(21), EPOCHS_PER_DAY) == pytest.approx(2880 * math.log(21), rel=REL)
    assert E.basic_composition(math.log(21), EPOCHS_PER_DAY) == pytest.approx(8768.3, abs=0.1)
    assert E.basic_composition(1.0, 0) == 0


@pytest.mark.parametrize("eps", [0.001, 0.01, 0.1, 1.0, math.log(21)])
@pytest.mark.parametrize("epochs", [1, 120, EPOCHS_PER_DAY])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 0.01])
def test_advanced_composition_formula(eps: float, epochs: int, delta: float) -> None:
    expected = eps * math.sqrt(2 * epochs * math.log(1 / delta)) + epochs * eps * (math.exp(eps) - 1)
    assert E.advanced_composition(eps, epochs, delta) == pytest.approx(expected, rel=1e-12)


def test_advanced_composition_monotone_in_epochs() -> None:
    for eps in (0.01, 0.5, 3.0):
        vals = [E.advanced_composition(eps, t) for t in range(0, 3000, 100)]
        assert vals[0] == 0.0
        assert all(a < b for a, b in zip(vals, vals[1:], strict=False))


def test_advanced_beats_basic_for_small_epsilon_over_a_day() -> None:
    """eps = 0.01 per epoch, 2,880 epochs, delta = 1e-6: basic 28.8, advanced 3.11."""
    basic = E.basic_composition(0.01, EPOCHS_PER_DAY)
    adv = E.advanced_composition(0.01, EPOCHS_PER_DAY, 1e-6)
    assert basic == pytest.approx(28.8, rel=REL)
    assert adv == pytest.approx(3.11, abs=0.01)
    assert adv < basic
    # ... but not for the papers' per-epoch epsilons: with RR's ln 21 the advanced bound is
    # far above the basic one, so a report must take the smaller of the two
    big = math.log(21)
    assert E.advanced_composition(big, EPOCHS_PER_DAY) > E.basic_composition(big, EPOCHS_PER_DAY)


def test_advanced_composition_edges() -> None:
    assert E.advanced_composition(0.0, EPOCHS_PER_DAY) == 0.0
    assert E.advanced_composition(math.inf, EPOCHS_PER_DAY) == math.inf
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
            E.advanced_composition(0.1, 10, bad)


# ---------------------------------------------------------------------------------------
# Haystack crowd sizes (Anonymized Local Privacy §VI-B)
# ---------------------------------------------------------------------------------------
def _lower_quantile_by_hand(n: int, p: float, q: float = 0.01) -> int:
    """Smallest k with P(Binomial(n, p) <= k) >= q, from the log pmf summed in order."""
    k = np.arange(n + 1)
    logpmf = (special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)
              + k * math.log(p) + (n - k) * math.log1p(-p))
    cdf = np.cumsum(np.exp(logpmf))
    return int(np.argmax(cdf >= q))


CROWDS = [(48_719, 0.05, 0.98), (1_047_719, 0.00025, 0.98), (10_047_719, 0.000025, 0.98),
          (3_320, 0.05, 0.98), (500, 0.3, 0.5), (20, 0.1, 0.9)]


@pytest.mark.parametrize(("no", "pis_no", "pi3"), CROWDS)
def test_crowd_size_mean_and_lower_one_percent_quantile(no: int, pis_no: float, pi3: float) -> None:
    c = E.crowd_size(no, pis_no, pi3)
    p = pis_no * pi3
    assert c.mean == pytest.approx(no * p, rel=REL)
    k = int(c.p01)
    assert k == c.p01
    assert stats.binom.cdf(k, no, p) >= 0.01
    assert k == 0 or stats.binom.cdf(k - 1, no, p) < 0.01
    if no <= 2_000_000:
        assert k == _lower_quantile_by_hand(no, p)


CROWD_EPOCHS = 20_000  # simulated crowds per setting (one per station of one epoch)


@pytest.mark.parametrize(("no", "pis_no", "pi3", "path"),
                         [(*c, "tally") for c in CROWDS[:3]] + [(*CROWDS[3], "per-vehicle"),
                                                                (*CROWDS[4], "per-vehicle")])
def test_crowd_size_describes_the_crowd_alp_devices_make(no: int, pis_no: float, pi3: float, path: str) -> None:
    """The crowd statistic the worker and the planner publish for an ALP query (the
    registry's ``extra_statistics``) against the crowds the project's own ALP devices make:
    ``no`` vehicles, none of them at any of 20,000 stations (each station is one independent
    crowd), privatized by the query's per-station sampler -- per vehicle
    (``PerStation.sample_sparse``, what a device sends) where that is affordable, else by the
    exact tally path (``PerStation.tally``, tally mode) -- counting the "Yes" reports per station.

    Checked (fixed seed): the mean of the crowds is the published mean within 5 SE
    (two-sided, false-failure 5.7e-7), and the published p01 is the lower 1% quantile of the
    crowds: fewer than 1% + 5 SE of them lie below it and at least 1% - 5 SE at or below it
    (one-sided, 2.9e-7 each; SE of a 1% frequency over 20,000 crowds: 0.07 points). So
    < 1.5e-6 per setting, < 1e-5 for the five."""
    spec = E.get_spec("alp")
    mech = spec.build({"pisNo": pis_no, "pi3": pi3}, 1)
    crowd = spec.extra_statistics(mech, no)
    (sampler,) = spec.per_station(mech, CROWD_EPOCHS)
    rng = np.random.default_rng(20_240_601 + no)
    if path == "tally":
        counts = sampler.tally(rng, np.zeros(CROWD_EPOCHS, dtype=np.int64), no)
    else:
        pairs = sampler.sample_sparse(rng, np.zeros(no, dtype=np.int64))
        counts = pair_counts(spec, mech, CROWD_EPOCHS, [pairs], no)[:, 0, :]
    crowds = counts[:, E.ALP_YES].astype(np.float64)
    se_mean = float(crowds.std(ddof=1)) / math.sqrt(crowds.size)
    assert abs(float(crowds.mean()) - crowd["mean"]) < 5 * se_mean, (crowds.mean(), crowd["mean"], se_mean)
    se01 = math.sqrt(0.01 * 0.99 / crowds.size)
    below, at_or_below = float(np.mean(crowds < crowd["p01"])), float(np.mean(crowds <= crowd["p01"]))
    assert below < 0.01 + 5 * se01, (below, crowd["p01"])
    assert at_or_below >= 0.01 - 5 * se01, (at_or_below, crowd["p01"])


def test_crowd_size_seed_004_table_ii() -> None:
    """Seed 004 Table II: crowd sizes 160 / 140 / 130 for populations 48,719 / 1,047,719 /
    10,047,719 with pisNo = 0.05 / 0.00025 / 0.000025 and pi3 = 0.98.

    Binomial(No, pisNo * pi3) -- the formula the paper states -- does NOT give those numbers:
    the means are 2,387.2 / 256.7 / 246.2 and the lower 1% quantiles 2,277 / 220 / 210 (No
    taken as the whole population; a Yes count of a few hundred changes nothing visible).
    What does reproduce: the crowd shrinks down the table, and the paper's sizes are below
    our 1% quantiles, i.e. conservative. (160 is close to 3,320 x 0.05 x 0.98 = 162.7, the
    mean for Table I's 3,320 stations -- the tables may have been mixed up.)"""
    rows = [(48_719, 0.05, 160, 2387.231, 2277), (1_047_719, 0.00025, 140, 256.691155, 220),
            (10_047_719, 0.000025, 130, 246.1691155, 210)]
    prev = math.inf
    for pop, pis_no, paper, mean, p01 in rows:
        c = E.crowd_size(pop, pis_no, 0.98)
        assert c.mean == pytest.approx(mean, rel=1e-9)
        assert c.p01 == p01
        assert paper <= c.p01 < prev
        prev = c.p01
    assert E.crowd_size(3_320, 0.05, 0.98).mean == pytest.approx(162.68, rel=1e-9)


def test_crowd_size_degenerate() -> None:
    assert E.crowd_size(0, 0.05, 0.98) == E.CrowdSize(mean=0.0, p01=0.0)
    assert E.crowd_size(1000, 0.0, 0.98) == E.CrowdSize(mean=0.0, p01=0.0)


# ---------------------------------------------------------------------------------------
# Query audit (Anonymized Local Privacy §IV-B)
# ---------------------------------------------------------------------------------------
def test_audit_accepts_a_query_within_the_limit() -> None:
    res = E.audit_query(1.0, [400_001, 400_002], epsilon_limit=2.0, blacklist=[400_003])
    assert res == E.AuditResult(True, None)
    assert E.audit_query(2.0, [1], epsilon_limit=2.0).accepted  # the limit itself is allowed
    assert E.audit_query(0.5, [], epsilon_limit=1.0).accepted


def test_audit_refuses_epsilon_over_the_limit() -> None:
    res = E.audit_query(math.log(21), [400_001], epsilon_limit=1.0)
    assert not res.accepted
    assert res.reason is not None
    assert "epsilon" in res.reason and "exceeds" in res.reason and "limit" in res.reason
    assert "3.045" in res.reason and "1" in res.reason
    assert not E.audit_query(1.0 + 1e-9, [1], epsilon_limit=1.0).accepted


@pytest.mark.parametrize("eps", [math.inf, float("nan")])
def test_audit_refuses_non_finite_epsilon(eps: float) -> None:
    res = E.audit_query(eps, [400_001], epsilon_limit=5.0)
    assert not res.accepted
    assert res.reason is not None and str(eps) in res.reason and "epsilon" in res.reason


@pytest.mark.parametrize(("eps", "limit"), [(math.inf, math.inf), (1.0, float("nan"))],
                         ids=["infinite epsilon, no limit", "nan limit"])
def test_audit_fails_closed(eps: float, limit: float) -> None:
    """The docstring: refuse "if its per-epoch epsilon exceeds the device's limit (or is not
    finite)". An infinite epsilon must be refused even when the device's limit is infinite
    (Sampling Privacy's linked rounds, ALP's eq. 2 toy), and a NaN limit (misconfiguration)
    must not let every query through."""
    assert not E.audit_query(eps, [400_001], epsilon_limit=limit).accepted


@pytest.mark.parametrize(("sensors", "blacklist", "banned"), [
    ([400_001, 400_002], [400_002], ["400002"]),
    ([400_001, 400_002], ["400002"], ["400002"]),
    (["400001", "400002"], [400_001], ["400001"]),
    (np.array([400_001, 400_002, 7], dtype=np.int64), [7, "400002"], ["400002", "7"]),
])
def test_audit_refuses_blacklisted_sensors_int_or_str(sensors: object, blacklist: list[int | str],
                                                      banned: list[str]) -> None:
    res = E.audit_query(0.5, sensors, epsilon_limit=2.0, blacklist=blacklist)  # type: ignore[arg-type]
    assert not res.accepted
    assert res.reason is not None and "blacklisted" in res.reason
    for s in banned:
        assert s in res.reason


def test_audit_blacklist_does_not_match_other_sensors() -> None:
    assert E.audit_query(0.5, [400_001], epsilon_limit=2.0, blacklist=[40_000, "4000011"]).accepted
