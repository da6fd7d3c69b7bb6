"""A replayed synthetic day with a 5-minute (span_s 300) unary query on a real broker: exactly one
report per device per span, carrying the span's first epoch, and its markers -- sent only with
the span's report; a span begun before the replay's first epoch is not sent (counted), the span
the replay ends in is marked interrupted with nothing sent. The tally path's counts are the
statistics core's from the same seeds (SpanFleet, cap_passages), and through
--via-shuffler every device of the fleet sends exactly one record per span."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter, defaultdict

import numpy as np
import pytest

from producers.fleet import Device, epoch_rng, privatize, split_fleet
from producers.pems import epoch_start
from producers.replay import fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from producers.spans import SpanFleet, cap_passages
from schemas import Query
from schemas.device_binary import DeviceFields, unpack_device
from schemas.kafka_io import publish_query

from .kafka_helpers import Decoded, drain, wait_for_marker

pytestmark = pytest.mark.integration

START, EPOCHS = 5, 27  # epochs 5..31 of the day: spans [0, 10) in part, [10, 20), [20, 30), [30, 40) in part


def _queries(settings: ReplaySettings) -> tuple[Query, Query]:
    day = load_day(settings)
    common = {"analyst_id": "a", "version": 1, "sensors": tuple(int(s) for s in day.stations), "population": 1000,
              "t_start": epoch_start(int(day.epochs[0])), "t_end": epoch_start(int(day.epochs[-1]) + 1)}
    span = Query(query_id="flow-5min", mechanism="unary", span_s=300, max_passages=2, **common)
    live = Query(query_id="live-30s", mechanism="unary", **common)
    return span, live


def _settings(replay_settings: ReplaySettings, **update: object) -> tuple[ReplaySettings, Query, Query]:
    settings = replay_settings.model_copy(update={"start_epoch": START, "max_epochs": EPOCHS,
                                                  "default_queries": False, **update})
    span, live = _queries(settings)
    for q in (span, live):
        publish_query(settings, q)
    return settings, span, live


def _core_span_counts(settings: ReplaySettings, q: Query, start: int, fleet: int) -> tuple[np.ndarray, int]:
    """The statistics core's tally of ``q``'s span from ``start`` from the same seeds, and the
    passages its cap drops."""
    day = load_day(settings)
    sf = SpanFleet(settings.seed, q.span_s, fleet, day.stations.size, 0, day.stations)
    for i in np.flatnonzero((day.epochs >= start) & (day.epochs < start + q.epochs_per_span)):
        e = int(day.epochs[i])
        sf.step(e, split_fleet(settings.seed, e, day.flows[i], fleet, 1)[0])
    assert sf.complete
    rng = epoch_rng(settings.seed, q, start, 0)
    sets, dropped = cap_passages(sf.query_sets(sf.passages(), day.stations, q), q.passages, rng)
    er = privatize(q, sets, rng, "tally", Device(settings.device_epsilon_limit),
                        day=epoch_start(start).date().isoformat())
    return er.rounds[0].arrays()["counts"], dropped


@pytest.mark.parametrize("mode", ["tally", "per-vehicle"])
def test_one_report_per_device_per_span_with_its_markers(replay_settings: ReplaySettings, mode: str) -> None:
    settings, span, live = _settings(replay_settings, mode=mode)
    summary = replay(settings, progress=False)
    day = load_day(settings)
    e0 = int(day.epochs[0])
    assert e0 % 10 == 0  # the day starts on a 5-minute boundary (midnight Pacific)
    fleet = summary.fleet_size
    assert fleet == fleet_size_for(day, settings, {300}) > day.peak_total()  # the span flow sizes it
    assert "300-s span flow" in summary.fleet_basis
    assert summary.epochs == EPOCHS and not summary.interrupted and summary.delivery_failures == 0
    assert summary.spans_sent == Counter({"flow-5min": 2})
    assert summary.spans_skipped == Counter({"flow-5min": 1}) and "first epoch" in summary.span_skip_reasons[
        "flow-5min"]
    wire = Decoded(drain(settings, settings.reports_topic))
    span_batches = {k: v for k, v in wire.batches.items() if k[0] == "flow-5min"}
    span_markers = {k: v for k, v in wire.markers.items() if k[0] == "flow-5min"}
    whole = [e0 + 10, e0 + 20]
    assert sorted(k[2] for k in span_batches) == whole  # reports only for whole spans, at their first epoch
    assert sorted(k[2] for k in span_markers) == [*whole, e0 + 30]
    for start in whole:
        batches = span_batches[("flow-5min", 1, start, 0)]
        markers = span_markers[("flow-5min", 1, start, 0)]
        assert sorted(m.partition for m in markers) == [0, 1, 2]
        for m in markers:
            assert not m.interrupted and m.participants == fleet and m.refused == 0 and m.epoch == start
            assert m.reports_total == sum(b.header.reports for _, b in batches)
            assert m.reports_to_partition == sum(b.header.reports for p, b in batches if p == m.partition)
        if mode == "tally":  # one report per device: every station's tally row counts the fleet, once
            assert sum(b.header.reports for _, b in batches) == fleet
            got = sum(b.arrays["counts"] for _, b in batches)
            want, _ = _core_span_counts(settings, span, start, fleet)
            np.testing.assert_array_equal(got, want)
            assert np.all(np.asarray(got).reshape(span.n_stations, 2).sum(axis=1) == fleet)
    dropped = sum(_core_span_counts(settings, span, s, fleet)[1] for s in whole)
    assert summary.passages_dropped["flow-5min"] == dropped > 0  # the cap at 2 passages binds
    # the span the replay ended in: marked interrupted, nothing sent
    for m in span_markers[("flow-5min", 1, e0 + 30, 0)]:
        assert m.interrupted and m.reports_total == 0 and m.participants == 0
    # the 30-s query beside it: as before, every epoch reported and marked, none interrupted
    live_epochs = sorted({k[2] for k in wire.markers if k[0] == "live-30s"})
    assert live_epochs == [e0 + START + i for i in range(EPOCHS)]
    assert {k[2] for k in wire.batches if k[0] == "live-30s"} == set(live_epochs)
    assert not any(m.interrupted for k, ms in wire.markers.items() if k[0] == "live-30s" for m in ms)


def test_via_shuffler_every_device_sends_one_record_per_span(replay_settings: ReplaySettings) -> None:
    settings, span, live = _settings(replay_settings, via_shuffler=True,
                                     device_topic=f"devices-{uuid.uuid4().hex[:8]}", device_partitions=3)
    summary = replay(settings, progress=False)
    e0 = int(load_day(settings).epochs[0])
    fleet = summary.fleet_size
    devices: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rec in drain(settings, settings.device_topic):
        f = unpack_device(rec.value)
        assert isinstance(f, DeviceFields) and f.device is not None
        devices[(f.query_id, f.epoch)].append(f.device)
    span_epochs = sorted(e for qid, e in devices if qid == "flow-5min")
    assert span_epochs == [e0 + 10, e0 + 20]
    for e in span_epochs:
        got = devices[("flow-5min", e)]
        assert len(got) == fleet and len(set(got)) == fleet  # each enrolled device of the fleet once
    assert sorted(e for qid, e in devices if qid == "live-30s") == [e0 + START + i for i in range(EPOCHS)]
    assert summary.spans_sent["flow-5min"] == 2


def test_ctrl_c_mid_span_marks_the_span_interrupted_with_nothing_sent(replay_settings: ReplaySettings) -> None:
    """SIGINT while a paced replay (speed 20: 1.5 s an epoch, 15 s a span) is inside a span: exit
    130; the span query's markers are those of the whole spans before the stop (not interrupted,
    their reports there) and of the span the stop fell in, carrying its first epoch: interrupted,
    nothing sent (unless the stop fell on the span's last epoch, whose report was being sent:
    then interrupted with exactly what is there); no span query report of any other epoch."""
    settings = replay_settings.model_copy(update={"default_queries": False})
    span, live = _queries(settings)
    for q in (span, live):
        publish_query(settings, q)
    s = settings
    env = {**os.environ, "PTT_BOOTSTRAP_SERVERS": s.bootstrap_servers, "PTT_REPORTS_TOPIC": s.reports_topic,
           "PTT_QUERIES_TOPIC": s.queries_topic, "PTT_TRUTH_TOPIC": s.truth_topic, "PTT_DATA_DIR": str(s.data_dir),
           "PTT_SYNTHETIC_STATIONS": str(s.synthetic_stations), "PTT_PARTITIONS": str(s.partitions)}
    proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "20", "--max-epochs",  # noqa: S603
                             "100", "--quiet", "--no-default-queries"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    wait_for_marker(s, s.reports_topic, proc, timeout_s=90)  # the 30-s query's first epoch is marked
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    wire = Decoded(drain(s, s.reports_topic))
    last = max(k[2] for k in wire.markers if k[0] == "live-30s")
    stop_span = span.span_start(last)
    starts = sorted({k[2] for k in wire.markers if k[0] == "flow-5min"})
    assert starts and starts[-1] == stop_span and all(e % 10 == 0 for e in starts)
    assert {k[2] for k in wire.batches if k[0] == "flow-5min"} <= set(starts)
    for e in starts:
        ms = wire.markers[("flow-5min", 1, e, 0)]
        assert sorted(m.partition for m in ms) == [0, 1, 2]
        sent = sum(b.header.reports for _, b in wire.batches.get(("flow-5min", 1, e, 0), []))
        for m in ms:
            assert m.epoch == e and m.reports_total == sent
            if e != stop_span:
                assert not m.interrupted and m.participants > 0
            else:
                assert m.interrupted
                if last != e + 9:  # the stop fell before the span's last epoch: nothing of it was sent
                    assert sent == 0 and m.participants == 0
