"""`ptt subscribe`'s ends, against real brokers: its broker stopped mid-run (one line, exit code
7, within 30 s; it hung silently before), Ctrl-C (exit code 130 and a line saying so; it was
0 and nothing), a topic that does not exist (named plainly, with the topics there, before
anything is printed; it was a Kafka-internal message or a silent wait)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.kafka_io import ensure_topics
from schemas.settings import KafkaSettings
from stream_app.cli.errors import EXIT_BROKER_LOST, EXIT_INTERRUPTED, EXIT_USAGE
from stream_app.cli.local_broker import LocalBroker
from tests.processes import sigint_default

pytestmark = pytest.mark.integration


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker of this test only (it is killed)."""
    b = LocalBroker(log_path=tmp_path / "tansu.log").start()
    try:
        ensure_topics(KafkaSettings(bootstrap_servers=b.bootstrap), {"ptt.estimates": 2, "ptt.queries": 1})
        yield b
    finally:
        b.stop()


def _subscribe(bootstrap: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "stream_app.cli", "subscribe",  # noqa: S603
                             "--bootstrap-servers", bootstrap, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _header(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> bytes:
    """The table's header: printed once the subscriber has connected and found its topic."""
    assert proc.stdout is not None
    fd, got = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in got:
        assert time.monotonic() < deadline and proc.poll() is None, (got, proc.poll())
        if select.select([fd], [], [], 0.5)[0]:
            got += os.read(fd, 4096)
    return got


def _one_line(err: bytes) -> str:
    text = err.decode()
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_broker_stopped_mid_run_ends_it_with_one_line_within_30_s(own_broker: LocalBroker) -> None:
    proc = _subscribe(own_broker.bootstrap)
    try:
        assert b"epoch start" in _header(proc)
        own_broker.kill()
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert took <= 30.0, took
    assert proc.returncode == EXIT_BROKER_LOST, err
    line = _one_line(err)
    assert line.startswith(f"ptt subscribe: error: lost the Kafka broker at {own_broker.bootstrap} mid-run"), line
    assert "refused the connection" in line and "--broker-loss-timeout-s" not in line, line  # no such flag here


def test_ctrl_c_exits_130_saying_so(own_broker: LocalBroker) -> None:
    # _subscribe's command, with SIGINT as a terminal leaves it (the test process may ignore it)
    proc = subprocess.Popen([sys.executable, "-m", "stream_app.cli", "subscribe",  # noqa: S603
                             "--bootstrap-servers", own_broker.bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=sigint_default)
    try:
        _header(proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert _one_line(err) == "ptt subscribe: stopped (Ctrl-C)"


@pytest.mark.parametrize("extra", [[], ["--json"], ["--parquet", "PATH"]])
def test_a_missing_topic_is_named_plainly_before_anything_is_printed(broker: str, tmp_path: Path,
                                                                     extra: list[str]) -> None:
    topic = f"no-such-topic-{os.getpid()}"
    args = [a.replace("PATH", str(tmp_path / "x.parquet")) for a in extra]
    flag = "--frames-topic" if "--parquet" in extra else "--topic"
    done = subprocess.run([sys.executable, "-m", "stream_app.cli", "subscribe", "--bootstrap-servers", broker,  # noqa: S603
                           flag, topic, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stdout == ""
    line = _one_line(done.stderr.encode())
    assert line.startswith(f"ptt subscribe: error: no topic '{topic}' on the broker (its topics: "), line
    assert "start one first, or name another --topic" in line, line
