"""A replayed synthetic day on a real broker: exactly the expected reports per epoch and round,
and summing them reproduces the statistics core's counts from the same seed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

import estimators as E
from producers.fleet import epoch_rng, fleet_share, query_truth_counts, split_fleet
from producers.pems import epoch_start
from producers.replay import default_queries, fleet_size_for, load_day, replay
from producers.settings import ReplaySettings
from schemas import DecodedBatch, GroundTruth, Query, decode_record
from schemas.kafka_io import publish_query, read_queries
from tests.processes import frozen
from tests.station_counts import pair_counts

from .kafka_helpers import Decoded, drain, wait_for_marker

pytestmark = pytest.mark.integration


def _core_counts(q: Query, settings: ReplaySettings, epoch: int, flows: np.ndarray, fleet: int,
                 producer: int = 0, producers: int = 1) -> list[np.ndarray]:
    """What the statistics core gives for this (query, epoch, producer) from the same seed:
    per round, the counts of reported values (sp) or of (station, report) pairs (alp/rr)."""
    day = load_day(settings)
    tc = query_truth_counts(split_fleet(settings.seed, epoch, flows, fleet, producers)[producer], day.stations, q)
    rng = epoch_rng(settings.seed, q, epoch, producer)
    if settings.mode == "tally":
        if q.mechanism == "sp":
            return list(q.build().tally(rng, tc))
        ps = E.PerStation(q.build(), q.n_stations)
        return [ps.tally(rng, tc[1:], int(tc.sum())).ravel()]
    truths = np.repeat(np.arange(tc.size), tc)
    rng.shuffle(truths)
    if q.mechanism == "sp":
        reports = q.build().sample(rng, truths)
        return [np.bincount(reports[r], minlength=q.n_stations + 1) for r in range(2)]
    ps = E.PerStation(q.build(), q.n_stations)
    return [pair_counts(q.spec, q.build(), q.n_stations, [ps.sample_sparse(rng, truths)], int(tc.sum())).ravel()]


def _wire_counts(q: Query, batches: list[tuple[int, DecodedBatch]], participants: int) -> np.ndarray:
    if q.mechanism == "sp":
        if batches and batches[0][1].header.layout == "counts":
            return sum(b.arrays["counts"] for _, b in batches)  # type: ignore[return-value]
        values = np.concatenate([b.arrays["value"] for _, b in batches])
        return np.bincount(values, minlength=q.n_stations + 1)
    if batches and batches[0][1].header.layout == "counts":
        return sum(b.arrays["counts"] for _, b in batches)  # type: ignore[return-value]
    st = np.concatenate([b.arrays["station"] for _, b in batches]) if batches else np.zeros(0, np.int64)
    out = np.concatenate([b.arrays["output"] for _, b in batches]) if batches else np.zeros(0, np.int64)
    pairs = E.SparseReports(np.zeros_like(st), st, out)
    return pair_counts(q.spec, q.build(), q.n_stations, [pairs], participants).ravel()


@pytest.mark.parametrize("mode", ["per-vehicle", "tally"])
def test_replayed_day_matches_the_statistics_core(replay_settings: ReplaySettings, mode: str) -> None:
    settings = replay_settings.model_copy(update={"mode": mode})
    summary = replay(settings, progress=False)
    day = load_day(settings)
    fleet = fleet_size_for(day, settings)
    assert summary.epochs == 8 and summary.delivery_failures == 0 and not summary.interrupted
    queries = {q.query_id: q for q in read_queries(settings)}
    assert set(queries) == {"sp-day", "alp-day", "rr-day"}
    wire = Decoded(drain(settings, settings.reports_topic))
    assert not wire.other
    for i in range(8):
        epoch = int(day.epochs[i])
        for q in queries.values():
            for r in range(q.n_rounds):
                key = (q.query_id, 1, epoch, r)
                batches = wire.batches[key]
                markers = wire.markers[key]
                # one marker per partition, each with exactly what reached that partition
                assert sorted(m.partition for m in markers) == [0, 1, 2]
                for m in markers:
                    on_p = [b for p, b in batches if p == m.partition]
                    assert m.reports_to_partition == sum(b.header.reports for b in on_p)
                    assert m.batches_to_partition == len(on_p)
                    assert m.reports_total == sum(b.header.reports for _, b in batches)
                    assert m.participants == fleet and m.refused == 0 and m.mode == mode
                if q.mechanism == "sp" or mode == "tally":  # one report per vehicle per round
                    assert sum(b.header.reports for _, b in batches) == fleet
                expected = _core_counts(q, settings, epoch, day.flows[i], fleet)[r]
                got = _wire_counts(q, batches, fleet)
                np.testing.assert_array_equal(got, expected)
    # batch ids are unique (duplicates downstream are deliveries, not data), keys are batch ids
    ids = [b.header.batch_id for bs in wire.batches.values() for _, b in bs]
    assert len(ids) == len(set(ids))
    assert Counter(k.decode() for k in wire.keys if k) == Counter(ids)


def test_ground_truth_topic(replay_settings: ReplaySettings) -> None:
    replay(replay_settings, progress=False)
    day = load_day(replay_settings)
    truths = [decode_record(r.value) for r in drain(replay_settings, replay_settings.truth_topic)]
    assert len(truths) == 8
    for i, t in enumerate(sorted(truths, key=lambda t: t.epoch)):  # type: ignore[union-attr]
        assert isinstance(t, GroundTruth) and t.evaluation_only
        assert t.epoch == int(day.epochs[i]) and list(t.flows) == [int(f) for f in day.flows[i]]
        assert list(t.stations) == [int(s) for s in day.stations]
    off = replay_settings.model_copy(update={"truth": False, "truth_topic": replay_settings.truth_topic + "-off"})
    replay(off, progress=False)
    assert drain(off, off.truth_topic, quiet_polls=2) == []


def test_two_producer_processes_share_the_fleet(replay_settings: ReplaySettings) -> None:
    settings = replay_settings.model_copy(update={"producers": 2, "max_epochs": 4})
    summary = replay(settings, progress=False)
    assert summary.epochs == 4 and summary.delivery_failures == 0
    day = load_day(settings)
    fleet = fleet_size_for(day, settings)
    wire = Decoded(drain(settings, settings.reports_topic))
    q = next(q for q in read_queries(settings) if q.mechanism == "sp")
    for i in range(4):
        epoch = int(day.epochs[i])
        for r in range(2):
            batches = wire.batches[(q.query_id, 1, epoch, r)]
            assert sum(b.header.reports for _, b in batches) == fleet
            markers = wire.markers[(q.query_id, 1, epoch, r)]
            assert len(markers) == 2 * 3  # two producers x three partitions
            assert {m.producer_count for m in markers} == {2}
            by_producer = {m.producer_index: m.participants for m in markers}
            assert by_producer == {k: fleet_share(fleet, k, 2) for k in range(2)}
            # the two producers' reports add up to the statistics core's per-producer counts
            producer_of = {m.producer_id: m.producer_index for m in markers}
            for k in range(2):
                mine = [(p, b) for p, b in batches if producer_of[b.header.producer_id] == k]
                expected = _core_counts(q, settings, epoch, day.flows[i], fleet, k, 2)[r]
                np.testing.assert_array_equal(_wire_counts(q, mine, fleet_share(fleet, k, 2)), expected)


def test_new_query_version_takes_effect_at_an_epoch_boundary(replay_settings: ReplaySettings) -> None:
    day = load_day(replay_settings)
    fleet = fleet_size_for(day, replay_settings)
    v1 = next(q for q in default_queries(day, fleet, replay_settings.mechanisms) if q.mechanism == "sp")
    switch = epoch_start(int(day.epochs[3])) + timedelta(seconds=10)  # mid-epoch 3: effective from epoch 4
    v2 = v1.model_copy(update={"version": 2, "params": {"pis": 0.3}, "t_start": switch})
    publish_query(replay_settings, v1)
    publish_query(replay_settings, Query.model_validate(v2.model_dump()))
    replay(replay_settings.model_copy(update={"default_queries": False}), progress=False)
    wire = Decoded(drain(replay_settings, replay_settings.reports_topic))
    versions = {e: v for (qid, v, e, r) in wire.batches if qid == v1.query_id}
    first = int(day.epochs[0])
    assert [versions[first + i] for i in range(8)] == [1, 1, 1, 1, 2, 2, 2, 2]


def test_device_audit_refuses_and_is_counted(replay_settings: ReplaySettings) -> None:
    """Limit 1.5: SP over 6 stations (ln 6.73 = 1.91) and RR (ln 21) are refused, ALP (ln 3.5 = 1.25)
    is answered."""
    settings = replay_settings.model_copy(update={"device_epsilon_limit": 1.5, "max_epochs": 3})
    summary = replay(settings, progress=False)
    day = load_day(settings)
    fleet = fleet_size_for(day, settings)
    queries = {q.query_id: q for q in read_queries(settings)}
    refused = {qid for qid, q in queries.items() if q.epsilon > 1.5}
    assert refused == {"sp-day", "rr-day"}
    assert summary.refused == Counter({qid: 3 * fleet for qid in refused})
    wire = Decoded(drain(settings, settings.reports_topic))
    assert {k[0] for k in wire.batches} == {"alp-day"}
    for (qid, _, _, _), markers in wire.markers.items():
        for m in markers:
            assert (m.refused, m.participants) == ((fleet, 0) if qid in refused else (0, fleet))


def test_blacklisted_sensor_refuses(replay_settings: ReplaySettings) -> None:
    day = load_day(replay_settings)
    settings = replay_settings.model_copy(update={"device_blacklist": (int(day.stations[2]),), "max_epochs": 2})
    summary = replay(settings, progress=False)
    assert set(summary.refused) == {"sp-day", "alp-day", "rr-day"}
    assert "blacklisted" in summary.refusal_reasons["alp-day"]


def test_fleet_too_small_and_expansion(replay_settings: ReplaySettings) -> None:
    day = load_day(replay_settings)
    need = day.peak_total()
    with pytest.raises(ValueError, match="smaller than the day's peak total flow"):
        fleet_size_for(day, replay_settings.model_copy(update={"fleet_size": need - 1}))
    big = replay_settings.model_copy(update={"expand_to": 20 * need, "max_epochs": 2})
    summary = replay(big, progress=False)
    assert summary.fleet_size == 20 * need
    wire = Decoded(drain(big, big.reports_topic))
    sp = [b for (qid, _, _, r), bs in wire.batches.items() if qid == "sp-day" and r == 0 for _, b in bs]
    assert sum(b.header.reports for b in sp) == 2 * 20 * need


def test_speed_paces_epochs(replay_settings: ReplaySettings) -> None:
    """--speed 300: one epoch per 0.1 s, so 6 epochs take at least 0.5 s (a lower bound only)."""
    settings = replay_settings.model_copy(update={"speed": 300.0, "max_epochs": 6})
    t0 = time.time()
    replay(settings, progress=False)
    assert time.time() - t0 >= 0.5


def _cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stream_app.cli", *args], stdout=subprocess.PIPE,  # noqa: S603
                            stderr=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]


def test_unreachable_broker_is_a_clear_error(tmp_path: Path) -> None:
    proc = _cli("replay", "--bootstrap-servers", "127.0.0.1:1", "--bootstrap-timeout-ms", "300",
                "--connect-attempts", "2", "--max-epochs", "1", "--quiet", "--data-dir", str(tmp_path), cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "cannot reach the Kafka broker at 127.0.0.1:1" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("producers", "speed"), [(1, "20"), (2, "20"), (2, "0")])
def test_ctrl_c_flushes_and_marks(replay_settings: ReplaySettings, producers: int, speed: str) -> None:
    """SIGINT mid-replay: exit 130 and the producers stop at one epoch (docs/wire.md, "Ctrl-C"):
    every epoch on the topic has every producer's markers for every query, round and partition;
    every epoch before the last is complete (no marker interrupted, and each Sampling Privacy
    round holds one report per participant); in the last epoch each producer is either complete
    or interrupted as a whole; every marker says exactly what is on the topic. Where the signal
    lands is up to the machine; the rule must hold wherever. Unpaced (speed 0) the producers are
    always mid-epoch, one of them often an epoch ahead: the case that used to leave an
    interrupted marker in the next-to-last epoch and the newest epoch without a producer."""
    s = replay_settings
    env = {**os.environ, "PTT_BOOTSTRAP_SERVERS": s.bootstrap_servers, "PTT_REPORTS_TOPIC": s.reports_topic,
           "PTT_QUERIES_TOPIC": s.queries_topic, "PTT_TRUTH_TOPIC": s.truth_topic, "PTT_DATA_DIR": str(s.data_dir),
           "PTT_SYNTHETIC_STATIONS": "6", "PTT_PARTITIONS": "3", "PTT_QUERY_MECHANISMS": s.query_mechanisms}
    max_epochs = 100 if speed != "0" else 2880  # paced: 150 s; unpaced: a whole day, far more than the wait
    proc = _cli("replay", "--speed", speed, "--max-epochs", str(max_epochs), "--quiet", "--producers",
                str(producers), env=env)
    wait_for_marker(s, s.reports_topic, proc, timeout_s=90)  # mid-replay: the first epoch is on the topic
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    wire = Decoded(drain(s, s.reports_topic))
    epochs = sorted({k[2] for k in wire.markers})
    assert 1 <= len(epochs) < max_epochs
    assert epochs == list(range(epochs[0], epochs[0] + len(epochs)))
    slots = {(i, p) for i in range(producers) for p in range(3)}  # (producer, partition)
    for key, ms in wire.markers.items():  # every producer marked every epoch, query and round
        assert sorted((m.producer_index, m.partition) for m in ms) == sorted(slots), key
        assert all(m.producer_count == producers for m in ms)
    assert {k[:2] for k in wire.markers} == {("sp-day", 1), ("alp-day", 1), ("rr-day", 1)}
    for (qid, _, e, _), ms in wire.markers.items():
        producer_states = {i: {m.interrupted for m in ms if m.producer_index == i} for i in range(producers)}
        assert all(len(v) == 1 for v in producer_states.values()), (qid, e, producer_states)
        if e != epochs[-1]:
            assert not any(m.interrupted for m in ms), (qid, e)
        complete = [m for m in ms if not m.interrupted]
        if qid == "sp-day":  # a complete producer sent one report per participant and round
            assert all(m.reports_total == m.participants > 0 for m in complete), (e, complete)
    for ms in wire.markers.values():  # what every marker says was sent is exactly what is there
        for m in ms:
            on_p = [b for p, b in wire.batches[(m.query_id, 1, m.epoch, m.round)]
                    if p == m.partition and b.header.producer_id == m.producer_id]
            assert m.reports_to_partition == sum(b.header.reports for b in on_p)
            assert m.batches_to_partition == len(on_p)
    assert all(e in epochs for (_, _, e, _) in wire.batches)  # nothing sent of an epoch left unmarked


def _replay_env(s: ReplaySettings) -> dict[str, str]:
    """The environment of a ``ptt replay`` subprocess on ``s``'s broker, topics and data."""
    return {**os.environ, "PTT_BOOTSTRAP_SERVERS": s.bootstrap_servers, "PTT_REPORTS_TOPIC": s.reports_topic,
            "PTT_QUERIES_TOPIC": s.queries_topic, "PTT_TRUTH_TOPIC": s.truth_topic, "PTT_DATA_DIR": str(s.data_dir),
            "PTT_SYNTHETIC_STATIONS": str(s.synthetic_stations), "PTT_PARTITIONS": str(s.partitions),
            "PTT_QUERY_MECHANISMS": s.query_mechanisms}


def test_sigterm_mid_epoch_flushes_and_marks(replay_settings: ReplaySettings) -> None:
    """SIGTERM (what a service manager sends) while one producer sends as fast as it can, so it
    lands inside an epoch: exit 130; the broker acknowledged everything sent (the summary counts
    no less than was sent, and exactly what is on the topic); every report record on the topic
    is counted by its producer's marker for its partition and every marker counts exactly what
    is there; only the last epoch can be marked interrupted."""
    s = replay_settings
    proc = _cli("replay", "--speed", "0", "--max-epochs", "2880", "--quiet", env=_replay_env(s))
    wait_for_marker(s, s.reports_topic, proc, timeout_s=90)  # mid-replay: the first epoch is on the topic
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: sent data flushed and marked" in err and "Traceback" not in err
    done = re.search(r"replayed (\d+) epochs, ([\d,]+) reports in ([\d,]+) records in", out)
    assert done is not None, out  # not "the broker acknowledged X of Y reports sent"
    completed, reports, records = (int(g.replace(",", "")) for g in done.groups())
    assert 1 <= completed < 2880, out
    wire = Decoded(drain(s, s.reports_topic))
    batches = [(p, b) for bs in wire.batches.values() for p, b in bs]
    assert (sum(b.header.reports for _, b in batches), len(batches)) == (reports, records)
    for key, bs in wire.batches.items():  # everything sent is marked ...
        for p, b in bs:
            assert any(m.partition == p and m.producer_id == b.header.producer_id for m in wire.markers[key]), key
    for ms in wire.markers.values():  # ... with exactly what is there
        for m in ms:
            on_p = [b for p, b in wire.batches[(m.query_id, 1, m.epoch, m.round)]
                    if p == m.partition and b.header.producer_id == m.producer_id]
            assert (m.reports_to_partition, m.batches_to_partition) == (sum(b.header.reports for b in on_p),
                                                                        len(on_p))
    epochs = sorted({k[2] for k in wire.markers})
    assert len(epochs) in (completed, completed + 1)  # the epoch under way when the signal came, if any
    assert {m.epoch for ms in wire.markers.values() for m in ms if m.interrupted} <= {epochs[-1]}


def test_a_second_ctrl_c_forces_quit(replay_settings: ReplaySettings, tmp_path: Path) -> None:
    """The first Ctrl-C starts a clean stop, which waits for the broker to acknowledge what was
    sent; with the broker frozen (SIGSTOP) that wait would last the loss timeout (120 s here).
    The first Ctrl-C says a second one quits at once; the second one ends the process with exit
    code 130 within FORCE_QUIT_GRACE_S (+ 3 s of slack), without a traceback. A broker of its
    own: the session's broker must not be frozen."""
    from producers.stopping import FORCE_QUIT_GRACE_S
    from stream_app.cli.local_broker import LocalBroker

    with LocalBroker(log_path=tmp_path / "tansu.log") as broker:
        assert broker.pid is not None
        s = replay_settings.model_copy(update={"bootstrap_servers": broker.bootstrap})
        err_path = tmp_path / "replay.err"
        with err_path.open("w") as err_file:
            proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "0",  # noqa: S603
                                     "--max-epochs", "2880", "--quiet", "--broker-loss-timeout-s", "120"],
                                    env=_replay_env(s), stdout=subprocess.DEVNULL, stderr=err_file, text=True)
        try:
            wait_for_marker(s, s.reports_topic, proc, timeout_s=90)
            with frozen(broker.pid):
                proc.send_signal(signal.SIGINT)
                deadline = time.monotonic() + 30
                while "Ctrl-C again to quit at once" not in err_path.read_text() and time.monotonic() < deadline:
                    assert proc.poll() is None, err_path.read_text()
                    time.sleep(0.05)
                assert "Ctrl-C again to quit at once" in err_path.read_text()
                assert proc.poll() is None  # the clean stop is still waiting for the frozen broker
                t0 = time.monotonic()
                proc.send_signal(signal.SIGINT)
                code = proc.wait(timeout=FORCE_QUIT_GRACE_S + 3)
                assert time.monotonic() - t0 <= FORCE_QUIT_GRACE_S + 3
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    err = err_path.read_text()
    assert code == 130, err
    assert "Traceback" not in err


def test_records_the_broker_refuses_are_delivery_failures_exit_1(replay_settings: ReplaySettings, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Records the broker refuses are delivery failures (README's exit codes, docs/wire.md):
    the replay prints its summary, then one line saying how many and why, and exits with 1. The
    broker refuses them for real: Tansu's schema registry (``SCHEMA_REGISTRY``, relative to its
    working directory) rejects every ground-truth record with INVALID_RECORD through a JSON schema
    no ``GroundTruth`` satisfies. A broker of its own (the registry is fixed at its start)."""
    from stream_app.cli.local_broker import LocalBroker

    registry = tmp_path / "registry"
    registry.mkdir()
    schema = {"type": "object", "properties": {"value": {"type": "object", "required": ["never_sent"]}}}
    (registry / f"{replay_settings.truth_topic}.json").write_text(json.dumps(schema))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SCHEMA_REGISTRY", "file://./registry")
    with LocalBroker(log_path=tmp_path / "tansu.log") as broker:
        s = replay_settings.model_copy(update={"bootstrap_servers": broker.bootstrap})
        proc = _cli("replay", "--max-epochs", "3", "--quiet", env=_replay_env(s))
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "replayed 3 epochs" in out, out  # the summary first
    (line,) = err.strip().splitlines()  # then one line, no traceback
    failed = re.fullmatch(r"ptt replay: error: (\d+) records could not be delivered \((.+)\); check the broker's "
                          r"health and replay into fresh topics", line)
    assert failed is not None, line
    assert int(failed.group(1)) >= 3 and "InvalidRecordError" in failed.group(2)  # >= the 3 ground-truth records
