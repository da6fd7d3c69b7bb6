"""What the shuffler's policy (:mod:`.policy`) decides for a due epoch: released with its rounds,
or withheld and why (pure data; :mod:`.release` turns either into the reports topic's records)."""

from __future__ import annotations

from dataclasses import dataclass

from estimators import Round
from schemas import Query

__all__ = ["Released", "ReleasedRound", "Withheld"]


@dataclass(frozen=True)
class ReleasedRound:
    """One round of a released epoch: its reports permuted (:class:`~estimators.Values`, or
    :class:`~estimators.Pairs`) -- or, released as an aggregate, their exact tally
    (:class:`~estimators.Counts` of the round's devices) -- and how many devices sent them (the
    markers' participants)."""

    data: Round
    devices: int

    @property
    def reports(self) -> int:
        """How many reports (values or pairs) the round holds; a tally's devices (what its header counts)."""
        return self.data.n_reports


@dataclass(frozen=True)
class Released:
    """A decided epoch that gets markers: its rounds, the stations (sensor ids) the replay said
    had no source reading, and whether the replay stopped in it (then the rounds carry no
    reports: the worker withholds an interrupted epoch, so nothing of it is released)."""

    query: Query
    epoch: int
    rounds: tuple[ReleasedRound, ...]
    no_data: frozenset[int] = frozenset()
    interrupted: bool = False


@dataclass(frozen=True)
class Withheld:
    query: Query
    epoch: int
    reason: str  # schemas.wire.SHUFFLER_WITHHELD
    devices: tuple[int, ...]  # per round
    detail: str = ""  # for the operator's dead letter and log line
