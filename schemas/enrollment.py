"""Device enrollment: each enrolled device's key, the MAC its reports carry, and the shuffler's
check of it (docs/wire.md, "Device authentication"). Standard library only (``hmac``,
``hashlib``): HKDF is RFC 5869's composition of HMAC-SHA256, checked against its test vector.

* The shuffler's operator holds one **enrollment secret** (at least 32 bytes) and enrolls the
  devices ``0 .. devices - 1``; device ``d``'s key is ``HKDF-SHA256(secret, salt=PROTOCOL,
  info=PROTOCOL + " device " + u32 d)``, 32 bytes. The simulated fleet derives its devices'
  keys the same way (it stands in for the enrolled devices).
* A report's **MAC** is HMAC-SHA256 under the device's key, truncated to 16 bytes, of
  :func:`~schemas.device_binary.auth_message` -- the binary layout with the ``auth`` bit up to
  and including the device id. A binary report carries id and MAC as its trailer; a JSON one as
  ``device`` and ``mac`` (hex) over the same bytes: one definition.
* **One report per device per slot**: :meth:`Enrollment.slot_digest` -- 8 bytes of a keyed
  hash of the device id under the slot's key, derived from the secret (never written
  anywhere) -- is what the shuffler keeps to refuse a second report; without the secret a digest says
  nothing of the device and two slots' digests of one device are unrelated.
* **Source notes** (:class:`~schemas.SourceEpoch`, the replay's per-epoch notes: the shuffler's
  clock) carry ``mac``, HMAC-SHA256 under the **notes key** ``HKDF-SHA256(secret, salt=PROTOCOL,
  info=PROTOCOL + " source notes")`` -- derived like a device's key, under a label no device id
  can produce -- of :func:`note_message` (the note's other fields as canonical JSON). The shuffler
  refuses a note without a MAC that verifies (``untrusted_note``) whatever the broker's ACLs.
* **Revocation**: :class:`Revocation`, a file of revoked device ids (one a line, ``#`` comments),
  re-read when it changes (:meth:`Enrollment.refresh_revocation`); a revoked device's report
  whose MAC verifies is refused ``revoked``, at the shuffler and at its front door.

>>> from schemas.device_binary import encode_device, unpack_device
>>> e = Enrollment(b"s" * 32, devices=10)
>>> sealed = e.seal(encode_device("q", 1, 9, 0, value=3), 7)
>>> unpack_device(sealed).device, e.check(7, sealed[:-MAC_BYTES], sealed[-MAC_BYTES:])
(7, None)
>>> e.check(7, sealed[:-MAC_BYTES], bytes(16)).reason, e.check(10, sealed[:-MAC_BYTES], sealed[-16:]).reason
('bad_mac', 'unknown_device')
>>> from schemas import SourceEpoch
>>> note = e.sign_note(SourceEpoch(epoch=9))
>>> e.check_note(note), e.check_note(SourceEpoch(epoch=9)).reason
(None, 'untrusted_note')
>>> e.check_note(note.model_copy(update={"epoch": 49})).detail
'a source note whose MAC does not verify under the notes key'
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .device_binary import FLAG_AUTH, MAC_BYTES, auth_message
from .wire import DeviceReport, SourceEpoch

__all__ = ["DIGEST_BYTES", "KEY_CACHE", "MIN_SECRET_BYTES", "NOTES_LABEL", "PROTOCOL", "AuthFailure", "Enrollment",
           "EnrollmentError", "Revocation", "hkdf_expand", "hkdf_extract", "hkdf_sha256", "note_message"]

log = logging.getLogger(__name__)

PROTOCOL = b"ptt device-report v1"
MIN_SECRET_BYTES = 32
DIGEST_BYTES = 8  # a slot digest: collisions among 136,161 devices in one slot ~ 5e-10
KEY_CACHE = 262_144  # derived keys kept (the papers' largest fleet is 136,161 devices)
NOTES_LABEL = PROTOCOL + b" source notes"  # the notes key's HKDF info (a device's is PROTOCOL + b" device " + u32)
MAX_REVOKED = 1 << 22  # ids in a revocation list, at most
_U32 = struct.Struct("<I")
_DEVICE_INFO = PROTOCOL + b" device "  # a device key's HKDF info, before its u32 id
_IPAD = bytes(x ^ 0x36 for x in range(256))  # RFC 2104's pads, as bytes.translate tables
_OPAD = bytes(x ^ 0x5C for x in range(256))


class EnrollmentError(ValueError):
    """No usable enrollment secret (missing, unreadable, too short)."""


@dataclass(frozen=True)
class AuthFailure:
    """Why a report's authentication failed; never names the device."""

    reason: str  # unauthenticated, unknown_device, bad_mac
    detail: str


_UNAUTHENTICATED = AuthFailure("unauthenticated", "a device report without a device id and MAC (enrollment is "
                                                  "required)")
_UNKNOWN = AuthFailure("unknown_device", "a device id that is not enrolled")
_BAD_MAC = AuthFailure("bad_mac", "the report's MAC does not verify under its device's key")
_REVOKED = AuthFailure("revoked", "a report of a revoked device (its MAC verifies; the revocation list names it)")
_UNSIGNED_NOTE = AuthFailure("untrusted_note", "a source note without a MAC (the replay signs its notes)")
_BAD_NOTE = AuthFailure("untrusted_note", "a source note whose MAC does not verify under the notes key")


def note_message(note: SourceEpoch) -> bytes:
    """The bytes a source note's MAC covers: ``NOTES_LABEL``, a 0x1f byte, then the note's
    fields but ``mac`` as JSON with sorted keys and no spaces (one definition for the replay
    and the shuffler, whatever bytes carried the note).

    >>> note_message(SourceEpoch(epoch=3, readings_missing=(7,)))[len(NOTES_LABEL) + 1:].decode()[:60]
    '{"device_offsets":[],"epoch":3,"interrupted":false,"kind":"s'
    """
    fields = note.model_dump(mode="json", exclude={"mac"} | (set() if note.ends else {"ends"}))  # as before ends
    return NOTES_LABEL + b"\x1f" + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


class Revocation:
    """The revoked device ids: a file of ids (decimal, one a line; blank lines and ``#``
    comments ignored), or none. :meth:`refresh` re-reads it when its mtime, size or inode
    changed (one ``stat``); a file that cannot be read or parsed on a refresh keeps the list
    in force and is logged (at start, :meth:`load` raises :class:`EnrollmentError`).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = Path(d) / "revoked"
    ...     _ = path.write_text("# stolen\\n7\\n\\n12\\n")
    ...     r = Revocation.load(path)
    ...     before = sorted(r.ids)
    ...     _ = path.write_text("7\\n12\\n30  # another\\n")
    ...     changed = r.refresh()
    >>> before, changed, sorted(r.ids)
    ([7, 12], True, [7, 12, 30])
    """

    def __init__(self, path: Path | None = None, ids: Iterable[int] = ()) -> None:
        self.path = path
        self.ids: frozenset[int] = frozenset(ids)
        self._stamp: tuple[int, int, int] | None = None

    @classmethod
    def load(cls, path: Path) -> Revocation:
        r = cls(path)
        try:
            r._stamp = r._stat()
            r.ids = _parse_ids(path.read_text())
        except OSError as exc:
            raise EnrollmentError(f"cannot read the revocation list {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise EnrollmentError(f"the revocation list {path}: {exc}") from exc
        return r

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path or "")
        return st.st_mtime_ns, st.st_size, st.st_ino

    def refresh(self) -> bool:
        """Re-read the file if it changed; whether the list was replaced."""
        if self.path is None:
            return False
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            ids = _parse_ids(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("the revocation list %s cannot be read (%s); the previous list (%d ids) stays in force",
                        self.path, exc, len(self.ids))
            return False
        self._stamp, self.ids = stamp, ids
        log.warning("revocation list %s re-read: %d device ids revoked", self.path, len(ids))
        return True


def _parse_ids(text: str) -> frozenset[int]:
    ids = set()
    for n, line in enumerate(text.splitlines(), 1):
        word = line.split("#", 1)[0].strip()
        if not word:
            continue
        if not word.isdigit() or int(word) >= 2**32:
            raise ValueError(f"line {n}: {word[:40]!r} is not a device id (0 .. 2**32 - 1)")
        ids.add(int(word))
        if len(ids) > MAX_REVOKED:
            raise ValueError(f"more than {MAX_REVOKED} ids")
    return frozenset(ids)


def _hmac_states(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256 under a key of at most 64 bytes as two SHA-256 states that have hashed the
    key padded to a block, xor ipad and xor opad (RFC 2104): a MAC is then an update of each
    (a copy of them, to keep them) and two digests."""
    block = key.ljust(64, b"\0")  # a key of at most a block: padded, never hashed first
    return hashlib.sha256(block.translate(_IPAD)), hashlib.sha256(block.translate(_OPAD))


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 HKDF-Extract with HMAC-SHA256: the pseudorandom key."""
    return hmac.digest(salt or bytes(32), ikm, "sha256")


def hkdf_expand(prk: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 HKDF-Expand with HMAC-SHA256."""
    if length > 255 * 32:
        raise ValueError("HKDF-SHA256 output is at most 8160 bytes")
    out, block = b"", b""
    for i in range((length + 31) // 32):
        block = hmac.digest(prk, block + info + bytes([i + 1]), "sha256")
        out += block
    return out[:length]


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 HKDF with HMAC-SHA256 (extract, then expand).

    RFC 5869, appendix A.1 (test case 1):

    >>> okm = hkdf_sha256(bytes([0x0b] * 22), bytes(range(13)), bytes(range(0xf0, 0xfa)), 42)
    >>> okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
    ...               "34007208d5b887185865")
    True
    """
    return hkdf_expand(hkdf_extract(salt, ikm), info, length)


class Enrollment:
    """The enrolled devices ``0 .. devices - 1`` under one secret: their keys (derived once,
    cached), sealing a report (the device side) and checking one (the shuffler's)."""

    def __init__(self, secret: bytes, devices: int, revocation: Revocation | None = None) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise EnrollmentError(f"the enrollment secret has {len(secret)} bytes, at least {MIN_SECRET_BYTES} needed")
        if not 1 <= devices <= 2**32:
            raise EnrollmentError(f"enrolled devices {devices}: 1 .. 2**32")
        self.devices = devices
        self._prk = hkdf_extract(PROTOCOL, secret)  # the extract step is the same for every key: once
        self._prk_states = _hmac_states(self._prk)  # and HMAC under it (each key's one expand block)
        # a fleet larger than the cache thrashes it (every device once per epoch or span, in turn):
        # then every MAC derives its key afresh, without the caches' upkeep
        self._cached = devices <= KEY_CACHE
        self._slot_key = hkdf_expand(self._prk, PROTOCOL + b" slot digests")
        self._notes_key = hkdf_expand(self._prk, NOTES_LABEL)
        self.revocation = revocation or Revocation()
        self.key = lru_cache(maxsize=KEY_CACHE)(self._derive)
        self._kept: dict[int, tuple[Any, Any]] = {}  # device -> its keyed states (a cached fleet: at most all of it)
        self._slot_keys = lru_cache(maxsize=4096)(self._slot_derive)

    def _derive(self, device: int) -> bytes:
        """Device ``device``'s key, ``hkdf_sha256(secret, PROTOCOL, PROTOCOL + b" device " + u32
        device)`` (no range check: :meth:`check` does it): its one HKDF-Expand block,
        HMAC(prk, info || 0x01), from the kept states of HMAC under the prk (half the cost of
        :func:`hkdf_expand`'s one-shot HMAC).

        >>> e = Enrollment(b"an enrollment secret of 32 bytes!", devices=8)
        >>> e.key(3) == hkdf_expand(e._prk, PROTOCOL + b" device " + _U32.pack(3))
        True
        """
        inner, outer = self._prk_states
        inner, outer = inner.copy(), outer.copy()
        inner.update(_DEVICE_INFO + _U32.pack(device) + b"\x01")
        outer.update(inner.digest())
        return outer.digest()  # type: ignore[no-any-return]

    def _keyed_states(self, device: int) -> tuple[Any, Any]:
        """HMAC-SHA256 under device ``device``'s key as two SHA-256 states that have hashed the
        key padded to a block, xor ipad and xor opad (RFC 2104), kept per device (:meth:`macs`): a
        MAC is then two copies, an update each and two digests -- cheaper than ``hmac.digest``,
        for which OpenSSL 3 sets a one-shot HMAC up anew on every call
        (``tests/benchmarks/bench_enrollment.py``). Kept ~0.65 KB a device: +87 MB at the
        papers' fleet (136,161)."""
        return _hmac_states(self._derive(device))

    def _slot_derive(self, query_id: str, version: int, epoch: int, rnd: int) -> Any:
        """The slot's keyed BLAKE2s state, its key block hashed (:meth:`slot_digests` copies it)."""
        key = hmac.digest(self._slot_key, f"{query_id}\x1f{version}\x1f{epoch}\x1f{rnd}".encode(), "sha256")
        return hashlib.blake2s(key=key, digest_size=DIGEST_BYTES)

    def enrolled(self, device: int) -> bool:
        return 0 <= device < self.devices

    def refresh_revocation(self) -> bool:
        """Re-read the revocation list if its file changed (:meth:`Revocation.refresh`: one
        ``stat`` when it did not); the shuffler calls it before each batch, the front door may
        before each request."""
        return self.revocation.refresh()

    def revoked(self, device: int) -> bool:
        return device in self.revocation.ids

    def sign_note(self, note: SourceEpoch) -> SourceEpoch:
        """``note`` with its ``mac`` (the replay's side)."""
        mac = hmac.digest(self._notes_key, note_message(note), "sha256").hex()
        return note.model_copy(update={"mac": mac})

    def check_note(self, note: SourceEpoch) -> AuthFailure | None:
        """Whether ``note`` carries the notes key's MAC of :func:`note_message` (None: it does);
        ``untrusted_note`` otherwise."""
        if note.mac is None:
            return _UNSIGNED_NOTE
        want = hmac.digest(self._notes_key, note_message(note), "sha256")
        return None if hmac.compare_digest(want, bytes.fromhex(note.mac)) else _BAD_NOTE

    def mac(self, device: int, message: bytes | memoryview) -> bytes:
        """HMAC-SHA256 of ``message`` under device ``device``'s key, its first ``MAC_BYTES``.

        >>> e = Enrollment(b"an enrollment secret of 32 bytes!", devices=8)
        >>> all(e.mac(3, m) == hmac.digest(e.key(3), m, "sha256")[:MAC_BYTES] for m in (b"", b"x" * 100))
        True
        """
        return self.macs((device,), (message,))[0]

    def macs(self, devices: Iterable[int], messages: Iterable[bytes | memoryview]) -> list[bytes]:
        """:meth:`mac` of each message under its device's key, in one loop (the replay's sealing
        and the shuffler's check: 1.2 µs a short report here, where a call of :meth:`mac` per
        record cost 2.0)."""
        out: list[bytes] = []
        append, size, keyed = out.append, MAC_BYTES, self._keyed_states
        # a fleet past the cache: each key derived afresh (7.98 us a seal against 22.4 through a thrashed cache)
        kept = self._kept if self._cached else None
        for device, message in zip(devices, messages, strict=True):
            states = None if kept is None else kept.get(device)
            if states is None:
                states = keyed(device)
                if kept is not None:
                    kept[device] = states
            inner, outer = states[0].copy(), states[1].copy()
            inner.update(message)
            outer.update(inner.digest())
            append(outer.digest()[:size])
        return out

    def seal(self, raw: bytes, device: int) -> bytes:
        """A binary report (:func:`~schemas.device_binary.encode_device`, no trailer) with its
        ``auth`` bit set and its trailer: the device id and the MAC."""
        message = bytes((raw[0], raw[1] | FLAG_AUTH)) + raw[2:] + _U32.pack(device)
        return message + self.mac(device, message)

    def seal_messages(self, messages: Sequence[bytes], devices: Sequence[int]) -> list[bytes]:
        """Many :func:`~schemas.device_binary.auth_message` byte strings, each with its MAC
        appended (the replay's path: ``encode_device_values(..., devices)``, then this)."""
        return [m + t for m, t in zip(messages, self.macs(devices, messages), strict=True)]

    def sign_report(self, report: DeviceReport, device: int) -> DeviceReport:
        """A JSON device report with its ``device`` and ``mac`` (hex) set."""
        message = auth_message(report.query_id, report.query_version, report.epoch, report.round, report.value,
                               report.pairs, device)
        return report.model_copy(update={"device": device, "mac": self.mac(device, message).hex()})

    def check(self, device: int, message: bytes, mac: bytes) -> AuthFailure | None:
        """Whether ``mac`` is device ``device``'s MAC of ``message`` (None: it is)."""
        if not self.enrolled(device):
            return _UNKNOWN
        if not hmac.compare_digest(self.mac(device, message), mac):
            return _BAD_MAC
        if device in self.revocation.ids:
            return _REVOKED
        return None

    def check_sealed(self, devices: Sequence[int], records: Sequence[bytes]) -> list[tuple[int, AuthFailure]]:
        """:meth:`check` of many sealed binary records, each's message and MAC its own bytes
        (the shuffler's decode step, one call per batch); ``devices``: each's trailer's device
        id, -1 where it has none (``unauthenticated``). The failures, by position (a revoked
        device's report whose MAC verifies: ``revoked``).

        >>> e = Enrollment(b"an enrollment secret of 32 bytes!", devices=8, revocation=Revocation(ids=(5,)))
        >>> good = e.seal(b"\\x01\\x00\\x01q" + bytes(13), 3)
        >>> [(j, why.reason) for j, why in e.check_sealed([3, 4, 9, -1], [good] * 4)]
        [(1, 'bad_mac'), (2, 'unknown_device'), (3, 'unauthenticated')]
        >>> [why.reason for _, why in e.check_sealed([5], [e.seal(b"\\x01\\x00\\x01q" + bytes(13), 5)])]
        ['revoked']
        """
        if len(devices) != len(records):
            raise ValueError(f"{len(devices)} devices for {len(records)} records")
        n, size, revoked = self.devices, MAC_BYTES, self.revocation.ids
        out = [(j, _UNAUTHENTICATED if device < 0 else _UNKNOWN) for j, device in enumerate(devices)
               if not 0 <= device < n]
        rows = [j for j, device in enumerate(devices) if 0 <= device < n] if out else range(len(devices))
        compare = hmac.compare_digest
        for j, tag in zip(rows, self.macs([devices[j] for j in rows], [records[j][:-size] for j in rows]),
                          strict=True):
            if not compare(tag, records[j][-size:]):
                out.append((j, _BAD_MAC))
            elif revoked and devices[j] in revoked:
                out.append((j, _REVOKED))
        return sorted(out, key=lambda t: t[0])

    def check_report(self, report: DeviceReport, raw: bytes | None = None) -> AuthFailure | None:
        """A decoded report's authentication: a binary one's trailer (``raw``: its bytes) or a
        JSON one's ``device`` and ``mac``; ``unauthenticated`` without them."""
        if report.device is None or report.mac is None:
            return _UNAUTHENTICATED
        if raw is not None and raw[:1] != b"{":
            return self.check(report.device, raw[:-MAC_BYTES], raw[-MAC_BYTES:])
        message = auth_message(report.query_id, report.query_version, report.epoch, report.round, report.value,
                               report.pairs, report.device)
        return self.check(report.device, message, bytes.fromhex(report.mac))

    def slot_digest(self, query_id: str, version: int, epoch: int, rnd: int, device: int) -> bytes:
        """The per-slot keyed digest of a device: what the shuffler keeps to admit one report
        per device and slot, apart from the reports: keyed BLAKE2s (RFC 7693's keyed mode, a
        PRF; one call costs a fifth of an HMAC-SHA256 here, and the shuffler makes one per
        report) of the u32 device id under the slot's key -- HMAC-SHA256 of the slot under a
        key derived from the secret."""
        return self.slot_digests(query_id, version, epoch, rnd, (device,))[0]

    def slot_digests(self, query_id: str, version: int, epoch: int, rnd: int, devices: Sequence[int]) -> list[bytes]:
        """:meth:`slot_digest` of many devices of one slot (the slot's key looked up once)."""
        base, pack = self._slot_keys(query_id, version, epoch, rnd), _U32.pack
        out: list[bytes] = []
        append = out.append
        for d in devices:  # a copy of the slot's keyed state, its key block hashed once: half a keyed call
            h = base.copy()
            h.update(pack(d))
            append(h.digest())
        return out
