"""Every reason a record can be dead-lettered for is known up front (its counter series exists
at zero from the start, so dashboards show 0 rather than "no data")."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from stream_app.worker.decode import REASONS
from stream_app.worker.estimate import WITHHELD_CODES
from stream_app.worker.metrics import StreamMonitor
from tests.paths import ROOT


def test_reasons_cover_every_raised_reason() -> None:
    raised: set[str] = set()
    for path in (ROOT / "schemas" / "wire.py", ROOT / "stream_app" / "worker" / "decode.py",
                 ROOT / "stream_app" / "worker" / "app.py",
                 ROOT / "estimators" / "registry.py"):  # SpecError reasons become stage-1 reasons
        raised |= set(re.findall(r'(?:WireError|Rejected|SpecError)\(\s*"([a-z_]+)"', path.read_text()))
    assert raised, "the scan found nothing: the pattern is stale"
    assert {"wrong_layout", "bad_marker", "out_of_bounds"} <= raised  # one from each kind of source
    assert raised <= set(REASONS), sorted(raised - set(REASONS))


def test_counters_exist_at_zero() -> None:
    reg = CollectorRegistry()
    m = StreamMonitor(reg)
    m.know_reasons(REASONS)
    m.know_query("q1")
    m.know_query("q1")  # idempotent
    for reason in REASONS:
        assert reg.get_sample_value("ptt_dead_letters_total", {"reason": reason}) == 0.0
    for name in ("ptt_late_records_total", "ptt_duplicate_records_total", "ptt_refused_vehicles_total",
                 "ptt_suppressed_estimates_total", "ptt_missing_batches_total", "ptt_reports_total"):
        assert reg.get_sample_value(name, {"query": "q1"}) == 0.0
    for code in WITHHELD_CODES:
        assert reg.get_sample_value("ptt_withheld_epochs_total", {"query": "q1", "reason": code}) == 0.0
