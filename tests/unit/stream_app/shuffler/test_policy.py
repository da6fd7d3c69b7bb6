"""The shuffler's pure policy (``stream_app.shuffler.policy``): no broker.

Checked: the trusted clock (a replay's source notes, every producer's; the wall clock) and the
deadline rules (the clock past the epoch by the lateness and the input read up to the offsets
the notes vouched for; end of input after the idle wait); device reports, however many, never
move the clock and are refused outside the open window; every epoch the clock passes is decided
(``no_reports``); the slot bound; late reports; min_crowd withholds; and that the release is a
uniform permutation (chi-square over positions, fixed seed); a replay's source notes (stations
without a reading, interrupted) reach the released epoch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
from scipy import stats

import estimators as E
from schemas import DeviceReport, Query, SourceEpoch, decode_device_record
from schemas.device_binary import encode_device
from stream_app.shuffler.policy import Released, ShufflePolicy, Withheld

T0 = datetime(2026, 11, 18, tzinfo=UTC)


def _query(mechanism: str = "sp", population: int = 100) -> Query:
    return Query(query_id="q", analyst_id="a", version=1, mechanism=mechanism, sensors=(1, 2, 3),  # type: ignore[arg-type]
                 population=population, t_start=T0, t_end=T0 + timedelta(days=1))


def _rep(epoch: int, value: int, rnd: int = 0) -> DeviceReport:
    return DeviceReport(query_id="q", query_version=1, epoch=epoch, round=rnd, value=value)


def _opened(p: ShufflePolicy, q: Query, epoch: int, producers: int = 1) -> ShufflePolicy:
    """``p`` with every replay producer's opening note of ``epoch`` taken."""
    for k in range(producers):
        assert p.note(SourceEpoch(epoch=epoch, opens=True, producer_index=k, producer_count=producers),
                      lambda e: [q], 0.0) is None
    return p


def _fill(p: ShufflePolicy, q: Query, epoch: int, n: int) -> None:
    for i in range(n):
        for r in (0, 1):
            assert p.admit(_rep(epoch, i % 4, r), q, 0.0) is None


def test_reports_never_move_the_clock_and_outside_the_window_open_nothing() -> None:
    """10,000 well-formed reports for a far epoch, and a flood for an epoch just past the
    window: every one refused ``outside_open_window``, the clock unmoved, no slot opened;
    before any note nothing is admitted at all."""
    q = _query(population=100_000)
    e = q.epoch_range()[0]
    p = ShufflePolicy(min_crowd=3, lateness_epochs=2, idle_release_s=5.0, partitions=(0, 1))
    why = p.admit(_rep(e, 1), q, 0.0)
    assert why is not None and why.reason == "outside_open_window"
    _opened(p, q, e)
    _fill(p, q, e, 3)
    for far in [e + 80] * 10_000 + [e + 2] * 500:
        why = p.admit(_rep(far, 1), q, 0.0)
        assert why is not None and why.reason == "outside_open_window", why
    assert (p.clock, p.open_epochs) == (e - 1, [("q", 1, e)])
    assert p.due(1e9, caught_up=(0, 1), positions={0: 10**9, 1: 10**9}) == []  # e is not finished
    assert p.admit(_rep(e + 1, 1), q, 0.0) is None  # open: ahead_epochs (2) past the clock, e - 1
    assert p.admit(_rep(e + 2, 1), q, 0.0) is not None


def test_the_clock_is_every_producers_and_waits_for_the_offsets_they_vouch_for() -> None:
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=1, idle_release_s=5.0, partitions=(0, 1)), q, e, 2)
    _fill(p, q, e, 3)
    for k, ends in ((0, ((0, 5),)), (1, ((0, 3), (1, 7), (9, 100)))):  # partition 9 is not this instance's
        assert p.note(SourceEpoch(epoch=e, producer_index=k, producer_count=2, device_offsets=ends),
                      lambda x: [q], 0.0) is None
    assert p.clock == e and p.due(1.0, caught_up=(), positions={0: 9, 1: 9}) == []  # lateness 1: e + 1 needed
    p.note(SourceEpoch(epoch=e + 1, producer_index=0, producer_count=2, device_offsets=((0, 20),)), lambda x: [q], 0.0)
    assert p.clock == e  # producer 1 has not finished e + 1
    p.note(SourceEpoch(epoch=e + 1, producer_index=1, producer_count=2), lambda x: [q], 0.0)
    assert p.clock == e + 1
    assert p.due(1.0, caught_up=(), positions={0: 19, 1: 7}) == []  # partition 0 not read to 20
    # e + 1 nobody reported for: it has its slot all the same
    assert p.due(1.0, caught_up=(), positions={0: 20, 1: 7}) == [("q", 1, e)]
    assert p.open_epochs == [("q", 1, e), ("q", 1, e + 1)]
    p.close(("q", 1, e), np.random.default_rng(0))
    out = p.close(("q", 1, e + 1), np.random.default_rng(0))
    assert isinstance(out, Withheld) and out.reason == "no_reports" and out.devices == (0, 0)


def test_the_wall_clock_opens_and_passes_epochs() -> None:
    q = _query()
    e = q.epoch_range()[0]
    p = ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,))
    p.advance(e, lambda x: [q])  # the first tick: the window starts at e + 1
    why = p.admit(_rep(e, 1), q, 0.0)
    assert why is not None and why.reason == "outside_open_window"
    _fill(p, q, e + 1, 2)
    p.advance(e + 2, lambda x: [q])
    assert p.due(1.0, caught_up=()) == []
    p.advance(e + 3, lambda x: [q])
    assert p.due(1.0, caught_up=()) == [("q", 1, e + 1)]
    assert p.open_epochs == [("q", 1, e + 1), ("q", 1, e + 2), ("q", 1, e + 3)]  # e + 2, e + 3: empty slots


def test_end_of_input_releases_everything_the_clock_passed_after_the_idle_wait() -> None:
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,)), q, e)
    _fill(p, q, e, 2)
    _fill(p, q, e + 1, 2)
    p.note(SourceEpoch(epoch=e), lambda x: [q], 0.0)
    assert p.due(4.9, caught_up=(0,)) == []
    assert p.due(5.0, caught_up=()) == []
    assert p.due(5.0, caught_up=(0,)) == [("q", 1, e)]  # e + 1 is not finished: it waits


def test_bounds_late_and_min_crowd() -> None:
    q = _query(population=3)
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=3, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), q, e)
    _fill(p, q, e, 3)
    rej = p.admit(_rep(e, 1), q, 0.0)
    assert rej is not None and rej.reason == "slot_full"
    assert (p.admit(_rep(e, 4), q, 0.0) or rej).reason == "out_of_range"
    _fill(p, q, e + 1, 2)
    released = p.close(("q", 1, e), np.random.default_rng(0))
    assert isinstance(released, Released) and [r.devices for r in released.rounds] == [3, 3]
    withheld = p.close(("q", 1, e + 1), np.random.default_rng(0))
    assert isinstance(withheld, Withheld) and withheld.reason == "below_min_crowd" and withheld.devices == (2, 2)
    late = p.admit(_rep(e, 1), q, 0.0)
    assert late is not None and late.reason == "late"


def test_release_is_a_uniform_permutation() -> None:
    """Where does the report that sorts first land? 6 reports with distinct values, 6,000
    releases: the landing position must be uniform (chi-square, 5 degrees of freedom).
    Fixed seed; with a uniform permutation the test fails with probability 1e-4 over seeds."""
    e = _query().epoch_range()[0]
    rng = np.random.default_rng(20261123)
    landed = np.zeros(6, dtype=np.int64)
    q6 = Query(query_id="q", analyst_id="a", version=1, mechanism="sp", sensors=(1, 2, 3, 4, 5, 6), population=10,
               t_start=T0, t_end=T0 + timedelta(days=1))
    for k in range(6000):
        p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), q6, e)
        p.ahead_epochs = 7
        for v in range(6):
            for r in (0, 1):
                assert p.admit(_rep(e + k % 7, v, r), q6, 0.0) is None
        out = p.close(("q", 1, e + k % 7), rng)
        assert isinstance(out, Released)
        values = out.rounds[0].data.arrays()["value"]
        assert sorted(values.tolist()) == list(range(6))
        landed[int(np.flatnonzero(values == 0)[0])] += 1
    assert stats.chisquare(landed).pvalue > 1e-4, landed


def test_source_notes_reach_the_release() -> None:
    """Two producers' notes of an epoch add up into its release (stations without a source
    reading); an interrupted epoch is released with its devices counted but no report, also
    for a query that holds none; a note for a decided epoch is late."""
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=2, lateness_epochs=1, idle_release_s=5.0, partitions=(0,)), q, e, 2)
    _fill(p, q, e, 3)
    assert p.note(SourceEpoch(epoch=e, readings_missing=(2,), producer_count=2), lambda x: [q], 0.0) is None
    assert p.note(SourceEpoch(epoch=e, readings_missing=(3,), producer_index=1, producer_count=2),
                  lambda x: [q], 0.0) is None
    out = p.close(("q", 1, e), np.random.default_rng(0))
    assert isinstance(out, Released) and out.no_data == {2, 3} and not out.interrupted
    assert out.rounds[0].reports == 3
    why = p.note(SourceEpoch(epoch=e), lambda x: [q], 0.0)
    assert why is not None and why.reason == "late"
    _fill(p, q, e + 1, 1)  # below min_crowd, but interrupted: released empty, flagged
    for k in (0, 1):
        assert p.note(SourceEpoch(epoch=e + 1, interrupted=True, producer_index=k, producer_count=2),
                      lambda x: [q], 0.0) is None
    out = p.close(("q", 1, e + 1), np.random.default_rng(0))
    assert isinstance(out, Released) and out.interrupted
    assert [(r.reports, r.devices, r.data.n_reports) for r in out.rounds] == [(0, 1, 0), (0, 1, 0)]
    for k in (0, 1):  # nothing sent of it
        assert p.note(SourceEpoch(epoch=e + 2, interrupted=True, producer_index=k, producer_count=2),
                      lambda x: [q], 0.0) is None
    assert p.open_epochs == [("q", 1, e + 2)]
    out = p.close(("q", 1, e + 2), np.random.default_rng(0))
    assert isinstance(out, Released) and out.interrupted and [r.devices for r in out.rounds] == [0, 0]


def _pairs(epoch: int, pairs: tuple[tuple[int, int], ...]) -> DeviceReport:
    return DeviceReport(query_id="q", query_version=1, epoch=epoch, round=0, pairs=pairs)


def test_pairs_are_checked_and_a_round_released_as_the_same_pairs() -> None:
    """Per-sensor reports (ALP): a station above V, the implied default report or one at or above
    the outputs, a station twice are refused with their reasons; an empty report counts as a
    participant; the released round holds exactly the admitted pairs, permuted (and the same
    seed gives the same release: it depends on the reports, not their arrival order)."""
    q = _query("alp")
    e = q.epoch_range()[0]
    default = q.default_report
    good, other = (o for o in range(q.n_outputs) if o != default)  # ALP: the two non-default reports
    Pairs = tuple[tuple[int, int], ...]
    refused: dict[str, list[Pairs]] = {"out_of_range": [((4, good),), ((1, good), (2, q.n_outputs))],
               "bad_pairs": [((1, good), (2, good), (1, good))]}
    if default is not None:
        refused["out_of_range"].append(((2, good), (3, default)))
    sent: list[Pairs] = [((1, good), (3, other)), (), ((2, good),), ((3, good), (1, other), (2, good))]

    def fill(order: list[int]) -> Released:
        p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), q, e)
        for reason, bad in refused.items():
            for pairs in bad:
                rej = p.admit(_pairs(e, pairs), q, 0.0)
                assert rej is not None and rej.reason == reason, (pairs, rej)
        for i in order:
            assert p.admit(_pairs(e, sent[i]), q, 0.0) is None
        out = p.close(("q", 1, e), np.random.default_rng(7))
        assert isinstance(out, Released)
        return out

    out = fill([0, 1, 2, 3])
    rnd = out.rounds[0]
    assert rnd.devices == 4 and rnd.reports == 6
    assert isinstance(rnd.data, E.Pairs)
    got = sorted(zip(rnd.data.station.tolist(), rnd.data.output.tolist(), strict=True))
    assert got == sorted(pair for pairs in sent for pair in pairs)
    again = fill([3, 1, 0, 2]).rounds[0]
    assert all(np.array_equal(rnd.data.arrays()[k], again.data.arrays()[k]) for k in ("station", "output"))


def test_the_aggregate_release_is_the_exact_tally_of_the_admitted_reports() -> None:
    """``release="aggregate"``: each round is one count array in the wire's exact-tally layout,
    equal to what the worker's registry counts from the permuted release of the same reports
    (``MechanismSpec.accumulate`` + ``complete``): per value for SP; per (station, report) for ALP
    and RR with the devices that sent no pair at a station at the default report (every row sums
    to the devices, the header's ``reports``). It does not depend on arrival order or the
    generator; a small crowd is still withheld, an interrupted epoch still carries no count."""
    e = _query().epoch_range()[0]
    gen = np.random.default_rng(5)
    for mechanism in ("sp", "alp", "rr"):
        q = _query(mechanism)
        mech, spec = q.build(), q.spec
        if q.per_station is None:
            sent = [[_rep(e, int(v), r) for v in gen.integers(0, q.n_stations + 1, 30)] for r in range(q.n_rounds)]
        else:
            others = [o for o in range(q.n_outputs) if o != q.default_report]
            sent = [[_pairs(e, tuple((s, int(gen.choice(others))) for s in range(1, 4) if gen.random() < 0.4))
                     for _ in range(30)]]

        def close(order: list[int], release: str, seed: int, q: Query = q, sent: list[list[DeviceReport]] = sent
                  ) -> Released:
            p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), q, e)
            for rnd in sent:
                for i in order:
                    assert p.admit(rnd[i], q, 0.0) is None
            out = p.close(("q", 1, e), np.random.default_rng(seed), release=release)
            assert isinstance(out, Released)
            return out

        agg = close(list(range(30)), "aggregate", 1)
        again = close(list(range(29, -1, -1)), "aggregate", 2)  # neither arrival order nor the generator
        assert all(np.array_equal(x.data.arrays()["counts"], y.data.arrays()["counts"])
                   for x, y in zip(agg.rounds, again.rounds, strict=True))
        perm = close(list(range(30)), "permuted", 1)
        for a, b in zip(agg.rounds, perm.rounds, strict=True):
            assert isinstance(a.data, E.Counts) and a.reports == a.devices == b.devices == 30
            counts = a.data.counts
            as_tally = spec.accumulate(mech, q.n_stations, a.data)  # the worker's check
            assert b.data.layout == spec.layout
            from_perm = spec.accumulate(mech, q.n_stations, b.data)
            done = [spec.complete(mech, q.n_stations, x[None, :], 30) for x in (as_tally, from_perm)]
            assert np.array_equal(done[0], done[1]) and np.array_equal(as_tally, counts)
    small = _opened(ShufflePolicy(min_crowd=3, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), _query(), e)
    _fill(small, _query(), e, 2)
    out = small.close(("q", 1, e), np.random.default_rng(0), release="aggregate")
    assert isinstance(out, Withheld) and out.reason == "below_min_crowd"
    cut = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), _query(), e)
    _fill(cut, _query(), e, 2)
    assert cut.note(SourceEpoch(epoch=e, interrupted=True), lambda x: [_query()], 0.0) is None
    out = cut.close(("q", 1, e), np.random.default_rng(0), release="aggregate")
    assert isinstance(out, Released) and out.interrupted and all(r.reports == 0 for r in out.rounds)


def test_a_bitmap_over_another_number_of_stations_is_the_wrong_layout() -> None:
    """A binary bitmap report (unary RR) must cover exactly its query's V stations: one over 2
    or 4 of a 3-station query is refused as wrong_layout naming both, even empty or with only
    stations the query has; over 3 it is admitted as its pairs (s, 1)."""
    q = _query("unary")
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=0, idle_release_s=1.0, partitions=(0,)), q, e)

    def bitmap(pairs: tuple[tuple[int, int], ...], v: int) -> DeviceReport:
        got = decode_device_record(encode_device("q", 1, e, 0, pairs=pairs, bitmap_stations=v))
        assert isinstance(got, DeviceReport) and got.bitmap_stations == v
        return got

    for v, pairs in ((2, ((1, 1),)), (4, ((2, 1),)), (4, ()), (2, ())):
        rej = p.admit(bitmap(pairs, v), q, 0.0)
        assert rej is not None and rej.reason == "wrong_layout" and f" {v} stations" in rej.detail \
            and "3 stations" in rej.detail, rej
    assert p.admit(bitmap(((3, 1), (1, 1)), 3), q, 0.0) is None
    assert p.admit(bitmap((), 3), q, 0.0) is None
    out = p.close(("q", 1, e), np.random.default_rng(7))
    assert isinstance(out, Released) and out.rounds[0].devices == 2
    assert sorted(out.rounds[0].data.arrays()["station"].tolist()) == [1, 3]


# -- how far a source note may move the clock (issue 35, item 4) ------------------------------------------------


def _offer(p: ShufflePolicy, q: Query, note: SourceEpoch, now: float = 0.0, wall: int | None = None) -> str | None:
    """What the runtime does with a note whose MAC verified: refused (its reason, counted
    against the epochs it could have opened) or taken."""
    why = p.note_refusal(note, now, wall)
    if why is not None:
        p.note_refused(note.epoch)
        return why.reason
    assert p.note(note, lambda e: [q], now) is None
    return None


def test_a_note_far_ahead_of_what_vouches_for_it_is_from_the_future_unpaced() -> None:
    """Speed 0 (no pace): a replay's notes one epoch at a time all move the clock, however fast
    they come; a note 40 epochs past the clock is ``note_from_future`` and moves nothing (at any
    host time); nor does an opening note that far; the bound is the clock or an admitted device
    report's epoch (``ahead_epochs`` past the clock at most) plus ``note_lead_epochs``."""
    q = _query()
    e = q.epoch_range()[0]
    p = ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,), note_lead_epochs=3)
    assert _offer(p, q, SourceEpoch(epoch=e, opens=True)) is None  # the anchor
    for k in range(10):
        assert _offer(p, q, SourceEpoch(epoch=e + k), now=k * 1e-4) is None
    assert p.clock == e + 9
    for now in (0.0, 1e6):
        assert _offer(p, q, SourceEpoch(epoch=e + 9 + 40), now=now) == "note_from_future"
        assert _offer(p, q, SourceEpoch(epoch=e + 9 + 40, opens=True), now=now) == "note_from_future"
    assert p.clock == e + 9 and p.open_epochs[-1][2] == e + 9
    assert _offer(p, q, SourceEpoch(epoch=e + 13)) == "note_from_future"  # lead 3: e + 12 at most
    assert p.admit(_rep(e + 11, 1), q, 1.0) is None  # an admitted report of e + 11 vouches for it
    assert _offer(p, q, SourceEpoch(epoch=e + 14), now=1.0) is None and p.clock == e + 14


def test_a_producer_a_lockstep_epoch_ahead_is_not_from_the_future() -> None:
    """Two producers: the clock is the slower one's; the faster may finish two epochs past it
    (the replay's lockstep) before the slower's note comes -- within the default lead."""
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,)), q, e, 2)
    for k in range(3):
        assert _offer(p, q, SourceEpoch(epoch=e + k, producer_index=1, producer_count=2)) is None
    assert p.clock == e - 1
    assert _offer(p, q, SourceEpoch(epoch=e, producer_index=0, producer_count=2)) is None and p.clock == e


def test_a_paced_note_may_run_ahead_by_the_hosts_time_at_the_pace() -> None:
    """``note_pace`` 120 (the demo's speed): 40 epochs ahead is from the future until the host's
    clock has passed 40 - lead epochs at 120x (37 x 30 s / 120 = 9.25 s) since the clock moved;
    with the wall clock (live), a note more than ``lateness_epochs`` past the host's epoch."""
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,),
                              note_lead_epochs=3, note_pace=120.0), q, e)
    assert _offer(p, q, SourceEpoch(epoch=e), now=100.0) is None
    assert _offer(p, q, SourceEpoch(epoch=e + 40), now=109.2) == "note_from_future"
    assert _offer(p, q, SourceEpoch(epoch=e + 40), now=109.3) is None and p.clock == e + 40
    live = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,)), q, e)
    assert _offer(live, q, SourceEpoch(epoch=e), wall=e - 2) is None
    assert _offer(live, q, SourceEpoch(epoch=e + 1), wall=e - 2) == "note_from_future"


def test_an_epoch_withheld_where_notes_were_refused_says_so() -> None:
    """The clock stuck by a refused note (say the replay's from the future at a wrong pace),
    then moved by a later one: the epochs it passed with their reports refused are withheld
    ``notes_refused``, not ``no_reports``; an empty epoch far from any refused note stays
    ``no_reports``; a full one is released whatever notes were refused."""
    q = _query()
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=2, lateness_epochs=2, idle_release_s=5.0, partitions=(0,),
                              note_lead_epochs=1), q, e)
    _fill(p, q, e, 2)
    assert _offer(p, q, SourceEpoch(epoch=e)) is None
    assert _offer(p, q, SourceEpoch(epoch=e + 1)) is None
    assert _offer(p, q, SourceEpoch(epoch=e + 6)) == "note_from_future"
    p.note_refused(e + 1)  # and an unsigned note of e + 1 (the runtime's untrusted_note)
    p.advance(e + 8, lambda x: [q])
    got = {k[2]: p.close(k, np.random.default_rng(0)) for k in p.open_epochs}
    assert isinstance(got[e], Released)
    reasons = {epoch: out.reason for epoch, out in got.items() if isinstance(out, Withheld)}
    assert reasons == {e + 1: "notes_refused", e + 2: "notes_refused", e + 3: "notes_refused",
                       e + 4: "no_reports", e + 5: "no_reports", e + 6: "notes_refused", e + 7: "notes_refused",
                       e + 8: "notes_refused"}
    assert "source note(s)" in got[e + 6].detail  # type: ignore[union-attr]


# -- the release is the query's (issue 33, item 3) --------------------------------------------------------------


def _released_under(query_release: str | None, shuffler_release: str) -> Released | Withheld:
    q = _query().model_copy(update={"release": query_release})
    e = q.epoch_range()[0]
    p = _opened(ShufflePolicy(min_crowd=1, lateness_epochs=2, idle_release_s=5.0, partitions=(0,)), q, e)
    _fill(p, q, e, 5)
    return p.close(("q", 1, e), np.random.default_rng(0), release=shuffler_release)


def test_a_shuffler_never_serves_a_query_under_another_release() -> None:
    """A shuffler under --release permuted given a query fixed to the aggregate release (what a
    device charged at the aggregate figure relies on) withholds its epoch ``release_mismatch``
    -- none of its reports leave -- and the other way round; a query that fixes none (null) or
    the shuffler's own release is served."""
    for query_release, shuffler_release in (("aggregate", "permuted"), ("permuted", "aggregate")):
        out = _released_under(query_release, shuffler_release)
        assert isinstance(out, Withheld) and out.reason == "release_mismatch", out
        assert out.devices == (5, 5) and f"fixes the {query_release} release" in out.detail
    for query_release, shuffler_release in ((None, "permuted"), (None, "aggregate"), ("permuted", "permuted"),
                                            ("aggregate", "aggregate")):
        out = _released_under(query_release, shuffler_release)
        assert isinstance(out, Released) and [r.devices for r in out.rounds] == [5, 5]
