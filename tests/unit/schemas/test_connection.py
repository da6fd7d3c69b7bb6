"""schemas.connection: the librdkafka translation carries every connection setting the
kafka-python one does (a SASL/TLS deployment's replay must reach its broker on both paths);
the clients' logged tracebacks are one line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.connection import client_logs, kafka_python_options, librdkafka_options
from schemas.settings import KafkaSettings


def test_librdkafka_options_carry_sasl_tls_and_the_topics_codec() -> None:
    s = KafkaSettings(bootstrap_servers="a:9093,b:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_plain_username="replay", sasl_plain_password="pw",
                      ssl_cafile=Path("/ca.pem"), ssl_certfile=Path("/c.pem"), ssl_keyfile=Path("/k.pem"),
                      ssl_password="kp",
                      compression_type="lz4", topic_compression={"ptt.device-reports": "zstd"})
    o = librdkafka_options(s, "ptt.device-reports")
    kp = kafka_python_options(s)
    assert o["bootstrap.servers"] == ",".join(kp["bootstrap_servers"])
    assert (o["security.protocol"], o["sasl.mechanism"], o["sasl.username"], o["sasl.password"]) == (
        "sasl_ssl", "SCRAM-SHA-512", "replay", "pw")
    assert (o["ssl.ca.location"], o["ssl.certificate.location"], o["ssl.key.location"], o["ssl.key.password"]) == (
        kp["ssl_cafile"], kp["ssl_certfile"], kp["ssl_keyfile"], kp["ssl_password"])
    assert o["compression.type"] == "zstd" and librdkafka_options(s)["compression.type"] == "lz4"
    assert o["request.timeout.ms"] == kp["request_timeout_ms"]


def test_librdkafka_options_plaintext_sets_no_credentials() -> None:
    o = librdkafka_options(KafkaSettings(compression_type="none"))
    assert o["security.protocol"] == "plaintext" and o["compression.type"] == "none"
    assert not any(k.startswith(("sasl.", "ssl.")) for k in o)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """The record factory and the ``kafka`` logger's level as they were before the test."""
    factory, level = logging.getLogRecordFactory(), logging.getLogger("kafka").level
    yield
    logging.setLogRecordFactory(factory)
    logging.getLogger("kafka").setLevel(level)


def _logged(name: str, level: int) -> str:
    """What ``name`` logs of a reset connection with ``log.exception``, formatted as a handler would."""
    log, out = logging.getLogger(name), io.StringIO()
    handler = logging.StreamHandler(out)
    log.addHandler(handler)
    old = log.level
    log.setLevel(level)  # not ``log.level =``: setLevel also clears the loggers' isEnabledFor cache
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError:
            log.exception("receiving")
    finally:
        log.removeHandler(handler)
        log.setLevel(old)
    return out.getvalue()


@pytest.mark.usefixtures("restored_logging")
def test_client_logs_put_a_kafka_client_s_traceback_on_one_line() -> None:
    """kafka-python's and aiokafka's errors with a traceback (a broker resetting a connection
    while a worker reads) become one line below DEBUG; at DEBUG, and in the project's own
    loggers, the traceback stays; installing twice wraps the factory once."""
    client_logs(logging.WARNING)
    installed = logging.getLogRecordFactory()
    client_logs(logging.ERROR)
    assert logging.getLogRecordFactory() is installed and logging.getLogger("kafka").level == logging.ERROR
    one_line = "receiving (ConnectionResetError: [Errno 104] Connection reset by peer)\n"
    for name in ("kafka.net.transport", "aiokafka.conn"):
        assert _logged(name, logging.WARNING) == one_line
        assert "Traceback" in _logged(name, logging.DEBUG)
    assert "Traceback" in _logged("stream_app.worker.app", logging.WARNING)
