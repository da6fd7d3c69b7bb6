"""The simulated fleet: who is where each epoch, and what each device sends. Pure, seeded.

Vehicles have virtual identities only inside this module (positions in an array that is
shuffled every epoch); nothing that leaves it can name or link a vehicle. Every draw comes
from a generator seeded by (seed, query, version, epoch, producer), so a replay can be
reproduced and checked against the statistics core directly.

A span query's vehicles keep their identity through the span (:mod:`producers.spans`); each
device's one report of the span privatizes the set of stations it passed (:func:`privatize` of
a :class:`~estimators.per_station.StationSets` truth). **The cap and its bias**: a query's
``passages`` (P, ``max_passages``) caps the stations one report names; a vehicle that passed
more of the query's stations reports a uniformly random P of them
(:func:`producers.spans.cap_passages`). The dropped passages are missing from the truth the
devices privatize, so a station's estimated span flow is biased low: E[estimate] = F_s - D_s,
where D_s is the expected dropped passages of station s -- each vehicle with k > P passages
that passed s drops it with chance (k - P) / k. The total dropped is exactly sum over vehicles
of max(0, k - P) (what ``cap_passages`` returns and the replay's summary counts as
``passages_dropped``); per station it is measured by comparing the set truths' Yes counts
before and after the cap, or the estimates against the ground truth (the sum of the 30-s truth
over the span). At the default P (one per epoch of the span) nothing is dropped: a vehicle
passes at most one station an epoch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from estimators import DayLedger, audit_query
from estimators.ledger import ShuffledDayLedger, report_charge
from estimators.per_station import PerStation, StationCounts, StationSets, Truth, YesCounts
from estimators.reports import Bitmaps, Counts, Pairs, Round, Values
from schemas import Query

__all__ = ["Device", "EpochReports", "FleetTooSmall", "charge", "epoch_rng", "fleet_share", "privatize",
           "query_truth_counts", "split_fleet"]

IntArray = npt.NDArray[np.int64]


class FleetTooSmall(ValueError):
    """The fleet cannot hold the vehicles the data puts at stations in some epoch."""


def fleet_share(fleet_size: int, index: int, count: int) -> int:
    """Vehicles owned by producer ``index`` of ``count`` (the first ones take the remainder)."""
    base, extra = divmod(fleet_size, count)
    return base + (1 if index < extra else 0)


def split_fleet(seed: int, epoch: int, flows: IntArray, fleet_size: int, producer_count: int) -> IntArray:
    """How many of each producer's vehicles are at each station: ``(producers, 1 + stations)``.

    Column 0 counts vehicles at none of the data's stations. Every producer process computes
    the same split (a seeded multivariate hypergeometric draw), then samples only its own row.
    """
    flows = np.asarray(flows, dtype=np.int64)
    at_stations = int(flows.sum())
    if at_stations > fleet_size:
        raise FleetTooSmall(f"epoch {epoch}: {at_stations} vehicles at stations but the fleet has {fleet_size}; "
                            f"use a fleet of at least the day's peak total flow")
    colors = np.concatenate([[fleet_size - at_stations], flows])
    rng = np.random.default_rng([seed, epoch, 0x5_1217])
    out = np.zeros((producer_count, colors.size), dtype=np.int64)
    remaining = colors.copy()
    for k in range(producer_count - 1):
        take = fleet_share(fleet_size, k, producer_count)
        out[k] = rng.multivariate_hypergeometric(remaining, take) if take else 0
        remaining -= out[k]
    out[-1] = remaining
    return out


def query_truth_counts(producer_row: IntArray, data_stations: IntArray, query: Query) -> IntArray:
    """Truth counts ``(V + 1,)`` in the query's station order; index 0 = at none of its sensors
    (elsewhere, at a station the query does not monitor, or at none at all)."""
    position = {int(s): j for j, s in enumerate(data_stations)}
    counts = np.zeros(query.n_stations + 1, dtype=np.int64)
    for i, sensor in enumerate(query.sensors):
        j = position.get(sensor)
        if j is not None:
            counts[i + 1] = producer_row[j + 1]
    counts[0] = int(producer_row.sum()) - int(counts[1:].sum())
    return counts


def epoch_rng(seed: int, query: Query, epoch: int, producer_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(query.query_id.encode()), query.version, epoch, producer_index])


@dataclass(frozen=True)
class Device:
    """What every simulated device is configured to accept (Anonymized Local Privacy §IV-B query audit)."""

    epsilon_limit: float = 10.0
    blacklist: frozenset[int] = frozenset()
    day_caps: bool = False  # whether it keeps a day's count of passages named (a fleet that drives all day)

    def accepts(self, query: Query) -> tuple[bool, str | None]:
        """The audit of ``epsilon_limit`` is per epoch: a span report (up to ``passages`` stations
        over ``epochs_per_span`` epochs) is held to it at its epsilon per epoch it covers. A query
        with a day cap is refused by a device that cannot keep it (its vehicle has no day's
        identity, or the query is a 30-s one, whose cap the simulation does not keep yet)."""
        if query.max_passages_day is not None and not (self.day_caps and query.is_span):
            return False, (f"a day cap of {query.max_passages_day} passages this device cannot keep (it needs a "
                           f"span query and a fleet that drives all day, --fleet-model trips)")
        result = audit_query(query.epsilon / query.epochs_per_span, query.sensors, self.epsilon_limit,
                             self.blacklist)
        return result.accepted, result.reason


@dataclass
class EpochReports:
    """What one producer sends for one query and epoch.

    ``rounds[r]`` is round r (:mod:`estimators.reports`): :class:`~estimators.reports.Values`
    for a station-valued mechanism, :class:`~estimators.reports.Pairs` for a per-sensor one
    (both the query's per-vehicle layout, ``MechanismSpec.layout``), :class:`~estimators.reports.Counts`
    in tally mode, or :class:`~estimators.reports.Bitmaps` (the device path's bit-valued round,
    :func:`privatize`); none when refused. ``reports[r]`` is how many reports (tally: vehicles)
    the round stands for.

    ``vehicles[r]`` (per-vehicle mode): the simulated vehicle behind each report of round r,
    in sending order -- its index in this producer's shuffled truths of the epoch. Device side
    only, like ``SparseReports.vehicle``: it never leaves the simulator; tests follow a vehicle
    onto the wire with it.
    """

    participants: int
    refused: int
    refusal_reason: str | None
    rounds: list[Round] = field(default_factory=list)
    vehicles: list[IntArray] = field(default_factory=list)

    @property
    def reports(self) -> list[int]:
        return [rnd.n_reports for rnd in self.rounds]


def charge(ledger: DayLedger | ShuffledDayLedger, day: str, query: Query) -> bool:
    """Charge one report of ``query`` to a device's ledger (call it once per report: per epoch for a
    30-s query, per span for a span query): every round composed, the whole span report of up to
    ``query.passages`` stations (:func:`estimators.ledger.report_charge`); through the shuffler,
    the PLD of the release the query fixes, or of the permuted release when it fixes none, at the
    shuffler's min_crowd. False: it would exceed the budget."""
    if isinstance(ledger, ShuffledDayLedger):
        return ledger.spend(day, query.record_key, query.spec, query.build(), query.n_stations,
                            passages=query.passages, span_s=query.span_s, release=query.release,
                            day_cap=query.max_passages_day)
    return ledger.spend(day, report_charge(query.spec, query.build(), query.n_stations, query.passages))


def _opened(query: Query, n: int, mode: str, device: Device, ledger: DayLedger | ShuffledDayLedger | None,
            day: str) -> EpochReports:
    """A report's audit and its charge to the ledger (once per report: an epoch's, or a span's):
    the refused reports, or an empty one to fill."""
    ok, reason = device.accepts(query)
    if ok and ledger is not None and not charge(ledger, day, query):
        ok, reason = False, (f"daily privacy budget: answering would take the day's epsilon over "
                             f"{ledger.budget:g} (spent {ledger.total(day):.4g})")
    if not ok:
        return EpochReports(participants=0, refused=n, refusal_reason=reason)
    if mode not in ("tally", "per-vehicle"):
        raise ValueError(f"unknown mode {mode!r}")
    return EpochReports(participants=n, refused=0, refusal_reason=None)


def privatize(query: Query, truth: Truth, rng: np.random.Generator, mode: str, device: Device,
              ledger: DayLedger | ShuffledDayLedger | None = None, day: str = "",
              mix_pairs: bool = True) -> EpochReports:
    """Run every device of one producer for one report of ``query``: each vehicle privatizes its
    own part of ``truth``, by its type --

    * :class:`~estimators.per_station.StationCounts`: a 30-s epoch's, each vehicle at one
      station or none (:func:`query_truth_counts`); the vehicles' order is re-drawn every epoch.
    * :class:`~estimators.per_station.StationSets`: a span's, each vehicle's set of stations
      (:meth:`SpanFleet.passages <producers.spans.SpanFleet.passages>`, in the query's order,
      capped: :func:`~producers.spans.cap_passages`), whose order is already re-drawn per span;
      a per-sensor ``query`` only. A station in the set answers from the Yes row, every other
      from the No row.
    * :class:`~estimators.per_station.YesCounts`: a span's sets tallied, tally mode only -- the
      same draws as their :class:`~estimators.per_station.StationSets` in tally mode, when the
      sets need not be read (no cap binds).

    Per-vehicle mode: each round's reports are shuffled independently (no position links a
    vehicle's two rounds), and per-sensor mechanisms send only the non-default (station,
    report) pairs, shuffled across vehicles. Tally mode: the exact-tally path of the statistics
    core (a set truth's per station: its span flow's Yes answers and the other vehicles' No
    answers, :meth:`~estimators.PerStation.tally` ``multi_hot``).

    With a ``ledger`` (the devices' daily privacy budget, :func:`charge`), a query whose report
    would take ``day``'s composed epsilon over the budget is refused, like an audit refusal: it
    is charged once per report (an epoch's, or a span's).

    ``mix_pairs=False`` (the device path, ``--via-shuffler``: every device sends its own record,
    and the shuffler mixes them) leaves per-sensor pairs grouped by vehicle instead of
    shuffling ~10^8 pairs only for the device path to group them again. A permutation an
    earlier round's draws are followed by is still drawn, so every round's pairs are the direct
    path's; the last round's is not (``rng`` is the report's own: nothing after it draws from it).
    Every round of a bit-valued mechanism (unary RR, per-sensor RR, fresh) whose bitmaps are
    the smaller encoding (:meth:`~estimators.PerStation.sparse_bits`: by its expected number of
    ones) comes as :class:`~estimators.reports.Bitmaps`, one row of bits per vehicle
    (:meth:`~estimators.PerStation.sample_bits`: the same draws), its reports its set bits, the
    direct path's pairs; one with few expected ones (unary RR at q = 1.7e-4 over 3,220
    stations: ~0.5 noise bits a report) comes as its pairs, station ids, grouped by vehicle.
    """
    match truth:
        case StationCounts():
            return _privatize_counts(query, truth.counts, rng, mode, device, ledger, day, mix_pairs)
        case StationSets():
            return _privatize_sets(query, truth, rng, mode, device, ledger, day, mix_pairs)
        case YesCounts():
            return _privatize_yes(query, truth, rng, mode, device, ledger, day)
        case _:
            raise TypeError(f"a truth is StationCounts, StationSets or YesCounts, not {type(truth).__name__}")


def _privatize_counts(query: Query, truth_counts: IntArray, rng: np.random.Generator, mode: str, device: Device,
                      ledger: DayLedger | ShuffledDayLedger | None, day: str, mix_pairs: bool) -> EpochReports:
    """:func:`privatize` of a 30-s truth (vehicles per station index, 0 = at none)."""
    n = int(truth_counts.sum())
    out = _opened(query, n, mode, device, ledger, day)
    if out.refused:
        return out
    samplers = query.per_station  # per-sensor mechanisms: one sampler per round
    if mode == "tally":
        if samplers is None:
            counts = query.build().tally(rng, truth_counts)
            out.rounds = [Counts(counts[r], n) for r in range(query.n_rounds)]
        else:
            out.rounds = [Counts(ps.tally(rng, truth_counts[1:], n).ravel(), n) for ps in samplers]
        return out
    truths = np.repeat(np.arange(truth_counts.size, dtype=np.int64), truth_counts)
    rng.shuffle(truths)  # virtual identities: a vehicle is a position, re-drawn every epoch
    if samplers is None:
        reports = query.build().sample(rng, truths)
        out.vehicles = [rng.permutation(n) for _ in range(query.n_rounds)]  # one shuffle per round
        out.rounds = [Values(reports[r][out.vehicles[r]]) for r in range(query.n_rounds)]
        return out
    _per_sensor_rounds(out, samplers, rng, StationSets.of_truths(truths), mix_pairs)
    return out


def _privatize_sets(query: Query, sets: StationSets, rng: np.random.Generator, mode: str, device: Device,
                    ledger: DayLedger | ShuffledDayLedger | None, day: str, mix_pairs: bool) -> EpochReports:
    """:func:`privatize` of a span's set truths."""
    samplers = _set_samplers(query)
    n = sets.n_vehicles
    out = _opened(query, n, mode, device, ledger, day)
    if out.refused:
        return out
    if mode == "tally":
        _tally_rounds(out, samplers, rng, sets.yes_counts(query.n_stations), n)
        return out
    _per_sensor_rounds(out, samplers, rng, sets, mix_pairs)
    return out


def _privatize_yes(query: Query, truth: YesCounts, rng: np.random.Generator, mode: str, device: Device,
                   ledger: DayLedger | ShuffledDayLedger | None, day: str) -> EpochReports:
    """:func:`privatize` of a span's set truths tallied (tally mode only)."""
    samplers = _set_samplers(query)
    if mode != "tally":
        raise ValueError(f"a tally of set truths (YesCounts) is privatized in tally mode only, not {mode!r}")
    out = _opened(query, truth.n, mode, device, ledger, day)
    if not out.refused:
        _tally_rounds(out, samplers, rng, truth.yes, truth.n)
    return out


def _set_samplers(query: Query) -> tuple[PerStation, ...]:
    """A per-sensor query's samplers, one a round; a station-valued one cannot answer a set truth."""
    samplers = query.per_station
    if samplers is None:
        raise ValueError(f"{query.mechanism} reports one station: it has no set truth")
    return samplers


def _tally_rounds(out: EpochReports, samplers: tuple[PerStation, ...], rng: np.random.Generator,
                  yes: IntArray, n: int) -> None:
    out.rounds = [Counts(ps.tally(rng, yes, n, multi_hot=True).ravel(), n) for ps in samplers]


def _per_sensor_rounds(out: EpochReports, samplers: tuple[PerStation, ...], rng: np.random.Generator,
                       sets: StationSets, mix_pairs: bool) -> None:
    """Per-vehicle mode of a per-sensor mechanism: every round's reports into ``out``."""
    n = sets.n_vehicles
    for r, ps in enumerate(samplers):  # fresh coins per round: each round sampled, shuffled and sent on its own
        last = not mix_pairs and r == len(samplers) - 1  # the generator's last draw: nothing later depends on it
        if not mix_pairs and ps.bit_valued and not ps.sparse_bits():  # the same draws, one bitmap per device
            bits = ps.sample_bits_sets(rng, sets)
            if not last:
                rng.permutation(bits.n_set)  # the direct path's shuffle of these pairs: later rounds draw after it
            out.rounds.append(Bitmaps(bits.rows, bits.n_set))
            out.vehicles.append(np.arange(n, dtype=np.int64))
            continue
        pairs = ps.sample_sparse_sets(rng, sets)
        if not last:
            order = rng.permutation(pairs.station.size)
        if mix_pairs:  # (never ``last``: ``order`` was drawn)
            out.rounds.append(Pairs(pairs.station[order], pairs.output[order]))
            out.vehicles.append(pairs.vehicle[order])
        else:  # the same draws; the pairs stay grouped by vehicle (two sorted runs)
            out.rounds.append(Pairs(pairs.station, pairs.output))
            out.vehicles.append(pairs.vehicle)
