"""What the shuffler's policy (:mod:`.policy`) decides for a due epoch: released with its rounds,
or withheld and why (pure data; :mod:`.release` turns either into the reports topic's records)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from schemas import Query

__all__ = ["Released", "ReleasedRound", "Withheld"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class ReleasedRound:
    """One round of a released epoch: the permuted arrays in the wire layout (``value``, or
    ``station`` and ``output``) and how many reports (values or pairs) they hold -- or, released
    as an aggregate, one array ``counts`` in the exact-tally layout and ``reports`` = its devices
    (what a tally's header counts) -- and how many devices sent them (the markers' participants)."""

    arrays: dict[str, IntArray]
    reports: int
    devices: int


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
