"""The test suite's enrolled devices: one enrollment secret, exported as ``PTT_ENROLLMENT_SECRET``
by tests/conftest.py for every shuffler and ``--via-shuffler`` replay a test starts (in-process
or as a child, which inherits it), and helpers that sign device reports as enrolled devices do
(schemas/enrollment.py)."""

from __future__ import annotations

from functools import cache

from schemas import DeviceReport, SourceEpoch, encode_json
from schemas.enrollment import Enrollment
from schemas.settings import EnrollmentSettings

__all__ = ["ENROLLMENT_SECRET", "enrollment", "signed", "signed_json", "signed_note"]

ENROLLMENT_SECRET = "ptt-test-suite-enrollment-secret-0123456789abcdef"  # not a secret: tests only


@cache
def enrollment() -> Enrollment:
    return Enrollment(ENROLLMENT_SECRET.encode(), EnrollmentSettings.model_fields["enrolled_devices"].default)


def signed(report: DeviceReport, device: int) -> DeviceReport:
    """``report`` as enrolled device ``device`` sends it (JSON: its id and MAC)."""
    return enrollment().sign_report(report, device)


def signed_json(report: DeviceReport, device: int) -> bytes:
    return encode_json(signed(report, device))


def signed_note(note: SourceEpoch) -> bytes:
    """A replay's source note as the replay sends it: signed with the suite's notes key."""
    return encode_json(enrollment().sign_note(note))
