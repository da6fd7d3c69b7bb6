"""Device enrollment (schemas/enrollment.py): RFC 5869 HKDF, per-device keys, the MAC of a binary
and a JSON report (one definition), the check's three reasons, what a dead letter may keep of a
sealed record (schemas.device_binary.strip_auth), and the settings that name the secret; the
replay's signed source notes (the notes key) and the revocation list."""
from __future__ import annotations

import hmac
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from schemas import DeviceReport, SourceEpoch, decode_device_record, encode_json
from schemas.device_binary import MAC_BYTES, auth_message, encode_device, encode_device_values, strip_auth
from schemas.enrollment import (
    KEY_CACHE,
    NOTES_LABEL,
    PROTOCOL,
    Enrollment,
    EnrollmentError,
    Revocation,
    hkdf_expand,
    hkdf_extract,
    hkdf_sha256,
    note_message,
)
from schemas.settings import EnrollmentSettings

SECRET = b"an enrollment secret of 32 bytes or more"
E = Enrollment(SECRET, devices=1000)


@pytest.mark.parametrize(("ikm", "salt", "info", "length", "okm"), [
    # RFC 5869 appendix A, test cases 1, 2 and 3 (SHA-256)
    (bytes([0x0B] * 22), bytes(range(13)), bytes(range(0xF0, 0xFA)), 42,
     "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"),
    (bytes(range(80)), bytes(range(0x60, 0xB0)), bytes(range(0xB0, 0x100)), 82,
     "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e09"
     "da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87"),
    (bytes([0x0B] * 22), b"", b"", 42,
     "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"),
])
def test_hkdf_rfc5869_vectors(ikm: bytes, salt: bytes, info: bytes, length: int, okm: str) -> None:
    assert hkdf_sha256(ikm, salt, info, length).hex() == okm


def test_keys_differ_per_device_and_secret() -> None:
    keys = {E.key(d) for d in range(1000)}
    assert len(keys) == 1000 and all(len(k) == 32 for k in keys)
    assert Enrollment(SECRET + b"!", 1000).key(5) != E.key(5)
    with pytest.raises(EnrollmentError, match="at least 32"):
        Enrollment(b"short", 10)


def test_binary_and_json_share_one_mac() -> None:
    report = DeviceReport(query_id="alp", query_version=2, epoch=9, round=1, pairs=((4, 1), (7, 0)))
    sealed = E.seal(encode_device("alp", 2, 9, 1, pairs=((4, 1), (7, 0))), 17)
    signed = E.sign_report(report, 17)
    assert signed.device == 17 and signed.mac == sealed[-MAC_BYTES:].hex()
    assert E.check_report(decode_device_record(sealed), sealed) is None  # type: ignore[arg-type]
    again = decode_device_record(encode_json(signed))
    assert isinstance(again, DeviceReport) and again == signed and E.check_report(again, encode_json(signed)) is None
    assert sealed[:-MAC_BYTES] == auth_message("alp", 2, 9, 1, None, ((4, 1), (7, 0)), 17)


def test_the_mac_is_rfc_2104_hmac_sha256_under_the_device_key() -> None:
    """The kept keyed states (``Enrollment._keyed_states``) give exactly HMAC-SHA256 (the
    library's one-shot) under each device's key, for messages below, at and above a block,
    repeatedly (a state used up in place would change the second MAC of a device)."""
    rng = np.random.default_rng(7)
    for device in (0, 1, 17, 999):
        for n in (0, 1, 41, 55, 56, 63, 64, 65, 128, 1300):
            m = rng.bytes(n)
            want = hmac.digest(E.key(device), m, "sha256")[:MAC_BYTES]
            assert E.mac(device, m) == want and E.mac(device, m) == want, (device, n)
    assert E.mac(1, b"x") != E.mac(2, b"x")


def test_a_fleet_past_the_key_cache_seals_and_checks_the_same_macs() -> None:
    """An enrollment of more devices than its caches hold (the papers' 10M vehicles) derives
    each key afresh for every MAC: the keys are RFC 5869's HKDF (the library's one-shot HMAC),
    and the MACs, the seals and their checks are those of a small enrollment under the secret."""
    big = Enrollment(SECRET, devices=KEY_CACHE + 1)
    assert big._cached is False and E._cached is True
    rng = np.random.default_rng(8)
    for device in (0, 17, 999):
        assert big.key(device) == hkdf_expand(hkdf_extract(PROTOCOL, SECRET), PROTOCOL + b" device "
                                              + device.to_bytes(4, "little")) == E.key(device)
        for n in (0, 41, 64, 300):
            m = rng.bytes(n)
            assert big.mac(device, m) == E.mac(device, m) == hmac.digest(E.key(device), m, "sha256")[:MAC_BYTES]
    sealed = big.seal_messages([b"\x01\x03\x01q" + bytes(13) + d.to_bytes(4, "little") for d in (5, 6)], [5, 6])
    assert sealed == E.seal_messages([r[:-MAC_BYTES] for r in sealed], [5, 6])
    assert big.check_sealed([5, 6], sealed) == [] and big.check_sealed([6], sealed[:1])[0][1].reason == "bad_mac"


def test_seal_messages_equals_seal() -> None:
    values, devices = np.array([3, 0, 9]), np.array([5, 6, 999])
    many = E.seal_messages(encode_device_values("q", 1, 9, 0, values, devices), devices.tolist())
    assert many == [E.seal(encode_device("q", 1, 9, 0, value=int(v)), int(d)) for v, d in zip(values, devices,
                                                                                            strict=True)]


def test_every_changed_bit_and_every_other_key_is_a_bad_mac() -> None:
    sealed = E.seal(encode_device("sp-day", 1, 59_832_000, 0, value=3), 42)
    message, mac = sealed[:-MAC_BYTES], sealed[-MAC_BYTES:]
    assert E.check(42, message, mac) is None
    for bit in range(8 * len(message)):  # the payload, the header, the device id: all covered
        flipped = bytearray(message)
        flipped[bit // 8] ^= 1 << (bit % 8)
        got = E.check(42, bytes(flipped), mac)
        assert got is not None and got.reason == "bad_mac"
    assert E.check(43, message, mac).reason == "bad_mac"  # type: ignore[union-attr]  # another device's key
    assert Enrollment(SECRET + b"!", 1000).check(42, message, mac).reason == "bad_mac"  # type: ignore[union-attr]
    for outside in (1000, 2**32 - 1):
        got = E.check(outside, message, mac)
        assert got is not None and got.reason == "unknown_device" and str(outside) not in got.detail


def test_unsigned_reports_are_unauthenticated() -> None:
    for raw in (encode_device("q", 1, 9, 0, value=1), encode_json(DeviceReport(query_id="q", query_version=1,
                                                                              epoch=9, value=1))):
        got = E.check_report(decode_device_record(raw), raw)  # type: ignore[arg-type]
        assert got is not None and got.reason == "unauthenticated"


def test_a_dead_letter_keeps_no_device_id_or_mac() -> None:
    """Every cut, extension and flipped flag of sealed records (fixed seed): what strip_auth
    keeps holds neither the MAC nor the device id's bytes where the trailer had them."""
    rng = np.random.default_rng(24)
    device = 0x5A5A1234
    big = Enrollment(SECRET, 2**32)
    seeds = [big.seal(encode_device("q", 1, 9, 0, value=7), device),
             big.seal(encode_device("alp", 1, 9, 1, pairs=((4, 1), (7, 0))), device),
             big.seal(encode_device("u", 1, 9, 1, pairs=((4, 1), (7, 1)), bitmap_stations=21), device)]
    bitmap = encode_device("u", 1, 9, 1, pairs=((4, 1), (7, 1)), bitmap_stations=21)
    assert strip_auth(seeds[2]) == bitmap and strip_auth(seeds[2] + b"xx") == bitmap  # cut at the bitmap's end
    for _ in range(3000):
        sealed = seeds[rng.integers(len(seeds))]
        trailer = sealed[-20:]
        raw = bytearray(sealed)
        op = rng.integers(3)
        if op == 0:
            del raw[rng.integers(len(raw)):]
        elif op == 1:
            raw += rng.integers(0, 256, rng.integers(1, 40), dtype=np.uint8).tobytes()
        else:
            raw[rng.integers(2, len(raw) - 20)] = int(rng.integers(256))
        kept = strip_auth(bytes(raw))
        assert trailer[:4] not in kept and trailer[4:12] not in kept and trailer[12:] not in kept, (raw, kept)
    signed = encode_json(E.sign_report(DeviceReport(query_id="q", query_version=1, epoch=9, value=1), 777))
    assert b"777" not in strip_auth(signed) and b"mac" not in strip_auth(signed)
    assert strip_auth(signed[:-5]) == b""  # unparseable JSON naming them: dropped whole


def test_settings_name_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTT_ENROLLMENT_SECRET", raising=False)
    with pytest.raises(EnrollmentError, match="no enrollment secret"):
        EnrollmentSettings().enrollment()
    with pytest.raises(EnrollmentError, match="cannot read"):
        EnrollmentSettings(enrollment_secret_file=tmp_path / "absent").enrollment()
    path = tmp_path / "secret"
    path.write_text("  " + SECRET.decode() + "\n")
    got = EnrollmentSettings(enrollment_secret_file=path, enrolled_devices=1000).enrollment()
    assert got.key(3) == E.key(3) and got.devices == 1000
    monkeypatch.setenv("PTT_ENROLLMENT_SECRET", "x" * 40)
    assert EnrollmentSettings().enrollment().key(3) == Enrollment(b"x" * 40, 10).key(3)
    assert EnrollmentSettings(enrollment_secret_file=path).enrollment().key(3) == E.key(3)  # the file wins
    path.write_text("too short")
    with pytest.raises(EnrollmentError, match="at least 32"):
        EnrollmentSettings(enrollment_secret_file=path).enrollment()


# -- source notes (issue 35, item 4) and revocation (item 5) ----------------------------------------------------


def _note(**kw: object) -> SourceEpoch:
    base: dict[str, object] = {"epoch": 59_832, "readings_missing": (400001, 400007), "producer_index": 1,
                               "producer_count": 2, "device_offsets": ((0, 120), (2, 77))}
    return SourceEpoch(**{**base, **kw})  # type: ignore[arg-type]


def test_a_signed_note_verifies_and_every_changed_field_or_key_is_untrusted() -> None:
    """The notes key's MAC covers every field of the note: each field changed (the epoch, the
    stations without data, interrupted, opens, the producer, the offsets), no MAC, a MAC under
    another secret, or under a device's key over the same bytes -- all ``untrusted_note``."""
    note = E.sign_note(_note())
    assert note.mac is not None and E.check_note(note) is None
    assert decode_device_record(encode_json(note)) == note  # the wire keeps the MAC
    for change in ({"epoch": 59_872}, {"readings_missing": (400001,)}, {"interrupted": True}, {"opens": True},
                   {"producer_index": 0}, {"producer_count": 3}, {"device_offsets": ((0, 121), (2, 77))}):
        forged = note.model_copy(update=change)
        why = E.check_note(forged)
        assert why is not None and why.reason == "untrusted_note", change
    unsigned = E.check_note(_note())
    assert unsigned is not None and unsigned.reason == "untrusted_note" and "without a MAC" in unsigned.detail
    other = Enrollment(SECRET + b"!", devices=1000).sign_note(_note())
    assert E.check_note(other) is not None
    device_mac = hmac.digest(E.key(0), note_message(_note()), "sha256").hex()  # a device cannot sign a note
    assert E.check_note(_note(mac=device_mac)) is not None


def test_the_note_message_is_the_fields_not_the_bytes_that_carried_them() -> None:
    """A signed note re-encoded with its JSON keys in another order (what another JSON writer
    may send) still verifies: the MAC covers the canonical form (sorted keys, no spaces)."""
    note = E.sign_note(_note())
    fields = json.loads(encode_json(note))
    reordered = json.dumps(dict(reversed(list(fields.items())))).encode()
    again = decode_device_record(reordered)
    assert isinstance(again, SourceEpoch) and E.check_note(again) is None
    assert note_message(_note()) == NOTES_LABEL + b"\x1f" + json.dumps(  # ``ends`` only when set (as notes were)
        _note().model_dump(mode="json", exclude={"mac", "ends"}), sort_keys=True, separators=(",", ":")).encode()
    last = _note().model_copy(update={"ends": True})
    assert note_message(last) == NOTES_LABEL + b"\x1f" + json.dumps(
        last.model_dump(mode="json", exclude={"mac"}), sort_keys=True, separators=(",", ":")).encode()
    assert E.check_note(E.sign_note(last)) is None and E.check_note(E.sign_note(_note()).model_copy(
        update={"ends": True})) is not None  # the MAC covers ends: a note cannot be made to end a replay


def test_the_notes_key_is_derived_with_its_own_label() -> None:
    """The notes key is HKDF(secret, PROTOCOL, NOTES_LABEL): a MAC made with it by hand verifies."""
    key = hkdf_sha256(SECRET, PROTOCOL, NOTES_LABEL)
    mac = hmac.digest(key, note_message(_note()), "sha256").hex()
    assert E.check_note(_note(mac=mac)) is None
    assert key not in {E.key(d) for d in range(1000)}


def test_a_revoked_device_is_refused_only_with_a_valid_mac(tmp_path: Path) -> None:
    """Revoked device 7: its sealed binary and signed JSON reports are ``revoked``; a bad MAC
    under its id stays ``bad_mac`` (nobody learns the list from forgeries); others pass."""
    path = tmp_path / "revoked"
    path.write_text("# stolen phones\n7\n  \n9 # another\n")
    e = Enrollment(SECRET, devices=1000, revocation=Revocation.load(path))
    assert e.revocation.ids == {7, 9}
    raw = encode_device("q", 1, 9, 0, value=3)
    sealed = {d: e.seal(raw, d) for d in (6, 7)}
    assert [why.reason for _, why in e.check_sealed([6, 7], [sealed[6], sealed[7]])] == ["revoked"]
    assert [why.reason for _, why in e.check_sealed([7], [sealed[7][:-1] + b"x"])] == ["bad_mac"]
    report = DeviceReport(query_id="q", query_version=1, epoch=9, value=3)
    why = e.check_report(e.sign_report(report, 7))
    assert why is not None and why.reason == "revoked"
    assert e.check_report(e.sign_report(report, 8)) is None
    assert e.check(7, sealed[7][:-MAC_BYTES], sealed[7][-MAC_BYTES:]).reason == "revoked"  # type: ignore[union-attr]


def test_the_revocation_list_is_reread_when_it_changes_and_kept_when_unreadable(tmp_path: Path) -> None:
    """A rewritten file is taken at the next refresh (the same size: the mtime tells); one
    refresh with nothing changed costs a stat and replaces nothing; a file that becomes
    unparsable or vanishes keeps the list in force; at start either is an EnrollmentError."""
    path = tmp_path / "revoked"
    path.write_text("1\n")
    e = Enrollment(SECRET, devices=1000, revocation=Revocation.load(path))
    assert not e.refresh_revocation() and e.revoked(1) and not e.revoked(2)
    path.write_text("2\n")  # same size
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert e.refresh_revocation() and e.revoked(2) and not e.revoked(1)
    path.write_text("two\n")
    assert not e.refresh_revocation() and e.revoked(2)
    path.unlink()
    assert not e.refresh_revocation() and e.revoked(2)
    with pytest.raises(EnrollmentError, match="cannot read the revocation list"):
        Revocation.load(path)
    path.write_text("5\n-1\n")
    with pytest.raises(EnrollmentError, match="line 2"):
        Revocation.load(path)


def test_the_shuffler_settings_name_the_revocation_file(tmp_path: Path) -> None:
    from stream_app.shuffler.settings import ShufflerSettings

    path = tmp_path / "revoked"
    path.write_text("3\n")
    s = ShufflerSettings(enrollment_secret=SECRET.decode(), revoked_devices_file=path)  # type: ignore[arg-type]
    assert s.enrollment().revoked(3)
    with pytest.raises(EnrollmentError, match="revocation list"):
        s.model_copy(update={"revoked_devices_file": tmp_path / "absent"}).enrollment()
