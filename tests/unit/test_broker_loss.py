"""Deciding that a broker is lost (pure), the worker's guard (no network), and what the
command line makes of a loss: exit code 7, the summary of what was acknowledged on stdout,
one line on stderr. The real broker dying is tests/integration/test_broker_loss.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from producers import replay as replay_mod
from producers.replay import ReplayLost, ReplaySummary
from producers.settings import ReplaySettings
from schemas.kafka_io import BrokerHealth, BrokerUnavailable, broker_lost
from stream_app import app as app_mod
from stream_app.cli import EXIT_BROKER_LOST, EXIT_CODES, main, replay_summary_lines
from stream_app.guard import BrokerGuard
from stream_app.settings import WorkerSettings


def test_silence_counts_from_the_last_sign_of_life_or_the_start_of_a_wait() -> None:
    h = BrokerHealth(timeout_s=10.0, now=0.0)
    assert h.silent(9.0, "refused") is None
    h.alive(9.0)  # an acknowledgement
    assert h.silent(18.5, "refused") is None
    h.waiting(100.0)  # idle for long, then a new wait: not silent since 9 s
    assert h.silent(105.0, "refused") is None
    assert h.silent(110.5, "refused") == "no answer from the broker for 10.5s: refused"
    h.alive(111.0)  # the verdict sticks
    assert h.lost is not None and h.seen({"t": "x"}) == h.lost


def test_topics_without_ids_are_not_judged_by_id() -> None:
    h = BrokerHealth(10.0, 0.0)
    assert h.seen({"t": ""}) is None and h.seen({"t": "00000000-0000-0000-0000-000000000000"}) is None
    assert h.seen({"t": "a"}) is None and h.seen({"t": "a", "u": "b"}) is None
    assert h.seen({"t": "a", "u": "c"}) == "topic u was deleted and recreated: the broker restarted?"


def test_broker_lost_is_a_broker_error_with_what_to_do() -> None:
    exc = broker_lost(ReplaySettings(bootstrap_servers="10.0.0.1:9092"), "topic x is gone")
    assert isinstance(exc, BrokerUnavailable)  # callers catching the broker's errors still do
    text = str(exc)
    assert text.startswith("lost the Kafka broker at 10.0.0.1:9092 mid-run (topic x is gone); ")
    assert "start the broker again" in text and "--broker-loss-timeout-s" in text and "\n" not in text


def test_guard_declares_once_and_one_reporter_settles() -> None:
    guard = BrokerGuard(WorkerSettings(broker_loss_timeout_s=5.0), ["t"])
    calls: list[str] = []
    guard._on_lost = calls.append  # as start() would, without the checking thread
    assert guard.failing("publishing estimates", since=float("inf"), why="KafkaTimeoutError") is None
    threads = [threading.Thread(target=guard.declare, args=(f"reason {i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and guard.lost == calls[0]
    assert guard.failing("publishing estimates", since=0.0, why="x") == calls[0]  # the first verdict sticks
    assert [guard.settle() for _ in range(3)] == [True, False, False]


def test_guard_failing_past_the_timeout_is_a_loss() -> None:
    guard = BrokerGuard(WorkerSettings(broker_loss_timeout_s=1.0), ["t"])
    verdict = guard.failing("publishing estimates", since=0.0, why="KafkaTimeoutError: expired")
    assert verdict is not None and verdict.startswith("publishing estimates failed for ")
    assert verdict.endswith(": KafkaTimeoutError: expired")


def test_exit_code_7_is_documented() -> None:
    assert EXIT_BROKER_LOST == 7 and "lost mid-run" in EXIT_CODES[7]


def _summary(epochs: int, reports: int, records: int, reports_sent: int, records_sent: int) -> ReplaySummary:
    return ReplaySummary(epochs=epochs, reports=reports, records=records, reports_sent=reports_sent,
                         records_sent=records_sent, fleet_size=247, data_quality="ok", elapsed_s=9.5)


def test_summary_lines_say_what_was_acknowledged() -> None:
    same = replay_summary_lines(_summary(epochs=5, reports=10, records=2, reports_sent=10, records_sent=2))
    assert same[1] == "fleet: 247 vehicles; replayed 5 epochs, 10 reports in 2 records in 9.5s"
    less = replay_summary_lines(_summary(epochs=5, reports=3208, records=20, reports_sent=3846, records_sent=24))
    assert less[1] == ("fleet: 247 vehicles; replayed 5 epochs, the broker acknowledged 3,208 of 3,846 reports sent "
                       "(20 of 24 records) in 9.5s")


def test_replay_that_lost_the_broker_prints_its_summary_then_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def lost(settings: ReplaySettings, progress: bool = True) -> ReplaySummary:
        summary = _summary(epochs=2, reports=1291, records=8, reports_sent=1910, records_sent=12)
        raise ReplayLost(str(broker_lost(settings, "no answer from the broker for 3.0s: refused")), summary)

    monkeypatch.setattr(replay_mod, "replay", lost)
    code = main(["replay", "--bootstrap-servers", "127.0.0.1:1", "--quiet", "--data-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == EXIT_BROKER_LOST
    assert "the broker acknowledged 1,291 of 1,910 reports sent (8 of 12 records)" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("ptt replay: error: lost the Kafka broker at 127.0.0.1:1 mid-run (no answer")


def test_worker_that_lost_the_broker_is_one_line(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, held_port: int,
                                                 tmp_path: Path) -> None:
    def lost(settings: WorkerSettings) -> int:
        raise broker_lost(settings, "topic ptt.reports is gone: deleted, or the broker restarted")

    monkeypatch.setattr(app_mod, "run_worker", lost)
    from producers.local_broker import free_port

    code = main(["worker", "--bootstrap-servers", f"127.0.0.1:{held_port}", "--web-port", str(free_port())])
    err = capsys.readouterr().err
    assert code == EXIT_BROKER_LOST
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ptt worker: error: lost the Kafka broker at 127.0.0.1:{held_port} mid-run (topic")
