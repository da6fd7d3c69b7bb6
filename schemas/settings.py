"""Connection settings shared by every process that talks to Kafka (no Kafka import here,
so that reading settings and building the command line stay light)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .connection import kafka_python_options

__all__ = ["BrokerLossSettings", "Codec", "KafkaSettings", "source_topic"]

# the record-batch codecs that work end to end with the embedded broker (Tansu 0.6.0) and every
# client here (docs/operations.md, "Compressed topics"); snappy needs python-snappy in kafka-python
Codec = Literal["none", "gzip", "lz4", "zstd"]


class KafkaSettings(BaseSettings):
    """Broker address, topic names and security options (passed through to kafka-python)."""

    model_config = SettingsConfigDict(env_prefix="PTT_", frozen=True, extra="ignore")

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="host:port[,host:port...]")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_password: SecretStr | None = None
    reports_topic: str = "ptt.reports"
    queries_topic: str = "ptt.queries"
    truth_topic: str = "ptt.truth"
    partitions: int = Field(default=4, ge=1, description="partitions of the reports topic when created")
    request_timeout_ms: int = Field(default=30_000, ge=1000)
    bootstrap_timeout_ms: int = Field(default=10_000, ge=100, description="how long one connection attempt waits")
    connect_attempts: int = Field(default=3, ge=1, description="connection attempts (exponential back-off)")
    compression_type: Codec = Field(
        default="zstd",
        description="codec of every producer's record batches (kafka-python, aiokafka, Faust's producer); "
                    "the broker stores and serves them compressed (docs/operations.md, \"Compressed topics\")")
    topic_compression: dict[str, Codec] = Field(
        default={},
        description="per-topic codec overriding compression_type (flag: ptt.estimate-frames=zstd,ptt.reports=lz4, "
                    "merged over the env's JSON) for the producers that write one topic (reports, estimates, "
                    "frames, changelog); Faust's one producer (dead letters, ticks) uses compression_type")

    def __hash__(self) -> int:  # frozen, but topic_compression is a dict
        return hash(tuple(sorted(self.to_env().items())))

    def to_env(self) -> dict[str, str]:
        """The ``PTT_*`` environment variables that reproduce these settings in a child process."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, tuple):
                value = json.dumps(list(value))
            elif isinstance(value, dict):
                value = json.dumps(value)
            env[f"PTT_{name.upper()}"] = str(value)
        return env

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security options for any kafka-python client (schemas.connection)."""
        return kafka_python_options(self)


class BrokerLossSettings(KafkaSettings):
    """Connection settings of a long-running process (``replay``, ``worker``): how long a lost
    broker is waited for before the process stops with one line and exit code 7."""

    broker_loss_timeout_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="stop with exit code 7 when the broker has acknowledged nothing (or answered no "
                    "metadata request) for this long, when a topic in use has been absent from its "
                    "metadata for a third of this (1-10 s), or at once when one was recreated (an "
                    "embedded broker's restart)")


def source_topic(device_topic: str) -> str:
    """The topic of a replay's per-epoch source notes beside the shuffler's device topic (one
    partition; only the replay principal may write it: the shuffler's trusted clock).

    >>> source_topic("ptt.device-reports")
    'ptt.device-reports-source'
    """
    return f"{device_topic}-source"
