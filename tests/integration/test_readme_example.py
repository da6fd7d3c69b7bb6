"""The README's plain kafka-python subscription example runs and prints estimates."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from producers.sink import ReportSink
from schemas.estimates import Estimate, EstimateBound
from schemas.kafka_io import ensure_topics
from schemas.settings import KafkaSettings
from tests.paths import ROOT

pytestmark = pytest.mark.integration


def _readme_example() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    example = next(b for b in blocks if "KafkaConsumer" in b and "ptt.estimates" in b)
    return example


def test_readme_subscription_example_runs(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    topic = kafka_settings.reports_topic + "-estimates"
    ensure_topics(kafka_settings, {topic: 2})
    sink = ReportSink(kafka_settings, topic)
    for station, est in ((400001, 12.3), (400002, -4.0)):
        e = Estimate(query_id="unary-day", query_version=1, mechanism="unary", estimator="unary", epoch=1,
                     epoch_start=datetime(2026, 11, 18, tzinfo=UTC), station=station, estimate=est, sd=3.0,
                     bounds=(EstimateBound(confidence=0.95, lower=5.0, upper=20.0),
                             EstimateBound(confidence=0.99, lower=3.0, upper=24.0)),
                     reports=100, participants=100, epsilon=1.0, closed_by="markers", round_count_mismatch=0,
                     late=0, refused=0, missing_batches=0)
        sink.send(e.model_dump_json().encode(), key=str(station).encode())
    sink.close()
    code = (_readme_example()
            .replace('"ptt.estimates"', repr(topic))
            .replace('"127.0.0.1:9092"', repr(kafka_settings.bootstrap_servers))
            .replace('auto_offset_reset="earliest"', 'auto_offset_reset="earliest", consumer_timeout_ms=5000'))
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)  # noqa: S603
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert len(lines) == 2 and "400001 12 (5.0, 20.0)" in lines[0] and "400002 -4 (5.0, 20.0)" in lines[1]
