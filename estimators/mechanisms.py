"""Local randomizers of the source papers, each described by data.

Every mechanism here is one *latent die* per vehicle per epoch plus an *emit map*:

* ``latent[t, f]`` is P(face f | truth t). A vehicle rolls the die ONCE per epoch.
* ``emit(r, f, t)`` is the report the vehicle sends in round ``r`` given face ``f`` and
  truth ``t`` (a deterministic function).

Everything else is derived from those two pieces of data, so nothing can drift apart:

* :meth:`Mechanism.output_table` -- P(report in round r | truth), the table the privacy
  accounting takes its brute-force epsilon from;
* :meth:`Mechanism.joint_table` -- P(round-1 report, round-2 report | truth), what an
  adversary who could link a vehicle's two rounds would see;
* :meth:`Mechanism.sample` -- path 1, per vehicle (alias method, vectorized);
* :meth:`Mechanism.tally` -- path 2, the exact joint distribution of the per-round counts
  given only how many vehicles hold each truth (multinomial per truth class), which is
  what makes a 10-million-vehicle day feasible.

Truth and output indices: for *station-valued* mechanisms (randomized response over
stations, Sampling Privacy) truth and report are station indices, ``0`` meaning "at none of
the monitored stations" and ``1..V`` the monitored stations. Binary mechanisms use
``0 = No`` and ``1 = Yes`` (a station-valued mechanism with ``V = 1``); the Anonymized Local
Privacy family reports ``0`` ("No"), ``1`` ("Yes") or ``2`` (bottom, "not participating").

References (docs/references.md; the formulas in docs/statistics.md): randomized response from
Differential Privacy by Sampling §1/App. A and Gaboardi's lecture notes; Sampling Privacy from
Differential Privacy by Sampling §4.1/§4.2; the fresh-sample variant from Towards Scaling
Privacy Strength; the Yes/No/⊥ family from Anonymized Local Privacy §V.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from ._types import FloatArray, IntArray

__all__ = [
    "ALP_BOTTOM",
    "ALP_NO",
    "ALP_YES",
    "Mechanism",
    "alp_optimal",
    "alp_plausible_deniability",
    "alp_sampling_noise",
    "epsilon_rr",
    "fresh_sample",
    "kary_rr",
    "sampling_privacy",
    "sp_binary",
    "symmetric_unary",
    "table_mechanism",
    "two_coin_rr",
]

ALP_NO = 0
ALP_YES = 1
ALP_BOTTOM = 2

_TOL = 1e-12


def _check_prob(name: str, value: float) -> float:
    v = float(value)
    if not np.isfinite(v) or v < 0.0 or v > 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
    return v


def _check_rows(latent: FloatArray, what: str) -> FloatArray:
    if latent.ndim != 2:
        raise ValueError(f"{what}: expected a 2-d table, got shape {latent.shape}")
    if np.any(latent < -_TOL) or not np.all(np.isfinite(latent)):
        raise ValueError(f"{what}: probabilities must be finite and non-negative")
    sums = latent.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > 1e-9):
        raise ValueError(f"{what}: each row must sum to 1, got sums {sums.tolist()}")
    clipped: FloatArray = np.clip(latent, 0.0, None)
    normalized: FloatArray = clipped / clipped.sum(axis=1, keepdims=True)
    return normalized


def _alias_tables(probs: FloatArray) -> tuple[FloatArray, IntArray]:
    """Vose's alias tables for each row of ``probs`` (rows x faces)."""
    rows, k = probs.shape
    accept = np.ones((rows, k))
    alias = np.tile(np.arange(k, dtype=np.int64), (rows, 1))
    for i in range(rows):
        scaled = probs[i] * k
        small = [j for j in range(k) if scaled[j] < 1.0]
        large = [j for j in range(k) if scaled[j] >= 1.0]
        while small and large:
            s = small.pop()
            g = large.pop()
            accept[i, s] = scaled[s]
            alias[i, s] = g
            scaled[g] = scaled[g] + scaled[s] - 1.0
            (small if scaled[g] < 1.0 else large).append(g)
        for j in small + large:  # leftovers are 1 up to rounding
            accept[i, j] = 1.0
    return accept, alias


@dataclass(frozen=True, eq=False)
class Mechanism:
    """A local randomizer: a latent die per truth plus a deterministic emit map.

    Subclasses provide :meth:`emit`. ``latent`` has shape ``(T, F)`` or ``(1, F)`` when the
    die does not depend on the truth (then only the emit map does).
    """

    name: str
    truth_labels: tuple[str, ...]
    output_labels: tuple[str, ...]
    face_labels: tuple[str, ...]
    latent: FloatArray
    n_rounds: int
    params: Mapping[str, float]
    station_valued: bool = False
    # Faces whose emitted report depends on the truth in some round. Only used by the exact
    # tally when the die is truth-independent; a unit test checks it against ``emit``.
    truth_dependent_faces: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        latent = _check_rows(np.asarray(self.latent, dtype=np.float64), self.name)
        if latent.shape[1] != len(self.face_labels):
            raise ValueError(f"{self.name}: latent has {latent.shape[1]} faces, labels {len(self.face_labels)}")
        if latent.shape[0] not in (1, len(self.truth_labels)):
            raise ValueError(f"{self.name}: latent rows must be 1 or one per truth")
        object.__setattr__(self, "latent", latent)
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    # -- the data ---------------------------------------------------------------------
    @property
    def n_truths(self) -> int:
        return len(self.truth_labels)

    @property
    def n_outputs(self) -> int:
        return len(self.output_labels)

    @property
    def n_faces(self) -> int:
        return len(self.face_labels)

    @property
    def truth_independent(self) -> bool:
        return bool(self.latent.shape[0] == 1)

    def emit(self, r: int, faces: IntArray, truths: IntArray) -> IntArray:
        """Report in round ``r`` for (broadcast) arrays of faces and truths."""
        raise NotImplementedError

    def latent_full(self) -> FloatArray:
        """P(face | truth) as a ``(T, F)`` table."""
        return np.broadcast_to(self.latent, (self.n_truths, self.n_faces))

    # -- derived tables -----------------------------------------------------------------
    def _grid_outputs(self, r: int) -> IntArray:
        t = np.arange(self.n_truths, dtype=np.int64)[:, None]
        f = np.arange(self.n_faces, dtype=np.int64)[None, :]
        return np.broadcast_to(self.emit(r, f, t), (self.n_truths, self.n_faces))

    def output_table(self, r: int = 0) -> FloatArray:
        """P(report in round ``r`` = o | truth = t), shape ``(T, O)``."""
        t_n, o_n = self.n_truths, self.n_outputs
        out = self._grid_outputs(r)
        flat = (np.arange(t_n, dtype=np.int64)[:, None] * o_n + out).ravel()
        table = np.asarray(np.bincount(flat, weights=self.latent_full().ravel(), minlength=t_n * o_n), dtype=np.float64)
        return table.reshape(t_n, o_n)

    def joint_table(self) -> FloatArray:
        """P(reports of all rounds, as one mixed-radix index | truth), shape ``(T, O**R)``.

        This is what an adversary able to link a vehicle's rounds would observe.
        """
        t_n, o_n, r_n = self.n_truths, self.n_outputs, self.n_rounds
        width = o_n**r_n
        if t_n * width > 50_000_000:
            raise ValueError(f"{self.name}: joint table of {t_n}x{width} is too large")
        idx = np.zeros((t_n, self.n_faces), dtype=np.int64)
        for r in range(r_n):
            idx = idx * o_n + self._grid_outputs(r)
        flat = (np.arange(t_n, dtype=np.int64)[:, None] * width + idx).ravel()
        weights = self.latent_full().ravel()
        table = np.asarray(np.bincount(flat, weights=weights, minlength=t_n * width), dtype=np.float64)
        return table.reshape(t_n, width)

    # -- path 1: per vehicle --------------------------------------------------------------
    @cached_property
    def _alias(self) -> tuple[FloatArray, IntArray]:
        return _alias_tables(self.latent)

    @cached_property
    def _alias_shift(self) -> IntArray:
        """``alias - column``: what to add to a column when its coin says "alias"."""
        shift: IntArray = self._alias[1] - np.arange(self.n_faces, dtype=np.int64)[None, :]
        return shift

    def draw_faces(self, rng: np.random.Generator, truths: IntArray) -> IntArray:
        """One die roll per vehicle (alias method: a uniform column and a uniform coin)."""
        accept, alias = self._alias
        n = int(truths.shape[0])
        # one uniform per vehicle: its integer part picks the column, its fraction the coin
        # (53-bit doubles leave > 30 bits for the coin with up to 2^20 faces)
        u: FloatArray = rng.random(size=n)
        u *= self.n_faces
        col: IntArray = u.astype(np.int64)
        coin = u - col
        if self.truth_independent:
            flat = col
            accept_t, shift_t = accept[0], self._alias_shift[0]
        else:
            flat = truths * self.n_faces + col
            accept_t, shift_t = accept.ravel(), self._alias_shift.ravel()
        # branch-free select (np.where on a random mask is several times slower)
        faces: IntArray = col + shift_t.take(flat) * (coin >= accept_t.take(flat))
        return faces

    def sample(self, rng: np.random.Generator, truths: IntArray) -> IntArray:
        """Each vehicle's reports, shape ``(R, n)``; column i is vehicle i.

        The columns of the rounds are aligned here, in memory on the device side only.
        Anything that leaves the device must tally or shuffle each round independently.
        """
        truths = self._check_truths(truths)
        faces = self.draw_faces(rng, truths)
        out = np.empty((self.n_rounds, truths.shape[0]), dtype=np.int64)
        for r in range(self.n_rounds):
            out[r] = self.emit(r, faces, truths)
        return out

    # -- path 2: exact tally --------------------------------------------------------------
    def tally(self, rng: np.random.Generator, truth_counts: IntArray) -> IntArray:
        """Draw the per-round report counts ``(R, O)`` from their exact joint distribution.

        ``truth_counts[t]`` vehicles hold truth ``t``. The counts of all rounds are drawn
        jointly (one die per vehicle), so e.g. Sampling Privacy's round difference is exact.
        """
        one: IntArray = self.tally_epochs(rng, truth_counts, 1)[0]
        return one

    def tally_epochs(self, rng: np.random.Generator, truth_counts: IntArray, epochs: int) -> IntArray:
        """``epochs`` independent draws of :meth:`tally` at once, ``(epochs, R, O)`` (Monte Carlo
        batteries): one multinomial call for every epoch's per-truth counts."""
        counts = np.asarray(truth_counts, dtype=np.int64)
        if counts.shape != (self.n_truths,) or np.any(counts < 0):
            raise ValueError(f"{self.name}: truth_counts must be {self.n_truths} non-negative counts")
        active = np.flatnonzero(counts)
        result = np.zeros((epochs, self.n_rounds, self.n_outputs), dtype=np.float64)

        def add(r: int, outputs: IntArray, weights: FloatArray | IntArray) -> None:
            """Round r's counts += per epoch, the weights (epochs, m) summed by outputs (m,)."""
            flat = (np.arange(epochs, dtype=np.int64)[:, None] * self.n_outputs + outputs.ravel()[None, :]).ravel()
            result[:, r] += np.bincount(flat, weights=np.reshape(weights, -1),
                                        minlength=epochs * self.n_outputs).reshape(epochs, self.n_outputs)

        if self.truth_independent:
            p = self.latent[0]
            dep = np.asarray(self.truth_dependent_faces, dtype=np.int64)
            rest = np.setdiff1d(np.arange(self.n_faces, dtype=np.int64), dep)
            p_rest = float(p[rest].sum())
            pv = np.append(p[dep], max(0.0, 1.0 - float(p[dep].sum())))
            per_truth = rng.multinomial(counts[active], pv, size=(epochs, active.size))  # (e, k, |dep| + 1)
            n_rest = per_truth[:, :, -1].sum(axis=1)
            pooled = (
                rng.multinomial(n_rest, p[rest] / p_rest)
                if n_rest.any() and p_rest > 0
                else np.zeros((epochs, rest.size), dtype=np.int64)
            )
            for r in range(self.n_rounds):
                if dep.size:
                    out_dep = self.emit(r, dep[None, :], active[:, None])
                    add(r, np.broadcast_to(out_dep, (active.size, dep.size)), per_truth[:, :, :-1])
                add(r, self.emit(r, rest, np.zeros_like(rest)), pooled)
        else:
            per_truth = rng.multinomial(counts[active], self.latent[active], size=(epochs, active.size))  # (e, k, F)
            faces = np.arange(self.n_faces, dtype=np.int64)[None, :]
            for r in range(self.n_rounds):
                add(r, np.broadcast_to(self.emit(r, faces, active[:, None]), per_truth.shape[1:]), per_truth)
        return np.rint(result).astype(np.int64)

    def _check_truths(self, truths: IntArray) -> IntArray:
        arr = np.asarray(truths)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{self.name}: truths must be a 1-d integer array")
        if arr.size and (arr.min() < 0 or arr.max() >= self.n_truths):
            raise ValueError(f"{self.name}: truths must lie in 0..{self.n_truths - 1}")
        return arr.astype(np.int64, copy=False)


# ---------------------------------------------------------------------------------------
# Concrete mechanisms
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class _TruthOrFixed(Mechanism):
    """Face 0 reports the truth; face j >= 1 reports ``fixed[j]`` (randomized response)."""

    fixed: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def emit(self, r: int, faces: IntArray, truths: IntArray) -> IntArray:
        truthful = faces == 0
        fixed = self.fixed.take(faces)
        out: IntArray = fixed + (truths - fixed) * truthful
        return out

    def output_table(self, r: int = 0) -> FloatArray:
        """:meth:`Mechanism.output_table` without the ``(T, F)`` grid when no two forced faces
        report the same value (k-ary RR over 3,220 stations: 0.9 s -> ~0.05 s). The numbers are
        the generic sum's: a cell gets the truthful face's mass (when it is the truth), then the
        one forced face's, in that order, from 0.0 (``a + b`` and ``b + a`` are the same double)."""
        t_n, o_n = self.n_truths, self.n_outputs
        forced = self.fixed[1:]
        if (t_n > o_n or forced.size == 0 or int(forced.min()) < 0 or int(forced.max()) >= o_n
                or np.unique(forced).size != forced.size):
            return super().output_table(r)
        w = self.latent  # (1, F) when the die does not depend on the truth: one row, broadcast
        rows = np.zeros((w.shape[0], o_n), dtype=np.float64)
        rows[:, forced] = w[:, 1:]
        table = np.empty((t_n, o_n), dtype=np.float64)
        table[...] = rows
        diag = np.arange(t_n)
        table[diag, diag] += np.broadcast_to(w[:, 0], (t_n,))
        return table


def two_coin_rr(pi1: float = 0.8, pi2: float = 0.2) -> Mechanism:
    """Two-coin randomized response (Differential Privacy by Sampling §1, App. A):
    truthful w.p. ``pi1``, else "Yes" w.p. ``pi2``. The papers' evaluation uses ``pi1=0.8, pi2=0.2``.

    A Yes owner says "Yes" w.p. ``pi1 + (1 - pi1) pi2``, a No owner w.p. ``(1 - pi1) pi2``:

    >>> two_coin_rr(0.8, 0.2).output_table().round(2).tolist()  # rows: truth No, Yes
    [[0.96, 0.04], [0.16, 0.84]]
    """
    pi1, pi2 = _check_prob("pi1", pi1), _check_prob("pi2", pi2)
    latent = np.array([[pi1, (1 - pi1) * pi2, (1 - pi1) * (1 - pi2)]])
    return _TruthOrFixed(
        name="rr",
        truth_labels=("no", "yes"),
        output_labels=("0", "1"),
        face_labels=("truthful", "forced_yes", "forced_no"),
        latent=latent,
        n_rounds=1,
        params={"pi1": pi1, "pi2": pi2},
        station_valued=True,
        truth_dependent_faces=(0,),
        fixed=np.array([0, 1, 0], dtype=np.int64),
    )


def symmetric_unary(q: float = 0.2) -> Mechanism:
    """Symmetric unary randomized response: the truth bit flipped with probability ``q < 1/2``.

    Asked about each sensor, a device's sparse report is the stations whose (flipped) bit is 1.
    One answer's epsilon is ``ln((1 - q) / q)``; a move from station a to b flips two answers,
    so the report's is twice that.

    >>> symmetric_unary(0.2).output_table().round(2).tolist()  # rows: truth No, Yes
    [[0.8, 0.2], [0.2, 0.8]]
    """
    q = _check_prob("q", q)
    if not 0.0 < q < 0.5:
        raise ValueError(f"q must be in (0, 1/2), got {q}")
    return table_mechanism("unary", np.array([[1 - q, q], [q, 1 - q]]), {"q": q}, output_labels=("0", "1"))


def epsilon_rr(epsilon: float) -> Mechanism:
    """epsilon-randomized response (Gaboardi's lecture notes): keep the truth w.p. e^eps / (1 + e^eps).

    Written as two-coin RR with ``pi1 = (e^eps - 1)/(e^eps + 1)`` and ``pi2 = 1/2``.
    """
    return kary_rr(2, epsilon, labels=("no", "yes"))


def kary_rr(k: int, epsilon: float, labels: Sequence[str] | None = None) -> Mechanism:
    """Generalized (k-ary) randomized response over ``k`` values (e.g. none + V stations).

    Reports the truth w.p. ``e^eps/(e^eps + k - 1)`` and each other value w.p.
    ``1/(e^eps + k - 1)``. Latent form: truthful w.p. ``pi1 = (e^eps - 1)/(e^eps + k - 1)``,
    else uniform over all k values -- the same output table, and only the truthful face
    depends on the truth, which keeps the exact tally O(k).
    """
    if k < 2:
        raise ValueError("k-ary randomized response needs k >= 2")
    eps = float(epsilon)
    if not np.isfinite(eps) or eps < 0:
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    pi1 = float(np.expm1(eps) / (np.exp(eps) + k - 1))
    labels_t = tuple(labels) if labels is not None else tuple(str(i) for i in range(k))
    latent = np.concatenate([[pi1], np.full(k, (1 - pi1) / k)])[None, :]
    return _TruthOrFixed(
        name="rr_kary" if k > 2 else "rr_eps",
        truth_labels=labels_t,
        output_labels=labels_t,
        face_labels=("truthful", *(f"uniform_{i}" for i in range(k))),
        latent=latent,
        n_rounds=1,
        params={"epsilon": eps, "k": float(k), "pi1": pi1},
        station_valued=True,
        truth_dependent_faces=(0,),
        fixed=np.concatenate([[0], np.arange(k)]).astype(np.int64),
    )


class _SamplingPrivacy(Mechanism):
    """Faces ``0..V`` report themselves in both rounds; face ``S = V+1`` reports 0 in
    round 1 and the truth in round 2 (Differential Privacy by Sampling §4.1, §4.2)."""

    def emit(self, r: int, faces: IntArray, truths: IntArray) -> IntArray:
        sampled = faces == self.n_faces - 1
        # branch-free: face S reports 0 (round 1) or the truth (round 2)
        out: IntArray = faces + (truths - faces) * sampled if r == 1 else faces * ~sampled
        return out


def sampling_privacy(
    n_stations: int, pis: float = 0.45, pi: Sequence[float] | None = None
) -> Mechanism:
    """Sampling Privacy over ``V = n_stations`` stations (Differential Privacy by Sampling §4.2).

    One die per vehicle per epoch with faces ``v`` (prob ``pi[v]``, v = 0..V) and ``S``
    (prob ``pis``); ``sum(pi) + pis = 1``; default ``pi[v] = (1 - pis)/(V + 1)``.
    There are V + 1 outputs (the paper's "V + 2 outputs" counts die faces).
    """
    if n_stations < 1:
        raise ValueError("Sampling Privacy needs at least one station")
    pis = _check_prob("pis", pis)
    v1 = n_stations + 1
    pis_arr = np.full(v1, (1.0 - pis) / v1) if pi is None else np.asarray(pi, dtype=np.float64)
    if pis_arr.shape != (v1,):
        raise ValueError(f"pi must have V + 1 = {v1} entries (index 0 = no station)")
    if np.any(pis_arr <= 0):
        raise ValueError("every pi_v must be > 0 (a zero face makes epsilon infinite)")
    if abs(float(pis_arr.sum()) + pis - 1.0) > 1e-9:
        raise ValueError(f"sum(pi) + pis must be 1, got {float(pis_arr.sum()) + pis}")
    labels = ("none", *(f"s{v}" for v in range(1, v1))) if n_stations > 1 else ("no", "yes")
    params = {"pis": pis, **({"pi0": float(pis_arr[0])} if n_stations == 1 else {})}
    if n_stations > 1:
        params["V"] = float(n_stations)
    return _SamplingPrivacy(
        name="sp_binary" if n_stations == 1 else "sp",
        truth_labels=labels,
        output_labels=labels,
        face_labels=(*labels, "S"),
        latent=np.append(pis_arr, pis)[None, :],
        n_rounds=2,
        params=params,
        station_valued=True,
        truth_dependent_faces=(v1,),
    )


def sp_binary(pi0: float = 0.275, pis: float = 0.45) -> Mechanism:
    """Binary Sampling Privacy (Differential Privacy by Sampling §4.1): faces 0 (``pi0``), S (``pis``),
    1 (``1 - pi0 - pis``). Defaults: the paper's ``pis = 0.45`` and ``pi0`` splitting the
    rest evenly (the paper gives no ``pi0``).

    Round 1 says nothing about the truth; in round 2 a Yes owner says "Yes" ``pis`` more
    often than a No owner, so the rounds' difference counts Yes owners, scaled by ``pis``:

    >>> m = sp_binary()  # pi0 = 0.275, pis = 0.45
    >>> m.output_table(0).round(3).tolist()  # round 1, rows: truth No, Yes
    [[0.725, 0.275], [0.725, 0.275]]
    >>> m.output_table(1).round(3).tolist()  # round 2
    [[0.725, 0.275], [0.275, 0.725]]
    """
    pi0 = _check_prob("pi0", pi0)
    pis = _check_prob("pis", pis)
    if pi0 + pis >= 1.0:
        raise ValueError("pi0 + pis must be < 1")
    return sampling_privacy(1, pis, [pi0, 1.0 - pi0 - pis])


class _IndexedFaces(Mechanism):
    """Faces are mixed-radix tuples of the per-round reports (fresh coins per round)."""

    def emit(self, r: int, faces: IntArray, truths: IntArray) -> IntArray:
        o = self.n_outputs
        shift = o ** (self.n_rounds - 1 - r)
        out: IntArray = np.broadcast_to((faces // shift) % o, np.broadcast_shapes(faces.shape, truths.shape))
        return out


def fresh_sample(
    pisYes1: float = 0.5,  # noqa: N803 - the papers' parameter names
    pisNo1: float = 0.05,  # noqa: N803
    pisYes2: float = 0.05,  # noqa: N803
    pisNo2: float = 0.05,  # noqa: N803
) -> Mechanism:
    """Two-round fresh-sample variant (Towards Scaling Privacy Strength): round r reports 1 w.p. ``pisYes_r``
    (Yes owner) or ``pisNo_r`` (No owner), with fresh coins each round.

    The poster gives no evaluation values; the defaults are this project's choice.
    """
    p = {k: _check_prob(k, v) for k, v in
         {"pisYes1": pisYes1, "pisNo1": pisNo1, "pisYes2": pisYes2, "pisNo2": pisNo2}.items()}
    if abs(p["pisYes1"] - p["pisYes2"] - (p["pisNo1"] - p["pisNo2"])) < 1e-12:
        raise ValueError("pisYes1 - pisYes2 must differ from pisNo1 - pisNo2")

    def row(q1: float, q2: float) -> list[float]:
        return [(1 - q1) * (1 - q2), (1 - q1) * q2, q1 * (1 - q2), q1 * q2]

    latent = np.array([row(p["pisNo1"], p["pisNo2"]), row(p["pisYes1"], p["pisYes2"])])
    return _IndexedFaces(
        name="fresh",
        truth_labels=("no", "yes"),
        output_labels=("0", "1"),
        face_labels=("00", "01", "10", "11"),
        latent=latent,
        n_rounds=2,
        params=p,
    )


class _TableMechanism(Mechanism):
    """Faces are the outputs: the die is the output table itself."""

    def emit(self, r: int, faces: IntArray, truths: IntArray) -> IntArray:
        out: IntArray = np.broadcast_to(faces, np.broadcast_shapes(faces.shape, truths.shape))
        return out


def table_mechanism(
    name: str, table: FloatArray, params: Mapping[str, float],
    truth_labels: tuple[str, ...] = ("no", "yes"),
    output_labels: tuple[str, ...] = ("0", "1", "⊥"),
) -> Mechanism:
    """A one-round mechanism given directly by its output table ``(T, O)``."""
    return _TableMechanism(
        name=name,
        truth_labels=truth_labels,
        output_labels=output_labels,
        face_labels=output_labels,
        latent=np.asarray(table, dtype=np.float64),
        n_rounds=1,
        params=params,
    )


def alp_sampling_noise(pisYes: float = 0.05, pisNo: float = 0.05) -> Mechanism:  # noqa: N803
    """ALP toy "sampling and noise" (Anonymized Local Privacy eq. 2): report the truth w.p. ``pi_s``, else ⊥."""
    y, n = _check_prob("pisYes", pisYes), _check_prob("pisNo", pisNo)
    table = np.array([[n, 0.0, 1 - n], [0.0, y, 1 - y]])
    return table_mechanism("alp_sampling_noise", table, {"pisYes": y, "pisNo": n})


def alp_plausible_deniability(
    pisYes: float = 0.1, pisNo: float = 0.05, pi1: float = 0.95, pi2: float = 0.98  # noqa: N803
) -> Mechanism:
    """ALP toy "sampling and plausible deniability" (Anonymized Local Privacy eqs. 3-4, the same as
    Differential Privacy by Sampling §3.3)."""
    y, n = _check_prob("pisYes", pisYes), _check_prob("pisNo", pisNo)
    p1, p2 = _check_prob("pi1", pi1), _check_prob("pi2", pi2)
    yes1 = y * (p1 + (1 - p1) * p2)
    no1 = n * (1 - p1) * p2
    table = np.array([[n - no1, no1, 1 - n], [y - yes1, yes1, 1 - y]])
    return table_mechanism("alp_plausible_deniability", table, {"pisYes": y, "pisNo": n, "pi1": p1, "pi2": p2})


def alp_optimal(
    pisYes1: float = 0.05,  # noqa: N803
    pisYes2: float = 0.05,  # noqa: N803
    pi1: float = 0.95,
    pi2: float = 0.98,
    pisNo: float = 0.05,  # noqa: N803
    pi3: float = 0.98,
) -> Mechanism:
    """The optimal Anonymized Local Privacy mechanism (Anonymized Local Privacy eqs. 6-7).

    Yes owner: 1 w.p. ``a = pisYes1*pi1 + pisYes2*pi2``, 0 w.p.
    ``pisYes1*(1-pi1) + pisYes2*(1-pi2)``, ⊥ otherwise. No owner: 1 w.p. ``b = pisNo*pi3``,
    0 w.p. ``pisNo*(1-pi3)``, ⊥ otherwise. Defaults: the paper's evaluation values (§VII-A);
    the paper varies ``pisNo`` from 0.05 down to 0.000025 as the population grows.

    >>> alp_optimal().output_table().round(4).tolist()  # rows: truth No, Yes; columns: 0, 1, ⊥
    [[0.001, 0.049, 0.95], [0.0035, 0.0965, 0.9]]
    """
    p = {k: _check_prob(k, v) for k, v in {"pisYes1": pisYes1, "pisYes2": pisYes2, "pi1": pi1,
                                           "pi2": pi2, "pisNo": pisNo, "pi3": pi3}.items()}
    if p["pisYes1"] + p["pisYes2"] > 1.0:
        raise ValueError("pisYes1 + pisYes2 must be <= 1")
    a = p["pisYes1"] * p["pi1"] + p["pisYes2"] * p["pi2"]
    yes0 = p["pisYes1"] * (1 - p["pi1"]) + p["pisYes2"] * (1 - p["pi2"])
    b = p["pisNo"] * p["pi3"]
    no0 = p["pisNo"] * (1 - p["pi3"])
    table = np.array([[no0, b, 1 - p["pisNo"]], [yes0, a, 1 - p["pisYes1"] - p["pisYes2"]]])
    return table_mechanism("alp", table, p)


# ---------------------------------------------------------------------------------------
# One binary mechanism asked about each of V stations (ALP, two-coin RR over stations)
# ---------------------------------------------------------------------------------------
