"""Each mechanism's derived tables against the papers' formulas, written out here by hand.

The mechanisms in ``estimators.mechanisms`` are data (a latent die plus an emit map) and
their output tables are *derived*. These tests hold the derived tables against the
formulas of the source papers (docs/references.md, docs/statistics.md), typed in again below
independently of the implementation:

* two-coin randomized response (Differential Privacy by Sampling §1, App. A): ``P(1|Yes) = pi1 + (1-pi1) pi2``,
  ``P(1|No) = (1-pi1) pi2``;
* epsilon-RR (Gaboardi's lecture notes): keep the truth w.p. ``e^eps / (1 + e^eps)``; k-ary RR: the truth
  w.p. ``e^eps / (e^eps + k - 1)``, every other value w.p. ``1 / (e^eps + k - 1)``;
* binary Sampling Privacy (Differential Privacy by Sampling eqs. 6-8) and multi-valued Sampling Privacy
  (eqs. 12-13): round 1 ``P(v|t) = pi_v + pis [v == 0]``, round 2 ``P(v|t) = pi_v + pis [v == t]``;
* the fresh-sample variant (Towards Scaling Privacy Strength): round r reports 1 w.p. ``pisYes_r`` / ``pisNo_r``;
* Anonymized Local Privacy toys (Anonymized Local Privacy eqs. 2-4) and the optimal mechanism (eqs. 6-7).

Also: rows sum to 1, joint (linked-rounds) tables, invalid parameters raise ``ValueError``
with a message naming the problem, ``truth_dependent_faces`` agrees with ``emit``, and the
per-station view of a station-valued mechanism is homogeneous over the "No" truths.

Everything here is exact (no Monte Carlo).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import estimators as E

ATOL = 1e-12


# ---------------------------------------------------------------------------------------
# The papers' tables, typed in independently. Rows = truths, columns = outputs.
# ---------------------------------------------------------------------------------------
def rr_table(pi1: float, pi2: float) -> np.ndarray:
    p_yes = pi1 + (1 - pi1) * pi2  # P(1 | Yes)
    p_no = (1 - pi1) * pi2  # P(1 | No)
    return np.array([[1 - p_no, p_no], [1 - p_yes, p_yes]])


def eps_rr_table(eps: float) -> np.ndarray:
    keep = math.exp(eps) / (1 + math.exp(eps))
    return np.array([[keep, 1 - keep], [1 - keep, keep]])


def kary_table(k: int, eps: float) -> np.ndarray:
    e = math.exp(eps)
    tab = np.full((k, k), 1 / (e + k - 1))
    np.fill_diagonal(tab, e / (e + k - 1))
    return tab


def sp_binary_round1(pi0: float, pis: float) -> np.ndarray:
    # eq. 6: 0 w.p. pi0, 0 w.p. pis, 1 w.p. 1 - pi0 - pis -- the same for Yes and No
    row = [pi0 + pis, 1 - pi0 - pis]
    return np.array([row, row])


def sp_binary_round2(pi0: float, pis: float) -> np.ndarray:
    # eq. 8 (No): 0 w.p. pi0 + pis; eq. 7 (Yes): the sampled face moves to 1
    return np.array([[pi0 + pis, 1 - pi0 - pis], [pi0, pis + 1 - pi0 - pis]])


def sp_round1(pi: np.ndarray, pis: float) -> np.ndarray:
    n = pi.size
    tab = np.tile(pi, (n, 1))
    tab[:, 0] += pis  # eq. 12: every sampled owner writes 0 in round one
    return tab


def sp_round2(pi: np.ndarray, pis: float) -> np.ndarray:
    n = pi.size
    return np.tile(pi, (n, 1)) + pis * np.eye(n)  # eq. 13: P(v|t) = pi_v + pis [v == t]


def sp_joint(pi: np.ndarray, pis: float) -> np.ndarray:
    """P(round-1 report a, round-2 report b | t), column a * O + b."""
    n = pi.size
    tab = np.zeros((n, n * n))
    for t in range(n):
        for v in range(n):
            tab[t, v * n + v] += pi[v]  # non-sampled faces repeat themselves
        tab[t, 0 * n + t] += pis  # the sampled face: 0 then the truth
    return tab


def fresh_round(p_yes: float, p_no: float) -> np.ndarray:
    return np.array([[1 - p_no, p_no], [1 - p_yes, p_yes]])


def fresh_joint(y1: float, n1: float, y2: float, n2: float) -> np.ndarray:
    r1, r2 = fresh_round(y1, n1), fresh_round(y2, n2)
    return np.stack([np.outer(r1[t], r2[t]).ravel() for t in range(2)])


# ALP columns: 0 = "No", 1 = "Yes", 2 = ⊥
def alp_noise_table(y: float, n: float) -> np.ndarray:
    # eq. 2: report the value w.p. pi_s, else ⊥
    return np.array([[n, 0.0, 1 - n], [0.0, y, 1 - y]])


def alp_pd_table(y: float, n: float, pi1: float, pi2: float) -> np.ndarray:
    yes1 = y * (pi1 + (1 - pi1) * pi2)  # eq. 3
    no1 = n * ((1 - pi1) * pi2)  # eq. 4
    return np.array([[n - no1, no1, 1 - n], [y - yes1, yes1, 1 - y]])


def alp_opt_table(y1: float, y2: float, pi1: float, pi2: float, n: float, pi3: float) -> np.ndarray:
    yes_row = [y1 * (1 - pi1) + y2 * (1 - pi2), y1 * pi1 + y2 * pi2, 1 - (y1 + y2)]  # eq. 6
    no_row = [n * (1 - pi3), n * pi3, 1 - n]  # eq. 7
    return np.array([no_row, yes_row])


# ---------------------------------------------------------------------------------------
# The catalogue: mechanism, expected per-round tables, expected joint table (or None)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[], E.Mechanism]
    rounds: tuple[np.ndarray, ...]
    joint: np.ndarray | None = None


def _pi_nonuniform() -> np.ndarray:
    # V = 4 stations, deliberately uneven, index 0 (no station) the smallest face
    return np.array([0.02, 0.30, 0.05, 0.13, 0.10])


def _cases() -> list[Case]:
    cases: list[Case] = []
    for pi1, pi2 in [(0.8, 0.2), (0.5, 0.5), (0.3, 0.9), (0.0, 0.4), (1.0, 0.3), (0.6, 0.0)]:
        cases.append(Case(f"rr-{pi1}-{pi2}", lambda a=pi1, b=pi2: E.two_coin_rr(a, b), (rr_table(pi1, pi2),)))
    for eps in [0.0, 0.5, math.log(3), 4.0]:
        cases.append(Case(f"eps_rr-{eps:.3g}", lambda e=eps: E.epsilon_rr(e), (eps_rr_table(eps),)))
    for k, eps in [(3, 1.0), (7, 0.0), (12, 2.5)]:
        cases.append(Case(f"kary-{k}-{eps}", lambda kk=k, e=eps: E.kary_rr(kk, e), (kary_table(k, eps),)))
    for pi0, pis in [(0.275, 0.45), (0.1, 0.25), (0.6, 0.3), (0.05, 0.9)]:
        pi = np.array([pi0, 1 - pi0 - pis])
        cases.append(Case(f"sp_binary-{pi0}-{pis}", lambda a=pi0, b=pis: E.sp_binary(a, b),
                          (sp_binary_round1(pi0, pis), sp_binary_round2(pi0, pis)), sp_joint(pi, pis)))
    for v, pis in [(2, 0.45), (5, 0.25), (9, 0.7)]:
        pi = np.full(v + 1, (1 - pis) / (v + 1))
        cases.append(Case(f"sp-uniform-V{v}-{pis}", lambda vv=v, b=pis: E.sampling_privacy(vv, b),
                          (sp_round1(pi, pis), sp_round2(pi, pis)), sp_joint(pi, pis)))
    pi_nu = _pi_nonuniform()
    pis_nu = 1 - float(pi_nu.sum())
    cases.append(Case("sp-nonuniform-V4", lambda: E.sampling_privacy(4, pis_nu, _pi_nonuniform().tolist()),
                      (sp_round1(pi_nu, pis_nu), sp_round2(pi_nu, pis_nu)), sp_joint(pi_nu, pis_nu)))
    for y1, n1, y2, n2 in [(0.5, 0.05, 0.05, 0.05), (0.3, 0.1, 0.2, 0.4), (0.9, 0.5, 0.1, 0.5)]:
        cases.append(Case(f"fresh-{y1}-{n1}-{y2}-{n2}",
                          lambda a=y1, b=n1, c=y2, d=n2: E.fresh_sample(a, b, c, d),
                          (fresh_round(y1, n1), fresh_round(y2, n2)), fresh_joint(y1, n1, y2, n2)))
    for y, n in [(0.05, 0.05), (0.3, 0.01)]:
        cases.append(Case(f"alp_noise-{y}-{n}", lambda a=y, b=n: E.alp_sampling_noise(a, b),
                          (alp_noise_table(y, n),)))
    for args in [(0.1, 0.05, 0.95, 0.98), (0.4, 0.2, 0.6, 0.3)]:
        cases.append(Case(f"alp_pd-{args}", lambda a=args: E.alp_plausible_deniability(*a),
                          (alp_pd_table(*args),)))
    for args in [(0.05, 0.05, 0.95, 0.98, 0.05, 0.98), (0.05, 0.05, 0.95, 0.98, 0.00025, 0.98),
                 (0.05, 0.05, 0.95, 0.98, 0.000025, 0.98), (0.3, 0.2, 0.7, 0.1, 0.4, 0.5)]:
        cases.append(Case(f"alp-{args}", lambda a=args: E.alp_optimal(*a), (alp_opt_table(*args),)))
    return cases


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_output_tables_match_the_papers(case: Case) -> None:
    m = case.make()
    assert m.n_rounds == len(case.rounds)
    for r, expected in enumerate(case.rounds):
        got = m.output_table(r)
        assert got.shape == expected.shape, f"round {r + 1}"
        np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL, err_msg=f"{case.id} round {r + 1}")
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=ATOL)
        assert np.all(got >= 0)


@pytest.mark.parametrize("case", [c for c in CASES if c.joint is not None],
                         ids=[c.id for c in CASES if c.joint is not None])
def test_joint_tables_match_the_papers(case: Case) -> None:
    m = case.make()
    got = m.joint_table()
    assert case.joint is not None
    np.testing.assert_allclose(got, case.joint, rtol=0, atol=ATOL)
    # the joint table's marginals are the per-round tables
    o = m.n_outputs
    cube = got.reshape(m.n_truths, o, o)
    np.testing.assert_allclose(cube.sum(axis=2), case.rounds[0], rtol=0, atol=ATOL)
    np.testing.assert_allclose(cube.sum(axis=1), case.rounds[1], rtol=0, atol=ATOL)


def test_epsilon_rr_is_two_coin_rr_with_pi2_one_half() -> None:
    # Gaboardi's lecture notes epsilon-RR written as two-coin RR: pi1 = (e^eps - 1)/(e^eps + 1), pi2 = 1/2
    for eps in [0.1, 1.0, 3.0]:
        pi1 = (math.exp(eps) - 1) / (math.exp(eps) + 1)
        np.testing.assert_allclose(E.epsilon_rr(eps).output_table(), E.two_coin_rr(pi1, 0.5).output_table(),
                                   rtol=0, atol=ATOL)


def test_sp_binary_is_sampling_privacy_with_one_station() -> None:
    a, b = E.sp_binary(0.2, 0.35), E.sampling_privacy(1, 0.35, [0.2, 0.45])
    for r in range(2):
        np.testing.assert_allclose(a.output_table(r), b.output_table(r), rtol=0, atol=ATOL)


def test_sampling_privacy_default_pi_is_uniform_and_has_v_plus_one_outputs() -> None:
    # the paper's "V + 2 outputs" counts die faces: outputs are 0..V, faces 0..V plus S
    m = E.sampling_privacy(6, 0.45)
    assert m.n_outputs == 7 and m.n_truths == 7 and m.n_faces == 8
    np.testing.assert_allclose(m.latent[0], [*([0.55 / 7] * 7), 0.45], rtol=0, atol=ATOL)


def test_alp_output_indices() -> None:
    assert (E.ALP_NO, E.ALP_YES, E.ALP_BOTTOM) == (0, 1, 2)
    m = E.alp_optimal()
    assert m.output_labels[E.ALP_BOTTOM] == "⊥"
    assert m.truth_labels == ("no", "yes")


# ---------------------------------------------------------------------------------------
# Invalid parameters
# ---------------------------------------------------------------------------------------
INVALID: list[tuple[str, Callable[[], object], str]] = [
    ("rr pi1 > 1", lambda: E.two_coin_rr(1.2, 0.2), r"pi1 must be a probability in \[0, 1\]"),
    ("rr pi2 < 0", lambda: E.two_coin_rr(0.8, -0.1), r"pi2 must be a probability in \[0, 1\]"),
    ("rr pi1 nan", lambda: E.two_coin_rr(float("nan"), 0.2), r"pi1 must be a probability"),
    ("rr pi2 inf", lambda: E.two_coin_rr(0.8, math.inf), r"pi2 must be a probability"),
    ("eps_rr eps < 0", lambda: E.epsilon_rr(-0.5), r"epsilon must be finite and >= 0"),
    ("eps_rr eps inf", lambda: E.epsilon_rr(math.inf), r"epsilon must be finite and >= 0"),
    ("kary eps nan", lambda: E.kary_rr(4, float("nan")), r"epsilon must be finite and >= 0"),
    ("kary k < 2", lambda: E.kary_rr(1, 1.0), r"k >= 2"),
    ("sp no station", lambda: E.sampling_privacy(0, 0.45), r"at least one station"),
    ("sp pis > 1", lambda: E.sampling_privacy(3, 1.5), r"pis must be a probability in \[0, 1\]"),
    ("sp pis < 0", lambda: E.sampling_privacy(3, -0.1), r"pis must be a probability"),
    ("sp pis = 1 leaves no room for pi_v", lambda: E.sampling_privacy(3, 1.0), r"pi_v must be > 0"),
    ("sp pi wrong length", lambda: E.sampling_privacy(3, 0.45, [0.275, 0.275]), r"V \+ 1 = 4 entries"),
    ("sp pi_v = 0", lambda: E.sampling_privacy(3, 0.45, [0.0, 0.2, 0.2, 0.15]), r"pi_v must be > 0"),
    ("sp pi_v < 0", lambda: E.sampling_privacy(3, 0.45, [-0.05, 0.2, 0.2, 0.2]), r"pi_v must be > 0"),
    ("sp pi + pis != 1", lambda: E.sampling_privacy(3, 0.45, [0.1, 0.1, 0.1, 0.1]),
     r"sum\(pi\) \+ pis must be 1"),
    ("sp pi + pis > 1", lambda: E.sampling_privacy(2, 0.5, [0.2, 0.2, 0.2]), r"sum\(pi\) \+ pis must be 1"),
    ("sp pi nan", lambda: E.sampling_privacy(2, 0.4, [float("nan"), 0.3, 0.3]), r"finite"),
    ("sp_binary pi0 + pis = 1", lambda: E.sp_binary(0.55, 0.45), r"pi0 \+ pis must be < 1"),
    ("sp_binary pi0 + pis > 1", lambda: E.sp_binary(0.6, 0.45), r"pi0 \+ pis must be < 1"),
    ("sp_binary pi0 = 0", lambda: E.sp_binary(0.0, 0.45), r"pi_v must be > 0"),
    ("sp_binary pi0 < 0", lambda: E.sp_binary(-0.1, 0.45), r"pi0 must be a probability"),
    ("fresh pisNo2 < 0", lambda: E.fresh_sample(0.5, 0.05, 0.05, -0.01), r"pisNo2 must be a probability"),
    ("fresh pisYes1 > 1", lambda: E.fresh_sample(1.01, 0.05, 0.05, 0.05), r"pisYes1 must be a probability"),
    ("fresh no contrast", lambda: E.fresh_sample(0.3, 0.3, 0.1, 0.1), r"must differ"),
    ("alp_noise pisYes > 1", lambda: E.alp_sampling_noise(2.0, 0.05), r"pisYes must be a probability"),
    ("alp_pd pi1 < 0", lambda: E.alp_plausible_deniability(0.1, 0.05, -0.1, 0.98), r"pi1 must be a probability"),
    ("alp pi3 > 1", lambda: E.alp_optimal(pi3=1.1), r"pi3 must be a probability"),
    ("alp pisNo nan", lambda: E.alp_optimal(pisNo=float("nan")), r"pisNo must be a probability"),
    ("alp pisYes1 + pisYes2 > 1", lambda: E.alp_optimal(pisYes1=0.6, pisYes2=0.5),
     r"pisYes1 \+ pisYes2 must be <= 1"),
    ("table rows do not sum to 1", lambda: E.table_mechanism("t", np.array([[0.5, 0.2, 0.2], [0.1, 0.1, 0.8]]), {}),
     r"each row must sum to 1"),
    ("table negative entry", lambda: E.table_mechanism("t", np.array([[1.2, -0.2, 0.0], [0.1, 0.1, 0.8]]), {}),
     r"finite and non-negative"),
    ("table faces vs labels", lambda: E.table_mechanism("t", np.array([[0.5, 0.5], [0.1, 0.9]]), {}),
     r"latent has 2 faces, labels 3"),
    ("table rows vs truths", lambda: E.table_mechanism("t", np.full((3, 3), 1 / 3), {}),
     r"latent rows must be 1 or one per truth"),
    ("per-station needs a binary one-round mechanism", lambda: E.PerStation(E.sp_binary(), 3),
     r"one-round binary"),
    ("per-station needs a station", lambda: E.PerStation(E.alp_optimal(), 0), r"n_stations must be >= 1"),
]


@pytest.mark.parametrize(("what", "build", "message"), INVALID, ids=[w for w, _, _ in INVALID])
def test_invalid_parameters_raise_value_error(what: str, build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


# ---------------------------------------------------------------------------------------
# truth_dependent_faces (used by the exact tally) must agree with emit
# ---------------------------------------------------------------------------------------
TRUTH_INDEPENDENT = [c for c in CASES if c.make().truth_independent]


def test_the_truth_independent_catalogue_is_not_empty() -> None:
    kinds = {c.id.split("-")[0] for c in TRUTH_INDEPENDENT}
    assert {"rr", "eps_rr", "kary", "sp_binary", "sp"} <= kinds


@pytest.mark.parametrize("case", TRUTH_INDEPENDENT, ids=[c.id for c in TRUTH_INDEPENDENT])
def test_truth_dependent_faces_are_exactly_the_faces_whose_report_depends_on_the_truth(case: Case) -> None:
    m = case.make()
    dependent = set()
    for f in range(m.n_faces):
        for r in range(m.n_rounds):
            reports = {int(m.emit(r, np.array([f]), np.array([t]))[0]) for t in range(m.n_truths)}
            if len(reports) > 1:
                dependent.add(f)
    assert set(m.truth_dependent_faces) == dependent
    assert len(m.truth_dependent_faces) == len(set(m.truth_dependent_faces))


# ---------------------------------------------------------------------------------------
# Per-station view: a "No" vehicle looks the same to station s whatever its true station
# ---------------------------------------------------------------------------------------
def _reduced_direct(m: E.Mechanism, s: int, truth: int) -> np.ndarray:
    """Distribution of the per-round indicators "report == s" (as a binary number over
    rounds) of a vehicle with the given truth, enumerated from the die and emit."""
    dist = np.zeros(2**m.n_rounds)
    probs = m.latent_full()[truth]
    for f in range(m.n_faces):
        code = 0
        for r in range(m.n_rounds):
            code = 2 * code + int(m.emit(r, np.array([f]), np.array([truth]))[0] == s)
        dist[code] += probs[f]
    return dist


def _reduced_view(view: E.StationView, i: int, yes: int) -> np.ndarray:
    dist = np.zeros(2**view.n_rounds)
    lat = view.latent[i if view.latent.shape[0] > 1 else 0, yes]
    for f in range(lat.size):
        code = 0
        for r in range(view.n_rounds):
            code = 2 * code + int(view.outputs[r, i, yes, f])
        dist[code] += lat[f]
    return dist


STATION_VALUED = {
    "kary-5": lambda: E.kary_rr(5, 1.3),
    "kary-9-eps0": lambda: E.kary_rr(9, 0.0),
    "sp-uniform-V6": lambda: E.sampling_privacy(6, 0.45),
    "sp-nonuniform-V4": lambda: E.sampling_privacy(4, 1 - float(_pi_nonuniform().sum()), _pi_nonuniform().tolist()),
    "sp_binary": lambda: E.sp_binary(0.2, 0.3),
    "rr": lambda: E.two_coin_rr(0.7, 0.3),
}


@pytest.mark.parametrize("name", list(STATION_VALUED))
def test_station_view_is_homogeneous_over_no_truths(name: str) -> None:
    m = STATION_VALUED[name]()
    assert m.station_valued
    view = E.station_view(m)
    v = m.n_truths - 1
    assert view.n_stations == v and view.n_outputs == 2
    for i, s in enumerate(range(1, v + 1)):
        no_row = _reduced_view(view, i, 0)
        yes_row = _reduced_view(view, i, 1)
        np.testing.assert_allclose(yes_row, _reduced_direct(m, s, s), rtol=0, atol=ATOL)
        for u in range(v + 1):
            if u == s:
                continue
            np.testing.assert_allclose(_reduced_direct(m, s, u), no_row, rtol=0, atol=ATOL,
                                       err_msg=f"station {s}, truth {u}")


def test_station_view_of_a_subset_of_stations() -> None:
    m = E.sampling_privacy(4, 1 - float(_pi_nonuniform().sum()), _pi_nonuniform().tolist())
    view = E.station_view(m, [3, 1])
    assert view.n_stations == 2
    for i, s in enumerate([3, 1]):
        np.testing.assert_allclose(_reduced_view(view, i, 1), _reduced_direct(m, s, s), rtol=0, atol=ATOL)
        np.testing.assert_allclose(_reduced_view(view, i, 0), _reduced_direct(m, s, 0), rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match=r"stations must lie in 1\.\.4"):
        E.station_view(m, [0])
    with pytest.raises(ValueError, match=r"stations must lie in 1\.\.4"):
        E.station_view(m, [5])
