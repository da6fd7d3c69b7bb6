"""Regenerate shuffle_reference.json: the public reference implementations' shuffled epsilons.

The two papers' own code, run offline at the (eps0, n, delta) points below; the test
(tests/unit/estimators/test_shuffle.py) holds estimators.shuffle between each one's lower and
upper bound. The code is not vendored: check it out and pass its directory::

    git clone https://github.com/apple/ml-shuffling-amplification   # computeamplification.py
    git clone https://github.com/wangsw/PrivacyAmplification        # unifiedamplification.py
    python tests/unit/estimators/data/make_shuffle_reference.py ml-shuffling-amplification PrivacyAmplification

Commits used for the stored file: apple/ml-shuffling-amplification 993d285a546114bf8c70c33d053dca322a755707,
wangsw/PrivacyAmplification 34ca048932dc1f211d1d1a3b1e642088c4b8390a. Takes ~15 minutes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

# Feldman-McMillan-Talwar's numerical clone bound: generic eps0
CLONE_POINTS = [(0.5, 2_000, 1e-5), (1.0, 10_000, 1e-6), (1.3068, 47_719, 1e-6), (2.0, 100_000, 1e-8),
                (4.8363, 47_719, 1e-6)]
# Wang et al.'s variation-ratio bound: (eps0, beta, n, delta); beta None = generic (e^eps0-1)/(e^eps0+1)
VR_POINTS = [(1.0, None, 10_000, 1e-6), (1.3068, 0.050075, 47_719, 1e-6), (2.0, None, 100_000, 1e-8),
             (4.8363, 0.8, 47_719, 1e-6), (math.log(3.0) + 0.0, 0.4, 5_000, 1e-6),
             (7.877, 0.45, 47_719, 1e-6)]
ITERATIONS = 20


def _commit(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"


def main(apple: Path, wang: Path) -> None:
    sys.path[:0] = [str(apple), str(wang)]
    import computeamplification as ca  # type: ignore[import-not-found]
    import unifiedamplification as ua  # type: ignore[import-not-found]

    clone = []
    for eps0, n, delta in CLONE_POINTS:
        step = max(1, n // 5_000)  # the code's own speed knob: a coarser step widens the bracket
        upper = ca.numericalanalysis(n, eps0, delta, ITERATIONS, step, True)
        lower = ca.numericalanalysis(n, eps0, delta, ITERATIONS, step, False)
        clone.append({"epsilon0": eps0, "n": n, "delta": delta, "step": step, "upper": upper, "lower": lower,
                      "search_resolution": eps0 / 2**ITERATIONS})
        print("clone", clone[-1], flush=True)
    vr = []
    for eps0, beta, n, delta in VR_POINTS:
        p = math.exp(eps0)
        b = (p - 1) / (p + 1) if beta is None else beta
        upper = float(ua.amplificationUB(p, b, p, p, n, delta, ITERATIONS))
        lower = float(ua.amplificationLB(p, b, p, p, n, delta, ITERATIONS))
        vr.append({"epsilon0": eps0, "beta": b, "n": n, "delta": delta, "upper": upper, "lower": lower,
                   "search_resolution": eps0 / 2**ITERATIONS})
        print("variation ratio", vr[-1], flush=True)
    out = {
        "clone": {"source": "apple/ml-shuffling-amplification computeamplification.numericalanalysis "
                            f"(num_iterations={ITERATIONS}, step=max(1, n // 5000))",
                  "commit": _commit(apple), "points": clone},
        "variation_ratio": {"source": "wangsw/PrivacyAmplification unifiedamplification.amplificationUB/LB "
                                      f"(T={ITERATIONS}, q0 = q1 = p)", "commit": _commit(wang), "points": vr},
    }
    target = Path(__file__).with_name("shuffle_reference.json")
    target.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", target)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: make_shuffle_reference.py <ml-shuffling-amplification dir> <PrivacyAmplification dir>")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
