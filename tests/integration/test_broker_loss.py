"""Issue 9, case 7: the embedded broker keeps everything in memory, and it dies (SIGKILL) or
restarts empty under a running replay, worker or shuffler. Each of them must end within a bound with
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
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from producers.replay import KIND_HEADER, ReplayLost, replay
from producers.replay import transport as replay_transport
from producers.settings import ReplaySettings
from producers.sink import ReportSink
from schemas import DecodedBatch, SourceEpoch, decode_record
from schemas.settings import KafkaSettings
from stream_app.cli.errors import EXIT_BROKER_LOST
from stream_app.cli.local_broker import LocalBroker, child_options, free_port, terminate_all
from stream_app.guard import check_interval_s, stop_grace_s
from stream_app.shuffler.settings import ShufflerSettings

from .kafka_helpers import drain, wait_for_marker
from .stream_helpers import WorkerProcess, env_for, pipeline_settings, wait_for, wait_for_estimates

pytestmark = pytest.mark.integration

LOSS_TIMEOUT_S = 3.0
# a paced replay's (speed 5: an epoch every 6 s) loss timeout: longer than the gap between two
# epochs, so the epoch after the loss is always sent before the loss is declared. With 3 s, a
# loss early in a gap was declared before the next epoch began: nothing was sent
# unacknowledged (seen once, 2 producers under two busy loops)
REPLAY_LOSS_TIMEOUT_S = 8.0
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


def _replay_losing_its_broker(s: ReplaySettings, cwd: Path, producers: int,
                              in_loop: Callable[[subprocess.Popen[str]], None],
                              lose: Callable[[], None]) -> tuple[subprocess.CompletedProcess[str], float]:
    """``ptt replay --speed 5 --max-epochs 100 --quiet --producers N`` in a subprocess; once
    ``in_loop(proc)`` returns (every producer in its loop), ``lose()`` its broker. Returns how the
    replay ended (within 120 s) and how long after the loss. Speed 5: an epoch every 6 s, sent at
    once -- the loss lands between epochs, so the next epoch's reports go to a broker that is gone."""
    proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "replay", "--speed", "5", "--max-epochs", "100",
                             "--quiet", "--producers", str(producers)],
                            env=env_for(s), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        in_loop(proc)
        lose()
        lost_at = time.monotonic()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), time.monotonic() - lost_at


def _assert_lost_mid_run(done: subprocess.CompletedProcess[str], took: float) -> str:
    """Exit 7 within the next epoch's start (6 s), the loss timeout and a margin; one line on
    stderr; a summary whose acknowledged reports and records are fewer than those sent (the
    epoch after the loss was sent, never acknowledged). Returns the line."""
    assert done.returncode == EXIT_BROKER_LOST, (done.stdout, done.stderr)
    line = _one_line(done.stderr, "replay")
    assert "start the broker again" in line, line
    assert took < 6 + REPLAY_LOSS_TIMEOUT_S + 30, took
    match = ACKED.search(done.stdout)
    assert match is not None, done.stdout
    acked, sent, acked_records, sent_records = (_count(g) for g in match.groups())
    assert 0 < acked < sent and 0 < acked_records < sent_records, done.stdout
    return line


@pytest.mark.parametrize(("producers", "how"), [(1, "kill"), (2, "kill"), (1, "restart")])
def test_replay_ends_with_one_line_when_the_broker_is_lost(own_broker: OwnBroker, tmp_path: Path,
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           producers: int, how: str) -> None:
    """The broker dies mid-replay (or restarts empty): exit 7 within the loss timeout plus a
    margin, one line naming the loss and what to do, and a summary whose acknowledged reports
    are fewer than those sent (the epoch after the loss was sent, never acknowledged)."""
    s = _settings(own_broker, tmp_path, tmp_path_factory.getbasetemp(), broker_loss_timeout_s=REPLAY_LOSS_TIMEOUT_S)
    # every producer is in its loop: one still starting when the broker goes (under load, after
    # a peer's first epoch) meets it dead while connecting and sends nothing, so nothing would
    # be sent unacknowledged and the summary would rightly say so
    done, took = _replay_losing_its_broker(
        s, tmp_path, producers, lambda proc: wait_for_marker(s, s.reports_topic, proc, producers=producers),
        lambda: own_broker.lose(how))
    line = _assert_lost_mid_run(done, took)
    assert "mid-run" in line and "replay into fresh topics" in line
    if how == "kill":
        assert "no answer from the broker" in line
    else:
        assert "was deleted and recreated" in line or "is gone" in line


def _epoch_notes(s: ReplaySettings) -> int:
    """How many epochs' source notes (not the opening ones) are on the replay's source-notes topic."""
    try:
        records = drain(s, s.source_topic, quiet_polls=1, timeout_s=5)
    except Exception:  # noqa: BLE001 - the topic may not exist yet
        return 0
    return sum(not SourceEpoch.model_validate_json(r.value).opens for r in records)


@pytest.mark.parametrize("producers", [1, 2])
def test_replay_via_shuffler_ends_with_one_line_when_the_broker_is_lost(own_broker: OwnBroker, tmp_path: Path,
                                                                        tmp_path_factory: pytest.TempPathFactory,
                                                                        producers: int) -> None:
    """The device path (``--via-shuffler``: one record per device report, handed to librdkafka
    in bulk, producers/bulk.py) loses its broker between epochs: exit 7 within the loss timeout
    plus a margin, the one line, and a summary whose acknowledged reports are fewer than those
    sent. The loss is only once every producer noted an epoch (all are in their loop)."""
    s = _settings(own_broker, tmp_path, tmp_path_factory.getbasetemp(), broker_loss_timeout_s=REPLAY_LOSS_TIMEOUT_S,
                  via_shuffler=True,
                  device_topic=f"dev-{tmp_path.name}-{producers}")

    def in_loop(proc: subprocess.Popen[str]) -> None:
        wait_for(lambda: proc.poll() is not None or _epoch_notes(s) >= producers, 90,
                 "an epoch noted by every producer")
        assert proc.poll() is None, proc.communicate()

    done, took = _replay_losing_its_broker(s, tmp_path, producers, in_loop, own_broker.kill)
    assert "no answer from the broker" in _assert_lost_mid_run(done, took)


def _held_by_the_broker(settings: KafkaSettings, topic: str, timeout_s: float = 30.0) -> tuple[int, int]:
    """(reports, report records) on ``topic`` as the broker holds them: every partition read
    from the beginning up to its high-water mark (its log end offset), by a consumer of its own."""
    consumer = KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or set())]
        assert tps, f"no partitions of {topic}"
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "could not read the reports topic to its end"
            for batch in consumer.poll(timeout_ms=300).values():
                records += batch
    finally:
        consumer.close()
    batches = [item for item in (decode_record(r.value) for r in records) if isinstance(item, DecodedBatch)]
    return sum(b.header.reports for b in batches), len(batches)


class KillingSink(ReportSink):
    """A ReportSink that, at the first record of the second epoch -- the first one after a
    marker set, which the replay flushed: nothing is in flight -- counts what the broker holds
    on the reports topic (a consumer of its own, :func:`_held_by_the_broker`), then kills the
    broker, and sends on. What the broker held when it died is what it acknowledged."""

    own: OwnBroker | None = None
    held: tuple[int, int] | None = None
    killed_at: float | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._after_markers = False

    def send(self, value: bytes, key: bytes | None = None, partition: int | None = None,
             headers: Iterable[tuple[str, bytes]] = (), topic: str | None = None, reports: int | None = None) -> None:
        headers = list(headers)
        marker = (KIND_HEADER, b"end_of_epoch") in headers
        if self._after_markers and not marker and KillingSink.killed_at is None:
            assert self.sent == self.delivered + self.failed, "records in flight at the epoch boundary"
            assert KillingSink.own is not None
            KillingSink.held = _held_by_the_broker(self._settings, self.topic)
            KillingSink.own.kill()
            KillingSink.killed_at = time.monotonic()
        self._after_markers = marker
        super().send(value, key=key, partition=partition, headers=headers, topic=topic, reports=reports)


def test_replay_summary_is_what_the_broker_acknowledged(own_broker: OwnBroker, tmp_path: Path,
                                                        tmp_path_factory: pytest.TempPathFactory,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the broker is killed between the first two epochs (nothing in flight),
    right after a separate consumer counted the reports and report records the broker held
    on the reports topic. The summary that comes with ReplayLost counts exactly those --
    counted apart from the sink's own callbacks -- and fewer than were sent (the second
    epoch's records went to a dead broker)."""
    KillingSink.own, KillingSink.held, KillingSink.killed_at = own_broker, None, None
    monkeypatch.setattr(replay_transport, "ReportSink", KillingSink)
    s = _settings(own_broker, tmp_path, tmp_path_factory.getbasetemp(), max_epochs=100)
    with pytest.raises(ReplayLost) as info:
        replay(s, progress=False)
    assert KillingSink.killed_at is not None and KillingSink.held is not None, "the broker was never killed"
    assert time.monotonic() - KillingSink.killed_at < LOSS_TIMEOUT_S + 30
    summary = info.value.summary
    assert "no answer from the broker" in str(info.value)
    assert (summary.reports, summary.records) == KillingSink.held
    assert 0 < summary.reports < summary.reports_sent
    assert 0 < summary.records < summary.records_sent
    assert summary.epochs == 1 and not summary.interrupted


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
    assert "Traceback" not in err, err[max(0, err.find("Traceback") - 1000):][:5000]  # what raised, and where
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
        wait_for_estimates(ws, 1, 180, "an estimated epoch")
        assert worker.proc is not None and worker.proc.poll() is None, (tmp_path / "worker.err").read_text()[-3000:]
    finally:
        worker.stop()
        terminate_all(busy)
    err = (tmp_path / "worker.err").read_text()
    assert worker.proc is not None and worker.proc.returncode != EXIT_BROKER_LOST, err[-3000:]
    assert "lost the Kafka broker" not in err, err[-3000:]


def _shuffler_scrape(ss: ShufflerSettings) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ss.metrics_port}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
    except OSError:
        return {}
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize("how", ["kill", "restart"])
def test_shuffler_ends_with_one_line_when_the_broker_is_lost(own_broker: OwnBroker, tmp_path: Path,
                                                             how: str) -> None:
    """A running ``ptt shuffler`` whose broker dies (or restarts empty) stops by itself, as the
    worker does: exit 7 within the loss timeout, a check interval and the stop grace (plus a
    margin), the one line last on stderr, and no traceback."""
    ss = ShufflerSettings(bootstrap_servers=own_broker.bootstrap, broker_loss_timeout_s=LOSS_TIMEOUT_S,
                          metrics_port=free_port(), partitions=2, device_partitions=2)
    err_path = tmp_path / "shuffler.err"
    with err_path.open("wb") as err_fh:
        proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "shuffler"],  # noqa: S603
                                env=env_for(ss), stdout=subprocess.DEVNULL, stderr=err_fh, cwd=tmp_path)
    try:
        # in its loop: its first transaction (the salt's state record) is committed
        wait_for(lambda: _shuffler_scrape(ss).get("ptt_shuffler_transactions_total[('outcome', 'committed')]", 0)
                 >= 1 or proc.poll() is not None, 60, "the shuffler's first transaction")
        assert proc.poll() is None, err_path.read_text()
        own_broker.lose(how)
        lost_at = time.monotonic()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - lost_at
    err = err_path.read_text()
    assert code == EXIT_BROKER_LOST, err[-3000:]
    assert "Traceback" not in err, err[max(0, err.find("Traceback") - 1000):][:5000]
    errors = [line for line in err.splitlines() if line.startswith("ptt shuffler: error:")]
    assert len(errors) == 1, err[-3000:]
    assert err.rstrip().splitlines()[-1] == errors[0]
    assert errors[0].startswith("ptt shuffler: error: lost the Kafka broker at ")
    assert "start the broker again" in errors[0]
    bound = LOSS_TIMEOUT_S + check_interval_s(LOSS_TIMEOUT_S) + stop_grace_s(LOSS_TIMEOUT_S)
    assert took < bound + 20, took
