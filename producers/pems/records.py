"""The per-row records the Station Raw parsers produce (fast path and row logic alike) and
the gridding consumes: one array per field, one entry per usable row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass
class Rows:
    """Per usable (not skipped) row: file order, epochs (fold 0/1), station, truth, cell flag
    bits, lane flag counts, and whether every present lane read exactly 0/0."""

    order: npt.NDArray[np.int64]
    ep0: npt.NDArray[np.int64]
    ep1: npt.NDArray[np.int64]
    station: npt.NDArray[np.int64]
    total: npt.NDArray[np.int64]
    bits: npt.NDArray[np.uint8]
    n_stuck: npt.NDArray[np.uint8]
    n_spike: npt.NDArray[np.uint8]
    n_oor: npt.NDArray[np.uint8]
    zero: npt.NDArray[np.bool_]

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        names = list(Rows.__dataclass_fields__)
        if not parts:
            return Rows(*(np.zeros(0, _ROW_DTYPES[n]) for n in names))
        if len(parts) == 1:
            return parts[0]
        return Rows(*(np.concatenate([getattr(p, n) for p in parts]) for n in names))

    def take(self, which: npt.NDArray[Any]) -> Rows:
        """The rows at ``which`` (indices or a mask)."""
        return Rows(*(getattr(self, n)[which] for n in Rows.__dataclass_fields__))


_ROW_DTYPES: dict[str, type[Any]] = {"bits": np.uint8, "n_stuck": np.uint8, "n_spike": np.uint8, "n_oor": np.uint8,
                                     "zero": np.bool_, **{n: np.int64 for n in ("order", "ep0", "ep1", "station",
                                                                                "total")}}
