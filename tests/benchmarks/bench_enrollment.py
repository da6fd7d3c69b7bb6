"""Benchmark: the CPU cost per device report of enrollment (schemas/enrollment.py), no broker.
One JSON line per step, process CPU microseconds per report (the best of ``--repeats`` runs of
``--records`` station-valued reports of the papers' scale: 3,221 values, ids from 47,719):

* ``replay_encode`` -- the replay's array encoding without a trailer (before enrollment);
* ``replay_seal`` -- the same with the device ids and each report's MAC (keys cached);
* ``key_derivation`` -- a device's first MAC: its key derived and its two keyed SHA-256 states
  built (once per device and process), and the MAC;
* ``mac`` -- one report's MAC with the device's keyed states kept;
* ``shuffler_decode`` / ``shuffler_decode_verify`` -- the shuffler's columnar decode step of
  unsigned reports (before) and of sealed ones with every MAC checked (after);
* ``slot_digest`` -- one report's keyed slot digest, checked and recorded (one per slot);
* ``hmac_sha256`` -- one HMAC-SHA256 of a report's size, for scale.

Run: ``python tests/benchmarks/bench_enrollment.py [--records 5000] [--repeats 20]``
"""
from __future__ import annotations

import argparse
import hmac
import json
import secrets
import time
from collections.abc import Callable

import numpy as np

from schemas.device_binary import encode_device_values
from schemas.enrollment import Enrollment
from stream_app.shuffler.columns import decode_batch
from stream_app.shuffler.enrolled import SlotDevices


def _best_us(fn: Callable[[], object], n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return round(1e6 * best / n, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    n, reps = args.records, args.repeats
    rng = np.random.default_rng(1)
    values, devices = rng.integers(0, 3221, n), rng.permutation(47_719)[:n] if n <= 47_719 else np.arange(n)
    enrollment = Enrollment(secrets.token_bytes(32), 262_144)
    ids = devices.tolist()
    plain = encode_device_values("sp-day", 1, 59_832_000, 0, values)
    sealed = enrollment.seal_messages(encode_device_values("sp-day", 1, 59_832_000, 0, values, devices), ids)
    slot = ("sp-day", 1, 59_832_000, 0)

    def digests() -> None:
        seen = SlotDevices(enrollment)
        for d in ids:
            g = seen.digest(slot, d)
            if not seen.took(slot, g):
                seen.add(slot, g)

    key, message = secrets.token_bytes(32), sealed[0][:-16]

    def derive() -> None:
        fresh = Enrollment(secrets.token_bytes(32), 262_144)
        for d in ids:
            fresh.mac(d, message)

    steps: dict[str, Callable[[], object]] = {
        "replay_encode": lambda: encode_device_values("sp-day", 1, 59_832_000, 0, values),
        "replay_seal": lambda: enrollment.seal_messages(
            encode_device_values("sp-day", 1, 59_832_000, 0, values, devices), ids),
        "key_derivation": derive,
        "mac": lambda: [enrollment.mac(d, message) for d in ids],
        "shuffler_decode": lambda: decode_batch(plain),
        "shuffler_decode_verify": lambda: decode_batch(sealed, enrollment),
        "slot_digest": digests,
        "hmac_sha256": lambda: [hmac.digest(key, message, "sha256") for _ in range(n)],
    }
    for name, fn in steps.items():
        print(json.dumps({"step": name, "records": n, "cpu_us_per_record": _best_us(fn, n, reps)}), flush=True)


if __name__ == "__main__":
    main()
