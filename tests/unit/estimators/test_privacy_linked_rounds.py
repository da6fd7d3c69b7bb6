"""Rounds that share a device's randomness have no shuffled bound: Sampling Privacy's two rounds
come from one die, so the difference of the rounds' released counts is the exact histogram of
the devices that drew the sampling face. Enumerated at n = 2: with the only other device at
station 1, a count of 1 at station 2 in that difference happens only when the target is at 2,
so delta(eps) >= pis at every eps, and composing per-round shuffled bounds (the old figure)
understated it."""

from __future__ import annotations

import itertools
import math

import numpy as np

from estimators import privacy
from estimators.mechanisms import fresh_sample, sampling_privacy
from estimators.registry import get_spec


def _released(mech, truths: tuple[int, ...]) -> dict[tuple[tuple[int, ...], ...], float]:
    """P(round-1 histogram, round-2 histogram | every device's truth), by enumerating every die."""
    prob = mech.latent_full()
    out: dict[tuple[tuple[int, ...], ...], float] = {}
    for faces in itertools.product(range(mech.n_faces), repeat=len(truths)):
        p = math.prod(float(prob[t, f]) for t, f in zip(truths, faces, strict=True))
        if p == 0.0:
            continue
        key = tuple(tuple(np.bincount([int(mech.emit(r, np.array([f]), np.array([t]))[0])
                                       for t, f in zip(truths, faces, strict=True)],
                                      minlength=mech.n_outputs).tolist())
                    for r in range(mech.n_rounds))
        out[key] = out.get(key, 0.0) + p
    return out


def _delta(p: dict, q: dict, eps: float) -> float:
    return sum(max(0.0, v - math.exp(eps) * q.get(k, 0.0)) for k, v in p.items())


def test_sampling_privacy_counts_reveal_the_sampled_devices_station() -> None:
    pis = 0.3
    sp = sampling_privacy(2, pis=pis)
    at_2 = _released(sp, (2, 1))  # the target at station 2, the other device at station 1
    at_1 = _released(sp, (1, 1))
    assert _delta(at_2, at_1, 30.0) >= pis - 1e-12  # no finite epsilon below delta = pis
    assert not privacy.rounds_independent(sp)
    assert math.isinf(get_spec("sp").shuffled_epsilon(get_spec("sp").build({}, 2), 2, 1000, 1e-6, release="aggregate"))
    assert math.isinf(get_spec("sp").shuffled_epsilon(get_spec("sp").build({}, 2), 2, 1000, 1e-6, release="permuted"))


def test_independent_rounds_keep_their_shuffled_bound() -> None:
    fresh = fresh_sample(0.3, 0.1, 0.05, 0.1)
    assert privacy.rounds_independent(fresh)
    # the joint table is the product of the rounds' tables (what independence means)
    joint = fresh.joint_table()
    t0, t1 = fresh.output_table(0), fresh.output_table(1)
    assert np.allclose(joint, (t0[:, :, None] * t1[:, None, :]).reshape(joint.shape))
    spec = get_spec("fresh")
    assert math.isfinite(spec.shuffled_epsilon(spec.build({}, 3), 3, 1000, 1e-6))
