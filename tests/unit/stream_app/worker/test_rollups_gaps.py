"""Rollups over an epoch withheld ``no_reports`` (``stream_app.worker.rollups``; issue 24 item 4).

Checked: such an epoch decides its rollups (they do not wait for it forever) and withholds them
with its epoch and code; when the epoch's data comes after all (a gap's window opened afresh)
its new summary replaces the ``no_reports`` one -- also after the rollup was decided and stored
-- and the rollup is decided again: published with exactly the sums of a run that never saw the
``no_reports``, or withheld with the new reason; a repeated ``no_reports`` changes nothing.
"""

from __future__ import annotations

import numpy as np

from stream_app.worker.rollups import RollupId, rollup_result
from tests.unit.stream_app.worker.test_rollups import CONF, E0, QE, by_id, epoch, hour, run


def test_a_no_reports_epoch_withholds_its_rollups_and_later_data_supersedes_it() -> None:
    clean = hour(seed=7)
    gapped = [*clean[:3], epoch(E0 + 3, np.random.default_rng(2), withheld="no_reports"), *clean[4:]]
    decided, store = run(gapped)
    five, first_hour = RollupId("q-rr", 1, 10, E0), RollupId("q-rr", 1, 120, E0)
    got = by_id(decided)
    for rid in (five, first_hour):
        res = rollup_result(QE, got[rid], CONF)
        assert res.withheld_code == "no_reports" and f"epoch {E0 + 3} withheld: no_reports" in str(res.withheld)
    assert rollup_result(QE, got[RollupId("q-rr", 1, 10, E0 + 10)], CONF).withheld is None

    again, store = run([gapped[3]], store=store)  # a restarted stage 2 sends it twice
    assert again == []
    later, store = run([clean[3]], store=store)  # the epoch's own outcome, after all
    assert sorted((s.rid.span, s.rid.start) for s in later) == [(10, E0), (120, E0)]
    want = by_id(run(clean)[0])
    for st in later:
        a, b = rollup_result(QE, st, CONF), rollup_result(QE, want[st.rid], CONF)
        assert a.withheld is None and st.published and a.participants == b.participants
        for name, v in a.values.items():
            np.testing.assert_allclose(v.estimate, b.values[name].estimate, rtol=1e-12)
            np.testing.assert_allclose(v.sd, b.values[name].sd, rtol=1e-12)
    assert run([gapped[3]], store=store)[0] == []  # the no_reports again: nothing changes


def test_a_superseding_withheld_epoch_re_withholds_the_rollup_with_its_reason() -> None:
    gapped = hour(seed=8, e3="no_reports", e5="no_reports")
    decided, store = run(gapped)
    late = epoch(E0 + 3, np.random.default_rng(1), withheld="late")
    later, _ = run([late], store=store)
    five = by_id(later)[RollupId("q-rr", 1, 10, E0)]
    res = rollup_result(QE, five, CONF)
    assert res.withheld_code == "late" and "and 1 more" in str(res.withheld) and not five.published
