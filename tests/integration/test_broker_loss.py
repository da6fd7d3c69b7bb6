"""Issue 9, case 7: the embedded broker keeps everything in memory, and it dies (SIGKILL) or
restarts empty under a running replay or worker. Each of them must end within a bound with
one line on stderr (what happened, what to do), exit code 7 and no traceback; the replay's
summary counts what the broker acknowledged, not what was handed to the producer. And the
converse: a worker whose broker stays up never declares it lost, even when it started
before its topics existed, on a loaded machine.

The loss tests run their own broker (the session's broker is not touched) with a loss
timeout of a few seconds; every test waits for conditions, never for a fixed time."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from producers import replay as replay_mod
from producers.local_broker import LocalBroker, child_options, terminate_all
from producers.replay import ReplayLost, replay
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from stream_app.cli import EXIT_BROKER_LOST
from stream_app.guard import check_interval_s, stop_grace_s

from .kafka_helpers import wait_for_marker
from .stream_helpers import WorkerProcess, env_for, pipeline_settings, read_estimates, wait_for

pytestmark = pytest.mark.integration

LOSS_TIMEOUT_S = 3.0
ACKED = re.compile(r"the broker acknowledged ([\d,]+) of ([\d,]+) reports sent \(([\d,]+) of ([\d,]+) records\)")


class OwnBroker:
    """A broker of this test only; ``kill`` is a crash, ``restart`` a crash and an empty start
    on the same port (what a supervisor restarting the embedded broker does)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.broker = LocalBroker(log_path=log).start()
        self.bootstrap = self.broker.bootstrap

    def kill(self) -> None:
        self.broker.kill()

    def restart(self) -> None:
        self.broker.kill()
        self.broker = LocalBroker(port=self.broker.port, log_path=self.log.with_suffix(".2.log")).start()

    def lose(self, how: str) -> None:
        self.kill() if how == "kill" else self.restart()

    def stop(self) -> None:
        self.broker.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    b = OwnBroker(tmp_path / "tansu.log")
    try:
        yield b
    finally:
        b.stop()


def _settings(own: OwnBroker, tmp_path: Path, base: Path, **kw: Any) -> ReplaySettings:
    rs, _ = pipeline_settings(own.bootstrap, tmp_path)
    return rs.model_copy(update={"data_dir": base / "ptt-data", "broker_loss_timeout_s": LOSS_TIMEOUT_S, **kw})


def _one_line(err: str, command: str) -> str:
    """stderr is exactly one line, the error, without a traceback; returns it."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"ptt {command}: error: lost the Kafka broker at "), err
    return lines[0]


def _count(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize(("producers", "how"), [(1, "kill"), (2, "kill"), (1, "restart")])
def test_replay_ends_with_one_line_when_the_broker_is_lost(own_broker: OwnBroker, tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           producers: int, how: str) -> None:
    """The broker dies mid-replay (or restarts empty): exit 7 within the loss timeout plus a
    margin, one line naming the loss and what to do, and a summary whose acknowledged reports
    are fewer than those sent (the epoch after the loss was sent, never acknowledged)."""
    s = _settings(own_broker, tmp_path, tmp_path_factory.getbasetemp())
    # speed 5: an epoch every 6 s, sent at once -- the loss lands between epochs, so the next
    # epoch's reports are sent to a broker that is gone
    proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "5", "--max-epochs", "100",
                             "--quiet", "--producers", str(producers)],
                            env=env_for(s), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        wait_for_marker(s, s.reports_topic, proc)
        own_broker.lose(how)
        lost_at = time.monotonic()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - lost_at
    assert proc.returncode == EXIT_BROKER_LOST, (out, err)
    line = _one_line(err, "replay")
    assert "mid-run" in line and "start the broker again" in line and "replay into fresh topics" in line
    if how == "kill":
        assert "no answer from the broker" in line
    else:
        assert "was deleted and recreated" in line or "is gone" in line
    # bounded: the next epoch starts within 6 s, then the loss timeout, then closing
    assert took < 6 + LOSS_TIMEOUT_S + 30, took
    match = ACKED.search(out)
    assert match is not None, out
    acked, sent, acked_records, sent_records = (_count(g) for g in match.groups())
    assert 0 < acked < sent and 0 < acked_records < sent_records, out


class SpySink(ReportSink):
    """A ReportSink that also adds up, itself, the reports its acknowledgement callbacks saw."""

    seen_reports = 0
    seen_records = 0
    marker_acked = threading.Event()
    instance: ReportSink | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        SpySink.instance = self

    def _ok(self, reports: int | None, metadata: Any) -> None:
        super()._ok(reports, metadata)
        if reports is None:
            SpySink.marker_acked.set()
        else:
            SpySink.seen_reports += reports
            SpySink.seen_records += 1

    @staticmethod
    def between_epochs() -> bool:
        """A marker was acknowledged and nothing is in flight: an epoch is done, the next not begun."""
        sink = SpySink.instance
        return (SpySink.marker_acked.is_set() and sink is not None
                and sink.sent == sink.delivered + sink.failed)


def test_replay_summary_is_what_the_callbacks_acknowledged(own_broker: OwnBroker, tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the broker is killed between two epochs; the summary that
    comes with ReplayLost counts exactly the reports (and report records) the sink's
    acknowledgement callbacks saw, fewer than it sent."""
    SpySink.seen_reports = SpySink.seen_records = 0
    SpySink.marker_acked = threading.Event()
    SpySink.instance = None
    monkeypatch.setattr(replay_mod, "ReportSink", SpySink)
    s = _settings(own_broker, tmp_path, tmp_path_factory.getbasetemp(), speed=5.0, max_epochs=100)
    killed_at: list[float] = []

    def killer() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if SpySink.between_epochs():
                own_broker.kill()
                killed_at.append(time.monotonic())
                return
            time.sleep(0.01)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    with pytest.raises(ReplayLost) as info:
        replay(s, progress=False)
    t.join(timeout=10)
    assert killed_at, "the broker was never killed"
    assert time.monotonic() - killed_at[0] < 6 + LOSS_TIMEOUT_S + 30
    summary = info.value.summary
    assert "no answer from the broker" in str(info.value)
    assert summary.reports == SpySink.seen_reports and summary.records == SpySink.seen_records
    assert 0 < summary.reports < summary.reports_sent
    assert 0 < summary.records < summary.records_sent
    assert summary.epochs >= 1 and not summary.interrupted


@pytest.mark.parametrize("how", ["kill", "restart"])
def test_worker_ends_with_one_line_when_the_broker_is_lost(own_broker: OwnBroker, tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           how: str) -> None:
    """A running worker whose broker dies (or restarts empty) stops by itself: exit 7 within
    the loss timeout, a check interval and the stop grace (plus a margin), the one line last
    on stderr, and no traceback anywhere in it."""
    rs, ws = pipeline_settings(own_broker.bootstrap, tmp_path)
    rs = rs.model_copy(update={"data_dir": tmp_path_factory.getbasetemp() / "ptt-data", "max_epochs": 3})
    ws = ws.model_copy(update={"broker_loss_timeout_s": LOSS_TIMEOUT_S, "worker_dir": tmp_path / "worker"})
    worker = WorkerProcess(ws, tmp_path / "worker.log", err=tmp_path / "worker.err").start()
    try:
        worker.wait_ready()
        replay(rs, progress=False)  # the worker has something to do
        own_broker.lose(how)
        lost_at = time.monotonic()
        assert worker.proc is not None
        code = worker.proc.wait(timeout=120)
    finally:
        worker.stop()
    took = time.monotonic() - lost_at
    err = (tmp_path / "worker.err").read_text()
    assert code == EXIT_BROKER_LOST, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("ptt worker: error:")]
    assert len(errors) == 1, err[-3000:]
    assert err.rstrip().splitlines()[-1] == errors[0]
    assert errors[0].startswith("ptt worker: error: lost the Kafka broker at ")
    assert "start the broker again" in errors[0]
    bound = LOSS_TIMEOUT_S + check_interval_s(LOSS_TIMEOUT_S) + stop_grace_s(LOSS_TIMEOUT_S)
    assert took < bound + 20, took


def test_worker_started_before_its_topics_exist_on_a_loaded_machine_is_not_lost(
        broker: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A worker started on the session's broker (up all along) before any of its topics exist,
    while two busy loops keep both cores loaded: it creates its topics, comes up, estimates an
    epoch and is still running -- its guard never declared the broker lost (exit 7). The guard
    asks every check_interval_s(6) = 1 s, from before Faust started; a topic it had not seen
    yet must not count as gone, nor a single "unknown topic" answer from a busy broker."""
    rs, ws = pipeline_settings(broker, tmp_path)
    rs = rs.model_copy(update={"data_dir": tmp_path_factory.getbasetemp() / "ptt-data", "max_epochs": 3})
    ws = ws.model_copy(update={"broker_loss_timeout_s": 6.0, "worker_dir": tmp_path / "worker"})
    busy: list[subprocess.Popen[bytes] | None] = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], **child_options())  # noqa: S603
        for _ in range(2)]
    worker = WorkerProcess(ws, tmp_path / "worker.log", err=tmp_path / "worker.err")
    try:
        worker.start().wait_ready(timeout_s=180)
        replay(rs, progress=False)
        wait_for(lambda: bool(read_estimates(ws)), 180, "an estimated epoch")
        assert worker.proc is not None and worker.proc.poll() is None, (tmp_path / "worker.err").read_text()[-3000:]
    finally:
        worker.stop()
        terminate_all(busy)
    err = (tmp_path / "worker.err").read_text()
    assert worker.proc is not None and worker.proc.returncode != EXIT_BROKER_LOST, err[-3000:]
    assert "lost the Kafka broker" not in err, err[-3000:]
