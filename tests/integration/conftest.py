"""Real Kafka-protocol broker for integration tests: Tansu (BROKER.md), started here on a free
port for the test session and stopped at the end. Every test gets its own topics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from producers.settings import ReplaySettings
from schemas.settings import KafkaSettings
from stream_app.cli.local_broker import LocalBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # own_group: the broker dies with this process (PR_SET_PDEATHSIG), also when an interrupted
    # pytest-xdist worker is killed before this teardown runs
    with LocalBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log", own_group=True) as b:
        yield b.bootstrap


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
    # Sampling Privacy opted in (not a default query: no whole-day bound), beside ALP and RR: the
    # tests exercise its two linked rounds and the three mechanisms' refusals
    return ReplaySettings(**kafka_settings.model_dump(), data_dir=data, synthetic_stations=6, max_epochs=8,
                          batch_size=150, seed=7, query_mechanisms="sp,alp,rr")
