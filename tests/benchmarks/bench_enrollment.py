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
* ``hmac_sha256`` -- one HMAC-SHA256 of a report's size, for scale;
* ``note_decode`` / ``note_decode_verify`` -- the shuffler's decode of one source note (the
  replay's per-epoch clock note: 4 device offsets, 100 stations without a reading) without and
  with its MAC checked under the notes key; ``note_sign`` -- the replay's signing of one;
* ``revocation_refresh`` -- the shuffler's check, once per polled batch, that the revocation
  list's file is unchanged (one ``stat``), per batch, not per record;
* ``shuffler_decode_verify_revoked`` -- ``shuffler_decode_verify`` with 10,000 devices revoked.

Run: ``python tests/benchmarks/bench_enrollment.py [--records 5000] [--repeats 20]``
"""
from __future__ import annotations

import argparse
import hmac
import json
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from schemas import SourceEpoch, decode_device_record, encode_json
from schemas.device_binary import encode_device_values
from schemas.enrollment import Enrollment, Revocation
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
    note = SourceEpoch(epoch=59_832_000, readings_missing=tuple(range(400_001, 400_101)), producer_index=1,
                       producer_count=4, device_offsets=tuple((p, 1_000_000 + p) for p in range(4)))
    plain_note, signed_note = encode_json(note), encode_json(enrollment.sign_note(note))

    def verify() -> bool:
        got = decode_device_record(signed_note)
        return isinstance(got, SourceEpoch) and enrollment.check_note(got) is None

    revoked = Enrollment(secrets.token_bytes(32), 262_144, Revocation(ids=range(100_000, 110_000)))
    sealed_r = revoked.seal_messages(encode_device_values("sp-day", 1, 59_832_000, 0, values, devices), ids)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "revoked"
        path.write_text("\n".join(str(d) for d in range(100_000, 110_000)))
        listed = Revocation.load(path)
        notes = max(n // 10, 1)
        for name, fn, count in (
                ("note_decode", lambda: [decode_device_record(plain_note) for _ in range(notes)], notes),
                ("note_decode_verify", lambda: [verify() for _ in range(notes)], notes),
                ("note_sign", lambda: [enrollment.sign_note(note) for _ in range(notes)], notes),
                ("revocation_refresh", lambda: [listed.refresh() for _ in range(notes)], notes),
                ("shuffler_decode_verify_revoked", lambda: decode_batch(sealed_r, revoked), n)):
            print(json.dumps({"step": name, "records": count, "cpu_us_per_record": _best_us(fn, count, reps)}),
                  flush=True)


if __name__ == "__main__":
    main()
