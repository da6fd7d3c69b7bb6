"""Consistent estimates: the per-station unbiased vector of one (query, epoch, estimator)
projected onto what a true vector can be.

Every vehicle is at one station or at none, so the true counts ``Y`` of a query's ``V``
stations satisfy ``Y >= 0`` and ``sum(Y) <= N`` (the participants). The unbiased estimates
do not: they may be negative and may sum past ``N``. :func:`project_capped_simplex` returns
the Euclidean projection of the estimates onto ``{x >= 0, sum(x) <= N}``:

    ``x = max(est - theta, 0)`` with ``theta = 0`` if ``sum(max(est, 0)) <= N``, otherwise the
    ``theta > 0`` for which ``sum(max(est - theta, 0)) = N``.

That is Norm-Sub (Wang, Lopuhaä-Zwakenberg, Chen, Li, Škorić, Li, "Locally Differentially
Private Frequency Estimation with Consistency", NDSS 2020, §IV-B: clip negatives to zero and
subtract one constant from the positive ones until the total is right), with the total an
upper bound instead of an equality because vehicles at no monitored station exist. The
paper's §IV-D and §VI show it lowers the mean squared error markedly when most true counts
are small; it is biased (upwards near zero, downwards when the cap binds), so the unbiased
estimate and its score bounds stay the reference (docs/statistics.md, "Consistent estimates").

``theta`` is found exactly by sorting (Duchi, Shalev-Shwartz, Singer, Chandra, "Efficient
Projections onto the l1-Ball for Learning in High Dimensions", ICML 2008, Fig. 1): O(V log V),
vectorized over leading axes.

>>> import numpy as np
>>> project_capped_simplex(np.array([3.0, -1.0, 0.5]), 10).tolist()  # cap slack: clip only
[3.0, 0.0, 0.5]
>>> project_capped_simplex(np.array([6.0, 5.0, -2.0]), 7).tolist()  # cap binds: subtract 2
[4.0, 3.0, 0.0]
>>> x = project_capped_simplex(np.array([[6.0, 5.0, -2.0], [1.0, 1.0, 1.0]]), np.array([[7.0], [2.0]]))
>>> x.round(6).tolist()
[[4.0, 3.0, 0.0], [0.666667, 0.666667, 0.666667]]
>>> project_capped_simplex(np.array([1.0]), -1)
Traceback (most recent call last):
...
ValueError: the cap (participants) must be finite and >= 0
"""

from __future__ import annotations

import numpy as np

from ._types import FloatArray

__all__ = ["project_capped_simplex"]


def project_capped_simplex(est: FloatArray, cap: float | FloatArray) -> FloatArray:
    """Euclidean projection of each vector along the last axis of ``est`` onto
    ``{x >= 0, sum(x) <= cap}``; ``cap`` broadcasts against ``est[..., :1]`` (one per vector).

    Non-finite estimates are refused (a ValueError): the caller withholds those epochs.
    """
    x = np.asarray(est, dtype=np.float64)
    if x.ndim == 0:
        raise ValueError("est must have at least one axis (the stations)")
    c = np.broadcast_to(np.asarray(cap, dtype=np.float64), (*x.shape[:-1], 1))
    if not np.all(np.isfinite(c)) or np.any(c < 0):
        raise ValueError("the cap (participants) must be finite and >= 0")
    if not np.all(np.isfinite(x)):
        raise ValueError("estimates must be finite")
    clipped = np.maximum(x, 0.0)
    over = clipped.sum(axis=-1, keepdims=True) > c  # (..., 1): the cap binds
    if not over.any():
        return clipped
    # sorted descending, cumulative sums: theta_j = (S_j - cap) / j for the largest j with
    # u_j > theta_j (Duchi et al., Fig. 1); only vectors where the cap binds use it
    u = -np.sort(-x, axis=-1)
    j = np.arange(1, x.shape[-1] + 1, dtype=np.float64)
    theta_j = (np.cumsum(u, axis=-1) - c) / j
    rho = np.sum(u > theta_j, axis=-1, keepdims=True)  # >= 1 where over: u_1 > (u_1 - cap)
    theta = np.take_along_axis(theta_j, np.maximum(rho - 1, 0), axis=-1)
    out: FloatArray = np.where(over, np.maximum(x - theta, 0.0), clipped)
    return out
