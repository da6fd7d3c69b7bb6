"""The mechanism registry: one frozen spec per mechanism that every layer iterates.

Modelled on PipelineDP's combiners: a :class:`MechanismSpec` owns everything that depends on
*which* mechanism a query runs -- its parameters and defaults, how a device builds it for
``V`` stations, its rounds, its wire layout and count width, how reports become count
arrays (:meth:`MechanismSpec.accumulate`, merged by addition), how the implied default
reports are filled in (:meth:`MechanismSpec.complete`), its estimators and headline, its
epsilon (of a device's whole report in an epoch), its extra statistics, and how it is
shown (its title, an estimator drawn next to the headline) and whether the demo runs it
(:func:`default_query_mechanisms`). Query validation, the fleet, the replay, the stream app,
the CLI, the report and the dashboards ask the registry; none of them compares or lists a
mechanism name.

Two shapes exist:

* **station-valued** (``per_sensor=False``): one report per vehicle per round names a
  station index ``0..V`` (Sampling Privacy). A round's counts have ``V + 1`` entries; on
  the wire, per vehicle: layout ``values``.
* **per-sensor** (``per_sensor=True``): a binary (No/Yes) mechanism asked about each of the
  ``V`` sensors (ALP, two-coin RR, the fresh-sample variant). A round's counts are
  ``V x O`` (row-major); per vehicle only the non-default ``(station, report)`` pairs travel
  (layout ``pairs``) and the default report is implied by the number of participants.

Both shapes also accept exact tallies (layout ``counts``).

Adding a mechanism = one :class:`MechanismSpec` in :data:`REGISTRY` (see the README).

>>> spec = get_spec("sp")
>>> spec.n_rounds, spec.per_sensor, spec.headline
(2, False, 'sp_difference')
>>> spec.width(spec.build({}, 3), 3)
4
>>> get_spec("nope")
Traceback (most recent call last):
...
estimators.registry.UnknownMechanism: unknown mechanism 'nope'; choose one of sp, sp-binary, alp, rr, unary, fresh, krr
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType
from typing import Literal

import numpy as np

import estimators.aggregate_multi as aggregate_multi
import estimators.figures as figures
import estimators.mechanisms as mechanisms  # the submodules, not through the package (no import cycle)
import estimators.privacy as privacy
import estimators.shuffle as shuffle

from ._types import IntArray
from .linear import LinearEstimator, alp_estimators, fresh_difference, rr_estimator, sp_difference, station_counts
from .mechanisms import Mechanism
from .per_station import PerStation
from .reports import Bitmaps, Counts, Pairs, Round, SpecError, Values

__all__ = ["AGGREGATE_N_CAP", "REGISTRY", "MechanismSpec", "PlanError", "SpecError", "UnknownMechanism",
           "all_estimator_names",
           "default_query_mechanisms", "get_spec", "mechanism_names"]

Layout = Literal["values", "pairs", "counts"]
#: the largest crowd a per-sensor aggregate release is accounted at (a larger one: at this many, valid)
AGGREGATE_N_CAP = aggregate_multi.TERNARY_N_CAP


class PlanError(ValueError):
    """A request that cannot be answered (unknown mechanism or parameter, bad value)."""


class UnknownMechanism(PlanError):
    """A mechanism name the registry does not hold: never a silent default."""


BuildFn = Callable[[Mapping[str, float], int], Mechanism]
EstimatorsFn = Callable[[Mechanism, "IntArray | None", tuple[float, float]], dict[str, LinearEstimator]]
ClosedFormFn = Callable[[Mechanism], float]
ExtraFn = Callable[[Mechanism, int], dict[str, float]]


def _no_extra(mech: Mechanism, participants: int) -> dict[str, float]:
    return {}


# MechanismSpec.shuffle_ratios, remembered per mechanism object: {(id(spec), stations): (spec, ratios)}
_Ratios = tuple[shuffle.VariationRatio, ...]
_RATIOS: weakref.WeakKeyDictionary[Mechanism, dict[tuple[int, int], tuple[MechanismSpec, _Ratios]]] = \
    weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class MechanismSpec:
    """Everything that depends on which mechanism a query runs (see the module doc).

    ``title``: what people read (dashboard panels; the name when empty). ``overlay``: an
    estimator drawn dotted next to the headline and its short label, e.g. ALP's
    ``("alp_gls", "GLS")``. ``default_query``: the demo and the deployment publish one query of
    it over every station (``producers.replay.default_queries``), and the station dashboard
    has a panel for it.
    """

    name: str
    summary: str
    defaults: Mapping[str, float]
    n_rounds: int
    per_sensor: bool
    estimator_names: tuple[str, ...]
    headline: str
    build_fn: BuildFn
    estimators_fn: EstimatorsFn
    closed_form_fn: ClosedFormFn
    extra_fn: ExtraFn = _no_extra
    extra_names: tuple[str, ...] = ()
    optional: frozenset[str] = frozenset()
    max_stations: int | None = None
    queryable: bool = True
    references: str = ""
    title: str = ""
    overlay: tuple[str, str] | None = None
    default_query: bool = False
    defaults_frozen: Mapping[str, float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.headline not in self.estimator_names:
            raise ValueError(f"{self.name}: headline {self.headline!r} is not one of its estimators")
        if self.overlay is not None and self.overlay[0] not in self.estimator_names:
            raise ValueError(f"{self.name}: overlay {self.overlay[0]!r} is not one of its estimators")
        object.__setattr__(self, "defaults_frozen", MappingProxyType(dict(self.defaults)))

    # -- parameters and construction -----------------------------------------------------
    def params(self, given: Mapping[str, float]) -> dict[str, float]:
        """The defaults overridden by ``given``; unknown names are a :class:`PlanError`."""
        allowed = set(self.defaults) | set(self.optional)
        unknown = sorted(set(given) - allowed)
        if unknown:
            raise PlanError(f"{self.name} takes parameters {', '.join(sorted(allowed))}; unknown: {', '.join(unknown)}")
        return {**self.defaults, **{k: float(v) for k, v in given.items()}}

    def build(self, given: Mapping[str, float], n_stations: int) -> Mechanism:
        """The mechanism a device runs for a query over ``n_stations`` sensors: station-valued
        over all of them, or the binary mechanism asked about each (per-sensor)."""
        if n_stations < 1:
            raise PlanError("a query needs at least one station")
        if self.max_stations is not None and n_stations > self.max_stations:
            raise PlanError(f"{self.name} takes at most {self.max_stations} station(s), got {n_stations}")
        p = self.params(given)
        try:
            return self.build_fn(p, n_stations)
        except PlanError:
            raise
        except ValueError as exc:
            raise PlanError(f"{self.name}: {exc}") from exc

    # -- wire layout and counts ------------------------------------------------------------
    @property
    def layout(self) -> Layout:
        """Per-vehicle wire layout (tallies always use ``counts``)."""
        return "pairs" if self.per_sensor else "values"

    def width(self, mech: Mechanism, n_stations: int) -> int:
        """Length of one round's count array: ``V + 1`` or ``V x O``."""
        return n_stations * mech.n_outputs if self.per_sensor else mech.n_outputs

    def default_report(self, mech: Mechanism) -> int | None:
        """The implied report of per-sensor mechanisms (most likely answer of a No vehicle)."""
        if not self.per_sensor:
            return None
        return _default_output(mech)

    def round_mechanisms(self, mech: Mechanism) -> tuple[Mechanism, ...]:
        """Per-sensor: one one-round binary mechanism per round (rounds must use fresh coins)."""
        if mech.n_rounds == 1:
            return (mech,)
        tables = [mech.output_table(r) for r in range(mech.n_rounds)]
        joint = mech.joint_table()
        product = tables[0]
        for t in tables[1:]:
            product = (product[:, :, None] * t[:, None, :]).reshape(product.shape[0], -1)
        if not np.allclose(joint, product, atol=1e-12):
            raise PlanError(f"{self.name}: a per-sensor mechanism's rounds must be independent")
        return tuple(mechanisms.table_mechanism(f"{mech.name}_r{r}", tables[r], {}, mech.truth_labels,
                                                mech.output_labels) for r in range(mech.n_rounds))

    def per_station(self, mech: Mechanism, n_stations: int) -> tuple[PerStation, ...]:
        """Per-sensor: the :class:`PerStation` sampler of each round."""
        return tuple(PerStation(m, n_stations) for m in self.round_mechanisms(mech))

    def accumulate(self, mech: Mechanism, n_stations: int, rnd: Round) -> IntArray:
        """One round's count array (``width`` entries, int64) from one record's round.

        :class:`Values`: station indices 0..V; :class:`Pairs`: non-default (station 1..V,
        report) pairs (:class:`Bitmaps`: their set bits, pairs (station, 1)); :class:`Counts`:
        an exact tally of ``n`` vehicles (each row must sum to it). Arrays must already be
        range-checked against ``n_stations``/``n_outputs`` (the wire does).
        :class:`SpecError` for a layout the mechanism cannot take.
        """
        o_n = mech.n_outputs
        width = self.width(mech, n_stations)
        if isinstance(rnd, Counts):
            c = np.asarray(rnd.counts, dtype=np.int64)
            if c.size != width:
                raise SpecError("wrong_layout", f"{c.size} counts for a {self.name} query of width {width}")
            rows = c.reshape(n_stations, o_n) if self.per_sensor else c.reshape(1, o_n)
            if np.any(rows.sum(axis=1) != rnd.n):
                raise SpecError("mismatched_sizes", f"tally rows must each sum to the {rnd.n} vehicles")
            return c
        if rnd.layout != self.layout:
            raise SpecError("wrong_layout", f"{rnd.layout} for a {self.name} query (per vehicle: {self.layout})")
        match rnd:
            case Values(value=value):
                return np.bincount(value, minlength=width).astype(np.int64)
            case Pairs(station=station, output=out):
                pass
            case Bitmaps():
                bits = rnd.sparse(np.zeros(0, np.int64), n_stations)
                station, out = bits.station, bits.output
        default = self.default_report(mech)
        if out.size and np.any(out == default):
            raise SpecError("out_of_range", f"pairs carry only non-default reports; {default} is the default")
        flat = (station - 1) * o_n + out
        return np.bincount(flat, minlength=width).astype(np.int64)

    def complete(self, mech: Mechanism, n_stations: int, counts: IntArray, participants: int) -> IntArray:
        """Per-station counts ``(V, R, O)`` for the estimators from the summed round counts
        ``(R, width)``.

        Per-sensor: every participant answers about every sensor in every round, so each
        station's row must sum to ``participants``; what per-vehicle pairs left implicit is
        the default report: ``participants - (row sum)``. (Callers check
        :meth:`impossible` first: a row above ``participants`` cannot be completed.)
        """
        c = np.asarray(counts, dtype=np.int64)
        if not self.per_sensor:
            return station_counts(mech, c)
        d = _default_output(mech)  # the default report
        out = c.reshape(self.n_rounds, n_stations, mech.n_outputs).copy()
        out[:, :, d] += participants - out.sum(axis=2)
        return np.transpose(out, (1, 0, 2))

    def row_totals(self, mech: Mechanism, n_stations: int, counts: IntArray) -> IntArray:
        """``(R, V)`` reports counted per round and station (per-sensor) or ``(R, 1)`` per round."""
        c = np.asarray(counts, dtype=np.int64)
        rows = n_stations if self.per_sensor else 1
        out: IntArray = c.reshape(self.n_rounds, rows, -1).sum(axis=2)
        return out

    # -- estimators, privacy, extras ----------------------------------------------------------
    def estimators(self, mech: Mechanism, stations: IntArray | None = None,
                   design: tuple[float, float] = (0.0, 1.0)) -> dict[str, LinearEstimator]:
        """The mechanism's estimators, headline included. ``stations`` (station-valued only):
        build for these station indices instead of all; ``design`` = (Yes, N) at which a
        combination estimator (ALP's GLS) chooses its weights."""
        ests = self.estimators_fn(mech, stations, design)
        if tuple(ests) != self.estimator_names:
            raise AssertionError(f"{self.name}: estimators {tuple(ests)} != declared {self.estimator_names}")
        return ests

    def closed_form_epsilon(self, mech: Mechanism) -> float:
        """The papers' closed form of the per-answer epsilon (NaN where they give none)."""
        return self.closed_form_fn(mech)

    def report_epsilon(self, mech: Mechanism, n_stations: int, passages: int = 1) -> float:
        """Epsilon of what one device sends in one round of an epoch (or a span): its whole report.

        Station-valued: one station index per round, so the largest per-round table epsilon
        (``passages`` must be 1: such a report names one station).
        Per-sensor: :func:`privacy.per_sensor_report_epsilon` (a move from station a to b
        flips two answers in opposite directions; a span report of up to ``passages`` stations
        flips up to ``2 x passages``).
        """
        if not self.per_sensor:
            if passages != 1:
                raise PlanError(f"{self.name} reports one station: it has no span report of {passages} passages")
            return self.answer_epsilon(mech)
        return max(privacy.per_sensor_report_epsilon(m.output_table(0), n_stations, passages)
                   for m in self.round_mechanisms(mech))

    def answer_epsilon(self, mech: Mechanism) -> float:
        """Epsilon of one answer (one sensor's report in one round): the brute force over each
        round's output table, the largest. (The linked-rounds figure is the planner's.)"""
        return max(privacy.local_epsilon(mech.output_table(r)) for r in range(mech.n_rounds))

    def shuffle_ratios(self, mech: Mechanism, n_stations: int) -> tuple[shuffle.VariationRatio, ...]:
        """Per round, the variation-ratio parameters of what one device sends (its whole report),
        the input of the shuffled accounting (:mod:`estimators.shuffle`). Rounds that share the
        device's randomness (Sampling Privacy's one die) cannot be accounted round by round: one
        ratio with ``p = inf`` then stands for the epoch, so every shuffled figure is infinite
        (:func:`privacy.rounds_independent` says why).

        Remembered per mechanism object (immutable) for as long as it lives: k-ary RR's over
        3,220 stations take ~1 s, and a plan or a figure per delta asks again."""
        per_mech = _RATIOS.setdefault(mech, {})
        hit = per_mech.get((id(self), n_stations))
        if hit is not None and hit[0] is self:
            return hit[1]
        ratios = self._shuffle_ratios(mech, n_stations)
        per_mech[(id(self), n_stations)] = (self, ratios)  # holding the spec: its id is not reused
        return ratios

    def _shuffle_ratios(self, mech: Mechanism, n_stations: int) -> tuple[shuffle.VariationRatio, ...]:
        if not privacy.rounds_independent(mech):
            return (shuffle.VariationRatio(math.inf, 1.0, math.inf),)
        if self.per_sensor:
            return tuple(shuffle.per_sensor_variation_ratio(m.output_table(0), n_stations)
                         for m in self.round_mechanisms(mech))
        return tuple(shuffle.variation_ratio(mech.output_table(r)) for r in range(mech.n_rounds))

    def shuffled_epsilon(self, mech: Mechanism, n_stations: int, n: int, delta: float = 1e-6,
                         release: str = "permuted") -> float:
        """Central epsilon at ``delta`` of one epoch whose reports were each shuffled among ``n``
        (every round its own shuffle); the trust assumption is :data:`shuffle.TRUST_ASSUMPTION`.

        ``release``: ``"permuted"`` (the reports, permuted: the clone bound) or ``"aggregate"``
        (only the counts: :mod:`estimators.aggregate`, exact where :meth:`aggregate_plds` is,
        else the permuted figure, valid by post-processing). The aggregate figure is computed
        at ``n`` rounded down to two significant digits (cached; a smaller shuffle is a valid,
        slightly looser bound, since adding devices only post-processes the counts)."""
        if release not in ("permuted", "aggregate"):
            raise PlanError(f"unknown release {release!r}; choose permuted or aggregate")
        return figures.epoch_epsilon(self, mech, n_stations, _two_digits(n) if release == "aggregate" else n,
                                     release, delta)

    def aggregate_plds(self, mech: Mechanism, n_stations: int, n: int,
                       stride: int | None = None, probe: bool = False) -> list[shuffle.Pld] | None:
        """One epoch's dominating PLDs of the aggregate release at ``n`` devices, worst case over
        the other devices' data. Per-sensor (binary or three report values, e.g. ALP): per round,
        the two stations a move changes (:mod:`estimators.aggregate`,
        :mod:`estimators.aggregate_multi`); k-ary RR's histogram: one PLD through the privacy
        blanket (:func:`aggregate_multi.kary_histogram_pld`). ``None`` where no such accounting
        exists (Sampling Privacy's rounds share one die; other tables): then the clone bound of
        the permuted release applies. ``stride``: see :func:`aggregate.covering_ks` (1: every
        assignment of the others searched directly); ``probe``: three report values' lower
        bound (:func:`aggregate_multi.ternary_station_pld`), a search's quick rejection only.

        A three-valued (ALP) crowd above :data:`AGGREGATE_N_CAP` is accounted at the cap, and a
        binary one at :func:`aggregate_multi.binary_crowd`: the release among more devices is a
        post-processing of the release among fewer (the adversary adds the extra devices'
        independent answers, as in :func:`aggregate.covering_ks`), so the figure is a valid,
        slightly looser bound, and a plan at ten million devices takes seconds instead of minutes
        (the windows grow with the crowd). A binary answer at ten million devices and a flip
        probability of 1e-4 is accounted among all of them: its noise is what a day cap buys."""
        if self.per_sensor:
            tables = tuple(m.output_table(0) for m in self.round_mechanisms(mech))
            return aggregate_multi.per_sensor_epoch_plds(tables, int(n), stride, probe)
        if mech.n_rounds != 1:
            return None
        rates = aggregate_multi.kary_rates(mech.output_table(0))
        if rates is None:
            return None
        return [aggregate_multi.kary_histogram_pld(rates[0], rates[1], max(int(n), 1))]

    def extra_statistics(self, mech: Mechanism, participants: int) -> dict[str, float]:
        """Mechanism-specific statistics of a closed epoch (ALP: Haystack crowd size)."""
        return self.extra_fn(mech, participants)


def _two_digits(n: int) -> int:
    """``n`` rounded down to two significant digits (at least 1).

    >>> _two_digits(47_719), _two_digits(99), _two_digits(0)
    (47000, 99, 1)
    """
    if n < 100:
        return max(int(n), 1)
    scale = 10 ** (len(str(int(n))) - 2)
    return int(n) // int(scale) * int(scale)


@lru_cache(maxsize=256)
def _default_output(mech: Mechanism) -> int:
    """The most likely report of a No vehicle (cached: a query builds its mechanism once)."""
    return int(np.argmax(mech.output_table(0)[0]))


# -- the specs -----------------------------------------------------------------------------
def _build_sp(p: Mapping[str, float], v: int) -> Mechanism:
    pi = None
    if "pi0" in p:  # baseline face given: the rest split evenly over the stations
        rest = (1.0 - p["pis"] - p["pi0"]) / v
        pi = [p["pi0"], *([rest] * v)]
    return mechanisms.sampling_privacy(v, p["pis"], pi)


def _sp_closed(m: Mechanism) -> float:
    return privacy.sp_epsilon_closed_form(m.latent[0, :-1].tolist(), m.params["pis"])


def _alp_crowd(m: Mechanism, participants: int) -> dict[str, float]:
    crowd = privacy.crowd_size(participants, m.params["pisNo"], m.params["pi3"])
    return {"mean": crowd.mean, "p01": crowd.p01}


_SPECS = (
    MechanismSpec(
        name="sp", summary="Sampling Privacy over the sensors: one die, two rounds, difference estimator",
        defaults={"pis": 0.45}, optional=frozenset({"pi0"}), n_rounds=2, per_sensor=False,
        estimator_names=("sp_difference",), headline="sp_difference",
        build_fn=_build_sp, estimators_fn=lambda m, st, d: {"sp_difference": sp_difference(m, st)},
        closed_form_fn=_sp_closed, references="Differential Privacy by Sampling §4.2, eqs. 16 and 29",
        # opt-in (--query-mechanisms): its two rounds share one die, so no shuffled or whole-day bound exists
        title="Sampling Privacy"),
    MechanismSpec(
        name="sp-binary", summary="binary Sampling Privacy (one sensor): faces 0, S, 1",
        defaults={"pi0": 0.275, "pis": 0.45}, n_rounds=2, per_sensor=False, max_stations=1,
        estimator_names=("sp_difference",), headline="sp_difference",
        build_fn=lambda p, v: mechanisms.sp_binary(p["pi0"], p["pis"]),
        estimators_fn=lambda m, st, d: {"sp_difference": sp_difference(m, st)},
        closed_form_fn=lambda m: privacy.sp_binary_epsilon_closed_form(m.params["pi0"], m.params["pis"]),
        references="Differential Privacy by Sampling §4.1, eqs. 11, 21 and 25", title="binary Sampling Privacy"),
    MechanismSpec(
        name="alp", summary="Anonymized Local Privacy (optimal Yes/No/⊥) asked about each sensor",
        defaults={"pisYes1": 0.05, "pisYes2": 0.05, "pi1": 0.95, "pi2": 0.98, "pisNo": 0.05, "pi3": 0.98},
        n_rounds=1, per_sensor=True,
        estimator_names=("alp_yhat", "alp_bottom", "alp_average", "alp_gls"), headline="alp_average",
        build_fn=lambda p, v: mechanisms.alp_optimal(p["pisYes1"], p["pisYes2"], p["pi1"], p["pi2"], p["pisNo"],
                                                     p["pi3"]),
        estimators_fn=lambda m, st, d: alp_estimators(m, design_yes=d[0], design_n=d[1]),
        closed_form_fn=lambda m: privacy.alp_epsilon_closed_form(**m.params),
        extra_fn=_alp_crowd, extra_names=("mean", "p01"), references="Anonymized Local Privacy §V, eqs. 6-11",
        # a default: the papers' headline estimator, with a finite day through the shuffler's release
        title="ALP", overlay=("alp_gls", "GLS"), default_query=True),
    MechanismSpec(
        name="rr", summary="two-coin randomized response asked about each sensor (the baseline)",
        defaults={"pi1": 0.8, "pi2": 0.2}, n_rounds=1, per_sensor=True,
        estimator_names=("rr",), headline="rr",
        build_fn=lambda p, v: mechanisms.two_coin_rr(p["pi1"], p["pi2"]),
        estimators_fn=lambda m, st, d: {"rr": rr_estimator(m)},
        closed_form_fn=lambda m: privacy.rr_epsilon_closed_form(m.params["pi1"], m.params["pi2"]),
        references="Differential Privacy by Sampling §1 and App. A, eq. 30; Gaboardi's lecture notes",
        # not a default: within a day budget its best member is symmetric unary RR (pi2 = 1/2), so a
        # third query would repeat unary's estimate at a third of the budget instead of a half
        title="Randomized response"),
    MechanismSpec(
        name="unary", summary="symmetric unary randomized response: each sensor's truth bit flipped w.p. q",
        defaults={"q": 0.2}, n_rounds=1, per_sensor=True,
        estimator_names=("unary",), headline="unary",
        build_fn=lambda p, v: mechanisms.symmetric_unary(p["q"]),
        estimators_fn=lambda m, st, d: {"unary": rr_estimator(m, name="unary")},
        closed_form_fn=lambda m: math.log((1 - m.params["q"]) / m.params["q"]),
        references="Wang et al., Locally Differentially Private Protocols for Frequency Estimation "
                   "(symmetric unary encoding)",
        # a default: the accurate one (within ~2% of a trusted curator's sd at a whole-day budget)
        title="Symmetric unary RR", default_query=True),
    MechanismSpec(
        name="fresh", summary="two-round fresh-sample variant asked about each sensor (a baseline)",
        defaults={"pisYes1": 0.5, "pisNo1": 0.05, "pisYes2": 0.05, "pisNo2": 0.05}, n_rounds=2, per_sensor=True,
        estimator_names=("fresh_difference",), headline="fresh_difference",
        build_fn=lambda p, v: mechanisms.fresh_sample(p["pisYes1"], p["pisNo1"], p["pisYes2"], p["pisNo2"]),
        estimators_fn=lambda m, st, d: {"fresh_difference": fresh_difference(m)},
        closed_form_fn=lambda m: float("nan"),  # the poster gives none
        references="Towards Scaling Privacy Strength", title="Fresh-sample variant"),
    MechanismSpec(
        # epsilon 1.31 by default: ALP's report epsilon at its default parameters (1.307: a
        # device's whole report), so that `ptt plan krr` and `ptt plan alp` compare at equal privacy
        name="krr", summary="k-ary (generalized) randomized response over the sensors: one report, k = V + 1 values",
        defaults={"epsilon": 1.31}, n_rounds=1, per_sensor=False,
        estimator_names=("krr",), headline="krr",
        build_fn=lambda p, v: mechanisms.kary_rr(v + 1, p["epsilon"]),
        estimators_fn=lambda m, st, d: {"krr": rr_estimator(m, st, name="krr")},
        closed_form_fn=lambda m: m.params["epsilon"],
        references="Kairouz, Oh and Viswanath, Extremal mechanisms for local differential privacy; "
                   "Gaboardi's lecture notes",
        title="k-ary randomized response"),
)

REGISTRY: Mapping[str, MechanismSpec] = MappingProxyType({s.name: s for s in _SPECS})


def mechanism_names(queryable_only: bool = False) -> tuple[str, ...]:
    """Registered mechanism names, in registry order."""
    return tuple(n for n, s in REGISTRY.items() if s.queryable or not queryable_only)


def default_query_mechanisms() -> tuple[str, ...]:
    """The mechanisms the demo's default queries run, in registry order: those with a finite
    whole-day bound through the shuffler's release (Sampling Privacy has none: opt in with
    ``--query-mechanisms``).

    >>> default_query_mechanisms()
    ('alp', 'unary')
    """
    return tuple(n for n, s in REGISTRY.items() if s.default_query)


def get_spec(name: str) -> MechanismSpec:
    """The spec of ``name``; :class:`UnknownMechanism` (a clear error) otherwise."""
    spec = REGISTRY.get(name)
    if spec is None:
        raise UnknownMechanism(f"unknown mechanism {name!r}; choose one of {', '.join(REGISTRY)}")
    return spec


def all_estimator_names() -> tuple[str, ...]:
    """Every estimator name of every mechanism (the estimate schema's enum)."""
    seen: dict[str, None] = {}
    for spec in REGISTRY.values():
        for n in spec.estimator_names:
            seen[n] = None
    return tuple(seen)
