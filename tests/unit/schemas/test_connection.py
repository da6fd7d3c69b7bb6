"""schemas.connection: the librdkafka translation carries every connection setting the
kafka-python one does (a SASL/TLS deployment's replay must reach its broker on both paths)."""

from __future__ import annotations

from pathlib import Path

from schemas.connection import kafka_python_options, librdkafka_options
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
